#include "daemon/cluster/rendezvous_records.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "daemon/cluster/rendezvous_keys.h"
#include "gradsync/v1/local.pb.h"
#include "gradsync/v1/rendezvous.pb.h"

namespace gradsync {
namespace {

absl::Status Malformed(absl::string_view key, absl::string_view why) {
  return MakeError(v1::INTERNAL, absl::StrCat("rendezvous record ", key, " is malformed: ", why));
}

// The message stored under `key`, or an error naming the key.
template <typename Record>
absl::StatusOr<Record> Parse(absl::string_view key, const std::optional<std::string>& value) {
  if (!value.has_value()) {
    return MakeError(v1::INTERNAL, absl::StrCat("rendezvous record ", key, " is missing"));
  }
  Record record;
  if (!record.ParseFromString(*value)) {
    return Malformed(key, absl::StrCat("not a ", Record::descriptor()->full_name()));
  }
  return record;
}

uint64_t MibToBytes(double mib) { return static_cast<uint64_t>(mib * (1 << 20)); }

absl::StatusOr<BucketCaps> CapsFromRecord(absl::string_view key, const v1::BucketCapsRecord& r) {
  if (!(r.bucket_cap_mb() > 0) || !(r.first_bucket_cap_mb() > 0)) {
    return Malformed(key, absl::StrCat("bucket caps must be > 0, got ", r.bucket_cap_mb(), " and ",
                                       r.first_bucket_cap_mb(), " MiB"));
  }
  // Beyond 2^44 MiB (or inf) the bytes do not fit in 64 bits: converting
  // them would be undefined (found by tests/fuzz:rendezvous_records_fuzz).
  if (!(r.bucket_cap_mb() < 0x1p44) || !(r.first_bucket_cap_mb() < 0x1p44)) {
    return Malformed(
        key, absl::StrCat("bucket caps must be below 2^44 MiB, got ", r.bucket_cap_mb(), " and ",
                          r.first_bucket_cap_mb(), " MiB"));
  }
  return BucketCaps{MibToBytes(r.bucket_cap_mb()), MibToBytes(r.first_bucket_cap_mb())};
}

v1::BucketCapsRecord CapsRecord(double bucket_cap_mb, double first_bucket_cap_mb) {
  v1::BucketCapsRecord r;
  r.set_bucket_cap_mb(bucket_cap_mb);
  r.set_first_bucket_cap_mb(first_bucket_cap_mb);
  return r;
}

}  // namespace

std::string GpuKey(uint64_t generation, absl::string_view name) {
  return absl::StrCat(GenerationKeyPrefix(generation), "gpu/", name);
}

std::string LayoutKey(uint64_t generation, int node_rank) {
  return absl::StrCat(GenerationKeyPrefix(generation), "layout/", node_rank);
}

std::string EncodeLayout(const Layout& layout) {
  v1::RegisterRequest record;
  for (const TensorInfo& t : layout) {
    v1::TensorSpec* s = record.add_tensors();
    s->set_name(t.name);
    s->set_dtype(static_cast<v1::DType>(t.dtype));
    s->set_numel(t.numel);
    // Nodes compare where gradients live (CPU or GPU), not which GPU.
    s->set_device(t.device >= 0 ? 0 : -1);
  }
  return record.SerializeAsString();
}

absl::StatusOr<Layout> DecodeLayout(absl::string_view key,
                                    const std::optional<std::string>& value) {
  ASSIGN_OR_RETURN(v1::RegisterRequest record, Parse<v1::RegisterRequest>(key, value));
  absl::StatusOr<Layout> layout = LayoutFromProto(record.tensors());
  if (!layout.ok()) return Malformed(key, layout.status().message());
  return layout;
}

std::string CapsKey(uint64_t generation) {
  return absl::StrCat(GenerationKeyPrefix(generation), "caps");
}

std::string WireDTypeKey(uint64_t generation, int node_rank) {
  return absl::StrCat(GenerationKeyPrefix(generation), "wire_dtype/", node_rank);
}

std::string UnevenInputsKey(uint64_t generation) {
  return absl::StrCat(GenerationKeyPrefix(generation), "uneven_inputs");
}

std::string CheckReplicasEveryKey(uint64_t generation, int node_rank) {
  return absl::StrCat(GenerationKeyPrefix(generation), "check_replicas_every/", node_rank);
}

std::string MinNodesKey(uint64_t generation, int node_rank) {
  return absl::StrCat(GenerationKeyPrefix(generation), "min_nodes/", node_rank);
}

std::string AutotuneKey(uint64_t generation, int node_rank) {
  return absl::StrCat(GenerationKeyPrefix(generation), "autotune/", node_rank);
}

std::string EncodeCaps(double bucket_cap_mb, double first_bucket_cap_mb) {
  return CapsRecord(bucket_cap_mb, first_bucket_cap_mb).SerializeAsString();
}

absl::StatusOr<BucketCaps> DecodeCaps(absl::string_view key,
                                      const std::optional<std::string>& value) {
  ASSIGN_OR_RETURN(v1::BucketCapsRecord record, Parse<v1::BucketCapsRecord>(key, value));
  return CapsFromRecord(key, record);
}

std::string ConfigKey(uint64_t generation, uint64_t version) {
  return absl::StrCat(GenerationKeyPrefix(generation), "config/", version);
}

std::string EncodeConfig(uint64_t generation, uint64_t at_iteration, double bucket_cap_mb,
                         double first_bucket_cap_mb) {
  v1::ConfigRecord record;
  record.set_generation(generation);
  record.set_at_iteration(at_iteration);
  *record.mutable_caps() = CapsRecord(bucket_cap_mb, first_bucket_cap_mb);
  return record.SerializeAsString();
}

std::string EncodeGrowConfig(uint64_t generation, uint64_t at_iteration) {
  v1::ConfigRecord record;
  record.set_generation(generation);
  record.set_at_iteration(at_iteration);
  record.set_grow(true);
  return record.SerializeAsString();
}

absl::StatusOr<JobConfigChange> DecodeConfig(absl::string_view key,
                                             const std::optional<std::string>& value) {
  ASSIGN_OR_RETURN(v1::ConfigRecord record, Parse<v1::ConfigRecord>(key, value));
  JobConfigChange change;
  if (record.grow()) {
    change.grow = true;
    change.generation = record.generation();
    change.at_iteration = record.at_iteration();
    return change;
  }
  if (!record.has_caps()) return Malformed(key, "no bucket caps");
  ASSIGN_OR_RETURN(change.caps, CapsFromRecord(key, record.caps()));
  change.generation = record.generation();
  change.at_iteration = record.at_iteration();
  change.bucket_cap_mb = record.caps().bucket_cap_mb();
  change.first_bucket_cap_mb = record.caps().first_bucket_cap_mb();
  return change;
}

std::string RunningPlanKey(uint64_t generation) {
  return absl::StrCat(GenerationKeyPrefix(generation), "running_plan");
}

std::string EncodeRunningPlan(const RunningPlan& plan) {
  v1::RunningPlanRecord record;
  for (uint32_t t : plan.order) record.add_order(t);
  // Bytes to MiB and back are exact: a division by a power of two.
  *record.mutable_caps() = CapsRecord(plan.caps.cap_bytes / double(1 << 20),
                                      plan.caps.first_cap_bytes / double(1 << 20));
  record.set_plan_version(plan.plan_version);
  record.set_catch_up_root(plan.catch_up_root);
  return record.SerializeAsString();
}

absl::StatusOr<RunningPlan> DecodeRunningPlan(absl::string_view key,
                                              const std::optional<std::string>& value,
                                              size_t num_tensors) {
  ASSIGN_OR_RETURN(v1::RunningPlanRecord record, Parse<v1::RunningPlanRecord>(key, value));
  RunningPlan plan;
  ASSIGN_OR_RETURN(plan.caps, CapsFromRecord(key, record.caps()));
  plan.plan_version = record.plan_version();
  if (record.catch_up_root() < 0) return Malformed(key, "a negative catch_up_root");
  plan.catch_up_root = record.catch_up_root();
  // The same checks as node 0's rebuilt order: a permutation of the layout.
  v1::PlanOrderRecord order;
  *order.mutable_order() = record.order();
  ASSIGN_OR_RETURN(plan.order, DecodeOrder(key, order.SerializeAsString(), num_tensors));
  if (plan.order.empty()) return Malformed(key, "no order");
  if (plan.plan_version == 0) return Malformed(key, "plan_version 0");
  return plan;
}

std::string PlanKey(uint64_t generation, uint64_t plan_version, int node_rank) {
  return absl::StrCat(PlanKeyPrefix(generation), plan_version, "/", node_rank);
}

std::string EncodePlanStamp(const PlanStamp& stamp) {
  v1::PlanStampRecord record;
  record.set_plan_version(stamp.plan_version);
  record.set_fingerprint(stamp.fingerprint);
  record.set_iteration(stamp.iteration);
  record.set_config_version(stamp.config_version);
  return record.SerializeAsString();
}

absl::StatusOr<PlanStamp> DecodePlanStamp(absl::string_view key,
                                          const std::optional<std::string>& value) {
  ASSIGN_OR_RETURN(v1::PlanStampRecord record, Parse<v1::PlanStampRecord>(key, value));
  return PlanStamp{record.plan_version(), record.fingerprint(), record.iteration(),
                   record.config_version()};
}

absl::Status ComparePlanStamps(const std::vector<PlanStamp>& by_node) {
  auto describe = [](const PlanStamp& s) {
    return absl::StrFormat("config version %d from iteration %d (plan fingerprint %016x)",
                           s.config_version, s.iteration, s.fingerprint);
  };
  for (size_t n = 1; n < by_node.size(); ++n) {
    const PlanStamp& a = by_node[0];
    const PlanStamp& b = by_node[n];
    if (a.fingerprint == b.fingerprint && a.iteration == b.iteration &&
        a.config_version == b.config_version && a.plan_version == b.plan_version) {
      continue;
    }
    return MakeError(v1::MISMATCH,
                     absl::StrCat("bucket plans diverged at plan version ", a.plan_version,
                                  ": node 0 has ", describe(a), ", node ", n, " has ", describe(b),
                                  " (plan version ", b.plan_version, ")"));
  }
  return absl::OkStatus();
}

std::string OrderKey(uint64_t generation) {
  return absl::StrCat(GenerationKeyPrefix(generation), "order");
}

std::string EncodeOrder(const std::vector<uint32_t>& order) {
  v1::PlanOrderRecord record;
  record.mutable_order()->Add(order.begin(), order.end());
  return record.SerializeAsString();
}

absl::StatusOr<std::vector<uint32_t>> DecodeOrder(absl::string_view key,
                                                  const std::optional<std::string>& value,
                                                  size_t num_tensors) {
  ASSIGN_OR_RETURN(v1::PlanOrderRecord record, Parse<v1::PlanOrderRecord>(key, value));
  if (record.order_size() != 0 && static_cast<size_t>(record.order_size()) != num_tensors) {
    return Malformed(key,
                     absl::StrCat(record.order_size(), " indices for ", num_tensors, " tensors"));
  }
  std::vector<bool> seen(num_tensors, false);
  for (uint32_t v : record.order()) {
    if (v >= num_tensors || seen[v]) {
      return Malformed(key, absl::StrCat("index ", v, " is out of range or repeated"));
    }
    seen[v] = true;
  }
  return std::vector<uint32_t>(record.order().begin(), record.order().end());
}

}  // namespace gradsync
