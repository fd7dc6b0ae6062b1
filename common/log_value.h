// LogValue: a value for gradsync's one-line key=value logs that can hold
// anything — tensor names, job ids and the messages quoting them are user
// input. Always double-quoted, with quotes, backslashes, newlines and other
// control or non-ASCII bytes C-escaped (absl::CHexEscape), so one event
// stays one line and a value can neither end its field nor forge a key.
#ifndef GRADSYNC_COMMON_LOG_VALUE_H_
#define GRADSYNC_COMMON_LOG_VALUE_H_

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace gradsync {

inline std::string LogValue(absl::string_view value) {
  // CHexEscape also escapes ' (messages quote names in '...'); inside a
  // double-quoted value it needs none, so each \' becomes ' again. Every '
  // in CHexEscape's output follows its own backslash, so this is exact.
  const std::string escaped = absl::CHexEscape(value);
  std::string out = "\"";
  out.reserve(escaped.size() + 2);
  for (size_t i = 0; i < escaped.size(); ++i) {
    if (escaped[i] == '\\' && i + 1 < escaped.size()) {
      if (escaped[i + 1] != '\'') out += escaped[i];
      out += escaped[++i];
      continue;
    }
    out += escaped[i];
  }
  out += '"';
  return out;
}

// For identifiers that are usually plain (job ids, paths): the value as is
// when it is a plain token — letters, digits and _ . / : @ + - only — so
// `job=default path=/var/log/x.json` stay easy to grep; LogValue otherwise.
inline std::string LogToken(absl::string_view value) {
  auto plain = [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '/' ||
           c == ':' || c == '@' || c == '+' || c == '-';
  };
  if (value.empty()) return LogValue(value);
  for (char c : value) {
    if (!plain(c)) return LogValue(value);
  }
  return std::string(value);
}

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_LOG_VALUE_H_
