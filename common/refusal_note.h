// The one line gradsyncd writes on a trainer's connection that it turns
// away before gRPC reads a byte (it ran out of file descriptors), so that
// the trainer can say what happened instead of guessing from a closed
// connection. A served connection starts with gRPC's HTTP/2 SETTINGS frame
// (binary, first byte 0), which never looks like this text.
//
// "gradsyncd-refused <gradsync.v1.Code number> <message>\n"
#ifndef GRADSYNC_COMMON_REFUSAL_NOTE_H_
#define GRADSYNC_COMMON_REFUSAL_NOTE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "gradsync/v1/local.pb.h"

namespace gradsync {

inline constexpr char kRefusalMarker[] = "gradsyncd-refused ";
// Longest note a reader needs to take (the daemon writes much less).
inline constexpr size_t kMaxRefusalNoteBytes = 512;

std::string FormatRefusalNote(v1::Code code, absl::string_view message);

// The daemon's status if `bytes` (the first bytes it sent) is a note;
// nullopt when it is anything else (a served connection). An unknown code
// reads as UNAVAILABLE.
std::optional<absl::Status> ParseRefusalNote(absl::string_view bytes);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_REFUSAL_NOTE_H_
