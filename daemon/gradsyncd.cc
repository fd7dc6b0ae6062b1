// gradsyncd, the release binary: run_gradsyncd with the real GPU device.
#include "daemon/daemon_device_factory.h"
#include "daemon/run_gradsyncd.h"

int main(int argc, char** argv) {
  return gradsync::RunGradsyncd(
      argc, argv, [](const gradsync::DaemonConfig&) -> absl::StatusOr<gradsync::GpuRuntime> {
        absl::StatusOr<std::shared_ptr<gradsync::gpu::DaemonDevice>> device =
            gradsync::NewReleaseDaemonDevice();
        if (!device.ok()) return device.status();
        gradsync::GpuRuntime gpu;
        gpu.device = std::move(*device);
        gpu.is_context_lost = gradsync::IsDeviceContextLost;
        return gpu;
      });
}
