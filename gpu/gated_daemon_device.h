// GatedDaemonDevice: the daemon's device as every job shares it — a
// DaemonDevice (CUDA or the simulation) whose memory management and
// collectives pass one DeviceGate (device_gate.h), so that no allocation,
// free, IPC open/close or communicator creation/destruction overlaps a
// collective on the same GPU, whichever job runs it.
//
// Memory calls wait at most `memory_wait` for the collectives in flight
// (each is bounded by its own timeout); a collective waits at most its
// group's timeout for memory work. Everything else passes straight through.
#ifndef GRADSYNC_GPU_GATED_DAEMON_DEVICE_H_
#define GRADSYNC_GPU_GATED_DAEMON_DEVICE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gpu/device.h"
#include "gpu/device_gate.h"

namespace gradsync::gpu {

class GatedDaemonDevice final : public DaemonDevice {
 public:
  GatedDaemonDevice(std::unique_ptr<DaemonDevice> device, absl::Duration memory_wait);

  DeviceGate& gate() { return gate_; }

  std::string name() const override { return device_->name(); }
  absl::Status CheckDevice(const DeviceId& device) override { return device_->CheckDevice(device); }
  absl::StatusOr<void*> Alloc(const DeviceId& device, size_t bytes) override;
  absl::Status Free(const DeviceId& device, void* ptr) override;
  absl::StatusOr<IpcHandle> ExportMemory(const DeviceId& device, void* base) override {
    return device_->ExportMemory(device, base);
  }
  absl::StatusOr<void*> OpenMemory(const DeviceId& device, const IpcHandle& handle) override;
  absl::StatusOr<uint64_t> MappedSize(const DeviceId& device, void* base) override {
    return device_->MappedSize(device, base);  // a host-side query: no gate needed
  }
  absl::Status CloseMemory(const DeviceId& device, void* base) override;
  absl::StatusOr<Event*> OpenEvent(const DeviceId& device, const IpcHandle& handle) override {
    return device_->OpenEvent(device, handle);
  }
  absl::StatusOr<Completion> QueryEvent(Event* event) override {
    return device_->QueryEvent(event);
  }
  void CloseEvent(Event* event) override { device_->CloseEvent(event); }
  absl::StatusOr<Stream*> CreateStream(const DeviceId& device) override {
    return device_->CreateStream(device);
  }
  void DestroyStream(Stream* stream) override { device_->DestroyStream(stream); }
  absl::StatusOr<Completion> QueryStream(Stream* stream) override {
    return device_->QueryStream(stream);
  }
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes, Stream* stream) override {
    return device_->CopyAsync(dst, src, bytes, stream);
  }
  absl::Status SumAsync(void* dst, const std::vector<const void*>& srcs, size_t count, DType dtype,
                        double scale, const NonFiniteCheck& check, Stream* stream) override {
    return device_->SumAsync(dst, srcs, count, dtype, scale, check, stream);
  }
  absl::Status ZeroAsync(void* dst, size_t bytes, Stream* stream) override {
    return device_->ZeroAsync(dst, bytes, stream);
  }
  absl::StatusOr<void*> AllocHost(const DeviceId& device, size_t bytes) override;
  absl::Status FreeHost(const DeviceId& device, void* ptr) override;
  absl::Status CopyToHostAsync(void* host, const void* src, size_t bytes, Stream* stream) override {
    return device_->CopyToHostAsync(host, src, bytes, stream);
  }
  absl::Status CopyFromHostAsync(void* dst, const void* host, size_t bytes,
                                 Stream* stream) override {
    return device_->CopyFromHostAsync(dst, host, bytes, stream);
  }
  absl::StatusOr<std::unique_ptr<CollectiveGroup>> CreateCollectives(
      const CollectiveOptions& options) override;

 private:
  const std::unique_ptr<DaemonDevice> device_;
  const absl::Duration memory_wait_;
  DeviceGate gate_;
};

}  // namespace gradsync::gpu

#endif  // GRADSYNC_GPU_GATED_DAEMON_DEVICE_H_
