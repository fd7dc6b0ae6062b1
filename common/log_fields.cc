#include "common/log_fields.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"

namespace gradsync {
namespace {

bool IsKeyChar(char c) { return absl::ascii_isalnum(c) || c == '_' || c == '.' || c == '-'; }

// Parses one `key=value` at `*at` (past leading spaces); false if the text
// there is not one.
bool NextField(absl::string_view text, size_t* at, std::pair<std::string, std::string>* field) {
  size_t i = *at;
  const size_t key_start = i;
  while (i < text.size() && IsKeyChar(text[i])) ++i;
  if (i == key_start || i >= text.size() || text[i] != '=') return false;
  field->first = std::string(text.substr(key_start, i - key_start));
  ++i;
  if (i < text.size() && text[i] == '"') {
    // A quoted value ends at the first quote not escaped by a backslash.
    size_t end = i + 1;
    while (end < text.size() && text[end] != '"') end += text[end] == '\\' ? 2 : 1;
    if (end >= text.size()) return false;
    std::string value;
    if (!absl::CUnescape(text.substr(i + 1, end - i - 1), &value)) return false;
    field->second = std::move(value);
    i = end + 1;
  } else {
    const size_t value_start = i;
    while (i < text.size() && text[i] != ' ') ++i;
    field->second = std::string(text.substr(value_start, i - value_start));
  }
  if (i < text.size() && text[i] != ' ') return false;
  *at = i;
  return true;
}

}  // namespace

LogFields ParseLogFields(absl::string_view message) {
  LogFields fields;
  size_t at = 0;
  while (true) {
    while (at < message.size() && message[at] == ' ') ++at;
    if (at >= message.size()) return fields;
    std::pair<std::string, std::string> field;
    if (!NextField(message, &at, &field)) break;
    fields.push_back(std::move(field));
  }
  // Free text from here on: kept verbatim.
  fields.emplace_back("message", std::string(message.substr(at)));
  return fields;
}

}  // namespace gradsync
