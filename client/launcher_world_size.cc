#include "client/launcher_world_size.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_code.h"

namespace gradsync {

absl::Status CheckLauncherWorldSize(int world_size, const char* launcher_world_size) {
  if (launcher_world_size == nullptr) return absl::OkStatus();
  const absl::string_view value = absl::StripAsciiWhitespace(launcher_world_size);
  if (value.empty()) return absl::OkStatus();
  int launcher = 0;
  if (!absl::SimpleAtoi(value, &launcher)) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat("$WORLD_SIZE is '", launcher_world_size, "', not an integer"));
  }
  if (launcher == world_size) return absl::OkStatus();
  return MakeError(
      v1::INVALID_ARGUMENT,
      absl::StrCat("$WORLD_SIZE is ", launcher,
                   " (set by the launcher, e.g. torchrun) but the "
                   "gradsync job has ",
                   world_size,
                   " trainers: start the gradsyncd of every node "
                   "with --local-size = trainers per node and --num-nodes = nodes, joined into "
                   "one job"));
}

}  // namespace gradsync
