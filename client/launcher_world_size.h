// The launcher's world size against gradsync's: torchrun and friends set
// $WORLD_SIZE for the trainers they start; a gradsync job whose daemons
// form a different world (wrong --local-size or --num-nodes, or nodes not
// joined into one job) would average over the wrong number of trainers, so
// gs_register refuses it (the Python client's check_world_size says the same).
#ifndef GRADSYNC_CLIENT_LAUNCHER_WORLD_SIZE_H_
#define GRADSYNC_CLIENT_LAUNCHER_WORLD_SIZE_H_

#include "absl/status/status.h"

namespace gradsync {

// OK when `launcher_world_size` ($WORLD_SIZE; null or empty: no launcher)
// equals `world_size`; otherwise INVALID_ARGUMENT naming both.
absl::Status CheckLauncherWorldSize(int world_size, const char* launcher_world_size);

}  // namespace gradsync

#endif  // GRADSYNC_CLIENT_LAUNCHER_WORLD_SIZE_H_
