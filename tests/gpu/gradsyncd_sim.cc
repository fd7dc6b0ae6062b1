// gradsyncd_sim: gradsyncd with the simulated GPU device (gpu/sim_device),
// for the GPU path's tests on machines without a GPU. testonly: it can
// never ship; the release gradsyncd does not link the simulation at all.
// The simulated node comes from GRADSYNC_SIM_* (see gpu/sim_device.h).
#include "absl/flags/flag.h"
#include "daemon/run_gradsyncd.h"
#include "gpu/gated_daemon_device.h"
#include "gpu/sim_device.h"

// Only here, never in the release binary: proves the tests catch a
// daemon that reduces without waiting for the trainers' readiness events.
ABSL_FLAG(bool, unsafe_skip_event_wait, false,
          "TEST ONLY: reduce without polling the trainers' readiness events");

int main(int argc, char** argv) {
  return gradsync::RunGradsyncd(
      argc, argv, [](const gradsync::DaemonConfig&) -> absl::StatusOr<gradsync::GpuRuntime> {
        auto device = gradsync::gpu::SimDaemonDevice::CreateFromEnv();
        if (!device.ok()) return device.status();
        gradsync::GpuRuntime gpu;
        // Gated like the release device (gpu/cuda_daemon_device): the
        // simulation underneath refuses memory work overlapping a collective.
        gpu.device = std::make_shared<gradsync::gpu::GatedDaemonDevice>(std::move(*device),
                                                                        absl::Minutes(10));
        gpu.unsafe_skip_event_wait = absl::GetFlag(FLAGS_unsafe_skip_event_wait);
        return gpu;
      });
}
