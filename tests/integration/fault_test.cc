// The ways users fail, against a real daemon and real trainer processes:
// a layout mismatch, a trainer killed with SIGKILL mid-iteration, a trainer
// withholding a gradient (timeout naming it), the daemon killed under its
// trainers and restarted, bad attach requests. Every failure must become a
// clear error in bounded time, and the daemon must keep serving.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gradsync/v1/local.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tests/integration/harness.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// mlp_trainer exits with 10 + gs_status when a gradsync call fails.

// No hang means: every trainer ends well within this bound.
constexpr auto kBound = seconds(30);

TEST(FaultTest, LayoutMismatchNamesTheFirstDifferingTensorAndTheDaemonKeepsServing) {
  Daemon daemon(2, {"--timeout-s=20"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  Process good = StartTrainer(daemon, 0, {"--steps=3"}, "");
  Process bad = StartTrainer(daemon, 1, {"--steps=3", "--hidden=33"}, "");
  ExitStatus g = good.Wait(kBound), b = bad.Wait(kBound);
  EXPECT_EQ(g.code, kExitMismatch) << good.Log();
  EXPECT_EQ(b.code, kExitMismatch) << bad.Log();
  for (Process* p : {&good, &bad}) {
    const std::string log = p->Log();
    EXPECT_NE(log.find("layout mismatch"), std::string::npos) << log;
    EXPECT_NE(log.find("'fc1.weight' float32[512] vs 'fc1.weight' float32[528]"), std::string::npos)
        << log;
  }
  EXPECT_TRUE(daemon.process().Running());
  ExpectTrains(daemon, 2, "after a mismatch", kBound);
}

TEST(FaultTest, ExtraTensorIsReportedByName) {
  Daemon daemon(2, {"--timeout-s=20"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  Process good = StartTrainer(daemon, 0, {"--steps=3"}, "");
  Process bad = StartTrainer(daemon, 1, {"--steps=3", "--extra-tensor=head.scale"}, "");
  EXPECT_EQ(good.Wait(kBound).code, kExitMismatch);
  EXPECT_EQ(bad.Wait(kBound).code, kExitMismatch);
  EXPECT_NE(bad.Log().find("head.scale"), std::string::npos) << bad.Log();
}

TEST(FaultTest, TrainerKilledMidIterationFailsItsPeersThenNewTrainersTrain) {
  Daemon daemon(3, {"--timeout-s=60"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  std::vector<Process> ps;
  for (int r = 0; r < 3; ++r) {
    // Slow backward: the kill lands while an iteration is in flight.
    ps.push_back(StartTrainer(daemon, r, {"--steps=1000", "--sleep-ms=50", "--batch=60"}, ""));
  }
  // Iteration 0 finished and the next is planned: iterations are in flight.
  ASSERT_TRUE(WaitForLog(daemon.process(), "event=plan_decided", kBound));
  ps[1].Signal(SIGKILL);
  EXPECT_EQ(ps[1].Wait(kBound).code, SIGKILL);
  for (int r : {0, 2}) {
    // Well within the daemon's 60 s timeout: the death is noticed, not timed out.
    ExitStatus st = ps[r].Wait(seconds(20));
    EXPECT_FALSE(st.timed_out) << "trainer " << r << " hung";
    EXPECT_EQ(st.code, kExitPeerFailed) << ps[r].Log();
    EXPECT_NE(ps[r].Log().find("local 1"), std::string::npos) << ps[r].Log();
  }
  ExpectTrains(daemon, 3, "after a trainer was killed", kBound);
}

TEST(FaultTest, WithheldGradientTimesOutNamingTrainerAndTensor) {
  Daemon daemon(2, {"--timeout-s=2", "--stall-threshold-s=1"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  Process ok = StartTrainer(daemon, 0, {"--steps=5"}, "");
  Process stuck =
      StartTrainer(daemon, 1, {"--steps=5", "--withhold=0", "--wait-timeout-ms=60000"}, "");
  ExitStatus a = ok.Wait(kBound), b = stuck.Wait(kBound);
  EXPECT_EQ(a.code, kExitTimeout) << ok.Log();
  EXPECT_EQ(b.code, kExitTimeout) << stuck.Log();
  for (Process* p : {&ok, &stuck}) {
    const std::string log = p->Log();
    EXPECT_NE(log.find("rank 1 (local 1"), std::string::npos) << log;
    EXPECT_NE(log.find("fc1.weight"), std::string::npos) << log;
  }
  const std::string dlog = daemon.process().Log();
  EXPECT_NE(dlog.find("event=stall"), std::string::npos) << dlog;
  ExpectTrains(daemon, 2, "after a timeout", kBound);
}

TEST(FaultTest, ClientSideTimeoutNamesUnmarkedTensors) {
  Daemon daemon(1, {"--timeout-s=30"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  Process p = StartTrainer(daemon, 0, {"--steps=3", "--withhold=2", "--wait-timeout-ms=300"}, "");
  EXPECT_EQ(p.Wait(kBound).code, kExitTimeout);
  EXPECT_NE(p.Log().find("this trainer has not marked fc2.weight"), std::string::npos) << p.Log();
}

TEST(FaultTest, DaemonKilledMidIterationThenRestarted) {
  auto daemon = std::make_unique<Daemon>(2, std::vector<std::string>{"--timeout-s=60"});
  ASSERT_TRUE(daemon->WaitReady(seconds(10)));
  const std::string socket = daemon->socket();
  const std::string prefix = daemon->shm_prefix();
  std::vector<Process> ps;
  for (int r = 0; r < 2; ++r)
    ps.push_back(StartTrainer(*daemon, r, {"--steps=1000", "--sleep-ms=30"}, ""));
  // Iteration 0 finished and the next is planned: iterations are in flight.
  ASSERT_TRUE(WaitForLog(daemon->process(), "event=plan_decided", kBound));
  const pid_t old_pid = daemon->process().pid();
  daemon->process().Signal(SIGKILL);
  daemon->process().Wait(kBound);
  for (int r = 0; r < 2; ++r) {
    ExitStatus st = ps[r].Wait(seconds(20));
    EXPECT_FALSE(st.timed_out) << "trainer " << r << " hung after the daemon died";
    EXPECT_EQ(st.code, kExitPeerFailed) << ps[r].Log();
  }
  // The killed daemon left its segments behind...
  EXPECT_FALSE(SegmentsWithPrefix(absl::StrCat(prefix, ".", old_pid, ".")).empty());
  // ...a new daemon on the same socket and prefix cleans them up and serves.
  Process restarted =
      Process::Spawn({Runfile("daemon/gradsyncd"), "--socket=" + socket, "--listen=127.0.0.1:0",
                      "--shm-prefix=" + prefix, "--local-size=2"},
                     daemon->dir() + "/daemon2.log");
  // The new daemon removes them as it starts: wait for that, with a deadline.
  EXPECT_TRUE(WaitUntil(
      [&] { return SegmentsWithPrefix(absl::StrCat(prefix, ".", old_pid, ".")).empty(); }, kBound))
      << ReadFile(restarted.log_path());
  std::vector<Process> again;
  for (int r = 0; r < 2; ++r) again.push_back(StartTrainer(*daemon, r, {"--steps=5"}, ""));
  for (int r = 0; r < 2; ++r) {
    ExitStatus st = again[r].Wait(kBound);
    EXPECT_TRUE(st.exited && st.code == 0) << again[r].Log() << ReadFile(restarted.log_path());
  }
  restarted.Signal(SIGTERM);
  EXPECT_EQ(restarted.Wait(seconds(10)).code, 0);
  EXPECT_TRUE(SegmentsWithPrefix(prefix + ".").empty()) << "segments left after a clean stop";
}

TEST(FaultTest, BadLocalRanksAreRefused) {
  Daemon daemon(2, {"--timeout-s=20"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  Process out_of_range = StartTrainer(daemon, 5, {"--steps=1"}, "");
  EXPECT_EQ(out_of_range.Wait(kBound).code, 10 + 1 /*INVALID_ARGUMENT*/);
  EXPECT_NE(out_of_range.Log().find("local rank 5 is not in [0, 2)"), std::string::npos)
      << out_of_range.Log();
  // Two trainers claiming local rank 0: the second is refused, the job still forms.
  Process first = StartTrainer(daemon, 0, {"--steps=3"}, "");
  // The twin comes second: once the daemon logged the first one's attach.
  ASSERT_TRUE(WaitForLog(daemon.process(), "event=attach job=", kBound)) << daemon.process().Log();
  Process twin = StartTrainer(daemon, 0, {"--steps=3"}, "");
  EXPECT_EQ(twin.Wait(kBound).code, kExitState) << twin.Log();
  EXPECT_NE(twin.Log().find("already attached"), std::string::npos) << twin.Log();
  Process second = StartTrainer(daemon, 1, {"--steps=3"}, "");
  EXPECT_EQ(first.Wait(kBound).code, 0) << first.Log();
  EXPECT_EQ(second.Wait(kBound).code, 0) << second.Log();
}

TEST(FaultTest, TrainerThatDiesBeforeOpeningItsWatchStreamIsReaped) {
  Daemon daemon(2, {"--timeout-s=20"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  {
    // Attach as local rank 0 and vanish without ever opening the Watch
    // stream (a process killed right after attaching).
    auto channel =
        grpc::CreateChannel("unix:" + daemon.socket(), grpc::InsecureChannelCredentials());
    auto stub = v1::Local::NewStub(channel);
    v1::AttachRequest req;
    req.set_local_rank(0);
    req.set_pid(1);
    req.set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
    v1::AttachResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Attach(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.error().code(), v1::OK) << resp.error().message();
  }
  // The daemon reaps the silent session (after its 10 s grace) and serves
  // new trainers.
  ASSERT_TRUE(WaitForLog(daemon.process(), "never opened its Watch stream", seconds(40)))
      << daemon.process().Log();
  ExpectTrains(daemon, 2, "after a silent attach", kBound);
}

// The daemon's first node segment ("<prefix>.<daemon pid>.node1.<random>"),
// the one the first job's trainers were told.
std::string FirstNodeSegmentPath(Daemon& daemon) {
  const std::vector<std::string> found =
      SegmentsWithPrefix(absl::StrCat(daemon.shm_prefix(), ".", daemon.process().pid(), ".node1."));
  return found.size() == 1 ? "/dev/shm/" + found[0] : "(no single first node segment)";
}

// Anyone of the daemon's user can damage the node segment between jobs:
// the next job (`what` names it) must get a sound one (and the daemon must
// say so, with `reason`), and a clean stop must still leave nothing behind.
void ExpectNodeSegmentRecreatedAfter(const std::string& what,
                                     const std::function<void(const std::string&)>& damage,
                                     const std::string& reason) {
  Daemon daemon(2, {"--timeout-s=20"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  ExpectTrains(daemon, 2, "the first job", kBound);
  ASSERT_NO_FATAL_FAILURE(damage(FirstNodeSegmentPath(daemon)));
  ExpectTrains(daemon, 2, what, kBound);
  const std::string log = daemon.process().Log();
  EXPECT_NE(log.find("event=node_segment_recreated reason=\"node segment"), std::string::npos)
      << log;
  EXPECT_NE(log.find(reason), std::string::npos) << log;
  EXPECT_EQ(daemon.Stop().code, 0) << daemon.process().Log();
  EXPECT_TRUE(SegmentsWithPrefix(daemon.shm_prefix() + ".").empty())
      << "segments left after a clean stop";
}

TEST(FaultTest, NodeSegmentWithOverwrittenMagicIsRecreatedAndTheNextJobTrains) {
  ExpectNodeSegmentRecreatedAfter(
      "after the node segment's magic was overwritten",
      [](const std::string& path) {
        const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
        ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
        const char garbage[16] = "garbage-garbage";
        EXPECT_EQ(pwrite(fd, garbage, sizeof(garbage), 0), static_cast<ssize_t>(sizeof(garbage)));
        close(fd);
      },
      "has bad magic");
}

TEST(FaultTest, UnlinkedNodeSegmentIsRecreatedAndTheNextJobTrains) {
  ExpectNodeSegmentRecreatedAfter(
      "after the node segment was unlinked",
      [](const std::string& path) {
        ASSERT_EQ(unlink(path.c_str()), 0) << path << ": " << std::strerror(errno);
      },
      "no longer names the daemon's segment");
}

// With real trainers: one accumulates two micro-batches
// under no_sync per step while its peer syncs every step. Both are told
// MISMATCH naming both and what each summed, instead of GS_OK and an average
// of a 2-iteration sum with a 1-iteration one; the daemon keeps serving.
TEST(MisuseTest, NoSyncOnOneTrainerOnlyFailsBothWithMismatch) {
  Daemon daemon(2, {"--timeout-s=20"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  Process in_step = StartTrainer(daemon, 0, {"--steps=3"}, "");
  Process no_sync = StartTrainer(daemon, 1, {"--steps=3", "--accumulate=2"}, "");
  ExitStatus a = in_step.Wait(kBound), b = no_sync.Wait(kBound);
  EXPECT_EQ(a.code, kExitMismatch) << in_step.Log() << daemon.process().Log();
  EXPECT_EQ(b.code, kExitMismatch) << no_sync.Log() << daemon.process().Log();
  for (Process* p : {&in_step, &no_sync}) {
    const std::string log = p->Log();
    EXPECT_NE(log.find("trainers out of step in iteration 0"), std::string::npos) << log;
    EXPECT_NE(log.find("rank 1 (local 1"), std::string::npos) << log;
    EXPECT_NE(log.find("rank 0 (local 0"), std::string::npos) << log;
    // Whichever trainer's entry arrived first is named first: "rank 0 ...
    // summed 1 iteration(s) ... but rank 1 ... summed 2 (1 under no_sync)" or
    // the other way round. Either way the accumulating rank 1 is named with 2.
    const bool rank1_first = log.find("rank 1 (local 1") < log.find("rank 0 (local 0");
    EXPECT_NE(log.find(rank1_first ? "summed 2 iteration(s)" : "summed 2 (1 under no_sync)"),
              std::string::npos)
        << log;
  }
  ASSERT_TRUE(daemon.process().Running()) << daemon.process().Log();
  ExpectTrains(daemon, 2, "after trainers out of step", kBound);
}

// With GRADSYNC_DEBUG=detail a trainer that changes a
// gradient after marking it (before the bucket is reduced: every gradient
// here is in one bucket, marked after the write) is told INVALID_ARGUMENT
// naming it and the tensor; its peer gets PEER_FAILED naming it.
TEST(MisuseTest, WriteAfterMarkInDebugModeNamesTheTrainerAndTheTensor) {
  Daemon daemon(2, {"--timeout-s=20"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  Process honest = StartTrainer(daemon, 0, {"--steps=3"}, "");
  SpawnOptions debug;
  debug.env = {{"LOCAL_RANK", "1"}, {"GRADSYNC_DEBUG", "detail"}};
  Process writer =
      Process::Spawn({Runfile("tests/testing/fault_trainer"), "--socket=" + daemon.socket(),
                      "--quiet", "--steps=3", "--write-after-mark"},
                     daemon.dir() + "/writer.log", debug);
  ExitStatus w = writer.Wait(kBound), h = honest.Wait(kBound);
  EXPECT_EQ(w.code, 10 + 1 /*INVALID_ARGUMENT*/) << writer.Log() << daemon.process().Log();
  EXPECT_NE(writer.Log().find("rank 1 (local 1"), std::string::npos) << writer.Log();
  // Backward marks the last parameter, "gate", first.
  EXPECT_NE(writer.Log().find("wrote tensor 4 'gate' after marking it in iteration 0"),
            std::string::npos)
      << writer.Log();
  EXPECT_EQ(h.code, kExitPeerFailed) << honest.Log();
  EXPECT_NE(honest.Log().find("rank 1 (local 1"), std::string::npos) << honest.Log();
  ASSERT_TRUE(daemon.process().Running()) << daemon.process().Log();
  ExpectTrains(daemon, 2, "after a write after mark", kBound);
}

// Runs tests/integration/rogue_trainer in `mode` as local rank 1 next to an
// honest trainer: the rogue is told INVALID_ARGUMENT naming itself (and
// `rogue_says`), the honest one PEER_FAILED naming the rogue, and the
// daemon survives to train the next job (`what` names it).
void ExpectRogueFailsAlone(const std::string& mode, const std::string& rogue_says,
                           const std::string& what) {
  Daemon daemon(2, {"--timeout-s=20"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  Process honest = StartTrainer(daemon, 0, {"--steps=5", "--sleep-ms=300"}, "");
  Process rogue =
      Process::Spawn({Runfile("tests/integration/rogue_trainer"), daemon.socket(), "1", mode},
                     daemon.dir() + "/rogue.log");
  ExitStatus r = rogue.Wait(kBound), h = honest.Wait(kBound);
  EXPECT_EQ(r.code, 1 /*INVALID_ARGUMENT*/) << rogue.Log() << daemon.process().Log();
  EXPECT_NE(rogue.Log().find("rank 1 (local 1"), std::string::npos) << rogue.Log();
  if (!rogue_says.empty()) {
    EXPECT_NE(rogue.Log().find(rogue_says), std::string::npos) << rogue.Log();
  }
  EXPECT_EQ(h.code, kExitPeerFailed) << honest.Log();
  EXPECT_NE(honest.Log().find("rank 1 (local 1"), std::string::npos) << honest.Log();
  ASSERT_TRUE(daemon.process().Running()) << daemon.process().Log();
  ExpectTrains(daemon, 2, what, kBound);
}

// A client that writes garbage into its readiness ring fails alone: it is
// told what was wrong, its honest peer gets PEER_FAILED naming it, nobody's
// gradients are touched, and the daemon keeps serving.
class GarbageEntryTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GarbageEntryTest, FailsTheCulpritOnlyAndTheDaemonSurvives) {
  ExpectRogueFailsAlone(GetParam(), "", "after a garbage entry");
}

INSTANTIATE_TEST_SUITE_P(Modes, GarbageEntryTest,
                         ::testing::Values("bad-index", "bad-sequence", "bad-kind", "corrupt-head"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

// A trainer that cuts its own segment short under the daemon (ftruncate:
// all of it, or its gradient arena after marking every gradient, so the
// daemon's reduction reads the missing pages) fails its job alone, named;
// the daemon, which would have died of SIGBUS, survives and trains the
// next job.
class TruncatedSegmentTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TruncatedSegmentTest, FailsThatTrainersJobAndTheDaemonTrainsTheNext) {
  ExpectRogueFailsAlone(GetParam(), "was truncated under the daemon",
                        "after a trainer truncated its segment");
}

INSTANTIATE_TEST_SUITE_P(Cuts, TruncatedSegmentTest,
                         ::testing::Values("truncate-segment", "truncate-arena"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

// The node segment cut short (any process of the daemon's user can): the
// running job fails naming it, the daemon survives, and the next job gets a
// fresh node segment and trains.
TEST(FaultTest, TruncatedNodeSegmentFailsTheJobNotTheDaemonAndTheNextJobTrains) {
  Daemon daemon(1, {"--timeout-s=20"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  Process rogue = Process::Spawn(
      {Runfile("tests/integration/rogue_trainer"), daemon.socket(), "0", "truncate-node"},
      daemon.dir() + "/rogue.log");
  ExitStatus r = rogue.Wait(kBound);
  EXPECT_EQ(r.code, 7 /*INTERNAL*/) << rogue.Log() << daemon.process().Log();
  // "<prefix>.<pid>.node<generation>.<random>": named up to its random suffix.
  const std::string said = rogue.Log();
  EXPECT_NE(said.find(absl::StrCat("the node segment ", daemon.shm_prefix(), ".",
                                   daemon.process().pid(), ".node")),
            std::string::npos)
      << said;
  EXPECT_NE(said.find(" was truncated under the daemon"), std::string::npos) << said;
  ASSERT_TRUE(daemon.process().Running()) << daemon.process().Log();
  ExpectTrains(daemon, 1, "after the node segment was truncated", kBound);
  EXPECT_NE(daemon.process().Log().find("event=node_segment_recreated reason=\"node segment"),
            std::string::npos)
      << daemon.process().Log();
}

TEST(FaultTest, ConnectWithoutDaemonIsUnavailable) {
  ScratchDir dir;
  Process p = Process::Spawn(
      {Runfile("tests/testing/fault_trainer"), "--socket=" + dir.File("none.sock"), "--steps=1"},
      dir.File("t.log"));
  EXPECT_EQ(p.Wait(kBound).code, 10 + 2 /*UNAVAILABLE*/);
  EXPECT_NE(p.Log().find("is the daemon running?"), std::string::npos) << p.Log();
}

}  // namespace
}  // namespace gradsync::testing
