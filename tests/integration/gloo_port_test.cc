// A stranger on the leader's Gloo port. While a
// generation forms, each Gloo pair of the leader listens on a TCP port and
// takes the first connection that arrives as its peer, with no credentials.
// A 48-byte Gloo message preamble sent there (SEND_UNBOUND_BUFFER for a
// slot nobody posted) made Gloo throw on its event-loop thread and aborted
// the leader daemon. Now Gloo runs in a worker process: the stranger only
// fails that job, the error names the stranger's address, the daemon stays
// up and the next job trains correctly.
//
// The test plays node 1 of the first job at the rendezvous (with the job's
// token) and never connects its Gloo pair, so the leader's pair is
// deterministically still listening when the stranger — who holds no token
// — connects.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/cluster/rendezvous_client.h"
#include "daemon/cluster/rendezvous_keys.h"
#include "daemon/cluster/rendezvous_records.h"
#include "tests/integration/cluster.h"
#include "tests/integration/control_stats.h"
#include "tests/integration/harness.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

constexpr auto kBound = seconds(60);
constexpr char kJob[] = "glooport";
constexpr char kToken[] = "port-secret";

std::string Endpoint(const sockaddr_in& addr) {
  char host[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &addr.sin_addr, host, sizeof(host));
  return absl::StrCat(host, ":", ntohs(addr.sin_port));
}

// Connects to a Gloo pair's listening socket without any credentials and
// sends one well-formed Gloo TCP preamble (Debian's Gloo 2022 snapshot:
// six size_t fields nbytes, opcode, slot, offset, length, roffset) asking
// to deliver 8 bytes to an unbound-buffer slot no receive was posted for.
// Returns the stranger's own address ("" on failure) and keeps the socket.
std::string SendHostilePreamble(const sockaddr_in& pair, int* fd_out) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&pair), sizeof(pair)) != 0) {
    close(fd);
    return "";
  }
  sockaddr_in self{};
  socklen_t len = sizeof(self);
  getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len);
  constexpr size_t kSendUnboundBuffer = 1;
  const size_t preamble[6] = {sizeof(size_t) * 6 + 8, kSendUnboundBuffer, 0x5eed, 0, 8, 0};
  if (write(fd, preamble, sizeof(preamble)) != static_cast<ssize_t>(sizeof(preamble))) {
    close(fd);
    return "";
  }
  *fd_out = fd;
  return Endpoint(self);
}

// The job of both tests: two nodes, one trainer each; `flags` for both.
ClusterOptions TwoNodes(const std::vector<std::string>& flags) {
  ClusterOptions options;
  options.job_id = kJob;
  options.token = kToken;
  options.flags = {"--timeout-s=20"};
  options.flags.insert(options.flags.end(), flags.begin(), flags.end());
  return options;
}

TEST(GlooPort, HostilePreambleOnTheLeadersGlooPortFailsOnlyTheJob) {
  Cluster cluster(TwoNodes({"--bucket-cap-mb=0.001", "--first-bucket-cap-mb=0.0001"}));
  ASSERT_TRUE(cluster.StartNode(0)) << cluster.DaemonLogs();
  Daemon& leader = cluster.node(0);
  const std::string leader_address = absl::StrCat("127.0.0.1:", cluster.port());

  // Job 1: a trainer on the leader; node 1 is played here.
  Process victim = StartTrainer(leader, 0, {"--steps=3"}, "");
  RendezvousClientOptions options;
  options.leader = leader_address;
  options.job_id = kJob;
  options.job_token = kToken;
  std::shared_ptr<RendezvousClient> node1 = RendezvousClient::Connect(options);
  JoinParams join;
  join.node_rank = 1;
  join.num_nodes = 2;
  join.local_size = 1;
  join.host = "127.0.0.1";
  join.timeout = absl::Seconds(30);
  absl::StatusOr<JoinResult> joined = node1->Join(join);
  ASSERT_TRUE(joined.ok()) << joined.status() << leader.process().Log();
  const uint64_t gen = joined->generation;
  // Node 1 registers node 0's layout, so the leader goes on to Gloo.
  ASSERT_TRUE(node1->Wait({LayoutKey(gen, 0)}, absl::Seconds(30)).ok()) << leader.process().Log();
  absl::StatusOr<std::optional<std::string>> layout = node1->Get(LayoutKey(gen, 0));
  ASSERT_TRUE(layout.ok() && layout->has_value());
  ASSERT_TRUE(node1->Set(MinNodesKey(gen, 1), "2").ok());  // a fixed 2-node job, as node 0
  ASSERT_TRUE(node1->Set(AutotuneKey(gen, 1), "off").ok());
  ASSERT_TRUE(node1->Set(LayoutKey(gen, 1), **layout).ok());
  ASSERT_TRUE(node1->Set(WireDTypeKey(gen, 1), "off").ok());

  // The leader's Gloo pair for node 1 is listening once its address is
  // published (Gloo's rendezvous key "<prefix>/0": one tcp::Address per
  // other rank, starting with the listening socket's sockaddr).
  const std::string gloo_key = GenerationKeyPrefix(gen) + "gloo/0";
  ASSERT_TRUE(node1->Wait({gloo_key}, absl::Seconds(30)).ok()) << leader.process().Log();
  absl::StatusOr<std::optional<std::string>> address = node1->Get(gloo_key);
  ASSERT_TRUE(address.ok() && address->has_value());
  ASSERT_GE((*address)->size(), sizeof(sockaddr_in));
  sockaddr_in pair{};
  std::memcpy(&pair, (*address)->data(), sizeof(pair));
  ASSERT_EQ(pair.sin_family, AF_INET);

  int stranger_fd = -1;
  const std::string stranger = SendHostilePreamble(pair, &stranger_fd);
  ASSERT_FALSE(stranger.empty()) << "could not reach the leader's Gloo pair at " << Endpoint(pair);

  // The job fails, naming what happened and who did it...
  const ExitStatus failed = victim.Wait(kBound);
  close(stranger_fd);
  ASSERT_TRUE(failed.exited) << failed.ToString() << victim.Log() << leader.process().Log();
  EXPECT_EQ(failed.code, kExitPeerFailed) << victim.Log() << leader.process().Log();
  EXPECT_NE(victim.Log().find("Gloo worker"), std::string::npos) << victim.Log();
  EXPECT_NE(victim.Log().find("it != localPendingRecv_.end()"), std::string::npos)
      << victim.Log() << leader.process().Log();
  EXPECT_NE(victim.Log().find("<- " + stranger), std::string::npos)
      << "the error does not name the stranger " << stranger << ":\n"
      << victim.Log();
  // ...and the leader daemon is still there.
  ASSERT_TRUE(leader.process().Running()) << leader.process().Log();
  node1->Leave(1, gen, "the test's node 1 is done").IgnoreError();

  // Job 2: a real node 1 joins the same leader; both train like one process.
  ASSERT_TRUE(cluster.StartNode(1)) << cluster.DaemonLogs();
  Daemon& real1 = cluster.node(1);
  const std::vector<std::string> args = {"--steps=10", "--batch=60", "--fp64"};
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(args, &outs);
  for (Process& t : trainers) {
    const ExitStatus st = t.Wait(kBound);
    ASSERT_TRUE(st.exited && st.code == 0)
        << t.Log() << leader.process().Log() << real1.process().Log();
  }
  const std::vector<double> expected = SingleProcessReference(cluster.dir(), args);
  for (const std::string& out : outs) {
    EXPECT_LE(RelativeDifference(LoadWeights(out), expected), 1e-12) << out;
  }
  EXPECT_TRUE(leader.process().Running()) << leader.process().Log();
}

// A stranger kills the leader's Gloo worker while the mesh connects: node
// 0 fails at once and reports it, and the leader aborts the generation.
// Node 1, still connecting (it has no heartbeat thread yet), must learn of
// that abort from the leader within a heartbeat and fail with PEER_FAILED
// naming node 0 and the cause, not wait out Gloo's own connect timeout
// (twice the job's) and fail as TIMEOUT.
//
// Node 1's daemon is stopped (SIGSTOP) inside its Join, so the leader's
// Gloo pair is deterministically still listening when the stranger
// connects; the test publishes node 1's layout for it meanwhile, and
// resumes it once the leader aborted the generation.
TEST(GlooPort, LeadersWorkerKilledWhileFormingFailsTheOtherNodePromptlyNamingNodeZero) {
  Cluster cluster(TwoNodes({"--bucket-cap-mb=0.001", "--first-bucket-cap-mb=0.0001"}));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  Daemon& node0 = cluster.node(0);
  Daemon& node1 = cluster.node(1);

  Process survivor = StartTrainer(node1, 0, {"--steps=3"}, "");
  ASSERT_TRUE(WaitForLog(node0.process(), "event=join node_rank=1 ", kBound))
      << cluster.DaemonLogs();
  node1.process().Signal(SIGSTOP);
  Process victim = StartTrainer(node0, 0, {"--steps=3"}, "");

  RendezvousClientOptions options;
  options.leader = absl::StrCat("127.0.0.1:", cluster.port());
  options.job_id = kJob;
  options.job_token = kToken;
  std::shared_ptr<RendezvousClient> client = RendezvousClient::Connect(options);
  const uint64_t gen = 1;  // the leader's first generation
  ASSERT_TRUE(WaitForLog(node0.process(), "event=generation_formed generation=1 ", kBound))
      << node0.process().Log();
  ASSERT_TRUE(client->Wait({LayoutKey(gen, 0)}, absl::Seconds(30)).ok()) << cluster.DaemonLogs();
  absl::StatusOr<std::optional<std::string>> layout = client->Get(LayoutKey(gen, 0));
  ASSERT_TRUE(layout.ok() && layout->has_value());
  ASSERT_TRUE(client->Set(MinNodesKey(gen, 1), "2").ok());  // a fixed 2-node job, as node 0
  ASSERT_TRUE(client->Set(AutotuneKey(gen, 1), "off").ok());
  ASSERT_TRUE(client->Set(LayoutKey(gen, 1), **layout).ok());
  ASSERT_TRUE(client->Set(WireDTypeKey(gen, 1), "off").ok());
  const std::string gloo_key = GenerationKeyPrefix(gen) + "gloo/0";
  ASSERT_TRUE(client->Wait({gloo_key}, absl::Seconds(30)).ok()) << cluster.DaemonLogs();
  absl::StatusOr<std::optional<std::string>> address = client->Get(gloo_key);
  ASSERT_TRUE(address.ok() && address->has_value());
  ASSERT_GE((*address)->size(), sizeof(sockaddr_in));
  sockaddr_in pair{};
  std::memcpy(&pair, (*address)->data(), sizeof(pair));
  int stranger_fd = -1;
  const std::string stranger = SendHostilePreamble(pair, &stranger_fd);
  ASSERT_FALSE(stranger.empty()) << "could not reach the leader's Gloo pair at " << Endpoint(pair);
  ASSERT_TRUE(WaitForLog(node0.process(), "event=generation_aborted generation=1 ", kBound))
      << node0.process().Log();
  node1.process().Signal(SIGCONT);

  const ExitStatus failed = victim.Wait(kBound);
  close(stranger_fd);
  ASSERT_TRUE(failed.exited) << failed.ToString() << victim.Log();
  EXPECT_EQ(failed.code, kExitPeerFailed) << victim.Log() << node0.process().Log();
  // The deadline is a hang guard: Gloo's own connect timeout (40 s here)
  // would end it too, as TIMEOUT.
  const ExitStatus st = survivor.Wait(kBound);
  ASSERT_TRUE(st.exited) << st.ToString() << survivor.Log() << cluster.DaemonLogs();
  EXPECT_EQ(st.code, kExitPeerFailed) << survivor.Log() << node1.process().Log();
  EXPECT_NE(survivor.Log().find("node_rank=0 (host=127.0.0.1) reported PEER_FAILED"),
            std::string::npos)
      << survivor.Log() << node1.process().Log();
  EXPECT_NE(survivor.Log().find("<- " + stranger), std::string::npos)
      << "node 1's error does not carry the cause (the stranger " << stranger << "):\n"
      << survivor.Log();
  EXPECT_TRUE(node0.process().Running()) << node0.process().Log();
  EXPECT_TRUE(node1.process().Running()) << node1.process().Log();
}

// The worker's pid from the daemon's "event=gloo_worker_started ... pid=N"
// line for `generation` (0 if absent).
pid_t WorkerPid(const Process& daemon, uint64_t generation) {
  const std::string log = daemon.Log();
  const std::string line = absl::StrCat("event=gloo_worker_started node_rank=");
  for (size_t at = log.find(line); at != std::string::npos; at = log.find(line, at + 1)) {
    const std::string entry = log.substr(at, log.find('\n', at) - at);
    if (entry.find(absl::StrCat(" generation=", generation, " ")) == std::string::npos) continue;
    const size_t pid = entry.find("pid=");
    if (pid != std::string::npos) return static_cast<pid_t>(std::atoi(entry.c_str() + pid + 4));
  }
  return 0;
}

// The worker dying in the middle of training (here SIGKILL, as the OOM
// killer would) fails the job on every node, naming the worker and how it
// died; both daemons stay up and train the next job correctly.
TEST(GlooPort, GlooWorkerKilledMidTrainingFailsTheJobOnEveryNodeOnly) {
  Cluster cluster(TwoNodes({}));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  Daemon& node0 = cluster.node(0);
  Daemon& node1 = cluster.node(1);

  std::vector<Process> busy;
  for (Daemon* d : {&node0, &node1}) {
    busy.push_back(StartTrainer(*d, 0, {"--steps=100000", "--sleep-ms=5"}, ""));
  }
  for (Daemon* d : {&node0, &node1}) {
    ASSERT_TRUE(WaitForLog(d->process(), "event=job_running", kBound)) << d->process().Log();
  }
  const pid_t worker = WorkerPid(node1.process(), 1);
  ASSERT_GT(worker, 0) << node1.process().Log();
  ASSERT_EQ(kill(worker, SIGKILL), 0);
  for (Process& t : busy) {
    const ExitStatus st = t.Wait(kBound);
    ASSERT_TRUE(st.exited) << st.ToString() << t.Log();
  }
  // Node 1 lost its own worker: PEER_FAILED. Node 0 sees either its Gloo
  // connection to node 1 closed (UNAVAILABLE) or the leader's abort of the
  // generation (PEER_FAILED), whichever reaches it first.
  EXPECT_EQ(busy[1].exit_status()->code, kExitPeerFailed) << busy[1].Log();
  EXPECT_TRUE(busy[0].exit_status()->code == kExitUnavailable ||
              busy[0].exit_status()->code == kExitPeerFailed)
      << busy[0].Log() << node0.process().Log();
  const std::string named = absl::StrCat("the Gloo worker (pid ", worker,
                                         ") of node_rank=1 generation=1 killed by signal 9");
  EXPECT_NE(busy[1].Log().find(named), std::string::npos) << busy[1].Log();
  ASSERT_TRUE(node0.process().Running()) << node0.process().Log();
  ASSERT_TRUE(node1.process().Running()) << node1.process().Log();

  const std::vector<std::string> args = {"--steps=10", "--batch=60", "--fp64"};
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(args, &outs);
  for (Process& t : trainers) {
    const ExitStatus st = t.Wait(kBound);
    ASSERT_TRUE(st.exited && st.code == 0)
        << t.Log() << node0.process().Log() << node1.process().Log();
  }
  const std::vector<double> expected = SingleProcessReference(cluster.dir(), args);
  for (const std::string& out : outs) {
    EXPECT_LE(RelativeDifference(LoadWeights(out), expected), 1e-12) << out;
  }
}

// The worker killed while it sums and averages in the trainers' arenas (a
// 64 MiB bucket: 9 pieces, each summed in trainer 0's arena and its
// average written into both trainers' arenas by the worker), iterations
// already under way: neither of that node's trainers is told an iteration
// is done; both fail PEER_FAILED naming the worker and how it died, and
// both daemons stay up.
TEST(GlooPort, GlooWorkerKilledWhileAveragingInTheArenasFailsEveryTrainerOfItsNodeNamingIt) {
  ClusterOptions options = TwoNodes({"--bucket-cap-mb=128", "--first-bucket-cap-mb=128"});
  options.local_size = 2;
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(
      {"--steps=100000", "--batch=8", "--fp64", "--dim=2048", "--hidden=4096"}, &outs);
  // Two iterations done: the next ones are under way, mostly in the pieces.
  ASSERT_TRUE(WaitUntil(
      [&] {
        const absl::StatusOr<v1::Stats> stats = GetStats(cluster.port(), kToken);
        return stats.ok() && stats->iterations() >= 2;
      },
      kBound))
      << cluster.DaemonLogs();
  const pid_t worker = WorkerPid(cluster.node(1).process(), 1);
  ASSERT_GT(worker, 0) << cluster.node(1).process().Log();
  ASSERT_TRUE(cluster.node(1).process().Log().find(
                  "event=gloo_worker_arenas_mapped node_rank=1 arenas=2") != std::string::npos)
      << cluster.node(1).process().Log();
  ASSERT_EQ(kill(worker, SIGKILL), 0);
  for (Process& t : trainers) {
    const ExitStatus st = t.Wait(kBound);
    ASSERT_TRUE(st.exited) << st.ToString() << t.Log();
  }
  const std::string named = absl::StrCat("the Gloo worker (pid ", worker,
                                         ") of node_rank=1 generation=1 killed by signal 9");
  // Node 1's trainers are trainers 2 and 3 (cluster.StartTrainers: by node).
  for (size_t i = 2; i < 4; ++i) {
    EXPECT_EQ(trainers[i].exit_status()->code, kExitPeerFailed) << trainers[i].Log();
    EXPECT_NE(trainers[i].Log().find(named), std::string::npos) << trainers[i].Log();
  }
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(trainers[i].exit_status()->code == kExitUnavailable ||
                trainers[i].exit_status()->code == kExitPeerFailed)
        << trainers[i].Log() << cluster.node(0).process().Log();
  }
  EXPECT_TRUE(cluster.node(0).process().Running()) << cluster.node(0).process().Log();
  EXPECT_TRUE(cluster.node(1).process().Running()) << cluster.node(1).process().Log();
}

}  // namespace
}  // namespace gradsync::testing
