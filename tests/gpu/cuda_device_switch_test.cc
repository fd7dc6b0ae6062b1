// CudaDeviceSwitch (gpu/cuda_device_switch): which cudaSetDevice calls it
// makes, against a fake runtime that behaves as CUDA does per thread (no GPU
// needed); then the same on real GPUs, skipping without one.
#include "gpu/cuda_device_switch.h"

#include <cuda.h>

#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_presence.h"

namespace gradsync::gpu {
namespace {

// ------------------------------------------------------------ fake runtime

// One thread's view of the CUDA runtime: without a context cudaGetDevice
// answers 0; cudaSetDevice creates the GPU's primary context and binds it.
struct FakeRuntime {
  int device_count = 2;
  bool has_context = false;
  int current = 0;
  std::vector<int> set_calls;
  std::set<int> contexts;  // GPUs with a primary context
};
FakeRuntime fake;

cudaError_t FakeGetDevice(int* ordinal) {
  *ordinal = fake.current;
  return cudaSuccess;
}
cudaError_t FakeSetDevice(int ordinal) {
  fake.set_calls.push_back(ordinal);
  if (ordinal < 0 || ordinal >= fake.device_count) return cudaErrorInvalidDevice;
  fake.contexts.insert(ordinal);
  fake.has_context = true;
  fake.current = ordinal;
  return cudaSuccess;
}
bool FakeHasContext() { return fake.has_context; }

constexpr CudaDeviceOps kFakeOps = {FakeGetDevice, FakeSetDevice, FakeHasContext};

class CudaDeviceSwitchFakeTest : public ::testing::Test {
 protected:
  void SetUp() override { fake = FakeRuntime(); }
  // A thread that already works on `ordinal`.
  void HasChosen(int ordinal) {
    ASSERT_EQ(FakeSetDevice(ordinal), cudaSuccess);
    fake.set_calls.clear();
  }
};

TEST_F(CudaDeviceSwitchFakeTest, AThreadWithoutAContextGetsNothingRestored) {
  {
    CudaDeviceSwitch use(kFakeOps);
    EXPECT_EQ(use.Use(1), cudaSuccess);
  }
  // Putting back the 0 that cudaGetDevice answered would create a context
  // on GPU 0, a GPU this thread never used.
  EXPECT_EQ(fake.set_calls, std::vector<int>{1});
  EXPECT_EQ(fake.contexts, std::set<int>{1});
  EXPECT_EQ(fake.current, 1);
}

TEST_F(CudaDeviceSwitchFakeTest, UseZeroOnAThreadWithoutAContextStillSetsTheDevice) {
  {
    CudaDeviceSwitch use(kFakeOps);
    EXPECT_EQ(use.Use(0), cudaSuccess);
  }
  EXPECT_EQ(fake.set_calls, std::vector<int>{0});
  EXPECT_TRUE(fake.has_context);
}

TEST_F(CudaDeviceSwitchFakeTest, ThePreviousDeviceComesBackWhereTheThreadHadOne) {
  HasChosen(1);
  {
    CudaDeviceSwitch use(kFakeOps);
    EXPECT_EQ(use.Use(0), cudaSuccess);
    EXPECT_EQ(fake.current, 0);
  }
  EXPECT_EQ(fake.set_calls, (std::vector<int>{0, 1}));
  EXPECT_EQ(fake.current, 1);
}

TEST_F(CudaDeviceSwitchFakeTest, TheCurrentDeviceIsNotSetAgain) {
  HasChosen(1);
  {
    CudaDeviceSwitch use(kFakeOps);
    EXPECT_EQ(use.Use(1), cudaSuccess);
    EXPECT_EQ(use.Use(1), cudaSuccess);
  }
  EXPECT_TRUE(fake.set_calls.empty());
}

TEST_F(CudaDeviceSwitchFakeTest, UseZeroTwiceOnAThreadWithoutAContextSetsItOnce) {
  CudaDeviceSwitch use(kFakeOps);
  EXPECT_EQ(use.Use(0), cudaSuccess);
  EXPECT_EQ(use.Use(0), cudaSuccess);
  EXPECT_EQ(fake.set_calls, std::vector<int>{0});
}

TEST_F(CudaDeviceSwitchFakeTest, AFailedSwitchIsReturnedAndLeavesTheDevice) {
  HasChosen(1);
  {
    CudaDeviceSwitch use(kFakeOps);
    EXPECT_EQ(use.Use(7), cudaErrorInvalidDevice);
    EXPECT_EQ(fake.current, 1);
  }
  // Nothing changed, so nothing to put back.
  EXPECT_EQ(fake.set_calls, std::vector<int>{7});
}

// ------------------------------------------------------------- real GPUs

#define CUDA_OK(expr)                                                          \
  do {                                                                         \
    cudaError_t err_ = (expr);                                                 \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

// Whether GPU `ordinal`'s primary context exists (driver API, through the
// runtime's entry points); false when that cannot be told.
bool PrimaryContextActive(int ordinal) {
  using DeviceGetFn = CUresult (*)(CUdevice*, int);
  using GetStateFn = CUresult (*)(CUdevice, unsigned int*, int*);
  void* get = nullptr;
  void* state = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuDeviceGet", &get, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess ||
      cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &state, 12000,
                                       cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    return false;
  }
  CUdevice dev = 0;
  unsigned int flags = 0;
  int active = 0;
  return reinterpret_cast<DeviceGetFn>(get)(&dev, ordinal) == CUDA_SUCCESS &&
         reinterpret_cast<GetStateFn>(state)(dev, &flags, &active) == CUDA_SUCCESS && active != 0;
}

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

TEST(CudaDeviceSwitchGpuTest, UseZeroOnAFreshThreadBindsAContext) {
  GS_SKIP_UNLESS_GPU();
  bool before = true, after = false;
  cudaError_t used = cudaErrorUnknown;
  int device = -1;
  std::thread([&] {
    before = ThreadHasCudaContext();
    CudaDeviceSwitch use;
    used = use.Use(0);
    after = ThreadHasCudaContext();
    if (cudaGetDevice(&device) != cudaSuccess) device = -1;
  }).join();
  EXPECT_FALSE(before) << "a new thread has no current context";
  EXPECT_EQ(used, cudaSuccess) << cudaGetErrorString(used);
  EXPECT_TRUE(after) << "Use(0) was skipped as if GPU 0 were already current";
  EXPECT_EQ(device, 0);
}

TEST(CudaDeviceSwitchGpuTest, AFreshThreadKeepsItsGpuAndGetsNoContextOnGpu0) {
  GS_SKIP_UNLESS_GPU();
  GS_SKIP_UNLESS_GPUS(DeviceCount(), 2);
  const bool gpu0_before = PrimaryContextActive(0);
  int device = -1;
  bool has_context = false;
  std::thread([&] {
    {
      CudaDeviceSwitch use;
      ASSERT_EQ(use.Use(1), cudaSuccess);
    }
    has_context = ThreadHasCudaContext();
    if (cudaGetDevice(&device) != cudaSuccess) device = -1;
  }).join();
  EXPECT_TRUE(has_context);
  EXPECT_EQ(device, 1) << "the switch put back a device the thread never chose";
  // Only tellable where nothing else in this process used GPU 0 yet.
  if (!gpu0_before) EXPECT_FALSE(PrimaryContextActive(0)) << "a context was created on GPU 0";
}

TEST(CudaDeviceSwitchGpuTest, ThePreviousDeviceComesBack) {
  GS_SKIP_UNLESS_GPU();
  GS_SKIP_UNLESS_GPUS(DeviceCount(), 2);
  int inside = -1, after = -1;
  std::thread([&] {
    CUDA_OK(cudaSetDevice(1));
    {
      CudaDeviceSwitch use;
      ASSERT_EQ(use.Use(0), cudaSuccess);
      CUDA_OK(cudaGetDevice(&inside));
    }
    CUDA_OK(cudaGetDevice(&after));
  }).join();
  EXPECT_EQ(inside, 0);
  EXPECT_EQ(after, 1);
}

}  // namespace
}  // namespace gradsync::gpu
