// CudaTrainerDevice against a fake driver (fake_cuda_driver.cc), so its
// loading, context handling and bookkeeping run on machines without a GPU:
// every entry point found through cuGetProcAddress_v2 at our headers' ABI,
// the primary context pushed for each call that needs one and the caller's
// context left as found, the flags CUDA IPC needs, reference-counted opens,
// FindAllocation of a sub-allocated pointer. What the fake cannot tell —
// the real driver's behaviour — is cuda_device_test's, on a GPU.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cuda.h>

#include "absl/strings/match.h"
#include "gpu/cuda_trainer_device.h"
#include "gpu/device.h"
#include "gtest/gtest.h"
#include "tests/gpu/fake_cuda_driver.h"

namespace gradsync::gpu {
namespace {

constexpr char kFakeId[] = "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf";

// The fake driver sits next to this test binary.
std::string FakeDriverPath() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "tests/gpu/libfake_cuda_driver.so";
  self[n] = '\0';
  std::string dir(self);
  return dir.substr(0, dir.rfind('/') + 1) + "libfake_cuda_driver.so";
}

class FakeDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The same handle the device gets: dlopen of one path is one library.
    lib_ = dlopen(FakeDriverPath().c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(lib_, nullptr) << dlerror();
    state_fn_ = reinterpret_cast<decltype(&fake_cuda_state)>(dlsym(lib_, "fake_cuda_state"));
    reset_ = reinterpret_cast<decltype(&fake_cuda_reset)>(dlsym(lib_, "fake_cuda_reset"));
    add_ = reinterpret_cast<decltype(&fake_cuda_add_allocation)>(dlsym(lib_, "fake_cuda_add_allocation"));
    current_ = reinterpret_cast<decltype(&fake_cuda_current)>(dlsym(lib_, "fake_cuda_current"));
    depth_ = reinterpret_cast<decltype(&fake_cuda_depth)>(dlsym(lib_, "fake_cuda_depth"));
    push_ = reinterpret_cast<decltype(&fake_cuda_push)>(dlsym(lib_, "fake_cuda_push"));
    pop_ = reinterpret_cast<decltype(&fake_cuda_pop)>(dlsym(lib_, "fake_cuda_pop"));
    ASSERT_TRUE(state_fn_ && reset_ && add_ && current_ && depth_ && push_ && pop_);
    reset_();
  }
  void TearDown() override {
    unsetenv("FAKE_CUDA_INIT_ERROR");
    unsetenv("FAKE_CUDA_HIDE");
    if (lib_ != nullptr) dlclose(lib_);
  }

  std::unique_ptr<TrainerDevice> Load() {
    auto dev = NewCudaTrainerDevice(FakeDriverPath());
    EXPECT_TRUE(dev.ok()) << dev.status();
    return dev.ok() ? *std::move(dev) : nullptr;
  }

  FakeCudaState& state() { return *state_fn_(); }

  void* lib_ = nullptr;
  decltype(&fake_cuda_state) state_fn_ = nullptr;
  decltype(&fake_cuda_reset) reset_ = nullptr;
  decltype(&fake_cuda_add_allocation) add_ = nullptr;
  decltype(&fake_cuda_current) current_ = nullptr;
  decltype(&fake_cuda_depth) depth_ = nullptr;
  decltype(&fake_cuda_push) push_ = nullptr;
  decltype(&fake_cuda_pop) pop_ = nullptr;
};

TEST_F(FakeDriverTest, ResolvesEverythingAtOurHeadersAbi) {
  auto dev = Load();
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(state().init_calls, 1);
  EXPECT_EQ(state().min_requested_version, CUDA_VERSION);
  EXPECT_EQ(state().max_requested_version, CUDA_VERSION);
  EXPECT_EQ(state().requested_flags_or, static_cast<uint64_t>(CU_GET_PROC_ADDRESS_LEGACY_STREAM));
  EXPECT_EQ(state().resolved, 18);
}

TEST_F(FakeDriverTest, MissingEntryPointIsNamed) {
  setenv("FAKE_CUDA_HIDE", "cuIpcOpenMemHandle", 1);
  auto dev = NewCudaTrainerDevice(FakeDriverPath());
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(dev.status().message(), "lacks cuIpcOpenMemHandle")) << dev.status();
}

TEST_F(FakeDriverTest, InitFailureIsUnavailable) {
  setenv("FAKE_CUDA_INIT_ERROR", "1", 1);
  auto dev = NewCudaTrainerDevice(FakeDriverPath());
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(dev.status().message(), "cuInit")) << dev.status();
}

TEST_F(FakeDriverTest, IdsAndOrdinals) {
  auto dev = Load();
  ASSERT_NE(dev, nullptr);
  auto id = dev->IdOfOrdinal(0);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, kFakeId);
  EXPECT_EQ(dev->IdOfOrdinal(1).status().code(), absl::StatusCode::kInvalidArgument);
  auto unknown = dev->CreateEvent("GPU-00000000-0000-0000-0000-000000000000");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(unknown.status().message(), "CUDA_VISIBLE_DEVICES")) << unknown.status();
}

TEST_F(FakeDriverTest, FindAllocationOfASubAllocatedPointer) {
  auto dev = Load();
  ASSERT_NE(dev, nullptr);
  std::vector<char> memory(1 << 16);
  std::vector<char> vmm(4096);
  add_(memory.data(), memory.size(), 1);
  add_(vmm.data(), vmm.size(), 0);

  auto alloc = dev->FindAllocation(memory.data() + 4104);
  ASSERT_TRUE(alloc.ok()) << alloc.status();
  EXPECT_EQ(alloc->base, memory.data());
  EXPECT_EQ(alloc->size, memory.size());
  EXPECT_EQ(alloc->device, kFakeId);

  int host = 0;
  EXPECT_EQ(dev->FindAllocation(&host).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev->FindAllocation(nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  auto not_ipc = dev->FindAllocation(vmm.data());
  EXPECT_EQ(not_ipc.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(not_ipc.status().message(), "expandable_segments")) << not_ipc.status();

  EXPECT_EQ(dev->ExportMemory(memory.data() + 8).status().code(), absl::StatusCode::kInvalidArgument);
  auto handle = dev->ExportMemory(memory.data());
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(std::memcmp(handle->bytes.data(), "fakemem", 7), 0);
  EXPECT_EQ(state().context_errors, 0);
  EXPECT_EQ(depth_(), 0);
}

TEST_F(FakeDriverTest, OpensAreReferenceCountedAndLazyPeer) {
  auto dev = Load();
  ASSERT_NE(dev, nullptr);
  std::vector<char> memory(4096);
  add_(memory.data(), memory.size(), 1);
  auto handle = dev->ExportMemory(memory.data());
  ASSERT_TRUE(handle.ok()) << handle.status();

  auto a = dev->OpenMemory(kFakeId, *handle);
  auto b = dev->OpenMemory(kFakeId, *handle);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(state().ipc_opens, 1);
  EXPECT_EQ(state().last_open_flags, static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  EXPECT_TRUE(dev->CloseMemory(*a).ok());
  EXPECT_EQ(state().ipc_closes, 0);
  EXPECT_TRUE(dev->CloseMemory(*a).ok());
  EXPECT_EQ(state().ipc_closes, 1);
  EXPECT_EQ(dev->CloseMemory(*a).code(), absl::StatusCode::kInvalidArgument);

  // Left open: the destructor unmaps it.
  ASSERT_TRUE(dev->OpenMemory(kFakeId, *handle).ok());
  dev.reset();
  EXPECT_EQ(state().ipc_closes, 2);
  EXPECT_EQ(state().context_errors, 0);
}

TEST_F(FakeDriverTest, EventsAreInterprocessAndRecordOnTheLegacyStream) {
  auto dev = Load();
  ASSERT_NE(dev, nullptr);
  auto event = dev->CreateEvent(kFakeId);
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_EQ(state().last_event_flags, static_cast<unsigned>(CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
  auto handle = dev->ExportEvent(*event);
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(std::memcmp(handle->bytes.data(), "fakeevt", 7), 0);

  ASSERT_TRUE(dev->RecordEvent(*event, nullptr).ok());
  EXPECT_EQ(state().last_stream, static_cast<void*>(CU_STREAM_LEGACY));
  void* torch_stream = reinterpret_cast<void*>(uintptr_t{0x7f00});
  ASSERT_TRUE(dev->RecordEvent(*event, dev->WrapStream(torch_stream)).ok());
  EXPECT_EQ(state().last_stream, torch_stream);

  dev->DestroyEvent(*event);
  EXPECT_EQ(state().live_events, 0);
  // Left alive: the destructor destroys it.
  ASSERT_TRUE(dev->CreateEvent(kFakeId).ok());
  EXPECT_EQ(state().live_events, 1);
  dev.reset();
  EXPECT_EQ(state().live_events, 0);
  EXPECT_EQ(state().context_errors, 0);
}

TEST_F(FakeDriverTest, MemsetZeroesOnTheGivenStream) {
  auto dev = Load();
  ASSERT_NE(dev, nullptr);
  std::vector<unsigned char> memory(256, 0xff);
  add_(memory.data(), memory.size(), 1);
  ASSERT_TRUE(dev->MemsetAsync(memory.data() + 16, 32, nullptr).ok());
  EXPECT_EQ(state().last_stream, static_cast<void*>(CU_STREAM_LEGACY));
  for (size_t i = 0; i < memory.size(); ++i) {
    EXPECT_EQ(memory[i], (i >= 16 && i < 48) ? 0 : 0xff) << i;
  }
  int host = 1;
  EXPECT_EQ(dev->MemsetAsync(&host, sizeof(host), nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(host, 1);
}

// A trainer's own current context (PyTorch's) is the same before and after.
TEST_F(FakeDriverTest, CallersContextLeftAsFound) {
  auto dev = Load();
  ASSERT_NE(dev, nullptr);
  std::vector<char> memory(4096);
  add_(memory.data(), memory.size(), 1);
  void* mine = reinterpret_cast<void*>(uintptr_t{0x2000});
  push_(mine);
  ASSERT_TRUE(dev->FindAllocation(memory.data() + 1).ok());
  auto event = dev->CreateEvent(kFakeId);
  ASSERT_TRUE(event.ok());
  ASSERT_TRUE(dev->RecordEvent(*event, nullptr).ok());
  ASSERT_TRUE(dev->ExportMemory(memory.data()).ok());
  ASSERT_TRUE(dev->MemsetAsync(memory.data(), 8, nullptr).ok());
  dev->DestroyEvent(*event);
  EXPECT_EQ(current_(), mine);
  EXPECT_EQ(depth_(), 1);
  pop_();
  EXPECT_EQ(state().context_errors, 0);
}

TEST_F(FakeDriverTest, PrimaryContextRetainedOnceAndReleased) {
  auto dev = Load();
  ASSERT_NE(dev, nullptr);
  ASSERT_TRUE(dev->CreateEvent(kFakeId).ok());
  ASSERT_TRUE(dev->CreateEvent(kFakeId).ok());
  EXPECT_EQ(state().primary_retains, 1);
  dev.reset();
  EXPECT_EQ(state().primary_retains, 0);
}

}  // namespace
}  // namespace gradsync::gpu
