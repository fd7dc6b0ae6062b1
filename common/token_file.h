// The job token on disk: what gradsyncd (--job-token-file) and gradsyncctl
// (--token-file) read. Like ssh with a private key, a file that group or
// others may read or write is refused: the token is the job's only secret.
// One exception, for Kubernetes: in a Secret volume (the kubelet's ..data
// symlink layout) the file may also be group-readable, as fsGroup makes it.
#ifndef GRADSYNC_COMMON_TOKEN_FILE_H_
#define GRADSYNC_COMMON_TOKEN_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace gradsync {

// The token (surrounding whitespace stripped). InvalidArgument naming
// `path` and its mode when group/other bits are set, when the file is empty
// or whitespace only, or cannot be read. Never puts the token in a message.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_TOKEN_FILE_H_
