// The "trainer" of cuda_device_test: a separate process (CUDA IPC handles
// cannot be opened by the process that exported them) driving
// gpu::CudaTrainerDevice the way libgradsync will, talking to the test over
// stdin/stdout, one line per message:
//
//   cuda_device_helper id
//       -> "ID <DeviceId of ordinal 0>"  (run under CUDA_VISIBLE_DEVICES)
//   cuda_device_helper trainer <device> <memory handle hex> <count>
//       maps the test's float buffer, checks it holds 0, 1, 2, ..., then on
//       a stream: a host function that sleeps 1.5 s, a copy of 2i+1 into the
//       buffer, a readiness event.
//       -> "EVENT <event handle hex>"; waits for "done" -> "OK"
//   cuda_device_helper export <count> <offset bytes>
//       allocates, fills base+offset with i+0.5, FindAllocation(base+offset)
//       -> "MEM <memory handle hex> <device>"; waits for "done" -> "OK"
//
// Any failure prints "ERROR <message>" and exits 1.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gpu/cuda_trainer_device.h"
#include "gpu/device.h"

namespace gradsync::gpu {
namespace {

int Fail(const std::string& message) {
  std::cout << "ERROR " << message << std::endl;
  return 1;
}

#define HELPER_CUDA(expr)                                                                      \
  do {                                                                                         \
    cudaError_t err_ = (expr);                                                                 \
    if (err_ != cudaSuccess) return Fail(absl::StrCat(#expr, ": ", cudaGetErrorString(err_))); \
  } while (0)

#define HELPER_OK(expr)                                                    \
  do {                                                                     \
    absl::Status st_ = (expr);                                             \
    if (!st_.ok()) return Fail(absl::StrCat(#expr, ": ", st_.ToString())); \
  } while (0)

// Blocks until the test says "done" (or closes the pipe).
void WaitForDone() {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "done") return;
  }
}

int Id(TrainerDevice& dev) {
  absl::StatusOr<DeviceId> id = dev.IdOfOrdinal(0);
  if (!id.ok()) return Fail(id.status().ToString());
  std::cout << "ID " << *id << std::endl;
  return 0;
}

void CUDART_CB Sleep(void*) { usleep(1500 * 1000); }

int Trainer(TrainerDevice& dev, const std::string& device, const std::string& handle_hex,
            size_t count) {
  absl::StatusOr<IpcHandle> handle = IpcHandle::FromBytes(absl::HexStringToBytes(handle_hex));
  HELPER_OK(handle.status());
  absl::StatusOr<void*> base = dev.OpenMemory(device, *handle);
  HELPER_OK(base.status());
  // A second Open of the same handle is the same mapping, one more reference.
  absl::StatusOr<void*> again = dev.OpenMemory(device, *handle);
  HELPER_OK(again.status());
  if (*again != *base) return Fail("reopening a handle gave another base");
  HELPER_OK(dev.CloseMemory(*again));

  std::vector<float> host(count);
  HELPER_CUDA(cudaMemcpy(host.data(), *base, count * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < count; ++i) {
    if (host[i] != static_cast<float>(i)) {
      return Fail(absl::StrCat("mapped buffer[", i, "] = ", host[i], ", want ", i));
    }
  }
  // Pinned: a copy from pageable memory may wait for the stream (here, for
  // the sleep) before returning, and the event would then be done already.
  float* pinned = nullptr;
  HELPER_CUDA(cudaMallocHost(reinterpret_cast<void**>(&pinned), count * sizeof(float)));
  for (size_t i = 0; i < count; ++i) pinned[i] = 2.0f * i + 1.0f;

  absl::StatusOr<Event*> event = dev.CreateEvent(device);
  HELPER_OK(event.status());
  absl::StatusOr<IpcHandle> event_handle = dev.ExportEvent(*event);
  HELPER_OK(event_handle.status());
  cudaStream_t stream;
  HELPER_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The event must stay pending until the stream has passed the write.
  HELPER_CUDA(cudaLaunchHostFunc(stream, Sleep, nullptr));
  HELPER_CUDA(
      cudaMemcpyAsync(*base, pinned, count * sizeof(float), cudaMemcpyHostToDevice, stream));
  HELPER_OK(dev.RecordEvent(*event, dev.WrapStream(stream)));
  std::cout << "EVENT " << absl::BytesToHexString(event_handle->ToBytes()) << std::endl;

  WaitForDone();
  HELPER_CUDA(cudaStreamSynchronize(stream));
  HELPER_CUDA(cudaStreamDestroy(stream));
  HELPER_CUDA(cudaFreeHost(pinned));
  HELPER_OK(dev.CloseMemory(*base));
  if (dev.CloseMemory(*base).ok())
    return Fail("a third CloseMemory of a twice-opened handle succeeded");
  dev.DestroyEvent(*event);
  std::cout << "OK" << std::endl;
  return 0;
}

int Export(TrainerDevice& dev, size_t count, size_t offset) {
  void* base = nullptr;
  HELPER_CUDA(cudaMalloc(&base, offset + count * sizeof(float)));
  std::vector<float> host(count);
  for (size_t i = 0; i < count; ++i) host[i] = i + 0.5f;
  char* tensor = static_cast<char*>(base) + offset;
  HELPER_CUDA(cudaMemcpy(tensor, host.data(), count * sizeof(float), cudaMemcpyHostToDevice));

  absl::StatusOr<Allocation> alloc = dev.FindAllocation(tensor);
  HELPER_OK(alloc.status());
  if (alloc->base != base || alloc->size < offset + count * sizeof(float)) {
    return Fail("FindAllocation found the wrong allocation");
  }
  absl::StatusOr<DeviceId> id = dev.IdOfOrdinal(0);
  HELPER_OK(id.status());
  if (alloc->device != *id)
    return Fail(absl::StrCat("FindAllocation: device ", alloc->device, " != ", *id));
  absl::StatusOr<IpcHandle> handle = dev.ExportMemory(alloc->base);
  HELPER_OK(handle.status());
  std::cout << "MEM " << absl::BytesToHexString(handle->ToBytes()) << " " << alloc->device
            << std::endl;
  WaitForDone();
  HELPER_CUDA(cudaFree(base));
  std::cout << "OK" << std::endl;
  return 0;
}

int Main(int argc, char** argv) {
  if (argc < 2) return Fail("usage: cuda_device_helper id|trainer|export ...");
  absl::StatusOr<std::unique_ptr<TrainerDevice>> dev = NewCudaTrainerDevice();
  HELPER_OK(dev.status());
  const std::string mode = argv[1];
  if (mode == "id") return Id(**dev);
  size_t a = 0, b = 0;
  if (mode == "trainer" && argc == 5 && absl::SimpleAtoi(argv[4], &a)) {
    return Trainer(**dev, argv[2], argv[3], a);
  }
  if (mode == "export" && argc == 4 && absl::SimpleAtoi(argv[2], &a) &&
      absl::SimpleAtoi(argv[3], &b)) {
    return Export(**dev, a, b);
  }
  return Fail(absl::StrCat("bad arguments for mode ", mode));
}

}  // namespace
}  // namespace gradsync::gpu

int main(int argc, char** argv) { return gradsync::gpu::Main(argc, argv); }
