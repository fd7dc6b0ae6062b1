// Where the daemon writes the traces of stalls and timeouts, and how many it
// keeps there: a job that stalls every minute must not fill the disk.
#ifndef GRADSYNC_DAEMON_OBSERVE_TRACE_DIRECTORY_H_
#define GRADSYNC_DAEMON_OBSERVE_TRACE_DIRECTORY_H_

#include <cstddef>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gradsync {

// Traces kept per directory; older ones are removed as new ones come.
inline constexpr size_t kMaxKeptTraces = 20;

// systemd's $LOGS_DIRECTORY (its first entry), else $STATE_DIRECTORY (the
// daemon's state directory), else /tmp/gradsync. `getenv` is ::getenv in
// the daemon.
std::string TraceDirectory(const std::function<const char*(const char*)>& getenv);

// A trace's file name: "gradsync-trace-<job>-node<N>-<stamp>.json", the job
// id (user input) reduced to [A-Za-z0-9._-] (no '/'): it cannot leave `dir`.
std::string TraceFileName(absl::string_view job_id, int node_rank, int64_t stamp);

// Creates `dir` (mode 0700) if missing, then removes the oldest
// gradsync-trace-*.json files (by modification time) so that at most
// `keep` - 1 remain: room for the one about to be written.
absl::Status MakeRoomForTrace(const std::string& dir, size_t keep);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_OBSERVE_TRACE_DIRECTORY_H_
