// gradsyncd, the release binary: run_gradsyncd with the real GPU device.
#include "common/status_macros.h"
#include "daemon/daemon_device_factory.h"
#include "daemon/run_gradsyncd.h"

int main(int argc, char** argv) {
  return gradsync::RunGradsyncd(
      argc, argv, [](const gradsync::DaemonConfig&) -> absl::StatusOr<gradsync::GpuRuntime> {
        gradsync::GpuRuntime gpu;
        ASSIGN_OR_RETURN(gpu.device, gradsync::NewReleaseDaemonDevice());
        gpu.is_context_lost = gradsync::IsDeviceContextLost;
        return gpu;
      });
}
