#include "common/refusal_note.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_code.h"

namespace gradsync {

std::string FormatRefusalNote(v1::Code code, absl::string_view message) {
  std::string line = absl::StrCat(kRefusalMarker, static_cast<int>(code), " ", message);
  if (line.size() >= kMaxRefusalNoteBytes) line.resize(kMaxRefusalNoteBytes - 1);
  // One line whatever the message holds.
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return line + "\n";
}

std::optional<absl::Status> ParseRefusalNote(absl::string_view bytes) {
  if (!absl::ConsumePrefix(&bytes, kRefusalMarker)) return std::nullopt;
  const size_t eol = bytes.find('\n');
  if (eol != absl::string_view::npos) bytes = bytes.substr(0, eol);
  const size_t space = bytes.find(' ');
  int code = 0;
  if (space == absl::string_view::npos || !absl::SimpleAtoi(bytes.substr(0, space), &code) ||
      !v1::Code_IsValid(code) || code == v1::OK) {
    code = v1::UNAVAILABLE;
  }
  const absl::string_view message =
      space == absl::string_view::npos ? bytes : bytes.substr(space + 1);
  return MakeError(static_cast<v1::Code>(code), message);
}

}  // namespace gradsync
