// gradsyncd_sim: gradsyncd with the simulated GPU device (gpu/sim/sim_device),
// for the GPU path's tests on machines without a GPU. testonly: it can
// never ship; the release gradsyncd does not link the simulation at all.
// The simulated node comes from GRADSYNC_SIM_* (see gpu/sim/sim_device.h).
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "daemon/run_gradsyncd.h"
#include "gpu/gated_daemon_device.h"
#include "gpu/sim/sim_device.h"

// Only here, never in the release binary: proves the tests catch a
// daemon that reduces without waiting for the trainers' readiness events.
ABSL_FLAG(bool, unsafe_skip_event_wait, false,
          "TEST ONLY: reduce without polling the trainers' readiness events");

// Only here: makes the race between a departing trainer's Detach and the
// last trainer's release of the whole GPU session certain, not a matter of
// load. A trainer that is not the last pauses before it looks for the
// session until the last one has taken it; the last one then holds the
// taken session, still mapping the first one's memory, for a while.
ABSL_FLAG(bool, test_departure_race, false,
          "TEST ONLY: hold the departure of trainers open to force the release race");

namespace {

void DepartureRacePause(const std::string& point) {
  static std::mutex mu;
  static std::condition_variable cv;
  static bool world_taken = false;
  std::unique_lock<std::mutex> lock(mu);
  if (point == "departure") {
    cv.wait_for(lock, std::chrono::seconds(30), [] { return world_taken; });
  } else if (point == "world_release") {
    world_taken = true;
    cv.notify_all();
    lock.unlock();
    // Widens the window (the daemon still maps the departed trainer's
    // memory): a Detach answered meanwhile lets that trainer free it.
    std::this_thread::sleep_for(std::chrono::seconds(3));
  }
}

}  // namespace

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
        if (absl::GetFlag(FLAGS_test_departure_race)) gpu.test_pause = DepartureRacePause;
        return gpu;
      });
}
