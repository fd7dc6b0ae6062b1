// libsystemd, loaded the first time gradsyncd needs it: a daemon not run by
// systemd (a Kubernetes sidecar, a test, a benchmark starting 16 daemons at
// once) never maps it nor the six libraries it pulls in (libgcrypt, liblzma,
// libzstd, liblz4, libcap, libgpg-error), which were a tenth of a daemon's
// start-up CPU. Under systemd it is the same library, the same two calls.
#ifndef GRADSYNC_DAEMON_SYSTEMD_LIBRARY_H_
#define GRADSYNC_DAEMON_SYSTEMD_LIBRARY_H_

#include <sys/uio.h>

#include "absl/status/statusor.h"

namespace gradsync {

struct SystemdLibrary {
  int (*notify)(int unset_environment, const char* state);
  int (*journal_sendv)(const struct iovec* iov, int n);
};

// The loaded library (dlopen of libsystemd.so.0 once per process), or
// FAILED_PRECONDITION with the loader's reason.
absl::StatusOr<const SystemdLibrary*> LoadSystemdLibrary();

// sd_notify(0, state) when $NOTIFY_SOCKET is set (a Type=notify service);
// nothing otherwise, exactly as sd_notify itself. A library that cannot be
// loaded under systemd is logged (systemd then times the start out).
void NotifySystemd(const char* state);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_SYSTEMD_LIBRARY_H_
