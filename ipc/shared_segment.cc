#include "ipc/shared_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "boost/interprocess/exceptions.hpp"
#include "boost/interprocess/shared_memory_object.hpp"
#include "common/status_macros.h"

namespace gradsync::ipc {
namespace bip = boost::interprocess;

namespace {

absl::Status FromBoost(const bip::interprocess_exception& e, const std::string& what) {
  const std::string msg = absl::StrCat(what, ": ", e.what());
  switch (e.get_error_code()) {
    case bip::not_found_error:
      return absl::NotFoundError(msg);
    case bip::already_exists_error:
      return absl::AlreadyExistsError(msg);
    case bip::security_error:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// One path component under /dev/shm: Boost would otherwise fail with an
// opaque internal error (or, for "..", reach outside /dev/shm).
absl::Status CheckName(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat("bad segment name '", name, "'"));
  }
  return absl::OkStatus();
}

// A zombie (exited, not yet reaped by its parent) counts as dead: it maps
// nothing any more, and a daemon killed with SIGKILL stays one until its
// launcher waits for it.
bool IsZombie(pid_t pid) {
  const int fd = open(absl::StrCat("/proc/", pid, "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[512];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return false;
  // "pid (comm) S ...": comm may hold spaces and parentheses, the state
  // follows the last ')'.
  const absl::string_view stat(buf, static_cast<size_t>(n));
  const size_t paren = stat.rfind(')');
  return paren != absl::string_view::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

// Where POSIX shared memory lives on Linux (and where Boost puts it).
constexpr char kShmDir[] = "/dev/shm";

// The last field of every segment name: the creator's pid namespace.
constexpr char kPidNamespaceTag[] = ".pidns";

// Takes the segment's pages now: a sparse tmpfs file that outgrows /dev/shm
// kills whoever touches the missing page with SIGBUS, long after creation.
absl::Status ReserveSpace(int fd, const std::string& name, size_t size) {
  if (size == 0) return absl::OkStatus();
  int err;
  do {
    err = posix_fallocate(fd, 0, static_cast<off_t>(size));
  } while (err == EINTR);
  if (err == 0) return absl::OkStatus();
  if (err == ENOSPC) {
    struct statvfs fs;
    const std::string free_bytes = statvfs(kShmDir, &fs) == 0
                                       ? absl::StrCat(uint64_t{fs.f_bavail} * fs.f_frsize)
                                       : std::string("an unknown number of");
    return absl::ResourceExhaustedError(absl::StrCat("segment ", name, " needs ", size, " bytes, ",
                                                     kShmDir, " has ", free_bytes, " bytes free"));
  }
  return absl::InternalError(
      absl::StrCat("segment ", name, ": reserving ", size, " bytes: ", std::strerror(err)));
}

bool ProcessAlive(pid_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno != EPERM) return false;
  return !IsZombie(pid);
}

}  // namespace

uint64_t OwnPidNamespace() {
  struct stat st;
  if (stat("/proc/self/ns/pid", &st) != 0) return 0;
  return st.st_ino;
}

std::string SegmentName(const std::string& prefix, pid_t daemon_pid, const std::string& suffix) {
  return absl::StrCat(prefix, ".", daemon_pid, ".", suffix, kPidNamespaceTag, OwnPidNamespace());
}

absl::StatusOr<SharedSegment> SharedSegment::Create(const std::string& name, size_t size,
                                                    mode_t mode, gid_t group) {
  RETURN_IF_ERROR(CheckName(name));
  SharedSegment seg;
  // Only a name we created may be removed on failure: when the name already
  // exists it belongs to someone else (a live daemon, another trainer).
  bool created = false;
  try {
    bip::permissions perm(mode);
    bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write, perm);
    created = true;
    // Boost creates with the mode masked by the umask on some versions: set it exactly.
    if (fchmod(shm.get_mapping_handle().handle, mode) != 0 ||
        (group != static_cast<gid_t>(-1) &&
         fchown(shm.get_mapping_handle().handle, -1, group) != 0)) {
      const int err = errno;
      bip::shared_memory_object::remove(name.c_str());
      return absl::PermissionDeniedError(
          absl::StrCat("segment ", name, ": cannot set mode/group: ", std::strerror(err)));
    }
    shm.truncate(static_cast<bip::offset_t>(size));  // fresh pages read as zero
    if (absl::Status reserved = ReserveSpace(shm.get_mapping_handle().handle, name, size);
        !reserved.ok()) {
      bip::shared_memory_object::remove(name.c_str());
      return reserved;
    }
    struct stat st;
    if (fstat(shm.get_mapping_handle().handle, &st) != 0) {
      const int err = errno;
      bip::shared_memory_object::remove(name.c_str());
      return absl::InternalError(absl::StrCat("segment ", name, ": fstat: ", std::strerror(err)));
    }
    seg.dev_ = st.st_dev;
    seg.ino_ = st.st_ino;
    seg.region_ = bip::mapped_region(shm, bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    if (created) bip::shared_memory_object::remove(name.c_str());
    return FromBoost(e, absl::StrCat("create segment ", name));
  }
  seg.name_ = name;
  return seg;
}

absl::StatusOr<SharedSegment> SharedSegment::Open(const std::string& name, mode_t max_mode,
                                                  std::optional<uid_t> owner) {
  RETURN_IF_ERROR(CheckName(name));
  SharedSegment seg;
  try {
    bip::shared_memory_object shm(bip::open_only, name.c_str(), bip::read_write);
    struct stat st;
    if (fstat(shm.get_mapping_handle().handle, &st) != 0) {
      return absl::InternalError(absl::StrCat("segment ", name, ": fstat: ", std::strerror(errno)));
    }
    const mode_t mode = st.st_mode & 0777;
    if ((mode & ~max_mode) != 0) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "segment %s has mode %04o, more open than %04o allows: refusing to use it (another "
          "user could write into it)",
          name, mode, max_mode));
    }
    // Root too, and group-shared segments too: root can open anything, and
    // a group member could have planted it.
    const uid_t expected = owner.value_or(geteuid());
    if (st.st_uid != expected) {
      return absl::PermissionDeniedError(
          absl::StrCat("segment ", name, " belongs to uid ", st.st_uid, ", not to uid ", expected,
                       " (", owner ? "the daemon's" : "ours", "): refusing to map it"));
    }
    if (st.st_size == 0) {
      return absl::FailedPreconditionError(absl::StrCat("segment ", name, " is empty"));
    }
    seg.dev_ = st.st_dev;
    seg.ino_ = st.st_ino;
    seg.region_ = bip::mapped_region(shm, bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    return FromBoost(e, absl::StrCat("open segment ", name));
  }
  seg.name_ = name;
  return seg;
}

absl::Status SharedSegment::CheckStillNamed() const {
  struct stat st;
  try {
    // Opened read-only and only fstat'ed: nothing of it is trusted.
    bip::shared_memory_object shm(bip::open_only, name_.c_str(), bip::read_only);
    if (fstat(shm.get_mapping_handle().handle, &st) != 0) {
      return absl::InternalError(
          absl::StrCat("segment ", name_, ": fstat: ", std::strerror(errno)));
    }
  } catch (const bip::interprocess_exception& e) {
    if (e.get_error_code() == bip::not_found_error) {
      return absl::NotFoundError(absl::StrCat(
          "segment ", name_, " no longer names the daemon's segment: it was unlinked"));
    }
    return FromBoost(e, absl::StrCat("open segment ", name_));
  }
  if (st.st_dev != dev_ || st.st_ino != ino_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "segment ", name_, " no longer names the daemon's segment: another object took the name"));
  }
  return absl::OkStatus();
}

absl::Status SharedSegment::Remove(const std::string& name) {
  if (!bip::shared_memory_object::remove(name.c_str())) {
    return absl::NotFoundError(absl::StrCat("segment ", name, " does not exist"));
  }
  return absl::OkStatus();
}

std::vector<std::string> RemoveStaleSegments(const std::string& prefix) {
  std::vector<std::string> removed;
  // Without our own namespace no recorded pid can be judged: keep them all.
  const uint64_t own_namespace = OwnPidNamespace();
  if (own_namespace == 0) return removed;
  DIR* dir = opendir(kShmDir);
  if (dir == nullptr) return removed;
  const std::string lead = prefix + ".";
  const uid_t euid = geteuid();
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(lead, 0) != 0) continue;
    std::vector<std::string> parts = absl::StrSplit(name.substr(lead.size()), '.');
    int pid = 0;
    if (parts.size() < 3 || !absl::SimpleAtoi(parts[0], &pid)) continue;
    // A pid is only meaningful in the namespace that recorded it: a daemon
    // in a container, or on a host sharing this /dev/shm, may be alive
    // under a pid that is dead (or someone else's) here.
    uint64_t recorded_namespace = 0;
    absl::string_view last = parts.back();
    if (!absl::ConsumePrefix(&last, kPidNamespaceTag + 1) ||
        !absl::SimpleAtoi(last, &recorded_namespace) || recorded_namespace != own_namespace) {
      continue;
    }
    // Another user's segment is not ours to judge (root could unlink it).
    struct stat st;
    if (fstatat(dirfd(dir), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != euid) {
      continue;
    }
    if (ProcessAlive(pid)) continue;
    if (bip::shared_memory_object::remove(name.c_str())) removed.push_back(name);
  }
  closedir(dir);
  return removed;
}

}  // namespace gradsync::ipc
