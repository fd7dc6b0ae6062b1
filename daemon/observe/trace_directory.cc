#include "daemon/observe/trace_directory.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace gradsync {

namespace fs = std::filesystem;

std::string TraceDirectory(const std::function<const char*(const char*)>& getenv) {
  for (const char* name : {"LOGS_DIRECTORY", "STATE_DIRECTORY"}) {
    const char* value = getenv(name);
    if (value == nullptr || *value == '\0') continue;
    // systemd joins several directories with ':'; the first is the daemon's.
    const std::string dirs(value);
    return dirs.substr(0, dirs.find(':'));
  }
  return "/tmp/gradsync";
}

std::string TraceFileName(absl::string_view job_id, int node_rank, int64_t stamp) {
  std::string job(job_id);
  for (char& c : job) {
    const bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '-' || c == '_';
    if (!safe) c = '_';
  }
  return absl::StrCat("gradsync-trace-", job, "-node", node_rank, "-", stamp, ".json");
}

absl::Status MakeRoomForTrace(const std::string& dir, size_t keep) {
  std::error_code ec;
  if (fs::create_directories(dir, ec)) {
    chmod(dir.c_str(), 0700);  // traces name tensors: not for other users
  } else if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  }
  std::vector<std::pair<fs::file_time_type, fs::path>> traces;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!absl::StartsWith(name, "gradsync-trace-") || !absl::EndsWith(name, ".json")) continue;
    std::error_code time_ec;
    const fs::file_time_type time = it->last_write_time(time_ec);
    if (!time_ec) traces.emplace_back(time, it->path());
  }
  if (ec) return absl::UnavailableError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  if (keep == 0 || traces.size() < keep) return absl::OkStatus();
  std::sort(traces.begin(), traces.end());  // oldest first
  for (size_t i = 0; i + keep - 1 < traces.size(); ++i) fs::remove(traces[i].second, ec);
  return absl::OkStatus();
}

}  // namespace gradsync
