// GpuSession::Open over the simulated device: what a trainer's user-pointer
// registration may ask the daemon to touch. The trainer is a forked process
// (a process cannot open its own IPC handles, in CUDA as in the simulation)
// that allocates, exports and waits until the test is done.
#include "daemon/engine/gpu_session.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_code.h"
#include "gpu/sim/sim_device.h"
#include "tests/testing/process.h"

namespace gradsync {
namespace {

using gpu::IpcHandle;
using testing::Process;

constexpr uint64_t kAllocationBytes = 4096;

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

gpu::SimOptions Options() {
  gpu::SimOptions o;
  o.prefix = "gssess";
  return o;
}

// A trainer process with one 4 KiB allocation and two readiness events on
// SIM-GPU-0, exported; it lives until the test closes `release`.
class Trainer {
 public:
  void Start() {
    int handles[2], release[2];
    ASSERT_EQ(pipe(handles), 0);
    ASSERT_EQ(pipe(release), 0);
    absl::StatusOr<Process> child = Process::Fork([&]() -> int {
      close(handles[0]);
      close(release[1]);
      auto dev = gpu::SimTrainerDevice::Create(Options());
      if (!dev.ok()) return 10;
      absl::StatusOr<void*> base = (*dev)->Alloc(gpu::SimDeviceId(0), kAllocationBytes);
      if (!base.ok()) return 11;
      absl::StatusOr<IpcHandle> mem = (*dev)->ExportMemory(*base);
      if (!mem.ok()) return 12;
      std::vector<IpcHandle> out = {*mem};
      for (int i = 0; i < 2; ++i) {
        absl::StatusOr<gpu::Event*> e = (*dev)->CreateEvent(gpu::SimDeviceId(0));
        if (!e.ok()) return 13;
        absl::StatusOr<IpcHandle> h = (*dev)->ExportEvent(*e);
        if (!h.ok()) return 14;
        out.push_back(*h);
      }
      for (const IpcHandle& h : out) {
        if (!WriteAll(handles[1], h.bytes.data(), IpcHandle::kSize)) return 15;
      }
      char c;
      while (read(release[0], &c, 1) > 0) {
      }
      return 0;
    });
    close(handles[1]);
    close(release[0]);
    release_ = release[1];
    ASSERT_TRUE(child.ok()) << child.status();
    process_ = std::move(*child);
    IpcHandle h[3];
    for (IpcHandle& x : h) ASSERT_TRUE(ReadAll(handles[0], x.bytes.data(), IpcHandle::kSize));
    close(handles[0]);
    memory_ = h[0];
    events_ = {h[1], h[2]};
  }
  ~Trainer() {
    if (release_ >= 0) close(release_);
    if (process_.started()) process_.Wait(std::chrono::seconds(20));
  }

  // The registration with these offsets of fc.weight and fc.bias.
  GpuTrainerSpec Spec(uint64_t weight_offset, uint64_t bias_offset) const {
    GpuTrainerSpec s;
    s.device = gpu::SimDeviceId(0);
    s.flat = false;
    s.allocations = {memory_};
    s.allocation = {0, 0};
    s.offset = {weight_offset, bias_offset};
    s.events = events_;
    return s;
  }

 private:
  Process process_;
  int release_ = -1;
  IpcHandle memory_;
  std::vector<IpcHandle> events_;
};

class GpuSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(trainer_.Start());  // forks before any device exists here
    auto dev = gpu::SimDaemonDevice::Create(Options());
    ASSERT_TRUE(dev.ok()) << dev.status();
    device_ = std::move(*dev);
  }

  absl::StatusOr<std::unique_ptr<GpuSession>> Open(const GpuTrainerSpec& spec) {
    GpuSession::WorldInput world;
    world.generation = 1;
    world.timeout = absl::Seconds(20);
    return GpuSession::Open(device_.get(), layout_, ipc::ArenaLayout{},
                            {{&spec, "rank 0 (local 0, pid 1)"}}, world);
  }

  const Layout layout_ = {{"fc.weight", DType::kFloat32, 256, 0},
                          {"fc.bias", DType::kFloat32, 4, 0}};

  Trainer trainer_;
  std::unique_ptr<gpu::SimDaemonDevice> device_;
};

TEST_F(GpuSessionTest, TensorsInsideTheirAllocationOpen) {
  const GpuTrainerSpec spec = trainer_.Spec(0, kAllocationBytes - 16);
  auto session = Open(spec);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_NE((*session)->tensor(0, 1), nullptr);
}

TEST_F(GpuSessionTest, ATensorReachingPastItsAllocationIsRefusedNamingIt) {
  const GpuTrainerSpec spec = trainer_.Spec(0, kAllocationBytes - 8);  // 16 bytes at 4088
  auto session = Open(spec);
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(CodeOf(session.status()), v1::INVALID_ARGUMENT) << session.status();
  EXPECT_NE(session.status().message().find("rank 0 (local 0, pid 1)'s tensor 1 'fc.bias'"),
            absl::string_view::npos)
      << session.status();
  EXPECT_NE(session.status().message().find("outside allocation 0 (4096 bytes mapped)"),
            absl::string_view::npos)
      << session.status();
}

TEST_F(GpuSessionTest, AnOffsetPastTheEndIsRefusedNamingTheTensor) {
  const GpuTrainerSpec spec = trainer_.Spec(uint64_t{1} << 40, 0);
  auto session = Open(spec);
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(CodeOf(session.status()), v1::INVALID_ARGUMENT) << session.status();
  EXPECT_NE(session.status().message().find("tensor 0 'fc.weight'"), absl::string_view::npos)
      << session.status();
}

TEST_F(GpuSessionTest, AnOffsetNotAlignedToTheDtypeIsRefusedNamingTheTensor) {
  const GpuTrainerSpec spec = trainer_.Spec(0, 1026);
  auto session = Open(spec);
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(CodeOf(session.status()), v1::INVALID_ARGUMENT) << session.status();
  EXPECT_NE(session.status().message().find("tensor 1 'fc.bias': offset 1026"),
            absl::string_view::npos)
      << session.status();
  EXPECT_NE(session.status().message().find("not aligned to its dtype's 4 bytes"),
            absl::string_view::npos)
      << session.status();
}

// A restarted trainer (another process, its own allocation and events)
// takes back local rank 0 of an elastic job whose trainer died: its
// predecessor's mapping and events are closed and its own opened in the
// same slot (GpuSession::ReplaceTrainer, called at an iteration boundary).
TEST_F(GpuSessionTest, ARestartedTrainersMemoryAndEventsReplaceItsPredecessorsInItsSlot) {
  const GpuTrainerSpec first = trainer_.Spec(0, kAllocationBytes - 16);
  auto session = Open(first);
  ASSERT_TRUE(session.ok()) << session.status();
  Trainer restarted;
  ASSERT_NO_FATAL_FAILURE(restarted.Start());
  const GpuTrainerSpec spec = restarted.Spec(16, 0);
  ASSERT_TRUE((*session)->CheckReplacement(0, spec, "rank 0 (local 0, pid 2)", 2).ok());
  const absl::Status st = (*session)->ReplaceTrainer(0, spec, "rank 0 (local 0, pid 2)", layout_);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ((*session)->events_opened(), 2u);
  EXPECT_EQ((*session)->trainer_name(0), "rank 0 (local 0, pid 2)");
  // Its own layout in its own allocation: fc.weight 16 bytes past fc.bias.
  const auto* weight = static_cast<const uint8_t*>((*session)->tensor(0, 0));
  const auto* bias = static_cast<const uint8_t*>((*session)->tensor(0, 1));
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(weight - bias, 16);
}

// One that registered a tensor outside its allocation is refused naming it
// at the boundary, and nothing of it stays open (it may free its memory
// once told): no event, no tensor.
TEST_F(GpuSessionTest, ARestartedTrainersTensorPastItsAllocationIsRefusedAndNothingStaysOpen) {
  const GpuTrainerSpec first = trainer_.Spec(0, kAllocationBytes - 16);
  auto session = Open(first);
  ASSERT_TRUE(session.ok()) << session.status();
  Trainer restarted;
  ASSERT_NO_FATAL_FAILURE(restarted.Start());
  const absl::Status st = (*session)->ReplaceTrainer(0, restarted.Spec(0, kAllocationBytes - 8),
                                                     "rank 0 (local 0, pid 2)", layout_);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(CodeOf(st), v1::INVALID_ARGUMENT) << st;
  EXPECT_NE(st.message().find("rank 0 (local 0, pid 2)'s tensor 1 'fc.bias'"),
            absl::string_view::npos)
      << st;
  EXPECT_EQ((*session)->events_opened(), 0u);
  EXPECT_EQ((*session)->tensor(0, 0), nullptr);
  EXPECT_EQ((*session)->tensor(0, 1), nullptr);
}

// Another GPU than its predecessor's, or the other registration mode, is
// refused when it registers, naming it and both.
TEST_F(GpuSessionTest, ARestartedTrainerOnAnotherGpuOrModeIsRefusedNamingIt) {
  const GpuTrainerSpec first = trainer_.Spec(0, kAllocationBytes - 16);
  auto session = Open(first);
  ASSERT_TRUE(session.ok()) << session.status();
  GpuTrainerSpec other_gpu = first;
  other_gpu.device = gpu::SimDeviceId(1);
  absl::Status st = (*session)->CheckReplacement(0, other_gpu, "rank 0 (local 0, pid 2)", 2);
  EXPECT_EQ(CodeOf(st), v1::INVALID_ARGUMENT) << st;
  EXPECT_NE(st.message().find(absl::StrCat(
                "rank 0 (local 0, pid 2) registered CUDA tensors on GPU ", gpu::SimDeviceId(1),
                ", but its local rank trained on "
                "GPU ",
                gpu::SimDeviceId(0))),
            absl::string_view::npos)
      << st;
  GpuTrainerSpec flat = first;
  flat.flat = true;
  st = (*session)->CheckReplacement(0, flat, "rank 0 (local 0, pid 2)", 2);
  EXPECT_EQ(CodeOf(st), v1::INVALID_ARGUMENT) << st;
  EXPECT_NE(st.message().find("rank 0 (local 0, pid 2) registered without cuda_ptr"),
            absl::string_view::npos)
      << st;
}

}  // namespace
}  // namespace gradsync
