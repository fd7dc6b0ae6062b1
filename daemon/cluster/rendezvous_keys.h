// Key namespaces of the rendezvous key-value store.
//
// A key that starts with "g<generation>/" belongs to that job generation: the
// leader refuses it once a newer generation has formed (a zombie node of an
// old generation cannot pollute the new one) and discards it then. Any other
// key lives for the whole job.
#ifndef GRADSYNC_DAEMON_CLUSTER_RENDEZVOUS_KEYS_H_
#define GRADSYNC_DAEMON_CLUSTER_RENDEZVOUS_KEYS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace gradsync {

// How many of a generation's newest job-wide config versions the leader
// keeps (ConfigKey in rendezvous_records.h); a node further behind fails.
inline constexpr size_t kConfigLogKeep = 256;

// "g<generation>/", the prefix of every key scoped to `generation`.
inline std::string GenerationKeyPrefix(uint64_t generation) {
  return absl::StrCat("g", generation, "/");
}

// The generation a key is scoped to, or nullopt for a job-wide key.
inline std::optional<uint64_t> KeyGeneration(absl::string_view key) {
  if (key.size() < 3 || key[0] != 'g') return std::nullopt;
  const size_t slash = key.find('/');
  if (slash == absl::string_view::npos || slash == 1) return std::nullopt;
  const absl::string_view digits = key.substr(1, slash - 1);
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  uint64_t generation = 0;
  if (!absl::SimpleAtoi(digits, &generation)) return std::nullopt;
  return generation;
}

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_RENDEZVOUS_KEYS_H_
