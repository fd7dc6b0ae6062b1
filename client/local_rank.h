// Which local rank a trainer attaches as. A rank taken from a mistyped
// option or environment variable would not fail where it was made: the
// trainer would attach as some other rank (LOCAL_RANK=abc as rank 0), and the
// trainer that really is that rank would then be refused as a duplicate,
// with nothing naming the variable. So anything but a plain rank is refused
// here, naming the value and where it came from.
#ifndef GRADSYNC_CLIENT_LOCAL_RANK_H_
#define GRADSYNC_CLIENT_LOCAL_RANK_H_

#include "absl/status/statusor.h"

namespace gradsync {

// `option` is gs_connect_options.local_rank: >= 0 is the rank; -1 means
// "read $LOCAL_RANK" (`env_local_rank`, its value or null when unset), and an
// unset or empty variable means rank 0. $LOCAL_RANK must be a decimal
// integer >= 0 with nothing around it (no sign, spaces, hex or suffix) that
// fits an int. Anything else is INVALID_ARGUMENT naming the value.
absl::StatusOr<int> ResolveLocalRank(int option, const char* env_local_rank);

}  // namespace gradsync

#endif  // GRADSYNC_CLIENT_LOCAL_RANK_H_
