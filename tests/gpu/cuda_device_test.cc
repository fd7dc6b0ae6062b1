// gpu::CudaTrainerDevice and gpu::CudaDaemonDevice.
//
// Without a GPU (CI, and every machine that builds gradsync): a missing or
// bogus driver is a clear error, never a crash; the UUID spelling; the
// local-sum launcher's argument checks. With a GPU: the test process is the
// daemon, cuda_device_helper the trainer (CUDA IPC needs two processes):
// memory export/open both ways, an event recorded there and polled here,
// FindAllocation of a sub-allocated pointer, SumAsync against a host
// reference in all four dtypes, and UUID <-> ordinal under
// CUDA_VISIBLE_DEVICES; with two GPUs, a trainer on the second GPU served
// from a daemon thread on the first. The GPU tests skip, saying why, when no
// device is usable (or, for the two-GPU ones, when only one is).
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/dtype.h"
#include "common/half.h"
#include "gpu/cuda_daemon_device.h"
#include "gpu/cuda_trainer_device.h"
#include "gpu/cuda_uuid.h"
#include "gpu/device.h"
#include "gpu/local_sum.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_presence.h"
#include "tests/testing/process.h"

namespace gradsync::gpu {
namespace {

using ::gradsync::testing::Process;
using ::gradsync::testing::SpawnOptions;

#define CUDA_OK(expr)                                                          \
  do {                                                                         \
    cudaError_t err_ = (expr);                                                 \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

// ---------------------------------------------------------------- no GPU needed

TEST(CudaUuidTest, SpelledLikeNvidiaSmi) {
  unsigned char bytes[16];
  for (int i = 0; i < 16; ++i) bytes[i] = static_cast<unsigned char>(i * 17);
  EXPECT_EQ(FormatGpuUuid(bytes), "GPU-00112233-4455-6677-8899-aabbccddeeff");
}

// The daemon matches a trainer's id against the ids it formats itself; a
// lower-cased copy of one of its own ids once matched nothing.
TEST(CudaUuidTest, SameGpuIgnoresCaseAndNothingElse) {
  EXPECT_TRUE(SameGpu("GPU-a32602a2-852c-b367-9014-46da471cc7ba",
                      "gpu-A32602A2-852C-B367-9014-46DA471CC7BA"));
  EXPECT_FALSE(SameGpu("GPU-a32602a2-852c-b367-9014-46da471cc7ba",
                       "GPU-a32602a2-852c-b367-9014-46da471cc7bb"));
  EXPECT_FALSE(SameGpu("GPU-a32602a2-852c-b367-9014-46da471cc7ba",
                       "GPU-a32602a2-852c-b367-9014-46da471cc7b"));
}

TEST(CudaTrainerDeviceTest, MissingDriverIsAClearError) {
  auto dev = NewCudaTrainerDevice("libgradsync-no-such-cuda-driver.so.1");
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(dev.status().message(),
                                "CUDA driver (libgradsync-no-such-cuda-driver.so.1) not found: "))
      << dev.status();
}

TEST(CudaTrainerDeviceTest, ALibraryThatIsNotTheDriverIsRefused) {
  auto dev = NewCudaTrainerDevice("libm.so.6");
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), absl::StatusCode::kFailedPrecondition) << dev.status();
  EXPECT_TRUE(absl::StrContains(dev.status().message(), "libm.so.6")) << dev.status();
}

// The toolkit's link stub exports every entry point but cuInit fails.
// Loaded in a child process: the stub's soname is libcuda.so.1, so once it
// is in a process the CUDA runtime's own dlopen("libcuda.so.1") finds it
// instead of the driver, and every later GPU test here would see no GPU.
TEST(CudaTrainerDeviceTest, TheToolkitStubIsNotADriver) {
  const char* home = getenv("CUDA_HOME");
  const std::string stub = absl::StrCat(home ? home : "/usr/local/cuda", "/lib64/stubs/libcuda.so");
  struct stat st;
  if (stat(stub.c_str(), &st) != 0) GTEST_SKIP() << "no CUDA stub library at " << stub;
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto dev = NewCudaTrainerDevice(stub);
        const bool refused_naming_stub =
            !dev.ok() &&
            (dev.status().code() == absl::StatusCode::kUnavailable ||
             dev.status().code() == absl::StatusCode::kFailedPrecondition) &&
            absl::StrContains(dev.status().message(), stub);
        fprintf(stderr, "status: %s\n",
                dev.ok() ? "OK" : std::string(dev.status().ToString()).c_str());
        std::_Exit(refused_naming_stub ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "status: (UNAVAILABLE|FAILED_PRECONDITION)");
}

// Whatever this machine has: a device, or an error saying why not.
TEST(CudaTrainerDeviceTest, DefaultDriverLoadsOrSaysWhy) {
  auto dev = NewCudaTrainerDevice();
  if (!dev.ok()) {
    EXPECT_TRUE(absl::StrContains(dev.status().message(), "CUDA driver (libcuda.so.1)"))
        << dev.status();
    EXPECT_TRUE(dev.status().code() == absl::StatusCode::kFailedPrecondition ||
                dev.status().code() == absl::StatusCode::kUnavailable)
        << dev.status();
  }
}

TEST(CudaDaemonDeviceTest, CreateFailsCleanlyWithoutAGpu) {
  auto dev = NewCudaDaemonDevice(nullptr);
  if (!dev.ok()) {
    EXPECT_TRUE(dev.status().code() == absl::StatusCode::kFailedPrecondition ||
                dev.status().code() == absl::StatusCode::kUnavailable)
        << dev.status();
    EXPECT_FALSE(dev.status().message().empty());
    return;
  }
  EXPECT_EQ((*dev)->name(), "cuda");
  EXPECT_EQ((*dev)->CheckDevice("GPU-not-a-gpu").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*dev)->CreateCollectives(CollectiveOptions{}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(LocalSumTest, LauncherRejectsBadArguments) {
  float x = 0;
  LocalSumArgs args;
  args.dst = &x;
  args.count = 1;
  args.nsrcs = 0;
  EXPECT_EQ(LaunchLocalSum(args, LocalSumType::kFloat32, 0, nullptr), cudaErrorInvalidValue);
  args.nsrcs = kMaxLocalSumSources + 1;
  EXPECT_EQ(LaunchLocalSum(args, LocalSumType::kFloat32, 0, nullptr), cudaErrorInvalidValue);
  args.nsrcs = 1;  // srcs[0] is null
  EXPECT_EQ(LaunchLocalSum(args, LocalSumType::kFloat32, 0, nullptr), cudaErrorInvalidValue);
}

TEST(CudaDaemonDeviceTest, PoisonedIsOnlySaidOfStickyErrors) {
  EXPECT_FALSE(IsCudaContextPoisoned(absl::OkStatus()));
  EXPECT_FALSE(IsCudaContextPoisoned(absl::InternalError("x")));
}

// ---------------------------------------------------------------- GPU

// The helper binary sits next to this test (bazel-bin, or a bundle).
std::string HelperPath() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "tests/gpu/cuda_device_helper";
  self[n] = '\0';
  std::string dir(self);
  return dir.substr(0, dir.rfind('/') + 1) + "cuda_device_helper";
}

// The helper with its stdin and stdout on pipes (Process::SendLine and
// ReadLine); nullptr if it cannot start.
std::unique_ptr<Process> StartHelper(const std::vector<std::string>& args,
                                     const std::string& visible_devices = "") {
  std::vector<std::string> argv = {HelperPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  SpawnOptions options;
  options.pipes = true;
  if (!visible_devices.empty()) options.env["CUDA_VISIBLE_DEVICES"] = visible_devices;
  auto helper = std::make_unique<Process>(Process::Spawn(argv, "", options));
  if (!helper->started()) return nullptr;
  return helper;
}

constexpr auto kHelperBound = std::chrono::seconds(60);

class CudaGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GS_SKIP_UNLESS_GPU();
    // A GPU is present from here on: a device that fails to open is a bug.
    auto dev = NewCudaDaemonDevice(nullptr);
    ASSERT_TRUE(dev.ok()) << "no usable CUDA device: " << dev.status();
    daemon_ = *std::move(dev);
    auto trainer = NewCudaTrainerDevice();
    ASSERT_TRUE(trainer.ok()) << "no usable CUDA driver: " << trainer.status();
    trainer_ = *std::move(trainer);
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    for (int i = 0; i < count; ++i) {
      cudaDeviceProp prop;
      ASSERT_EQ(cudaGetDeviceProperties(&prop, i), cudaSuccess);
      ids_.push_back(FormatGpuUuid(prop.uuid.bytes));
    }
    CUDA_OK(cudaSetDevice(0));
  }

  std::unique_ptr<DaemonDevice> daemon_;
  std::unique_ptr<TrainerDevice> trainer_;
  std::vector<DeviceId> ids_;  // by this process's ordinal
};

TEST_F(CudaGpuTest, IdsMatchBetweenDriverAndRuntime) {
  for (size_t i = 0; i < ids_.size(); ++i) {
    auto id = trainer_->IdOfOrdinal(static_cast<int>(i));
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(*id, ids_[i]);
    EXPECT_TRUE(daemon_->CheckDevice(ids_[i]).ok());
  }
  EXPECT_EQ(trainer_->IdOfOrdinal(static_cast<int>(ids_.size())).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A trainer under CUDA_VISIBLE_DEVICES calls its GPU 0; the id is the same.
TEST_F(CudaGpuTest, UuidOfOrdinalUnderCudaVisibleDevices) {
  const int last = static_cast<int>(ids_.size()) - 1;
  for (const std::string& visible : {ids_[last], std::to_string(last)}) {
    auto helper = StartHelper({"id"}, visible);
    ASSERT_NE(helper, nullptr);
    EXPECT_EQ(helper->ReadLine(), "ID " + ids_[last]) << "CUDA_VISIBLE_DEVICES=" << visible;
    EXPECT_EQ(helper->Wait(kHelperBound).ToString(), "exit 0");
  }
}

TEST_F(CudaGpuTest, FindAllocationOfASubAllocatedPointer) {
  void* base = nullptr;
  CUDA_OK(cudaMalloc(&base, 1 << 20));
  char* tensor = static_cast<char*>(base) + 4096 + 8;
  auto alloc = trainer_->FindAllocation(tensor);
  ASSERT_TRUE(alloc.ok()) << alloc.status();
  EXPECT_EQ(alloc->base, base);
  EXPECT_GE(alloc->size, size_t{1} << 20);
  EXPECT_EQ(alloc->device, ids_[0]);
  // Only the base can be exported.
  EXPECT_EQ(trainer_->ExportMemory(tensor).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(trainer_->ExportMemory(base).ok());

  std::vector<float> host(16);
  auto not_device = trainer_->FindAllocation(host.data());
  EXPECT_EQ(not_device.status().code(), absl::StatusCode::kInvalidArgument) << not_device.status();
  CUDA_OK(cudaFree(base));
  EXPECT_EQ(trainer_->FindAllocation(tensor).status().code(), absl::StatusCode::kInvalidArgument);
}

// Daemon-owned buffer: exported here, mapped and written by the trainer,
// whose event (recorded after the write) is polled here.
TEST_F(CudaGpuTest, DaemonBufferAndTrainerEventAcrossProcesses) {
  constexpr size_t kCount = 1 << 16;
  auto buffer = daemon_->Alloc(ids_[0], kCount * sizeof(float));
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::vector<float> host(kCount);
  CUDA_OK(cudaMemcpy(host.data(), *buffer, kCount * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(host[i], 0.0f) << "Alloc must zero, at " << i;
  for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<float>(i);
  CUDA_OK(cudaMemcpy(*buffer, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice));
  auto handle = daemon_->ExportMemory(ids_[0], *buffer);
  ASSERT_TRUE(handle.ok()) << handle.status();

  auto helper = StartHelper(
      {"trainer", ids_[0], absl::BytesToHexString(handle->ToBytes()), std::to_string(kCount)});
  ASSERT_NE(helper, nullptr);
  const std::string line = helper->ReadLine();
  ASSERT_TRUE(absl::StartsWith(line, "EVENT ")) << line;
  auto event_handle = IpcHandle::FromBytes(absl::HexStringToBytes(line.substr(6)));
  ASSERT_TRUE(event_handle.ok());
  auto event = daemon_->OpenEvent(ids_[0], *event_handle);
  ASSERT_TRUE(event.ok()) << event.status();

  // The helper's stream sleeps 1.5 s before its write: pending first.
  auto first = daemon_->QueryEvent(*event);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, Completion::kPending);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  absl::StatusOr<Completion> state = first;
  while (state.ok() && *state == Completion::kPending &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    state = daemon_->QueryEvent(*event);
  }
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(*state, Completion::kDone);
  // The event completes after the trainer's write: the data is there.
  CUDA_OK(cudaMemcpy(host.data(), *buffer, kCount * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(host[i], 2.0f * i + 1.0f) << "at " << i;

  daemon_->CloseEvent(*event);
  helper->SendLine("done");
  EXPECT_EQ(helper->ReadLine(), "OK");
  EXPECT_EQ(helper->Wait(kHelperBound).ToString(), "exit 0");
  EXPECT_TRUE(daemon_->Free(ids_[0], *buffer).ok());
  EXPECT_EQ(daemon_->Free(ids_[0], *buffer).code(), absl::StatusCode::kInvalidArgument);
}

// User-pointer mode: the trainer exports its allocation's base; the tensor
// is at an offset into it.
TEST_F(CudaGpuTest, TrainerAllocationOpenedByTheDaemon) {
  constexpr size_t kCount = 10000;
  constexpr size_t kOffset = 512 * 3;
  auto helper = StartHelper({"export", std::to_string(kCount), std::to_string(kOffset)});
  ASSERT_NE(helper, nullptr);
  const std::string line = helper->ReadLine();
  std::vector<std::string> parts = absl::StrSplit(line, ' ');
  ASSERT_EQ(parts.size(), 3u) << line;
  ASSERT_EQ(parts[0], "MEM") << line;
  EXPECT_EQ(parts[2], ids_[0]);
  auto handle = IpcHandle::FromBytes(absl::HexStringToBytes(parts[1]));
  ASSERT_TRUE(handle.ok());
  auto base = daemon_->OpenMemory(parts[2], *handle);
  ASSERT_TRUE(base.ok()) << base.status();
  auto again = daemon_->OpenMemory(parts[2], *handle);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *base);
  std::vector<float> host(kCount);
  CUDA_OK(cudaMemcpy(host.data(), static_cast<char*>(*base) + kOffset, kCount * sizeof(float),
                     cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(host[i], i + 0.5f) << "at " << i;
  EXPECT_TRUE(daemon_->CloseMemory(parts[2], *base).ok());
  EXPECT_TRUE(daemon_->CloseMemory(parts[2], *base).ok());
  EXPECT_EQ(daemon_->CloseMemory(parts[2], *base).code(), absl::StatusCode::kInvalidArgument);
  helper->SendLine("done");
  EXPECT_EQ(helper->ReadLine(), "OK");
  EXPECT_EQ(helper->Wait(kHelperBound).ToString(), "exit 0");
}

// Host model of an element type: values, and its rounding.
double RoundTo(DType t, double v) {
  switch (t) {
    case DType::kFloat32:
      return static_cast<float>(v);
    case DType::kFloat64:
      return v;
    case DType::kFloat16:
      return Float16ToFloat(FloatToFloat16(static_cast<float>(v)));
    case DType::kBFloat16:
      return BFloat16ToFloat(FloatToBFloat16(static_cast<float>(v)));
  }
  return v;
}

void Store(DType t, double v, void* p) {
  switch (t) {
    case DType::kFloat32: {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case DType::kFloat64:
      std::memcpy(p, &v, 8);
      break;
    case DType::kFloat16: {
      uint16_t h = FloatToFloat16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kBFloat16: {
      uint16_t h = FloatToBFloat16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
  }
}

double Load(DType t, const void* p) {
  switch (t) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kFloat64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return Float16ToFloat(h);
    }
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return BFloat16ToFloat(h);
    }
  }
  return 0;
}

// Relative error allowed against an exact (fp64) reference: the result is
// rounded once to the type (fp16/bf16 accumulate in fp32), plus fp32
// accumulation error for up to ~20 terms.
double Tolerance(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 1e-5;
    case DType::kFloat64:
      return 1e-13;
    case DType::kFloat16:
      return 1e-3;  // 2^-11 rounding, plus accumulation
    case DType::kBFloat16:
      return 8e-3;  // 2^-8 rounding, plus accumulation
  }
  return 0;
}

struct SumCase {
  DType dtype;
  size_t count;
  int nsrcs;
  size_t misalign;  // elements: defeats the 16-byte vector path
  bool in_place;    // dst == srcs[0]
};

void RunSum(DaemonDevice& dev, const DeviceId& gpu, const SumCase& c) {
  SCOPED_TRACE(absl::StrCat(DTypeName(c.dtype), " count=", c.count, " nsrcs=", c.nsrcs,
                            " misalign=", c.misalign, " in_place=", c.in_place));
  const size_t esize = DTypeSize(c.dtype);
  const size_t bytes = (c.count + c.misalign) * esize;
  const double scale = 1.0 / 3.0;  // fp64 is scaled in fp64, the others in fp32
  std::mt19937 rng(static_cast<unsigned>(c.count * 31 + c.nsrcs));
  std::uniform_real_distribution<double> uniform(-4.0, 4.0);

  std::vector<void*> bufs;
  std::vector<std::vector<char>> host(c.nsrcs, std::vector<char>(c.count * esize));
  std::vector<double> expect(c.count, 0.0);
  std::vector<const void*> srcs;
  for (int k = 0; k < c.nsrcs; ++k) {
    auto b = dev.Alloc(gpu, bytes);
    ASSERT_TRUE(b.ok()) << b.status();
    bufs.push_back(*b);
    for (size_t i = 0; i < c.count; ++i) {
      double v = RoundTo(c.dtype, uniform(rng));
      Store(c.dtype, v, host[k].data() + i * esize);
      expect[i] += v;
    }
    char* data = static_cast<char*>(*b) + c.misalign * esize;
    CUDA_OK(cudaMemcpy(data, host[k].data(), c.count * esize, cudaMemcpyHostToDevice));
    srcs.push_back(data);
  }
  void* dst = const_cast<void*>(srcs[0]);
  if (!c.in_place) {
    auto b = dev.Alloc(gpu, bytes);
    ASSERT_TRUE(b.ok()) << b.status();
    bufs.push_back(*b);
    dst = static_cast<char*>(*b) + c.misalign * esize;
  }
  auto stream = dev.CreateStream(gpu);
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE(dev.SumAsync(dst, srcs, c.count, c.dtype, scale, {}, *stream).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  absl::StatusOr<Completion> state = dev.QueryStream(*stream);
  while (state.ok() && *state == Completion::kPending &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    state = dev.QueryStream(*stream);
  }
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(*state, Completion::kDone);

  std::vector<char> out(c.count * esize);
  CUDA_OK(cudaMemcpy(out.data(), dst, out.size(), cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t i = 0; i < c.count; ++i) {
    const double want = expect[i] * scale;
    const double got = Load(c.dtype, out.data() + i * esize);
    // Absolute floor: terms of size 4 cancelling to ~0 keep their error.
    const double tol = Tolerance(c.dtype) * (std::fabs(want) + 4.0 * c.nsrcs * scale);
    if (!(std::fabs(got - want) <= tol) && bad++ < 5) {
      ADD_FAILURE() << "element " << i << ": got " << got << ", want " << want;
    }
  }
  EXPECT_EQ(bad, 0u);
  dev.DestroyStream(*stream);
  for (void* b : bufs) EXPECT_TRUE(dev.Free(gpu, b).ok());
}

TEST_F(CudaGpuTest, SumAsyncMatchesHostReference) {
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    RunSum(*daemon_, ids_[0], {t, (1 << 20) + 7, 3, 0, false});  // vector path + tail
    RunSum(*daemon_, ids_[0], {t, 100003, 2, 1, false});         // scalar path
    RunSum(*daemon_, ids_[0], {t, 4099, 4, 0, true});            // dst == srcs[0]
    RunSum(*daemon_, ids_[0], {t, 1, 1, 0, false});              // one element, one source
  }
  // More sources than one launch takes: chained launches.
  RunSum(*daemon_, ids_[0], {DType::kFloat32, 65536 + 5, kMaxLocalSumSources + 4, 0, true});
}

// Polls `stream` until its work is done (bounded).
void WaitDone(DaemonDevice& dev, Stream* stream) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  absl::StatusOr<Completion> state = dev.QueryStream(stream);
  while (state.ok() && *state == Completion::kPending &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    state = dev.QueryStream(stream);
  }
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(*state, Completion::kDone);
}

// The kernel's non-finite check: a NaN in one source and an Inf at the last
// element of srcs[0] (dst) set the flag to the launch's token read back
// through pinned memory, and dst keeps srcs[0]'s values there; finite sums
// leave the flag alone. Vector and scalar paths, chained launches.
void RunCheckedSum(DaemonDevice& dev, const DeviceId& gpu, DType t, size_t count, int nsrcs,
                   size_t misalign) {
  SCOPED_TRACE(
      absl::StrCat(DTypeName(t), " count=", count, " nsrcs=", nsrcs, " misalign=", misalign));
  const size_t esize = DTypeSize(t);
  std::vector<void*> bufs;
  std::vector<const void*> srcs;
  std::vector<char> one(count * esize);
  for (size_t i = 0; i < count; ++i) Store(t, 1.0, one.data() + i * esize);
  for (int k = 0; k < nsrcs; ++k) {
    auto b = dev.Alloc(gpu, (count + misalign) * esize);
    ASSERT_TRUE(b.ok()) << b.status();
    bufs.push_back(*b);
    char* data = static_cast<char*>(*b) + misalign * esize;
    CUDA_OK(cudaMemcpy(data, one.data(), one.size(), cudaMemcpyHostToDevice));
    srcs.push_back(data);
  }
  auto flag = dev.Alloc(gpu, sizeof(uint32_t));
  auto host = dev.AllocHost(gpu, sizeof(uint32_t));
  auto stream = dev.CreateStream(gpu);
  ASSERT_TRUE(flag.ok() && host.ok() && stream.ok());
  auto* f = static_cast<uint32_t*>(*flag);
  auto* seen = static_cast<uint32_t*>(*host);
  void* dst = const_cast<void*>(srcs[0]);
  ASSERT_TRUE(dev.SumAsync(dst, srcs, count, t, 1.0, {f, 5}, *stream).ok());
  ASSERT_TRUE(dev.CopyToHostAsync(seen, f, sizeof(uint32_t), *stream).ok());
  ASSERT_NO_FATAL_FAILURE(WaitDone(dev, *stream));
  EXPECT_EQ(*seen, 0u);

  const size_t nan_at = count / 2;
  std::vector<char> v(esize);
  Store(t, std::nan(""), v.data());
  CUDA_OK(cudaMemcpy(const_cast<char*>(static_cast<const char*>(srcs[nsrcs - 1])) + nan_at * esize,
                     v.data(), esize, cudaMemcpyHostToDevice));
  Store(t, std::numeric_limits<double>::infinity(), v.data());
  CUDA_OK(cudaMemcpy(static_cast<char*>(dst) + (count - 1) * esize, v.data(), esize,
                     cudaMemcpyHostToDevice));
  ASSERT_TRUE(dev.SumAsync(dst, srcs, count, t, 0.5, {f, 6}, *stream).ok());
  ASSERT_TRUE(dev.CopyToHostAsync(seen, f, sizeof(uint32_t), *stream).ok());
  ASSERT_NO_FATAL_FAILURE(WaitDone(dev, *stream));
  EXPECT_EQ(*seen, 6u);
  std::vector<char> out(count * esize);
  CUDA_OK(cudaMemcpy(out.data(), dst, out.size(), cudaMemcpyDeviceToHost));
  const double sum = static_cast<double>(nsrcs);  // srcs[0] after the first sum
  // Chained launches: the NaN's launch keeps the running sum of the first.
  const double kept = nsrcs <= kMaxLocalSumSources ? sum : sum + (kMaxLocalSumSources - 1);
  EXPECT_EQ(Load(t, out.data() + nan_at * esize), kept) << "srcs[0]'s value kept";
  EXPECT_EQ(Load(t, out.data() + (count - 1) * esize), std::numeric_limits<double>::infinity());
  if (nan_at > 0) {
    EXPECT_EQ(Load(t, out.data()), 0.5 * (sum + nsrcs - 1));
  }
  dev.DestroyStream(*stream);
  EXPECT_TRUE(dev.FreeHost(gpu, *host).ok());
  EXPECT_TRUE(dev.Free(gpu, *flag).ok());
  for (void* b : bufs) EXPECT_TRUE(dev.Free(gpu, b).ok());
}

TEST_F(CudaGpuTest, SumAsyncFlagsNonFiniteResultsAndKeepsTheFirstSource) {
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    RunCheckedSum(*daemon_, ids_[0], t, (1 << 16) + 3, 2, 0);  // vector path + tail
    RunCheckedSum(*daemon_, ids_[0], t, 4097, 3, 1);           // scalar path
  }
  RunCheckedSum(*daemon_, ids_[0], DType::kFloat32, 1029, kMaxLocalSumSources + 3, 0);
}

TEST_F(CudaGpuTest, CopyAsyncAndBadArguments) {
  auto a = daemon_->Alloc(ids_[0], 4096);
  auto b = daemon_->Alloc(ids_[0], 4096);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<unsigned char> host(4096);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<unsigned char>(i * 7);
  CUDA_OK(cudaMemcpy(*a, host.data(), host.size(), cudaMemcpyHostToDevice));
  auto stream = daemon_->CreateStream(ids_[0]);
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE(daemon_->CopyAsync(*b, *a, host.size(), *stream).ok());
  absl::StatusOr<Completion> state;
  do {
    state = daemon_->QueryStream(*stream);
  } while (state.ok() && *state == Completion::kPending);
  ASSERT_TRUE(state.ok()) << state.status();
  std::vector<unsigned char> out(host.size());
  CUDA_OK(cudaMemcpy(out.data(), *b, out.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(out, host);

  EXPECT_EQ(daemon_->Alloc("GPU-00000000-0000-0000-0000-000000000000", 16).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(daemon_->SumAsync(*b, {}, 16, DType::kFloat32, 1.0f, {}, *stream).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(daemon_->ExportMemory(ids_[0], static_cast<char*>(*a) + 16).status().code(),
            absl::StatusCode::kInvalidArgument);
  daemon_->DestroyStream(*stream);
  EXPECT_TRUE(daemon_->Free(ids_[0], *a).ok());
  EXPECT_TRUE(daemon_->Free(ids_[0], *b).ok());
}

// The GPU a pointer's memory is on, as the runtime knows it (-1: not device
// memory).
int DeviceOfPointer(const void* p) {
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess || attr.type != cudaMemoryTypeDevice) {
    return -1;
  }
  return attr.device;
}

int CurrentDevice() {
  int device = -1;
  return cudaGetDevice(&device) == cudaSuccess ? device : -1;
}

// Two GPUs: what the daemon does for a trainer on GPU 1 (its buffer, the
// trainer's IPC mapping and event, the local-sum kernel on a stream of GPU
// 1) from a thread whose current device is GPU 0. Every call must select
// GPU 1 itself (a kernel on another device's stream, or an event opened in
// the wrong context, fails) and leave GPU 0 current.
TEST_F(CudaGpuTest, TrainerOnTheSecondGpuWhileTheDaemonThreadIsOnTheFirst) {
  GS_SKIP_UNLESS_GPUS(ids_.size(), 2u);
  constexpr size_t kCount = 1 << 16;
  const DeviceId& gpu1 = ids_[1];
  ASSERT_EQ(CurrentDevice(), 0);
  auto buffer = daemon_->Alloc(gpu1, kCount * sizeof(float));
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(DeviceOfPointer(*buffer), 1) << "Alloc for GPU 1 allocated elsewhere";
  std::vector<float> host(kCount);
  for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<float>(i);
  CUDA_OK(cudaMemcpy(*buffer, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice));
  auto handle = daemon_->ExportMemory(gpu1, *buffer);
  ASSERT_TRUE(handle.ok()) << handle.status();

  auto helper = StartHelper(
      {"trainer", gpu1, absl::BytesToHexString(handle->ToBytes()), std::to_string(kCount)});
  ASSERT_NE(helper, nullptr);
  const std::string line = helper->ReadLine();
  ASSERT_TRUE(absl::StartsWith(line, "EVENT ")) << line;
  auto event_handle = IpcHandle::FromBytes(absl::HexStringToBytes(line.substr(6)));
  ASSERT_TRUE(event_handle.ok());
  auto event = daemon_->OpenEvent(gpu1, *event_handle);
  ASSERT_TRUE(event.ok()) << event.status();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  absl::StatusOr<Completion> state = daemon_->QueryEvent(*event);
  while (state.ok() && *state == Completion::kPending &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    state = daemon_->QueryEvent(*event);
  }
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(*state, Completion::kDone);
  EXPECT_EQ(CurrentDevice(), 0) << "a daemon call left GPU 1 current";

  // The trainer wrote 2i+1; the kernel on GPU 1 doubles it.
  auto stream = daemon_->CreateStream(gpu1);
  ASSERT_TRUE(stream.ok()) << stream.status();
  const absl::Status sum =
      daemon_->SumAsync(*buffer, {*buffer, *buffer}, kCount, DType::kFloat32, 1.0, {}, *stream);
  ASSERT_TRUE(sum.ok()) << sum;
  ASSERT_NO_FATAL_FAILURE(WaitDone(*daemon_, *stream));
  EXPECT_EQ(CurrentDevice(), 0) << "a daemon call left GPU 1 current";
  CUDA_OK(cudaMemcpy(host.data(), *buffer, kCount * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(host[i], 2.0f * (2.0f * i + 1.0f)) << "at " << i;

  daemon_->DestroyStream(*stream);
  daemon_->CloseEvent(*event);
  helper->SendLine("done");
  EXPECT_EQ(helper->ReadLine(), "OK");
  EXPECT_EQ(helper->Wait(kHelperBound).ToString(), "exit 0");
  EXPECT_TRUE(daemon_->Free(gpu1, *buffer).ok());
  EXPECT_EQ(CurrentDevice(), 0);
}

// Two GPUs: a daemon call for GPU 1 on a thread that never chose a device
// leaves GPU 1 current there (nothing is "restored" to the GPU 0 that
// cudaGetDevice answered before), and a thread that had chosen GPU 0 gets
// it back.
TEST_F(CudaGpuTest, ACallForTheSecondGpuRestoresOnlyAChosenDevice) {
  GS_SKIP_UNLESS_GPUS(ids_.size(), 2u);
  int fresh = -1, chosen = -1;
  std::thread([&] {
    auto stream = daemon_->CreateStream(ids_[1]);
    ASSERT_TRUE(stream.ok()) << stream.status();
    fresh = CurrentDevice();
    daemon_->DestroyStream(*stream);
  }).join();
  std::thread([&] {
    CUDA_OK(cudaSetDevice(0));
    auto stream = daemon_->CreateStream(ids_[1]);
    ASSERT_TRUE(stream.ok()) << stream.status();
    chosen = CurrentDevice();
    daemon_->DestroyStream(*stream);
  }).join();
  EXPECT_EQ(fresh, 1);
  EXPECT_EQ(chosen, 0);
}

}  // namespace
}  // namespace gradsync::gpu
