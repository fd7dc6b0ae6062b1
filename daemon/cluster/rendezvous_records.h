// The records daemons exchange through the rendezvous key-value store: each
// record's key and its value, one serialized gradsync.v1 message
// (rendezvous.proto). Writers and readers of a record both go through here,
// so the format lives in one place. A reader refuses a missing value or one
// that does not parse or fails its checks with an INTERNAL error naming the
// key: a bad record fails the job clearly, it never crashes the daemon.
#ifndef GRADSYNC_DAEMON_CLUSTER_RENDEZVOUS_RECORDS_H_
#define GRADSYNC_DAEMON_CLUSTER_RENDEZVOUS_RECORDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/layout.h"
#include "daemon/engine/bucket_planner.h"

namespace gradsync {

// A node's registered layout in a generation ("g<gen>/layout/<rank>").
std::string LayoutKey(uint64_t generation, int node_rank);
std::string EncodeLayout(const Layout& layout);
absl::StatusOr<Layout> DecodeLayout(absl::string_view key, const std::optional<std::string>& value);

// Node 0's bucket caps in a generation ("g<gen>/caps"), in MiB as set.
std::string CapsKey(uint64_t generation);
std::string EncodeCaps(double bucket_cap_mb, double first_bucket_cap_mb);
absl::StatusOr<BucketCaps> DecodeCaps(absl::string_view key,
                                      const std::optional<std::string>& value);

// Each node's --wire-dtype, published at join ("g<gen>/wire_dtype/<rank>").
std::string WireDTypeKey(uint64_t generation, int node_rank);
// Node 0's --uneven-inputs, "1" or "0" ("g<gen>/uneven_inputs").
std::string UnevenInputsKey(uint64_t generation);
// Each node's --check-replicas-every, published at join before its layout
// ("g<gen>/check_replicas_every/<rank>"): the nodes compare fingerprints
// together, so all must check at the same iterations.
std::string CheckReplicasEveryKey(uint64_t generation, int node_rank);
// Each node's --min-nodes, decimal ("g<gen>/min_nodes/<rank>"): a node that
// would fail at a death while the others re-form must not join them.
std::string MinNodesKey(uint64_t generation, int node_rank);
// Each node's --autotune, "on" or "off" ("g<gen>/autotune/<rank>"): the
// generation's first member tunes for all, so a node without it must not
// join nodes with it (its stats would name a tuner that does not tune).
std::string AutotuneKey(uint64_t generation, int node_rank);

// A job-wide caps change published by the leader, version `version` of the
// generation's ordered config log ("g<gen>/config/<version>").
struct JobConfigChange {
  uint64_t generation = 0;    // the generation it was made for
  uint64_t at_iteration = 0;  // every node switches at this iteration
  double bucket_cap_mb = 0;
  double first_bucket_cap_mb = 0;
  BucketCaps caps;  // the same caps in bytes
  // Not a caps change (no caps): nodes join the running job at this
  // iteration's boundary (ConfigRecord.grow).
  bool grow = false;
};
std::string ConfigKey(uint64_t generation, uint64_t version);
// The leader's entry admitting nodes that wait to join the running job.
std::string EncodeGrowConfig(uint64_t generation, uint64_t at_iteration);
std::string EncodeConfig(uint64_t generation, uint64_t at_iteration, double bucket_cap_mb,
                         double first_bucket_cap_mb);
absl::StatusOr<JobConfigChange> DecodeConfig(absl::string_view key,
                                             const std::optional<std::string>& value);

// Node 0's rebuilt bucket order in a generation ("g<gen>/order"): must be a
// permutation of [0, num_tensors), or empty: node 0 observed no order (its
// local rank 0 joined before the first iteration) and no node rebuilds.
std::string OrderKey(uint64_t generation);
std::string EncodeOrder(const std::vector<uint32_t>& order);
absl::StatusOr<std::vector<uint32_t>> DecodeOrder(absl::string_view key,
                                                  const std::optional<std::string>& value,
                                                  size_t num_tensors);

// What a node joining a running job plans with ("g<gen>/running_plan"):
// the members' ready order, caps and plan decisions so far.
std::string RunningPlanKey(uint64_t generation);
std::string EncodeRunningPlan(const RunningPlan& plan);
absl::StatusOr<RunningPlan> DecodeRunningPlan(absl::string_view key,
                                              const std::optional<std::string>& value,
                                              size_t num_tensors);

// A node's plan decision ("g<gen>/plan/<plan_version>/<rank>").
std::string PlanKey(uint64_t generation, uint64_t plan_version, int node_rank);
std::string EncodePlanStamp(const PlanStamp& stamp);
absl::StatusOr<PlanStamp> DecodePlanStamp(absl::string_view key,
                                          const std::optional<std::string>& value);
// Every node's stamp for one plan version, by node rank: OK when all equal
// node 0's, else MISMATCH naming node 0's and the first differing node's
// config versions, iterations and fingerprints.
absl::Status ComparePlanStamps(const std::vector<PlanStamp>& by_node);

// What the GPU path exchanges in a generation ("g<gen>/gpu/<name>"): each
// node's GPU count, the NCCL unique id. Opaque bytes, scoped to the job's
// generation so a stale value is never read.
std::string GpuKey(uint64_t generation, absl::string_view name);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_RENDEZVOUS_RECORDS_H_
