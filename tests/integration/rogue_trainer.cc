// rogue_trainer: attaches like a trainer (gRPC Local service), registers
// mlp_trainer's default layout, then writes garbage into its own readiness
// ring instead of honest entries — what a buggy or malicious client could
// do. Prints the daemon's verdict and exits with the gradsync code it got
// (0 if the daemon never objected within the timeout: a test failure).
//   rogue_trainer SOCKET LOCAL_RANK MODE   (MODE: bad-index | bad-sequence |
//                                           bad-kind | corrupt-head |
//                                           truncate-segment | truncate-arena |
//                                           truncate-node)
// The truncate modes cut shared memory the daemon reads short (ftruncate):
// its whole segment, its gradient arena (after marking every gradient, so
// the daemon sums the missing pages), or the node segment. The verdict then
// comes over the Watch stream: the segment itself is gone.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "gradsync/v1/local.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "ipc/node_segment.h"
#include "ipc/trainer_segment.h"
#include "tests/testing/wait.h"

namespace {

int Fail(const char* what) {
  std::fprintf(stderr, "rogue_trainer: %s\n", what);
  return 100;
}

// What anyone who can open a segment can do to every mapping of it.
bool Truncate(const std::string& name, off_t size) {
  const int fd = open(("/dev/shm/" + name).c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ftruncate(fd, size) == 0;
  close(fd);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return Fail("usage: rogue_trainer SOCKET LOCAL_RANK MODE");
  const std::string mode = argv[3];
  auto channel =
      grpc::CreateChannel(std::string("unix:") + argv[1], grpc::InsecureChannelCredentials());
  auto stub = gradsync::v1::Local::NewStub(channel);

  gradsync::v1::AttachRequest attach;
  attach.set_local_rank(std::atoi(argv[2]));
  attach.set_pid(getpid());
  attach.set_protocol_version(gradsync::v1::PROTOCOL_VERSION_CURRENT);
  gradsync::v1::AttachResponse attached;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!stub->Attach(&ctx, attach, &attached).ok() || attached.error().code() != 0) {
      return Fail("attach failed");
    }
  }
  // Hold a Watch stream like a real client (the daemon reaps sessions without one).
  grpc::ClientContext watch_ctx;
  gradsync::v1::WatchRequest watch;
  watch.set_session_id(attached.session_id());
  auto reader = stub->Watch(&watch_ctx, watch);
  gradsync::v1::WatchEvent first;
  if (!reader->Read(&first)) return Fail("no watch stream");
  // The first error the daemon sends over the stream.
  std::mutex watch_mu;
  gradsync::v1::Error watch_error;
  std::thread drain([&] {
    gradsync::v1::WatchEvent e;
    while (reader->Read(&e)) {
      std::lock_guard<std::mutex> lock(watch_mu);
      if (e.has_error() && e.error().code() != 0 && watch_error.code() == 0) {
        watch_error = e.error();
      }
    }
  });

  gradsync::v1::RegisterRequest reg;
  reg.set_session_id(attached.session_id());
  const std::pair<const char*, int> layout[] = {
      {"fc1.weight", 512}, {"fc1.bias", 32}, {"fc2.weight", 32}, {"fc2.bias", 1}, {"gate", 1}};
  for (const auto& [name, numel] : layout) {
    auto* t = reg.add_tensors();
    t->set_name(name);
    t->set_dtype(gradsync::v1::FLOAT32);
    t->set_numel(numel);
    t->set_device(-1);
  }
  gradsync::v1::RegisterResponse registered;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (!stub->Register(&ctx, reg, &registered).ok() || registered.error().code() != 0) {
      return Fail("register failed");
    }
  }
  auto node = gradsync::ipc::NodeSegment::Open(registered.node_segment_name());
  auto seg = gradsync::ipc::TrainerSegment::Open(
      registered.segment_name(), registered.layout_hash(), registered.arena_bytes());
  if (!node.ok() || !seg.ok()) return Fail("cannot open the segments");

  gradsync::ipc::ReadyEvent e{};
  e.kind = static_cast<uint32_t>(gradsync::ipc::ReadyKind::kReady);
  if (mode == "bad-index") {
    e.tensor = 999;
  } else if (mode == "bad-sequence") {
    e.sequence = 7;
  } else if (mode == "bad-kind") {
    e.kind = 77;
  } else if (mode == "truncate-segment" || mode == "truncate-arena" || mode == "truncate-node") {
    if (mode == "truncate-arena") {
      // Every gradient marked honestly: the daemon reduces the arena...
      for (uint32_t i = 0; i < 5; ++i) {
        gradsync::ipc::ReadyEvent mark{};
        mark.kind = static_cast<uint32_t>(gradsync::ipc::ReadyKind::kReady);
        mark.tensor = i;
        mark.sequence = i;
        if (!seg->ready_ring().TryPush(mark)) return Fail("ring full");
      }
      node->ready_bell().Ring();
    }
    // ...which is no longer there. From here on this process touches
    // neither its segment nor (truncate-node) the node segment.
    const bool cut =
        mode == "truncate-node"
            ? Truncate(registered.node_segment_name(), 0)
            : Truncate(
                  registered.segment_name(),
                  mode == "truncate-arena" ? static_cast<off_t>(seg->header()->arena_offset) : 0);
    if (!cut) return Fail("cannot truncate");
    gradsync::testing::WaitUntil(
        [&] {
          std::lock_guard<std::mutex> lock(watch_mu);
          if (watch_error.code() != 0) {
            std::printf("rogue_trainer: daemon said code=%d: %s\n", watch_error.code(),
                        watch_error.message().c_str());
            std::fflush(stdout);
            // Exit without unmapping the cut segments' pages by touching them.
            std::_Exit(watch_error.code());
          }
          return false;
        },
        std::chrono::seconds(20));
    std::_Exit(0);
  } else if (mode == "corrupt-head") {
    auto* control = reinterpret_cast<gradsync::ipc::RingControl*>(
        reinterpret_cast<uint8_t*>(seg->header()) + seg->header()->ready_offset);
    control->head.store(control->tail.load() + (1u << 30));
  } else {
    return Fail("unknown mode");
  }
  if (mode != "corrupt-head" && !seg->ready_ring().TryPush(e)) return Fail("ring full");
  node->ready_bell().Ring();

  // The verdict arrives as an error entry in our completion ring.
  gradsync::ipc::CompletionEvent c;
  const bool error = gradsync::testing::WaitUntil(
      [&] {
        return seg->completion_ring().TryPop(&c) == gradsync::ipc::PopResult::kOk &&
               c.kind == static_cast<uint32_t>(gradsync::ipc::CompletionKind::kError);
      },
      std::chrono::seconds(20));
  if (error) {
    std::printf("rogue_trainer: daemon said code=%d: %s\n", c.status, seg->ErrorMessage().c_str());
    watch_ctx.TryCancel();
    drain.join();
    return c.status;
  }
  watch_ctx.TryCancel();
  drain.join();
  return 0;
}
