#include "tests/testing/small_shm.h"

#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradsync::testing {

std::string SmallShmUnavailableReason() {
  if (geteuid() != 0) {
    return "mounting a small tmpfs on /dev/shm needs root (a private mount namespace)";
  }
  return "";
}

absl::Status MountSmallShm(size_t bytes) {
  if (unshare(CLONE_NEWNS) != 0) {
    return absl::ErrnoToStatus(errno, "unshare(CLONE_NEWNS)");
  }
  // Mounts must not propagate back to the machine's namespace.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return absl::ErrnoToStatus(errno, "making / private");
  }
  const std::string options = absl::StrCat("size=", bytes, ",mode=1777");
  if (mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("mount -t tmpfs -o ", options, " /dev/shm"));
  }
  return absl::OkStatus();
}

}  // namespace gradsync::testing
