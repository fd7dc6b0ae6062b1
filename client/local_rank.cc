#include "client/local_rank.h"

#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_code.h"

namespace gradsync {

absl::StatusOr<int> ResolveLocalRank(int option, const char* env_local_rank) {
  if (option >= 0) return option;
  if (option != -1) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat("gs_connect_options.local_rank is ", option,
                                  ": give the trainer's rank on its node (>= 0), or -1 to read "
                                  "$LOCAL_RANK"));
  }
  if (env_local_rank == nullptr || *env_local_rank == '\0') return 0;
  const absl::string_view value(env_local_rank);
  bool digits_only = true;
  for (char ch : value)
    digits_only = digits_only && absl::ascii_isdigit(static_cast<unsigned char>(ch));
  int rank = 0;
  // SimpleAtoi alone would take " 1" and "+1"; the digit check refuses them,
  // and SimpleAtoi refuses what overflows an int instead of wrapping.
  if (!digits_only || !absl::SimpleAtoi(value, &rank)) {
    return MakeError(
        v1::INVALID_ARGUMENT,
        absl::StrCat("$LOCAL_RANK is '", value, "': not a local rank (a decimal integer from 0 to ",
                     std::numeric_limits<int>::max(),
                     " with nothing around it); fix what the launcher or the "
                     "environment sets, or pass gs_connect_options.local_rank"));
  }
  return rank;
}

}  // namespace gradsync
