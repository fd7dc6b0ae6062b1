// SmallShm: gives the calling process (and the children it starts later) a
// /dev/shm of its own, a fresh tmpfs of a few megabytes, so a test can run
// segments, daemons and trainers against a full /dev/shm — a container's
// 64 MiB default, scaled down — without touching the machine's.
//
// It moves the whole process into a new mount namespace: call it in a forked
// child, or in a test binary of its own. Needs root (CAP_SYS_ADMIN).
#ifndef GRADSYNC_TESTS_TESTING_SMALL_SHM_H_
#define GRADSYNC_TESTS_TESTING_SMALL_SHM_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"

namespace gradsync::testing {

// Why a small /dev/shm cannot be had here ("" when it can: we are root).
std::string SmallShmUnavailableReason();

// Unshares the mount namespace and mounts a `bytes`-sized tmpfs on /dev/shm.
absl::Status MountSmallShm(size_t bytes);

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_TESTING_SMALL_SHM_H_
