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

// A config change made while no generation runs is held and becomes version
// 1 of the next generation at this many iterations past the one it starts
// in (0, or the iteration survivors resume): iteration 1's boundary is the
// one-time order rebuild, so the held change gets the next one to itself.
inline constexpr uint64_t kHeldConfigAfter = 2;

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

// "g<generation>/gloo": where that generation's Gloo rendezvous keys live
// (GlooBackendOptions::store_prefix). Generation-scoped: the leader refuses
// and discards them once the generation is over, and a Wait on them fails
// when it aborts.
inline std::string GlooKeyPrefix(uint64_t generation) {
  return absl::StrCat(GenerationKeyPrefix(generation), "gloo");
}

// The job-wide key where node `node_rank` reports, before it joins, why it
// has not joined yet (which local trainers it still waits for); the leader
// quotes it when a Join times out and drops it when that node joins.
inline std::string FormingReportKey(int node_rank) {
  return absl::StrCat("forming/node", node_rank);
}

// "g<generation>/plan/", the prefix of every node's plan stamp of that
// generation (PlanKey in rendezvous_records.h: "<prefix><version>/<node>").
inline std::string PlanKeyPrefix(uint64_t generation) {
  return absl::StrCat(GenerationKeyPrefix(generation), "plan/");
}

// What a plan-stamp key names: the plan version and the publishing node.
struct PlanKeyParts {
  uint64_t version = 0;
  int node_rank = 0;
};

// The parts of a plan-stamp key, or nullopt for any other key.
inline std::optional<PlanKeyParts> ParsePlanKey(absl::string_view key) {
  const std::optional<uint64_t> generation = KeyGeneration(key);
  if (!generation) return std::nullopt;
  const std::string prefix = PlanKeyPrefix(*generation);
  if (key.substr(0, prefix.size()) != prefix) return std::nullopt;
  const absl::string_view rest = key.substr(prefix.size());
  const size_t slash = rest.find('/');
  PlanKeyParts parts;
  if (slash == absl::string_view::npos ||
      !absl::SimpleAtoi(rest.substr(0, slash), &parts.version) ||
      !absl::SimpleAtoi(rest.substr(slash + 1), &parts.node_rank)) {
    return std::nullopt;
  }
  return parts;
}

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_RENDEZVOUS_KEYS_H_
