// The host simulation of the device seam: memory and events across real
// processes (fork), stream ordering, SumAsync, dead owners, collectives.
// The point of the simulation is that a missing wait gives a wrong result:
// several tests prove that it does.
#include "gpu/sim/sim_device.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/half.h"
#include "common/monotonic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace gradsync::gpu {
namespace {

using ::gradsync::testing::Process;
using ::gradsync::testing::WaitUntil;
using ::testing::HasSubstr;

constexpr char kPrefix[] = "gssimtest";

// Each process its own host (as NCCL_HOSTID would make it), so that the
// forked "nodes" may each use SIM-GPU-0.
SimOptions Options(int gpus = 2) {
  SimOptions o;
  o.num_gpus = gpus;
  o.prefix = kPrefix;
  o.host = absl::StrCat("test-host-", getpid());
  return o;
}

// A one-way byte channel between a test and its child (a pipe).
class Channel {
 public:
  Channel() {
    if (pipe2(fds_, O_CLOEXEC) != 0) std::abort();
  }
  ~Channel() {
    close(fds_[0]);
    close(fds_[1]);
  }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  bool Send(const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = write(fds_[1], bytes.data() + done, bytes.size() - done);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
  // Exactly `size` bytes, or empty after `timeout`.
  std::string Receive(size_t size, absl::Duration timeout = absl::Seconds(20)) {
    std::string out(size, '\0');
    size_t done = 0;
    const absl::Time deadline = MonotonicNow() + timeout;
    while (done < size) {
      pollfd p{fds_[0], POLLIN, 0};
      const int left_ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - MonotonicNow()));
      if (left_ms <= 0 || poll(&p, 1, left_ms) <= 0) return "";
      const ssize_t n = read(fds_[0], &out[done], size - done);
      if (n <= 0) return "";
      done += static_cast<size_t>(n);
    }
    return out;
  }
  std::string ReceiveHandle() { return Receive(IpcHandle::kSize); }

 private:
  int fds_[2];
};

// In a child: report and fail.
#define CHILD_OK(expr)                                                        \
  do {                                                                        \
    const absl::Status _st = (expr);                                          \
    if (!_st.ok()) {                                                          \
      std::fprintf(stderr, "child: %s: %s\n", #expr, _st.ToString().c_str()); \
      return 1;                                                               \
    }                                                                         \
  } while (0)

// Polls until the event completes (or fails, or 20 s pass: a hang guard).
absl::StatusOr<Completion> AwaitEvent(SimDaemonDevice& dev, Event* event) {
  absl::StatusOr<Completion> c = Completion::kPending;
  WaitUntil(
      [&] {
        c = dev.QueryEvent(event);
        return !c.ok() || *c == Completion::kDone;
      },
      absl::Seconds(20));
  return c;
}

std::vector<float> ReadFloats(const void* p, size_t n) {
  const auto* f = static_cast<const float*>(p);
  return std::vector<float>(f, f + n);
}

class SimDeviceTest : public ::testing::Test {
 protected:
  void TearDown() override { RemoveStaleSimSegments(kPrefix); }
};

// ------------------------------------------------------------- the node

TEST_F(SimDeviceTest, TheNodeHasTheConfiguredNumberOfGpusNamedByIndex) {
  auto dev = SimDaemonDevice::Create(Options(3));
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_EQ((*dev)->name(), "sim");
  EXPECT_TRUE((*dev)->CheckDevice("SIM-GPU-0").ok());
  EXPECT_TRUE((*dev)->CheckDevice("SIM-GPU-2").ok());
  const absl::Status missing = (*dev)->CheckDevice("SIM-GPU-3");
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.message(), HasSubstr("SIM-GPU-3"));
  EXPECT_EQ((*dev)->CheckDevice("GPU-0").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*dev)->CheckDevice("SIM-GPU-01").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SimDeviceTest, EnvironmentSelectsTheGpusAndTheVisibleOrdinals) {
  setenv("GRADSYNC_SIM_GPUS", "4", 1);
  setenv("GRADSYNC_SIM_VISIBLE_DEVICES", "3,1", 1);
  auto trainer = SimTrainerDevice::CreateFromEnv();
  unsetenv("GRADSYNC_SIM_GPUS");
  unsetenv("GRADSYNC_SIM_VISIBLE_DEVICES");
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  // Like CUDA_VISIBLE_DEVICES=3,1: the trainer's GPU 0 is the node's GPU 3.
  EXPECT_EQ(*(*trainer)->IdOfOrdinal(0), "SIM-GPU-3");
  EXPECT_EQ(*(*trainer)->IdOfOrdinal(1), "SIM-GPU-1");
  EXPECT_EQ((*trainer)->IdOfOrdinal(2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*trainer)->CreateEvent("SIM-GPU-0").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SimDeviceTest, AMalformedEnvironmentIsAnErrorNamingTheVariable) {
  setenv("GRADSYNC_SIM_GPUS", "two", 1);
  auto options = SimOptions::FromEnv();
  unsetenv("GRADSYNC_SIM_GPUS");
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(options.status().message(), HasSubstr("GRADSYNC_SIM_GPUS"));
}

TEST_F(SimDeviceTest, TheSegmentPrefixComesFromTheEnvironmentAndAPathInItIsRefused) {
  setenv("GRADSYNC_SIM_PREFIX", "gssimenvtest", 1);
  auto options = SimOptions::FromEnv();
  setenv("GRADSYNC_SIM_PREFIX", "a/b", 1);
  auto bad = SimOptions::FromEnv();
  unsetenv("GRADSYNC_SIM_PREFIX");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->prefix, "gssimenvtest");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("bad segment prefix 'a/b'"));
}

// ----------------------------------------------------------------- memory

TEST_F(SimDeviceTest, AllocatedMemoryIsZeroedAndFoundFromAnyPointerInside) {
  auto trainer = SimTrainerDevice::Create(Options());
  ASSERT_TRUE(trainer.ok());
  auto base = (*trainer)->Alloc("SIM-GPU-1", 1000);
  ASSERT_TRUE(base.ok()) << base.status();
  const auto* bytes = static_cast<const unsigned char*>(*base);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(bytes[i], 0) << i;

  auto a = (*trainer)->FindAllocation(static_cast<char*>(*base) + 640);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->base, *base);
  EXPECT_EQ(a->size, 1000u);
  EXPECT_EQ(a->device, "SIM-GPU-1");

  int host = 0;
  EXPECT_EQ((*trainer)->FindAllocation(&host).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*trainer)->FindAllocation(static_cast<char*>(*base) + 1000).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*trainer)->Free(*base).ok());
  EXPECT_EQ((*trainer)->FindAllocation(*base).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*trainer)->Free(*base).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SimDeviceTest, MemoryExportedByTheDaemonIsWrittenByATrainerProcess) {
  Channel handle_to_child;
  Process child;
  {
    auto started = Process::Fork([&]() -> int {
      auto trainer = SimTrainerDevice::Create(Options());
      if (!trainer.ok()) return 1;
      auto handle = IpcHandle::FromBytes(handle_to_child.ReceiveHandle());
      CHILD_OK(handle.status());
      auto base = (*trainer)->OpenMemory("SIM-GPU-1", *handle);
      CHILD_OK(base.status());
      const std::vector<float> grad = {1.5f, -2.0f, 3.25f, 4.0f};
      CHILD_OK((*trainer)->SetDevice("SIM-GPU-1"));  // its kernels run there
      CHILD_OK((*trainer)->WriteAsync(*base, grad.data(), 16, nullptr));
      CHILD_OK((*trainer)->Synchronize(nullptr));
      CHILD_OK((*trainer)->CloseMemory(*base));
      return 0;
    });
    ASSERT_TRUE(started.ok()) << started.status();
    child = *std::move(started);
  }
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  auto base = (*daemon)->Alloc("SIM-GPU-1", 16);
  ASSERT_TRUE(base.ok()) << base.status();
  auto handle = (*daemon)->ExportMemory("SIM-GPU-1", *base);
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_TRUE(handle_to_child.Send(handle->ToBytes()));
  auto exit = child.Wait(std::chrono::seconds(30)).ExitCode();
  ASSERT_TRUE(exit.ok()) << exit.status();
  ASSERT_EQ(*exit, 0);
  EXPECT_EQ(ReadFloats(*base, 4), (std::vector<float>{1.5f, -2.0f, 3.25f, 4.0f}));
  EXPECT_TRUE((*daemon)->Free("SIM-GPU-1", *base).ok());
}

TEST_F(SimDeviceTest, OpeningAHandleTwiceReturnsTheSameBaseAndClosesBalance) {
  Channel to_parent, to_child;
  auto exporter = Process::Fork([&]() -> int {
    auto daemon = SimDaemonDevice::Create(Options());
    CHILD_OK(daemon.status());
    auto base = (*daemon)->Alloc("SIM-GPU-0", 64);
    CHILD_OK(base.status());
    auto handle = (*daemon)->ExportMemory("SIM-GPU-0", *base);
    CHILD_OK(handle.status());
    to_parent.Send(handle->ToBytes());
    to_child.Receive(1, absl::Seconds(60));  // keeps the allocation until the test is done
    return 0;
  });
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  auto trainer = SimTrainerDevice::Create(Options());
  ASSERT_TRUE(trainer.ok());
  auto handle = IpcHandle::FromBytes(to_parent.ReceiveHandle());
  ASSERT_TRUE(handle.ok()) << handle.status();

  auto first = (*trainer)->OpenMemory("SIM-GPU-0", *handle);
  auto second = (*trainer)->OpenMemory("SIM-GPU-0", *handle);
  ASSERT_TRUE(first.ok() && second.ok()) << first.status() << second.status();
  EXPECT_EQ(*first, *second);
  EXPECT_TRUE((*trainer)->CloseMemory(*first).ok());
  EXPECT_TRUE((*trainer)->CloseMemory(*first).ok());
  EXPECT_EQ((*trainer)->CloseMemory(*first).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(to_child.Send("q"));
  EXPECT_EQ(*exporter->Wait(std::chrono::seconds(30)).ExitCode(), 0);
}

// CUDA refuses cudaIpcOpenMemHandle / cudaIpcOpenEventHandle in the process
// that exported the handle; so does the simulation, naming the handle.
TEST_F(SimDeviceTest, OpeningAHandleThisProcessExportedIsRefused) {
  auto daemon = SimDaemonDevice::Create(Options());
  auto trainer = SimTrainerDevice::Create(Options());
  ASSERT_TRUE(daemon.ok() && trainer.ok());
  auto flat = (*daemon)->Alloc("SIM-GPU-0", 64);
  ASSERT_TRUE(flat.ok());
  auto flat_handle = (*daemon)->ExportMemory("SIM-GPU-0", *flat);
  ASSERT_TRUE(flat_handle.ok());
  auto mapped = (*trainer)->OpenMemory("SIM-GPU-0", *flat_handle);
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mapped.status().message(), HasSubstr("was exported by this process"));

  auto grad = (*trainer)->Alloc("SIM-GPU-0", 64);
  ASSERT_TRUE(grad.ok());
  auto grad_handle = (*trainer)->ExportMemory(*grad);
  ASSERT_TRUE(grad_handle.ok());
  EXPECT_EQ((*daemon)->OpenMemory("SIM-GPU-0", *grad_handle).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto event = (*trainer)->CreateEvent("SIM-GPU-0");
  ASSERT_TRUE(event.ok());
  auto event_handle = (*trainer)->ExportEvent(*event);
  ASSERT_TRUE(event_handle.ok());
  auto opened = (*daemon)->OpenEvent("SIM-GPU-0", *event_handle);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(opened.status().message(), HasSubstr("cudaIpcOpenEventHandle"));
  EXPECT_TRUE((*daemon)->Free("SIM-GPU-0", *flat).ok());
}

// cudaIpcGetEventHandle needs an event created with cudaEventInterprocess |
// cudaEventDisableTiming; one made with default flags does not export.
TEST_F(SimDeviceTest, ExportingAnEventNotCreatedInterprocessIsRefused) {
  auto trainer = SimTrainerDevice::Create(Options());
  ASSERT_TRUE(trainer.ok());
  auto local = (*trainer)->CreateLocalEvent("SIM-GPU-0");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_TRUE((*trainer)->RecordEvent(*local, nullptr).ok());  // usable in its process
  auto handle = (*trainer)->ExportEvent(*local);
  EXPECT_EQ(handle.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(handle.status().message(), HasSubstr("cudaEventInterprocess"));
  auto shared = (*trainer)->CreateEvent("SIM-GPU-0");
  ASSERT_TRUE(shared.ok());
  EXPECT_TRUE((*trainer)->ExportEvent(*shared).ok());
}

TEST_F(SimDeviceTest, GarbageOrMisdirectedHandlesAreRefused) {
  auto daemon = SimDaemonDevice::Create(Options());
  auto trainer = SimTrainerDevice::Create(Options());
  ASSERT_TRUE(daemon.ok() && trainer.ok());

  IpcHandle garbage;
  for (size_t i = 0; i < IpcHandle::kSize; ++i)
    garbage.bytes[i] = static_cast<unsigned char>(i * 7 + 1);
  EXPECT_EQ((*trainer)->OpenMemory("SIM-GPU-0", garbage).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*daemon)->OpenEvent("SIM-GPU-0", garbage).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*daemon)->OpenMemory("SIM-GPU-0", IpcHandle{}).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto base = (*daemon)->Alloc("SIM-GPU-0", 64);
  ASSERT_TRUE(base.ok());
  auto mem = (*daemon)->ExportMemory("SIM-GPU-0", *base);
  ASSERT_TRUE(mem.ok());
  // On the wrong GPU, or used as an event handle.
  auto wrong_gpu = (*trainer)->OpenMemory("SIM-GPU-1", *mem);
  EXPECT_EQ(wrong_gpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_gpu.status().message(), HasSubstr("GPU 0"));
  EXPECT_EQ((*daemon)->OpenEvent("SIM-GPU-0", *mem).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Exporting anything but an allocation base, or on the wrong GPU.
  EXPECT_EQ((*daemon)->ExportMemory("SIM-GPU-0", static_cast<char*>(*base) + 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*daemon)->ExportMemory("SIM-GPU-1", *base).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A freed allocation's handle names nothing.
  ASSERT_TRUE((*daemon)->Free("SIM-GPU-0", *base).ok());
  EXPECT_EQ((*trainer)->OpenMemory("SIM-GPU-0", *mem).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ------------------------------------------------------ streams and events

TEST_F(SimDeviceTest, AnEventIsPendingUntilEverythingBeforeItOnItsStreamHasRun) {
  Channel to_parent, to_child;
  auto started = Process::Fork([&]() -> int {
    auto trainer = SimTrainerDevice::Create(Options());
    if (!trainer.ok()) return 1;
    auto grad = (*trainer)->Alloc("SIM-GPU-0", 16);
    CHILD_OK(grad.status());
    auto stream = (*trainer)->CreateStream("SIM-GPU-0");
    CHILD_OK(stream.status());
    auto event = (*trainer)->CreateEvent("SIM-GPU-0");
    CHILD_OK(event.status());
    Stream* s = (*trainer)->WrapStream(*stream);  // the test's "native" stream
    CHILD_OK(SimPauseStream(s));
    const std::vector<float> values = {1, 2, 3, 4};
    CHILD_OK((*trainer)->SetDevice("SIM-GPU-0"));
    CHILD_OK((*trainer)->WriteAsync(*grad, values.data(), 16, s));
    CHILD_OK((*trainer)->RecordEvent(*event, s));
    auto mem = (*trainer)->ExportMemory(*grad);
    CHILD_OK(mem.status());
    auto ev = (*trainer)->ExportEvent(*event);
    CHILD_OK(ev.status());
    to_parent.Send(mem->ToBytes() + ev->ToBytes());
    if (to_child.Receive(1) != "g") return 2;
    CHILD_OK(SimResumeStream(s));
    CHILD_OK((*trainer)->Synchronize(s));
    to_child.Receive(1);  // keep the allocation until the parent is done
    return 0;
  });
  ASSERT_TRUE(started.ok()) << started.status();

  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  const std::string handles = to_parent.Receive(2 * IpcHandle::kSize);
  ASSERT_EQ(handles.size(), 2 * IpcHandle::kSize);
  auto mem = (*daemon)->OpenMemory("SIM-GPU-0", *IpcHandle::FromBytes(handles.substr(0, 64)));
  auto event = (*daemon)->OpenEvent("SIM-GPU-0", *IpcHandle::FromBytes(handles.substr(64)));
  ASSERT_TRUE(mem.ok()) << mem.status();
  ASSERT_TRUE(event.ok()) << event.status();

  EXPECT_EQ(*(*daemon)->QueryEvent(*event), Completion::kPending);
  EXPECT_EQ(ReadFloats(*mem, 4), (std::vector<float>{0, 0, 0, 0}));  // not written yet

  ASSERT_TRUE(to_child.Send("g"));
  auto done = AwaitEvent(**daemon, *event);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(*done, Completion::kDone);
  EXPECT_EQ(ReadFloats(*mem, 4), (std::vector<float>{1, 2, 3, 4}));

  (*daemon)->CloseEvent(*event);
  EXPECT_TRUE((*daemon)->CloseMemory("SIM-GPU-0", *mem).ok());
  ASSERT_TRUE(to_child.Send("x"));
  auto exit = started->Wait(std::chrono::seconds(30)).ExitCode();
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 0);
}

TEST_F(SimDeviceTest, EventsCompleteInRecordOrderUnderRandomDelays) {
  // No pausing: the stream's own random delays. Whenever the event reads
  // done, every write recorded before it is visible. The trainer is a
  // child (a process cannot open the handles it exported).
  constexpr int kRounds = 20;
  Channel to_parent, to_child;
  auto child = Process::Fork([&]() -> int {
    auto trainer = SimTrainerDevice::Create(Options());
    CHILD_OK(trainer.status());
    auto grad = (*trainer)->Alloc("SIM-GPU-0", sizeof(float));
    CHILD_OK(grad.status());
    auto event = (*trainer)->CreateEvent("SIM-GPU-0");
    CHILD_OK(event.status());
    auto mem = (*trainer)->ExportMemory(*grad);
    CHILD_OK(mem.status());
    auto ev = (*trainer)->ExportEvent(*event);
    CHILD_OK(ev.status());
    to_parent.Send(mem->ToBytes() + ev->ToBytes());
    CHILD_OK((*trainer)->SetDevice("SIM-GPU-0"));
    for (int i = 1; i <= kRounds; ++i) {
      const float v = static_cast<float>(i);
      CHILD_OK((*trainer)->WriteAsync(*grad, &v, sizeof(v), nullptr));
      CHILD_OK((*trainer)->RecordEvent(*event, nullptr));
      to_parent.Send("r");
      if (to_child.Receive(1, absl::Seconds(60)) != "n") return 2;
    }
    to_child.Receive(1, absl::Seconds(60));  // keeps its memory until the test is done
    return 0;
  });
  ASSERT_TRUE(child.ok()) << child.status();
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  const std::string handles = to_parent.Receive(2 * IpcHandle::kSize);
  ASSERT_EQ(handles.size(), 2 * IpcHandle::kSize);
  auto grad = (*daemon)->OpenMemory("SIM-GPU-0", *IpcHandle::FromBytes(handles.substr(0, 64)));
  auto opened = (*daemon)->OpenEvent("SIM-GPU-0", *IpcHandle::FromBytes(handles.substr(64)));
  ASSERT_TRUE(grad.ok()) << grad.status();
  ASSERT_TRUE(opened.ok()) << opened.status();
  for (int i = 1; i <= kRounds; ++i) {
    ASSERT_EQ(to_parent.Receive(1), "r") << i;
    auto done = AwaitEvent(**daemon, *opened);
    ASSERT_TRUE(done.ok() && *done == Completion::kDone) << i;
    EXPECT_EQ(*static_cast<const float*>(*grad), static_cast<float>(i));
    ASSERT_TRUE(to_child.Send("n"));
  }
  (*daemon)->CloseEvent(*opened);
  EXPECT_TRUE((*daemon)->CloseMemory("SIM-GPU-0", *grad).ok());
  ASSERT_TRUE(to_child.Send("q"));
  EXPECT_EQ(*child->Wait(std::chrono::seconds(30)).ExitCode(), 0);
}

TEST_F(SimDeviceTest, AnEventNeverRecordedIsDone) {
  Channel to_parent, to_child;
  auto child = Process::Fork([&]() -> int {
    auto trainer = SimTrainerDevice::Create(Options());
    CHILD_OK(trainer.status());
    auto event = (*trainer)->CreateEvent("SIM-GPU-1");
    CHILD_OK(event.status());
    auto handle = (*trainer)->ExportEvent(*event);
    CHILD_OK(handle.status());
    to_parent.Send(handle->ToBytes());
    to_child.Receive(1, absl::Seconds(60));
    return 0;
  });
  ASSERT_TRUE(child.ok()) << child.status();
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  auto handle = IpcHandle::FromBytes(to_parent.ReceiveHandle());
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ((*daemon)->OpenEvent("SIM-GPU-0", *handle).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto opened = (*daemon)->OpenEvent("SIM-GPU-1", *handle);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(*(*daemon)->QueryEvent(*opened), Completion::kDone);
  (*daemon)->CloseEvent(*opened);
  ASSERT_TRUE(to_child.Send("q"));
  EXPECT_EQ(*child->Wait(std::chrono::seconds(30)).ExitCode(), 0);
}

TEST_F(SimDeviceTest, RecordingOnAStreamOfAnotherGpuIsRefused) {
  auto trainer = SimTrainerDevice::Create(Options());
  ASSERT_TRUE(trainer.ok());
  auto event = (*trainer)->CreateEvent("SIM-GPU-0");
  auto stream = (*trainer)->CreateStream("SIM-GPU-1");
  ASSERT_TRUE(event.ok() && stream.ok());
  const absl::Status refused = (*trainer)->RecordEvent(*event, *stream);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("event on SIM-GPU-0, stream on SIM-GPU-1"));
  EXPECT_THAT(refused.message(), HasSubstr("CUDA_ERROR_INVALID_HANDLE"));
  (*trainer)->DestroyStream(*stream);
  // A destroyed stream is not a stream any more.
  EXPECT_EQ((*trainer)->RecordEvent(*event, *stream).code(), absl::StatusCode::kInvalidArgument);
}

// ------------------------------------------------------ the current device
// Each runs on a fresh thread: the current device is per thread, and the
// test thread's is whatever earlier tests left.

TEST_F(SimDeviceTest, AKernelLaunchOnAStreamOfAnotherDeviceIsRefusedNamingBoth) {
  auto trainer = SimTrainerDevice::Create(Options());
  ASSERT_TRUE(trainer.ok());
  auto grad = (*trainer)->Alloc("SIM-GPU-1", 16);
  auto stream = (*trainer)->CreateStream("SIM-GPU-1");
  ASSERT_TRUE(grad.ok() && stream.ok());
  const std::vector<float> v = {1, 2, 3, 4};
  absl::Status wrong, right;
  std::thread([&] {
    ASSERT_TRUE((*trainer)->SetDevice("SIM-GPU-0").ok());
    wrong = (*trainer)->WriteAsync(*grad, v.data(), 16, *stream);
    ASSERT_TRUE((*trainer)->SetDevice("SIM-GPU-1").ok());
    right = (*trainer)->WriteAsync(*grad, v.data(), 16, *stream);
  }).join();
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.message(), HasSubstr("stream of SIM-GPU-1"));
  EXPECT_THAT(wrong.message(), HasSubstr("current device is SIM-GPU-0"));
  EXPECT_THAT(wrong.message(), HasSubstr("cudaErrorInvalidResourceHandle"));
  EXPECT_TRUE(right.ok()) << right;
  ASSERT_TRUE((*trainer)->Synchronize(*stream).ok());
  EXPECT_EQ(ReadFloats(*grad, 4), v);
}

TEST_F(SimDeviceTest, ACopyOnAStreamOfAnotherDeviceThanTheCurrentOneSucceeds) {
  auto trainer = SimTrainerDevice::Create(Options());
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(trainer.ok() && daemon.ok());
  auto src = (*daemon)->Alloc("SIM-GPU-1", 16);
  auto dst = (*daemon)->Alloc("SIM-GPU-1", 16);
  auto host = (*daemon)->AllocHost("SIM-GPU-1", 16);
  auto stream = (*daemon)->CreateStream("SIM-GPU-1");
  auto trainer_dst = (*trainer)->Alloc("SIM-GPU-1", 16);
  auto trainer_stream = (*trainer)->CreateStream("SIM-GPU-1");
  ASSERT_TRUE(src.ok() && dst.ok() && host.ok() && stream.ok());
  ASSERT_TRUE(trainer_dst.ok() && trainer_stream.ok());
  const std::vector<float> v = {7, 8, 9, 10};
  std::memcpy(*host, v.data(), 16);
  absl::Status up, across, trainer_copy;
  DeviceId current_after;
  std::thread([&] {
    ASSERT_TRUE((*trainer)->SetDevice("SIM-GPU-0").ok());
    up = (*daemon)->CopyFromHostAsync(*src, *host, 16, *stream);
    across = (*daemon)->CopyAsync(*dst, *src, 16, *stream);
    // Another stream: it may read dst only once the daemon's is done.
    ASSERT_TRUE((*daemon)->Synchronize(*stream).ok());
    trainer_copy = (*trainer)->CopyAsync(*trainer_dst, *dst, 16, *trainer_stream);
    current_after = (*trainer)->CurrentDevice();
  }).join();
  EXPECT_TRUE(up.ok()) << up;
  EXPECT_TRUE(across.ok()) << across;
  EXPECT_TRUE(trainer_copy.ok()) << trainer_copy;
  // The daemon's calls select their GPU for the call only, on a thread that
  // chose one.
  EXPECT_EQ(current_after, "SIM-GPU-0");
  ASSERT_TRUE((*trainer)->Synchronize(*trainer_stream).ok());
  EXPECT_EQ(ReadFloats(*trainer_dst, 4), v);
}

TEST_F(SimDeviceTest, AnEventOfOneDeviceRecordedOnAStreamOfAnotherIsRefused) {
  auto trainer = SimTrainerDevice::Create(Options());
  ASSERT_TRUE(trainer.ok());
  auto event = (*trainer)->CreateEvent("SIM-GPU-1");
  auto stream = (*trainer)->CreateStream("SIM-GPU-0");
  ASSERT_TRUE(event.ok() && stream.ok());
  absl::Status refused;
  std::thread([&] {
    // Whatever the current device: CUDA refuses the pair, not the thread.
    ASSERT_TRUE((*trainer)->SetDevice("SIM-GPU-1").ok());
    refused = (*trainer)->RecordEvent(*event, *stream);
  }).join();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("event on SIM-GPU-1, stream on SIM-GPU-0"));
  EXPECT_THAT(refused.message(), HasSubstr("CUDA_ERROR_INVALID_HANDLE"));
}

TEST_F(SimDeviceTest, WaitingOnAndQueryingAnEventOfAnotherDeviceSucceed) {
  Channel to_parent;
  Channel release;
  auto child = Process::Fork([&]() -> int {
    auto trainer = SimTrainerDevice::Create(Options());
    CHILD_OK(trainer.status());
    auto event = (*trainer)->CreateEvent("SIM-GPU-1");
    auto on_1 = (*trainer)->CreateStream("SIM-GPU-1");
    auto on_0 = (*trainer)->CreateStream("SIM-GPU-0");
    auto grad = (*trainer)->Alloc("SIM-GPU-0", 16);
    CHILD_OK(event.status());
    CHILD_OK(on_1.status());
    CHILD_OK(on_0.status());
    CHILD_OK(grad.status());
    CHILD_OK((*trainer)->SetDevice("SIM-GPU-0"));
    CHILD_OK((*trainer)->RecordEvent(*event, *on_1));
    // A stream of GPU 0 waits on GPU 1's event, from a thread on GPU 0.
    CHILD_OK((*trainer)->StreamWaitEvent(*on_0, *event));
    const std::vector<float> v = {1, 2, 3, 4};
    CHILD_OK((*trainer)->WriteAsync(*grad, v.data(), 16, *on_0));
    CHILD_OK((*trainer)->Synchronize(*on_0));
    if (ReadFloats(*grad, 4) != v) return 2;
    auto handle = (*trainer)->ExportEvent(*event);
    CHILD_OK(handle.status());
    to_parent.Send(handle->ToBytes());
    release.Receive(1, absl::Seconds(30));
    return 0;
  });
  ASSERT_TRUE(child.ok()) << child.status();
  auto handle = IpcHandle::FromBytes(to_parent.ReceiveHandle());
  ASSERT_TRUE(handle.ok()) << handle.status();
  auto daemon = SimDaemonDevice::Create(Options());
  auto trainer = SimTrainerDevice::Create(Options());
  ASSERT_TRUE(daemon.ok() && trainer.ok());
  auto opened = (*daemon)->OpenEvent("SIM-GPU-1", *handle);
  ASSERT_TRUE(opened.ok()) << opened.status();
  absl::StatusOr<Completion> query = absl::UnknownError("not queried");
  std::thread([&] {
    ASSERT_TRUE((*trainer)->SetDevice("SIM-GPU-0").ok());
    query = AwaitEvent(**daemon, *opened);
  }).join();
  ASSERT_TRUE(query.ok()) << query.status();
  EXPECT_EQ(*query, Completion::kDone);
  (*daemon)->CloseEvent(*opened);
  release.Send("x");
  EXPECT_EQ(*child->Wait(std::chrono::seconds(30)).ExitCode(), 0);
}

TEST_F(SimDeviceTest, AThreadThatNeverSetADeviceUsesDeviceZero) {
  auto trainer = SimTrainerDevice::Create(Options());
  ASSERT_TRUE(trainer.ok());
  // Another thread's choice is not this one's.
  ASSERT_TRUE((*trainer)->SetDevice("SIM-GPU-1").ok());
  auto on_0 = (*trainer)->Alloc("SIM-GPU-0", 16);
  auto on_1 = (*trainer)->Alloc("SIM-GPU-1", 16);
  auto stream_1 = (*trainer)->CreateStream("SIM-GPU-1");
  ASSERT_TRUE(on_0.ok() && on_1.ok() && stream_1.ok());
  const std::vector<float> v = {3, 1, 4, 1};
  DeviceId current;
  absl::Status on_default, on_other;
  std::thread([&] {
    current = (*trainer)->CurrentDevice();
    // Null: the legacy default stream of the current device, GPU 0.
    on_default = (*trainer)->WriteAsync(*on_0, v.data(), 16, nullptr);
    on_other = (*trainer)->WriteAsync(*on_1, v.data(), 16, *stream_1);
  }).join();
  EXPECT_EQ(current, "SIM-GPU-0");
  EXPECT_TRUE(on_default.ok()) << on_default;
  EXPECT_EQ(on_other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(on_other.message(), HasSubstr("current device is SIM-GPU-0"));
  ASSERT_TRUE((*trainer)->Synchronize(nullptr).ok());
  EXPECT_EQ(ReadFloats(*on_0, 4), v);
  EXPECT_EQ((*trainer)->CurrentDevice(), "SIM-GPU-1");
}

TEST_F(SimDeviceTest, ADaemonCallLeavesItsGpuCurrentOnlyOnAThreadThatNeverChoseOne) {
  auto trainer = SimTrainerDevice::Create(Options());
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(trainer.ok() && daemon.ok());
  // CudaDeviceSwitch restores the previous device only where the thread had
  // a context: restoring "device 0" would create one on a GPU it never used.
  DeviceId fresh, chosen;
  std::thread([&] {
    auto stream = (*daemon)->CreateStream("SIM-GPU-1");
    ASSERT_TRUE(stream.ok());
    fresh = (*trainer)->CurrentDevice();
    (*daemon)->DestroyStream(*stream);
  }).join();
  std::thread([&] {
    ASSERT_TRUE((*trainer)->SetDevice("SIM-GPU-0").ok());
    auto stream = (*daemon)->CreateStream("SIM-GPU-1");
    ASSERT_TRUE(stream.ok());
    chosen = (*trainer)->CurrentDevice();
    (*daemon)->DestroyStream(*stream);
  }).join();
  EXPECT_EQ(fresh, "SIM-GPU-1");
  EXPECT_EQ(chosen, "SIM-GPU-0");
}

TEST_F(SimDeviceTest, APendingEventOfADeadTrainerIsUnavailableNamingItsPid) {
  Channel to_parent;
  auto started = Process::Fork([&]() -> int {
    auto trainer = SimTrainerDevice::Create(Options());
    if (!trainer.ok()) return 1;
    auto stream = (*trainer)->CreateStream("SIM-GPU-0");
    CHILD_OK(stream.status());
    auto event = (*trainer)->CreateEvent("SIM-GPU-0");
    CHILD_OK(event.status());
    CHILD_OK(SimPauseStream(*stream));  // the "kernel" never finishes
    CHILD_OK((*trainer)->RecordEvent(*event, *stream));
    auto handle = (*trainer)->ExportEvent(*event);
    CHILD_OK(handle.status());
    to_parent.Send(handle->ToBytes());
    pause();  // until killed
    return 0;
  });
  ASSERT_TRUE(started.ok()) << started.status();
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  auto handle = IpcHandle::FromBytes(to_parent.ReceiveHandle());
  ASSERT_TRUE(handle.ok()) << handle.status();
  auto event = (*daemon)->OpenEvent("SIM-GPU-0", *handle);
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_EQ(*(*daemon)->QueryEvent(*event), Completion::kPending);

  const pid_t pid = started->pid();
  ASSERT_TRUE(started->Kill().ok());
  auto after = (*daemon)->QueryEvent(*event);
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(after.status().message(), HasSubstr(absl::StrCat(pid)));
  (*daemon)->CloseEvent(*event);
}

TEST_F(SimDeviceTest, ACompletedEventOfADeadTrainerStaysDone) {
  Channel to_parent;
  auto started = Process::Fork([&]() -> int {
    auto trainer = SimTrainerDevice::Create(Options());
    if (!trainer.ok()) return 1;
    auto event = (*trainer)->CreateEvent("SIM-GPU-0");
    CHILD_OK(event.status());
    CHILD_OK((*trainer)->RecordEvent(*event, nullptr));
    CHILD_OK((*trainer)->Synchronize(nullptr));
    auto handle = (*trainer)->ExportEvent(*event);
    CHILD_OK(handle.status());
    to_parent.Send(handle->ToBytes());
    pause();
    return 0;
  });
  ASSERT_TRUE(started.ok()) << started.status();
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  auto handle = IpcHandle::FromBytes(to_parent.ReceiveHandle());
  ASSERT_TRUE(handle.ok());
  auto event = (*daemon)->OpenEvent("SIM-GPU-0", *handle);
  ASSERT_TRUE(event.ok()) << event.status();
  ASSERT_TRUE(started->Kill().ok());
  EXPECT_EQ(*(*daemon)->QueryEvent(*event), Completion::kDone);
}

// ---------------------------------------- a missing wait is a wrong result

TEST_F(SimDeviceTest, ADaemonThatSumsBeforeTheTrainersEventCompletesGetsStaleGradients) {
  Channel to_parent, to_child;
  auto started = Process::Fork([&]() -> int {
    auto trainer = SimTrainerDevice::Create(Options());
    if (!trainer.ok()) return 1;
    auto handle = IpcHandle::FromBytes(to_child.ReceiveHandle());
    CHILD_OK(handle.status());
    auto flat = (*trainer)->OpenMemory("SIM-GPU-0", *handle);
    CHILD_OK(flat.status());
    auto stream = (*trainer)->CreateStream("SIM-GPU-0");
    CHILD_OK(stream.status());
    auto event = (*trainer)->CreateEvent("SIM-GPU-0");
    CHILD_OK(event.status());
    // Backward: the gradient kernel is queued, the event recorded after it,
    // then the gradient is marked ready — the kernel has not run yet.
    CHILD_OK(SimPauseStream(*stream));
    const std::vector<float> grad = {10, 20, 30, 40};
    CHILD_OK((*trainer)->SetDevice("SIM-GPU-0"));
    CHILD_OK((*trainer)->WriteAsync(*flat, grad.data(), 16, *stream));
    CHILD_OK((*trainer)->RecordEvent(*event, *stream));
    auto ev = (*trainer)->ExportEvent(*event);
    CHILD_OK(ev.status());
    to_parent.Send(ev->ToBytes());
    if (to_child.Receive(1) != "g") return 2;
    CHILD_OK(SimResumeStream(*stream));
    to_child.Receive(1);
    return 0;
  });
  ASSERT_TRUE(started.ok()) << started.status();

  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  auto flat = (*daemon)->Alloc("SIM-GPU-0", 16);
  auto own = (*daemon)->Alloc("SIM-GPU-0", 16);  // the daemon's other input
  auto out = (*daemon)->Alloc("SIM-GPU-0", 16);
  auto stream = (*daemon)->CreateStream("SIM-GPU-0");
  ASSERT_TRUE(flat.ok() && own.ok() && out.ok() && stream.ok());
  const std::vector<float> ones = {1, 1, 1, 1};
  std::memcpy(*own, ones.data(), 16);
  ASSERT_TRUE(to_child.Send((*daemon)->ExportMemory("SIM-GPU-0", *flat)->ToBytes()));
  auto event = (*daemon)->OpenEvent("SIM-GPU-0", *IpcHandle::FromBytes(to_parent.ReceiveHandle()));
  ASSERT_TRUE(event.ok()) << event.status();

  // The bug: reducing on "marked ready" without polling the event.
  ASSERT_TRUE((*daemon)->SumAsync(*out, {*flat, *own}, 4, DType::kFloat32, 1.0f, {}, *stream).ok());
  ASSERT_TRUE((*daemon)->Synchronize(*stream).ok());
  EXPECT_EQ(ReadFloats(*out, 4), (std::vector<float>{1, 1, 1, 1}))
      << "the simulation must expose the missing wait as a wrong sum";

  // The fix: poll the event, then reduce.
  ASSERT_TRUE(to_child.Send("g"));
  auto done = AwaitEvent(**daemon, *event);
  ASSERT_TRUE(done.ok() && *done == Completion::kDone) << done.status();
  ASSERT_TRUE((*daemon)->SumAsync(*out, {*flat, *own}, 4, DType::kFloat32, 1.0f, {}, *stream).ok());
  ASSERT_TRUE((*daemon)->Synchronize(*stream).ok());
  EXPECT_EQ(ReadFloats(*out, 4), (std::vector<float>{11, 21, 31, 41}));
  ASSERT_TRUE(to_child.Send("x"));
  auto exit = started->Wait(std::chrono::seconds(30)).ExitCode();
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 0);
}

TEST_F(SimDeviceTest, ReadingTheDaemonsOwnResultBeforeItsStreamCompletesSeesStaleData) {
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  auto a = (*daemon)->Alloc("SIM-GPU-0", 8);
  auto b = (*daemon)->Alloc("SIM-GPU-0", 8);
  auto stream = (*daemon)->CreateStream("SIM-GPU-0");
  ASSERT_TRUE(a.ok() && b.ok() && stream.ok());
  const std::vector<float> v = {2, 3};
  std::memcpy(*a, v.data(), 8);
  ASSERT_TRUE(SimPauseStream(*stream).ok());
  ASSERT_TRUE((*daemon)->CopyAsync(*b, *a, 8, *stream).ok());
  EXPECT_EQ(*(*daemon)->QueryStream(*stream), Completion::kPending);
  EXPECT_EQ(ReadFloats(*b, 2), (std::vector<float>{0, 0}));
  ASSERT_TRUE(SimResumeStream(*stream).ok());
  ASSERT_TRUE((*daemon)->Synchronize(*stream).ok());
  EXPECT_EQ(*(*daemon)->QueryStream(*stream), Completion::kDone);
  EXPECT_EQ(ReadFloats(*b, 2), (std::vector<float>{2, 3}));
  (*daemon)->DestroyStream(*stream);
}

// ---------------------------------------------------------------- SumAsync

// Element i of source k: multiples of 1/4 below 5, exact in every dtype, and
// so are their sums and halves.
double Value(int k, int i) { return (k + 1) * 0.25 * (i % 7) - k; }

void Store(DType t, void* p, int i, double v) {
  switch (t) {
    case DType::kFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      return;
    case DType::kFloat64:
      static_cast<double*>(p)[i] = v;
      return;
    case DType::kFloat16:
      static_cast<uint16_t*>(p)[i] = FloatToFloat16(static_cast<float>(v));
      return;
    case DType::kBFloat16:
      static_cast<uint16_t*>(p)[i] = FloatToBFloat16(static_cast<float>(v));
      return;
  }
}

double Load(DType t, const void* p, int i) {
  switch (t) {
    case DType::kFloat32:
      return static_cast<const float*>(p)[i];
    case DType::kFloat64:
      return static_cast<const double*>(p)[i];
    case DType::kFloat16:
      return Float16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kBFloat16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}

class SumAsyncTest : public SimDeviceTest, public ::testing::WithParamInterface<DType> {};

TEST_P(SumAsyncTest, SumsEverySourceScalesAndMayWriteOverTheFirst) {
  const DType t = GetParam();
  constexpr int kCount = 1000;
  constexpr int kSources = 3;
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  auto stream = (*daemon)->CreateStream("SIM-GPU-1");
  ASSERT_TRUE(stream.ok());
  std::vector<void*> srcs;
  for (int k = 0; k < kSources; ++k) {
    auto p = (*daemon)->Alloc("SIM-GPU-1", kCount * DTypeSize(t));
    ASSERT_TRUE(p.ok());
    for (int i = 0; i < kCount; ++i) Store(t, *p, i, Value(k, i));
    srcs.push_back(*p);
  }
  auto out = (*daemon)->Alloc("SIM-GPU-1", kCount * DTypeSize(t));
  ASSERT_TRUE(out.ok());

  ASSERT_TRUE(
      (*daemon)->SumAsync(*out, {srcs[0], srcs[1], srcs[2]}, kCount, t, 0.5f, {}, *stream).ok());
  // In place: dst is the first source.
  ASSERT_TRUE((*daemon)->SumAsync(srcs[0], {srcs[0], srcs[1]}, kCount, t, 1.0f, {}, *stream).ok());
  ASSERT_TRUE((*daemon)->Synchronize(*stream).ok());
  for (int i = 0; i < kCount; ++i) {
    const double sum3 = Value(0, i) + Value(1, i) + Value(2, i);
    ASSERT_EQ(Load(t, *out, i), 0.5 * sum3) << DTypeName(t) << " element " << i;
    ASSERT_EQ(Load(t, srcs[0], i), Value(0, i) + Value(1, i)) << DTypeName(t) << " element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, SumAsyncTest,
                         ::testing::Values(DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                           DType::kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// The gradient path scales by 1/world_size; in fp64 that must be the fp64
// reciprocal (a float 1/3 is off by ~3e-8 relative, far outside fp64).
TEST_F(SimDeviceTest, SumAsyncScalesFloat64InFloat64) {
  constexpr int kCount = 64;
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  auto stream = (*daemon)->CreateStream("SIM-GPU-1");
  ASSERT_TRUE(stream.ok());
  std::vector<void*> srcs;
  for (int k = 0; k < 3; ++k) {
    auto p = (*daemon)->Alloc("SIM-GPU-1", kCount * sizeof(double));
    ASSERT_TRUE(p.ok());
    for (int i = 0; i < kCount; ++i) Store(DType::kFloat64, *p, i, Value(k, i) + 0.1 * i);
    srcs.push_back(*p);
  }
  const double third = 1.0 / 3.0;
  ASSERT_TRUE((*daemon)
                  ->SumAsync(srcs[0], {srcs[0], srcs[1], srcs[2]}, kCount, DType::kFloat64, third,
                             {}, *stream)
                  .ok());
  ASSERT_TRUE((*daemon)->Synchronize(*stream).ok());
  for (int i = 0; i < kCount; ++i) {
    const double sum = (Value(0, i) + 0.1 * i) + (Value(1, i) + 0.1 * i) + (Value(2, i) + 0.1 * i);
    ASSERT_EQ(Load(DType::kFloat64, srcs[0], i), sum * third) << "element " << i;
  }
}

class HalfSumAsyncTest : public SumAsyncTest {};

TEST_P(HalfSumAsyncTest, AccumulatesInFloat32AndRoundsOnce) {
  const DType t = GetParam();
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  auto stream = (*daemon)->CreateStream("SIM-GPU-0");
  ASSERT_TRUE(stream.ok());
  // 1 + 4 * tiny: each tiny alone is lost when rounded into 1, but their
  // fp32 sum is not (tiny = a quarter of the ulp at 1).
  const double ulp = t == DType::kFloat16 ? 1.0 / 1024 : 1.0 / 128;
  std::vector<const void*> srcs;
  auto one = (*daemon)->Alloc("SIM-GPU-0", 2);
  ASSERT_TRUE(one.ok());
  Store(t, *one, 0, 1.0);
  srcs.push_back(*one);
  for (int k = 0; k < 4; ++k) {
    auto p = (*daemon)->Alloc("SIM-GPU-0", 2);
    ASSERT_TRUE(p.ok());
    Store(t, *p, 0, ulp / 4);
    srcs.push_back(*p);
  }
  auto out = (*daemon)->Alloc("SIM-GPU-0", 2);
  ASSERT_TRUE(out.ok());
  ASSERT_TRUE((*daemon)->SumAsync(*out, srcs, 1, t, 1.0f, {}, *stream).ok());
  ASSERT_TRUE((*daemon)->Synchronize(*stream).ok());
  EXPECT_EQ(Load(t, *out, 0), 1.0 + ulp);
}

INSTANTIATE_TEST_SUITE_P(HalfDTypes, HalfSumAsyncTest,
                         ::testing::Values(DType::kFloat16, DType::kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// The non-finite check (gpu/local_sum.h's semantics): a result element that
// is not finite sets the flag to the launch's token and leaves dst holding
// srcs[0]'s element; finite results store the sum and leave the flag alone.
class SumAsyncCheckTest : public SumAsyncTest {};

TEST_P(SumAsyncCheckTest, NonFiniteResultSetsTheFlagAndKeepsTheFirstSourcesElement) {
  const DType t = GetParam();
  constexpr int kCount = 37;
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  auto stream = (*daemon)->CreateStream("SIM-GPU-0");
  auto a = (*daemon)->Alloc("SIM-GPU-0", kCount * DTypeSize(t));
  auto b = (*daemon)->Alloc("SIM-GPU-0", kCount * DTypeSize(t));
  auto flag = (*daemon)->Alloc("SIM-GPU-0", sizeof(uint32_t));
  auto host = (*daemon)->AllocHost("SIM-GPU-0", sizeof(uint32_t));
  ASSERT_TRUE(stream.ok() && a.ok() && b.ok() && flag.ok() && host.ok());
  for (int i = 0; i < kCount; ++i) {
    Store(t, *a, i, Value(0, i));
    Store(t, *b, i, Value(1, i));
  }
  auto* f = static_cast<uint32_t*>(*flag);
  const NonFiniteCheck first{f, 7};
  // All finite: summed in place, flag untouched.
  ASSERT_TRUE((*daemon)->SumAsync(*a, {*a, *b}, kCount, t, 1.0, first, *stream).ok());
  ASSERT_TRUE((*daemon)->CopyToHostAsync(*host, f, sizeof(uint32_t), *stream).ok());
  ASSERT_TRUE((*daemon)->Synchronize(*stream).ok());
  EXPECT_EQ(*static_cast<uint32_t*>(*host), 0u) << DTypeName(t);
  for (int i = 0; i < kCount; ++i) {
    ASSERT_EQ(Load(t, *a, i), Value(0, i) + Value(1, i)) << DTypeName(t) << " element " << i;
  }
  // A NaN in the second source and an Inf at the last element of the
  // first: those results are not finite, the first source keeps its values.
  Store(t, *b, 3, std::nan(""));
  Store(t, *a, kCount - 1, std::numeric_limits<double>::infinity());
  const double a3 = Load(t, *a, 3);
  ASSERT_TRUE((*daemon)->SumAsync(*a, {*a, *b}, kCount, t, 0.5, {f, 8}, *stream).ok());
  ASSERT_TRUE((*daemon)->CopyToHostAsync(*host, f, sizeof(uint32_t), *stream).ok());
  ASSERT_TRUE((*daemon)->Synchronize(*stream).ok());
  EXPECT_EQ(*static_cast<uint32_t*>(*host), 8u) << DTypeName(t);
  EXPECT_EQ(Load(t, *a, 3), a3) << DTypeName(t);
  EXPECT_EQ(Load(t, *a, kCount - 1), std::numeric_limits<double>::infinity()) << DTypeName(t);
  EXPECT_TRUE(std::isfinite(Load(t, *a, 4))) << DTypeName(t);
  EXPECT_TRUE((*daemon)->FreeHost("SIM-GPU-0", *host).ok());
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, SumAsyncCheckTest,
                         ::testing::Values(DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                           DType::kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST_F(SimDeviceTest, HostCopiesGoThroughAllocHostMemoryOnly) {
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  auto stream = (*daemon)->CreateStream("SIM-GPU-0");
  auto dev = (*daemon)->Alloc("SIM-GPU-0", 64);
  auto host = (*daemon)->AllocHost("SIM-GPU-0", 64);
  ASSERT_TRUE(stream.ok() && dev.ok() && host.ok());
  std::memset(*host, 0x5a, 64);
  ASSERT_TRUE((*daemon)->CopyFromHostAsync(*dev, *host, 64, *stream).ok());
  ASSERT_TRUE((*daemon)->Synchronize(*stream).ok());
  EXPECT_EQ(static_cast<unsigned char*>(*dev)[63], 0x5a);
  static_cast<unsigned char*>(*dev)[0] = 0x11;
  ASSERT_TRUE((*daemon)->CopyToHostAsync(*host, *dev, 1, *stream).ok());
  ASSERT_TRUE((*daemon)->Synchronize(*stream).ok());
  EXPECT_EQ(static_cast<unsigned char*>(*host)[0], 0x11);
  unsigned char pageable[64] = {};
  const absl::Status st = (*daemon)->CopyToHostAsync(pageable, *dev, 64, *stream);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("not host memory from AllocHost"));
  EXPECT_EQ((*daemon)->CopyToHostAsync(static_cast<char*>(*host) + 1, *dev, 64, *stream).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*daemon)->CopyFromHostAsync(*host, *dev, 64, *stream).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*daemon)->FreeHost("SIM-GPU-0", *host).ok());
  EXPECT_EQ((*daemon)->FreeHost("SIM-GPU-0", *host).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SimDeviceTest, DeviceOperationsRefuseMemoryOfAnotherGpuOutOfBoundsOrOnTheHost) {
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  auto stream = (*daemon)->CreateStream("SIM-GPU-0");
  auto here = (*daemon)->Alloc("SIM-GPU-0", 64);
  auto there = (*daemon)->Alloc("SIM-GPU-1", 64);
  ASSERT_TRUE(stream.ok() && here.ok() && there.ok());
  float host[16] = {};
  auto code = [](const absl::Status& s) { return s.code(); };
  EXPECT_EQ(code((*daemon)->CopyAsync(*here, *there, 64, *stream)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code((*daemon)->CopyAsync(*here, host, 64, *stream)),
            absl::StatusCode::kInvalidArgument);
  const absl::Status past_end =
      (*daemon)->SumAsync(*here, {*here}, 17, DType::kFloat32, 1.0f, {}, *stream);
  EXPECT_EQ(past_end.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past_end.message(), HasSubstr("past the end"));
  EXPECT_EQ(code((*daemon)->SumAsync(*here, {}, 16, DType::kFloat32, 1.0f, {}, *stream)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code((*daemon)->SumAsync(*here, {*here}, 16, static_cast<DType>(9), 1.0f, {}, *stream)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code((*daemon)->CopyAsync(*here, *here, 64, nullptr)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*daemon)->QueryStream(nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SimDeviceTest, FreeingMemoryWithWorkStillQueuedOnItIsSafe) {
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  auto a = (*daemon)->Alloc("SIM-GPU-0", 4096);
  auto b = (*daemon)->Alloc("SIM-GPU-0", 4096);
  auto stream = (*daemon)->CreateStream("SIM-GPU-0");
  ASSERT_TRUE(a.ok() && b.ok() && stream.ok());
  ASSERT_TRUE(SimPauseStream(*stream).ok());
  ASSERT_TRUE((*daemon)->CopyAsync(*b, *a, 4096, *stream).ok());
  ASSERT_TRUE((*daemon)->Free("SIM-GPU-0", *a).ok());
  ASSERT_TRUE((*daemon)->Free("SIM-GPU-0", *b).ok());
  // The queued copy keeps both mapped until it has run.
  ASSERT_TRUE(SimResumeStream(*stream).ok());
  EXPECT_TRUE((*daemon)->Synchronize(*stream).ok());
  EXPECT_EQ((*daemon)->CopyAsync(*b, *a, 4096, *stream).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SimDeviceTest, MemsetAsyncZeroesInStreamOrder) {
  auto trainer = SimTrainerDevice::Create(Options());
  ASSERT_TRUE(trainer.ok());
  auto grad = (*trainer)->Alloc("SIM-GPU-0", 16);
  auto stream = (*trainer)->CreateStream("SIM-GPU-0");
  ASSERT_TRUE(grad.ok() && stream.ok());
  const std::vector<float> v = {5, 6, 7, 8};
  ASSERT_TRUE((*trainer)->SetDevice("SIM-GPU-0").ok());
  ASSERT_TRUE((*trainer)->WriteAsync(*grad, v.data(), 16, *stream).ok());
  ASSERT_TRUE((*trainer)->MemsetAsync(static_cast<char*>(*grad) + 4, 8, *stream).ok());
  ASSERT_TRUE((*trainer)->Synchronize(*stream).ok());
  EXPECT_EQ(ReadFloats(*grad, 4), (std::vector<float>{5, 0, 0, 8}));
  EXPECT_EQ((*trainer)->MemsetAsync(*grad, 17, *stream).code(), absl::StatusCode::kInvalidArgument);
}

// ------------------------------------------------------------- collectives

// The rendezvous store's part: one file per key in a directory every
// process of the test can see.
class FileStore {
 public:
  FileStore() {
    std::string tmpl = ::testing::TempDir() + "/simstoreXXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    dir_ = tmpl;
  }
  ~FileStore() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  void Fill(CollectiveOptions& o) const {
    const std::string dir = dir_;
    o.publish = [dir](const std::string& key, const std::string& value) -> absl::Status {
      const std::string path = Path(dir, key);
      FILE* f = std::fopen((path + ".tmp").c_str(), "w");
      if (f == nullptr) return absl::InternalError("publish: cannot write");
      std::fwrite(value.data(), 1, value.size(), f);
      std::fclose(f);
      std::rename((path + ".tmp").c_str(), path.c_str());
      return absl::OkStatus();
    };
    o.fetch = [dir](const std::string& key, absl::Time deadline) -> absl::StatusOr<std::string> {
      const std::string path = Path(dir, key);
      while (true) {
        if (FILE* f = std::fopen(path.c_str(), "r")) {
          char buf[256];
          const size_t n = std::fread(buf, 1, sizeof(buf), f);
          std::fclose(f);
          return std::string(buf, n);
        }
        if (MonotonicNow() >= deadline) {  // fetch deadlines are monotonic
          return absl::DeadlineExceededError(absl::StrCat("key ", key, " never published"));
        }
        absl::SleepFor(absl::Milliseconds(1));
      }
    };
  }

 private:
  static std::string Path(const std::string& dir, std::string key) {
    for (char& c : key) {
      if (c == '/') c = '_';
    }
    return absl::StrCat(dir, "/", key);
  }
  std::string dir_;
};

CollectiveOptions Group(int nranks, int first_rank, std::vector<DeviceId> devices,
                        const FileStore* store, absl::Duration timeout = absl::Seconds(30)) {
  CollectiveOptions o;
  o.nranks = nranks;
  o.first_rank = first_rank;
  o.devices = std::move(devices);
  o.generation = 7;
  o.timeout = timeout;
  if (store != nullptr) store->Fill(o);
  return o;
}

// Rank r's input, element i: exact in every dtype, sums too.
double Input(int rank, int i) { return 0.5 * ((rank + 1) * (i % 5)) - rank; }

// Allocates `count` elements of `t` on `device` holding rank `rank`'s input.
void* Fill(SimDaemonDevice& dev, const DeviceId& device, DType t, int count, int rank) {
  void* p = *dev.Alloc(device, count * DTypeSize(t));
  for (int i = 0; i < count; ++i) Store(t, p, i, Input(rank, i));
  return p;
}

// Whether `p` holds the sum of ranks 0..nranks-1's inputs.
bool HoldsSum(DType t, const void* p, int count, int nranks) {
  for (int i = 0; i < count; ++i) {
    double want = 0;
    for (int r = 0; r < nranks; ++r) want += Input(r, i);
    if (Load(t, p, i) != want) {
      std::fprintf(stderr, "%s element %d: %g, want %g\n", DTypeName(t), i, Load(t, p, i), want);
      return false;
    }
  }
  return true;
}

TEST_F(SimDeviceTest, ACollectiveOverOneRankLeavesItsBufferAsItIs) {
  auto dev = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(dev.ok());
  auto group = (*dev)->CreateCollectives(Group(1, 0, {"SIM-GPU-1"}, nullptr));
  ASSERT_TRUE(group.ok()) << group.status();
  void* p = Fill(**dev, "SIM-GPU-1", DType::kFloat32, 100, 0);
  ASSERT_TRUE((*group)->AllreduceSum({{0, p, 100}}, DType::kFloat32).ok());
  EXPECT_TRUE(HoldsSum(DType::kFloat32, p, 100, 1));
}

TEST_F(SimDeviceTest, ACollectiveOverTwoLocalGpusSumsEveryBufferOnBoth) {
  auto dev = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(dev.ok());
  auto group = (*dev)->CreateCollectives(Group(2, 0, {"SIM-GPU-0", "SIM-GPU-1"}, nullptr));
  ASSERT_TRUE(group.ok()) << group.status();
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    // Two buckets per GPU, launched as one group.
    void* a0 = Fill(**dev, "SIM-GPU-0", t, 300, 0);
    void* b0 = Fill(**dev, "SIM-GPU-0", t, 50, 0);
    void* a1 = Fill(**dev, "SIM-GPU-1", t, 300, 1);
    void* b1 = Fill(**dev, "SIM-GPU-1", t, 50, 1);
    ASSERT_TRUE(
        (*group)->AllreduceSum({{0, a0, 300}, {1, a1, 300}, {0, b0, 50}, {1, b1, 50}}, t).ok());
    EXPECT_TRUE(HoldsSum(t, a0, 300, 2));
    EXPECT_TRUE(HoldsSum(t, a1, 300, 2));
    EXPECT_TRUE(HoldsSum(t, b0, 50, 2));
    EXPECT_TRUE(HoldsSum(t, b1, 50, 2));
  }
}

TEST_F(SimDeviceTest, ACollectiveRefusesBuffersThatDoNotMatchItsGpus) {
  auto dev = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(dev.ok());
  auto group = (*dev)->CreateCollectives(Group(2, 0, {"SIM-GPU-0", "SIM-GPU-1"}, nullptr));
  ASSERT_TRUE(group.ok()) << group.status();
  void* a0 = Fill(**dev, "SIM-GPU-0", DType::kFloat32, 10, 0);
  void* a1 = Fill(**dev, "SIM-GPU-1", DType::kFloat32, 10, 1);
  // Rank 1's buffer on GPU 0; then sizes that differ: NCCL would hang.
  EXPECT_EQ((*group)->AllreduceSum({{0, a0, 10}, {1, a0, 10}}, DType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  auto other = (*dev)->CreateCollectives(Group(2, 0, {"SIM-GPU-0", "SIM-GPU-1"}, nullptr));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->AllreduceSum({{0, a0, 10}, {1, a1, 9}}, DType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  // After a failure the group is unusable.
  EXPECT_EQ((*other)->AllreduceSum({{0, a0, 10}, {1, a1, 10}}, DType::kFloat32).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(
      (*dev)->CreateCollectives(Group(2, 0, {"SIM-GPU-0", "SIM-GPU-0"}, nullptr)).status().code(),
      absl::StatusCode::kInvalidArgument);
}

// Rank r's byte i before a broadcast.
unsigned char BroadcastByte(int rank, size_t i) {
  return static_cast<unsigned char>(i * 7 + static_cast<size_t>(rank) * 31 + 1);
}

// `bytes` of rank `rank`'s pattern on `device`.
void* FillBytes(SimDaemonDevice& dev, const DeviceId& device, size_t bytes, int rank) {
  auto* p = static_cast<unsigned char*>(*dev.Alloc(device, bytes));
  for (size_t i = 0; i < bytes; ++i) p[i] = BroadcastByte(rank, i);
  return p;
}

// Whether `p` holds rank `root`'s pattern.
bool HoldsBytesOf(const void* p, size_t bytes, int root) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < bytes; ++i) {
    if (b[i] != BroadcastByte(root, i)) {
      std::fprintf(stderr, "byte %zu: %d, want rank %d's %d\n", i, b[i], root,
                   BroadcastByte(root, i));
      return false;
    }
  }
  return true;
}

TEST_F(SimDeviceTest, ABroadcastOverTwoLocalGpusCopiesTheRootsBytesToBoth) {
  auto dev = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(dev.ok());
  auto group = (*dev)->CreateCollectives(Group(2, 0, {"SIM-GPU-0", "SIM-GPU-1"}, nullptr));
  ASSERT_TRUE(group.ok()) << group.status();
  for (const int root : {1, 0}) {
    void* a = FillBytes(**dev, "SIM-GPU-0", 4099, 0);
    void* b = FillBytes(**dev, "SIM-GPU-1", 4099, 1);
    ASSERT_TRUE((*group)->Broadcast({{0, a, 4099}, {1, b, 4099}}, root).ok());
    EXPECT_TRUE(HoldsBytesOf(a, 4099, root));
    EXPECT_TRUE(HoldsBytesOf(b, 4099, root));
  }
  // A root outside the group: refused, and the group is unusable after it.
  void* a = FillBytes(**dev, "SIM-GPU-0", 8, 0);
  void* b = FillBytes(**dev, "SIM-GPU-1", 8, 1);
  const absl::Status bad = (*group)->Broadcast({{0, a, 8}, {1, b, 8}}, 2);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("root 2"), std::string::npos) << bad;
}

// A simulated node in a child process broadcasting `bytes` from global
// rank `root` over its ranks first_rank.., `rounds` times.
int RunBroadcastNode(const FileStore& store, int nranks, int first_rank,
                     std::vector<DeviceId> devices, int root, size_t bytes, int rounds) {
  auto dev = SimDaemonDevice::Create(Options());
  if (!dev.ok()) return 1;
  auto group = (*dev)->CreateCollectives(Group(nranks, first_rank, devices, &store));
  CHILD_OK(group.status());
  for (int round = 0; round < rounds; ++round) {
    std::vector<DeviceBuffer> buffers;
    for (size_t j = 0; j < devices.size(); ++j) {
      buffers.push_back({static_cast<int>(j),
                         FillBytes(**dev, devices[j], bytes, first_rank + static_cast<int>(j)),
                         bytes});
    }
    CHILD_OK((*group)->Broadcast(buffers, root));
    for (const DeviceBuffer& b : buffers) {
      if (!HoldsBytesOf(b.data, bytes, root)) return 3;
    }
  }
  return 0;
}

TEST_F(SimDeviceTest, TwoNodesWithTwoGpusEachBroadcastTheRootsBytesToAllFourRanks) {
  FileStore store;
  auto peer = Process::Fork([&] {
    return RunBroadcastNode(store, 4, 2, {"SIM-GPU-0", "SIM-GPU-1"}, 3, 5000, 2);
  });
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(RunBroadcastNode(store, 4, 0, {"SIM-GPU-1", "SIM-GPU-0"}, 3, 5000, 2), 0);
  auto exit = peer->Wait(std::chrono::seconds(60)).ExitCode();
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 0);
}

TEST_F(SimDeviceTest, ATrainerCopiesDeviceMemoryInStreamOrderAndTellsItFromHostMemory) {
  auto trainer = SimTrainerDevice::Create(Options());
  ASSERT_TRUE(trainer.ok());
  auto src = (*trainer)->Alloc("SIM-GPU-1", 4099);
  auto dst = (*trainer)->Alloc("SIM-GPU-1", 4099);
  ASSERT_TRUE(src.ok() && dst.ok());
  auto stream = (*trainer)->CreateStream("SIM-GPU-1");
  ASSERT_TRUE(stream.ok());
  std::vector<unsigned char> pattern(4099);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = BroadcastByte(5, i);
  // The write and the copy on one stream: the copy sees the write.
  ASSERT_TRUE((*trainer)->SetDevice("SIM-GPU-1").ok());
  ASSERT_TRUE((*trainer)->WriteAsync(*src, pattern.data(), pattern.size(), *stream).ok());
  ASSERT_TRUE((*trainer)->CopyAsync(*dst, *src, pattern.size(), *stream).ok());
  ASSERT_TRUE((*trainer)->SynchronizeStream("SIM-GPU-1", *stream, absl::Seconds(10)).ok());
  EXPECT_TRUE(HoldsBytesOf(*dst, 4099, 5));
  auto where = (*trainer)->DeviceOfPointer(static_cast<unsigned char*>(*dst) + 17);
  ASSERT_TRUE(where.ok()) << where.status();
  EXPECT_EQ(*where, "SIM-GPU-1");
  EXPECT_EQ((*trainer)->DeviceOfPointer(pattern.data()).status().code(),
            absl::StatusCode::kNotFound);
}

// A simulated node in a child process: a daemon owning `devices` as ranks
// first_rank.., running `rounds` collectives over every dtype.
int RunNode(const FileStore& store, int nranks, int first_rank, std::vector<DeviceId> devices,
            int rounds) {
  auto dev = SimDaemonDevice::Create(Options());
  if (!dev.ok()) return 1;
  auto group = (*dev)->CreateCollectives(Group(nranks, first_rank, devices, &store));
  CHILD_OK(group.status());
  for (int round = 0; round < rounds; ++round) {
    for (DType t : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      std::vector<DeviceBuffer> buffers;
      for (size_t j = 0; j < devices.size(); ++j) {
        buffers.push_back({static_cast<int>(j),
                           Fill(**dev, devices[j], t, 257, first_rank + static_cast<int>(j)), 257});
      }
      CHILD_OK((*group)->AllreduceSum(buffers, t));
      for (const DeviceBuffer& b : buffers) {
        if (!HoldsSum(t, b.data, 257, nranks)) return 3;
      }
    }
  }
  return 0;
}

TEST_F(SimDeviceTest, TwoNodesWithOneRankEachSumAcrossProcesses) {
  FileStore store;
  auto peer = Process::Fork([&] { return RunNode(store, 2, 1, {"SIM-GPU-0"}, 3); });
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(RunNode(store, 2, 0, {"SIM-GPU-0"}, 3), 0);
  auto exit = peer->Wait(std::chrono::seconds(60)).ExitCode();
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 0);
}

TEST_F(SimDeviceTest, TwoNodesWithTwoGpusEachSumOverFourRanks) {
  FileStore store;
  auto peer = Process::Fork([&] { return RunNode(store, 4, 2, {"SIM-GPU-0", "SIM-GPU-1"}, 2); });
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(RunNode(store, 4, 0, {"SIM-GPU-1", "SIM-GPU-0"}, 2), 0);
  auto exit = peer->Wait(std::chrono::seconds(60)).ExitCode();
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 0);
}

TEST_F(SimDeviceTest, TwoNodesInOneProcessSumAcrossThreads) {
  // Two daemons' devices in one test binary (one thread each) meet through
  // the same rendezvous as separate processes would.
  FileStore store;
  int peer_result = -1;
  std::thread peer([&] { peer_result = RunNode(store, 2, 1, {"SIM-GPU-1"}, 1); });
  EXPECT_EQ(RunNode(store, 2, 0, {"SIM-GPU-0"}, 1), 0);
  peer.join();
  EXPECT_EQ(peer_result, 0);
}

// NCCL refuses two ranks of one communicator on one GPU of one host, on
// every rank; it tells hosts apart by NCCL_HOSTID, so the same two ranks
// on two "hosts" (the one-GPU test node's trick) are accepted.
TEST_F(SimDeviceTest, TwoRanksOnOneGpuOfOneHostAreRefusedOnEveryRank) {
  for (const bool same_host : {true, false}) {
    FileStore store;
    SimOptions mine = Options(), theirs = Options();
    mine.host = "node-a";
    theirs.host = same_host ? "node-a" : "node-b";
    absl::Status peer_status;
    std::thread peer([&] {
      auto dev = SimDaemonDevice::Create(theirs);
      peer_status = dev.ok()
                        ? (*dev)->CreateCollectives(Group(2, 1, {"SIM-GPU-0"}, &store)).status()
                        : dev.status();
    });
    auto dev = SimDaemonDevice::Create(mine);
    ASSERT_TRUE(dev.ok());
    const absl::Status st = (*dev)->CreateCollectives(Group(2, 0, {"SIM-GPU-0"}, &store)).status();
    peer.join();
    if (same_host) {
      for (const absl::Status& s : {st, peer_status}) {
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
        EXPECT_THAT(s.message(), HasSubstr("ranks 0 and 1 of one communicator are both on "
                                           "SIM-GPU-0 of host 'node-a'"));
      }
    } else {
      EXPECT_TRUE(st.ok()) << st;
      EXPECT_TRUE(peer_status.ok()) << peer_status;
    }
  }
}

TEST_F(SimDeviceTest, ARankThatNeverJoinsMakesCreationTimeOutNamingIt) {
  FileStore store;
  auto dev = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(dev.ok());
  auto group =
      (*dev)->CreateCollectives(Group(3, 0, {"SIM-GPU-0"}, &store, absl::Milliseconds(300)));
  EXPECT_EQ(group.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(group.status().message(), HasSubstr("ranks 1, 2"));
}

TEST_F(SimDeviceTest, ANodeThatSkipsACollectiveMakesItTimeOutNamingItsRank) {
  FileStore store;
  Channel to_child;
  auto peer = Process::Fork([&]() -> int {
    auto dev = SimDaemonDevice::Create(Options());
    if (!dev.ok()) return 1;
    auto group = (*dev)->CreateCollectives(Group(2, 1, {"SIM-GPU-0"}, &store));
    CHILD_OK(group.status());
    to_child.Receive(1, absl::Seconds(60));  // joined, then never launches anything
    return 0;
  });
  ASSERT_TRUE(peer.ok());
  auto dev = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(dev.ok());
  // Long enough for the peer to join even on a loaded machine (the group's
  // timeout bounds creation too); the skipped collective then takes it all.
  auto group = (*dev)->CreateCollectives(Group(2, 0, {"SIM-GPU-0"}, &store, absl::Seconds(3)));
  ASSERT_TRUE(group.ok()) << group.status();
  void* p = Fill(**dev, "SIM-GPU-0", DType::kFloat32, 8, 0);
  const absl::Status st = (*group)->AllreduceSum({{0, p, 8}}, DType::kFloat32);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(st.message(), HasSubstr("rank 1 "));
  to_child.Send("x");
  auto exit = peer->Wait(std::chrono::seconds(60)).ExitCode();
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 0);
}

TEST_F(SimDeviceTest, AbortEndsAnInFlightCollectiveAndEveryLaterOne) {
  FileStore store;
  Channel to_parent, to_child;
  auto peer = Process::Fork([&]() -> int {
    auto dev = SimDaemonDevice::Create(Options());
    if (!dev.ok()) return 1;
    auto group = (*dev)->CreateCollectives(Group(2, 1, {"SIM-GPU-0"}, &store));
    CHILD_OK(group.status());
    to_parent.Send("j");
    if (to_child.Receive(1, absl::Seconds(60)) != "c") return 2;
    // The peer aborted: this node's next collective fails as a peer failure.
    void* p = Fill(**dev, "SIM-GPU-0", DType::kFloat32, 8, 1);
    const absl::Status st = (*group)->AllreduceSum({{0, p, 8}}, DType::kFloat32);
    return st.code() == absl::StatusCode::kUnavailable ? 0 : 4;
  });
  ASSERT_TRUE(peer.ok());
  auto dev = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(dev.ok());
  // A long timeout: only Abort can end the collective before the test's.
  auto group = (*dev)->CreateCollectives(Group(2, 0, {"SIM-GPU-0"}, &store, absl::Seconds(600)));
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(to_parent.Receive(1), "j");
  void* p = Fill(**dev, "SIM-GPU-0", DType::kFloat32, 8, 0);
  // The collective is in flight once its input segment exists (it is
  // created first and removed on return): abort it then, not before.
  const std::string in_flight = absl::StrCat(kPrefix, ".", getpid(), ".c");
  std::thread aborter([&] {
    EXPECT_TRUE(WaitUntil(
        [&] {
          for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
            if (e.path().filename().string().rfind(in_flight, 0) == 0) return true;
          }
          return false;
        },
        absl::Seconds(20)));
    (*group)->Abort("test: scheduler shutting down");
  });
  const absl::Status st = (*group)->AllreduceSum({{0, p, 8}}, DType::kFloat32);
  aborter.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(st.message(), HasSubstr("scheduler shutting down"));
  EXPECT_EQ((*group)->AllreduceSum({{0, p, 8}}, DType::kFloat32).code(),
            absl::StatusCode::kAborted);
  ASSERT_TRUE(to_child.Send("c"));
  auto exit = peer->Wait(std::chrono::seconds(60)).ExitCode();
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 0);
}

TEST_F(SimDeviceTest, AbortBeforeACollectiveMakesItReturnAborted) {
  auto dev = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(dev.ok());
  auto group = (*dev)->CreateCollectives(Group(1, 0, {"SIM-GPU-0"}, nullptr));
  ASSERT_TRUE(group.ok());
  (*group)->Abort("generation replaced");
  void* p = Fill(**dev, "SIM-GPU-0", DType::kFloat32, 8, 0);
  const absl::Status st = (*group)->AllreduceSum({{0, p, 8}}, DType::kFloat32);
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(st.message(), HasSubstr("generation replaced"));
}

TEST_F(SimDeviceTest, APeerThatDiesMakesTheCollectiveUnavailableNamingIt) {
  FileStore store;
  Channel to_parent;
  auto peer = Process::Fork([&]() -> int {
    auto dev = SimDaemonDevice::Create(Options());
    if (!dev.ok()) return 1;
    auto group = (*dev)->CreateCollectives(Group(2, 1, {"SIM-GPU-0"}, &store));
    CHILD_OK(group.status());
    to_parent.Send("j");
    pause();  // until killed
    return 0;
  });
  ASSERT_TRUE(peer.ok());
  auto dev = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(dev.ok());
  auto group = (*dev)->CreateCollectives(Group(2, 0, {"SIM-GPU-0"}, &store, absl::Seconds(600)));
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(to_parent.Receive(1), "j");
  const pid_t pid = peer->pid();
  ASSERT_TRUE(peer->Kill().ok());
  void* p = Fill(**dev, "SIM-GPU-0", DType::kFloat32, 8, 0);
  const absl::Status st = (*group)->AllreduceSum({{0, p, 8}}, DType::kFloat32);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(st.message(), HasSubstr(absl::StrCat("rank 1 (process ", pid, ")")));
}

// CUDA: freeing exported memory before every importer closed its mapping
// is undefined behaviour (the importer keeps a dangling mapping). The
// simulation reports it, naming the importer, and tells a closed or dead
// importer (whose mappings went with its process) from a live one.
TEST_F(SimDeviceTest, FreeingMemoryALiveProcessStillMapsIsRefusedNamingIt) {
  Channel handles_to_child, to_parent, to_child;
  auto child = Process::Fork([&]() -> int {
    auto trainer = SimTrainerDevice::Create(Options());
    if (!trainer.ok()) return 1;
    std::vector<void*> bases;
    for (int i = 0; i < 3; ++i) {
      auto handle = IpcHandle::FromBytes(handles_to_child.ReceiveHandle());
      CHILD_OK(handle.status());
      auto base = (*trainer)->OpenMemory("SIM-GPU-0", *handle);
      CHILD_OK(base.status());
      bases.push_back(*base);
    }
    CHILD_OK((*trainer)->CloseMemory(bases[1]));  // closed before the free
    to_parent.Send("o");
    if (to_child.Receive(1, absl::Seconds(60)) != "q") return 2;
    return 0;  // exits still mapping bases[0] and bases[2]
  });
  ASSERT_TRUE(child.ok()) << child.status();
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  std::vector<void*> bases;
  for (int i = 0; i < 3; ++i) {
    auto base = (*daemon)->Alloc("SIM-GPU-0", 64);
    ASSERT_TRUE(base.ok()) << base.status();
    auto handle = (*daemon)->ExportMemory("SIM-GPU-0", *base);
    ASSERT_TRUE(handle.ok()) << handle.status();
    ASSERT_TRUE(handles_to_child.Send(handle->ToBytes()));
    bases.push_back(*base);
  }
  ASSERT_EQ(to_parent.Receive(1), "o");
  EXPECT_TRUE((*daemon)->Free("SIM-GPU-0", bases[1]).ok());
  const absl::Status mapped = (*daemon)->Free("SIM-GPU-0", bases[0]);
  EXPECT_EQ(mapped.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(mapped.message(),
              HasSubstr(absl::StrCat("freed while mapped by process ", child->pid())));
  ASSERT_TRUE(to_child.Send("q"));
  auto exit = child->Wait(std::chrono::seconds(30)).ExitCode();
  ASSERT_TRUE(exit.ok()) << exit.status();
  ASSERT_EQ(*exit, 0);
  EXPECT_TRUE((*daemon)->Free("SIM-GPU-0", bases[2]).ok());  // its importer is dead
}

// CUDA: using an imported event after its exporter destroyed it is
// undefined behaviour. The simulation answers an error naming the owner,
// never a stale kDone.
TEST_F(SimDeviceTest, QueryingAnEventItsOwnerDestroyedIsAnErrorNamingTheOwner) {
  Channel to_parent, to_child;
  auto child = Process::Fork([&]() -> int {
    auto trainer = SimTrainerDevice::Create(Options());
    if (!trainer.ok()) return 1;
    auto event = (*trainer)->CreateEvent("SIM-GPU-0");
    CHILD_OK(event.status());
    auto handle = (*trainer)->ExportEvent(*event);
    CHILD_OK(handle.status());
    to_parent.Send(handle->ToBytes());
    if (to_child.Receive(1, absl::Seconds(60)) != "d") return 2;
    (*trainer)->DestroyEvent(*event);
    to_parent.Send("k");
    if (to_child.Receive(1, absl::Seconds(60)) != "q") return 2;
    return 0;
  });
  ASSERT_TRUE(child.ok()) << child.status();
  auto daemon = SimDaemonDevice::Create(Options());
  ASSERT_TRUE(daemon.ok());
  auto handle = IpcHandle::FromBytes(to_parent.ReceiveHandle());
  ASSERT_TRUE(handle.ok()) << handle.status();
  auto event = (*daemon)->OpenEvent("SIM-GPU-0", *handle);
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_EQ(*(*daemon)->QueryEvent(*event), Completion::kDone);
  ASSERT_TRUE(to_child.Send("d"));
  ASSERT_EQ(to_parent.Receive(1), "k");
  auto after = (*daemon)->QueryEvent(*event);
  EXPECT_EQ(after.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(after.status().message(),
              HasSubstr(absl::StrCat("destroyed by its owner process ", child->pid())));
  (*daemon)->CloseEvent(*event);
  ASSERT_TRUE(to_child.Send("q"));
  auto exit = child->Wait(std::chrono::seconds(30)).ExitCode();
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 0);
}

// Memory management on a GPU while one of the daemon's collectives runs
// there can deadlock under CUDA + NCCL; the simulation refuses it, naming
// the call and the GPU. Other GPUs are not concerned.
TEST_F(SimDeviceTest, MemoryWorkOnAGpuWhereACollectiveRunsIsRefusedNamingIt) {
  FileStore store;
  SimOptions peer_host = Options();
  peer_host.host += "-peer";  // two nodes, one GPU each: two hosts
  auto dev = SimDaemonDevice::Create(Options());
  auto peer_dev = SimDaemonDevice::Create(peer_host);
  ASSERT_TRUE(dev.ok() && peer_dev.ok());
  absl::StatusOr<std::unique_ptr<CollectiveGroup>> peer_group;
  std::thread peer_init(
      [&] { peer_group = (*peer_dev)->CreateCollectives(Group(2, 1, {"SIM-GPU-0"}, &store)); });
  auto group = (*dev)->CreateCollectives(Group(2, 0, {"SIM-GPU-0"}, &store));
  peer_init.join();
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_TRUE(peer_group.ok()) << peer_group.status();
  void* mine = Fill(**dev, "SIM-GPU-0", DType::kFloat32, 8, 0);
  void* theirs = Fill(**peer_dev, "SIM-GPU-0", DType::kFloat32, 8, 1);

  absl::Status collective;
  std::thread running([&] {
    collective = (*group)->AllreduceSum({{0, mine, 8}}, DType::kFloat32);
  });
  // The collective waits for its peer; wait for the refusal that shows it
  // is in flight (until then an allocation is legitimate: free it again).
  absl::Status refused;
  std::vector<void*> later;  // allocated just before the collective started
  WaitUntil(
      [&] {
        absl::StatusOr<void*> p = (*dev)->Alloc("SIM-GPU-0", 64);
        if (!p.ok()) {
          refused = p.status();
        } else if (!(*dev)->Free("SIM-GPU-0", *p).ok()) {
          later.push_back(*p);
        }
        return !refused.ok();
      },
      absl::Seconds(20));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("cudaMalloc on SIM-GPU-0 while 1 collective(s) run"));
  EXPECT_TRUE((*dev)->Alloc("SIM-GPU-1", 64).ok());
  EXPECT_EQ((*dev)->Free("SIM-GPU-0", mine).code(), absl::StatusCode::kFailedPrecondition);

  EXPECT_TRUE((*peer_group)->AllreduceSum({{0, theirs, 8}}, DType::kFloat32).ok());
  running.join();
  EXPECT_TRUE(collective.ok()) << collective;
  EXPECT_TRUE(HoldsSum(DType::kFloat32, mine, 8, 2));
  EXPECT_TRUE((*dev)->Free("SIM-GPU-0", mine).ok());  // nothing runs there any more
  for (void* p : later) EXPECT_TRUE((*dev)->Free("SIM-GPU-0", p).ok());
}

}  // namespace
}  // namespace gradsync::gpu
