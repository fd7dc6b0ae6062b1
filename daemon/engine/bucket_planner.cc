#include "daemon/engine/bucket_planner.h"

#include <algorithm>
#include <map>
#include <utility>

#include "common/fnv1a.h"

namespace gradsync {

uint64_t PlanFingerprint(const BucketPlan& plan) {
  Fnv1a h;
  h.AddValue<uint64_t>(plan.buckets.size());
  for (const PlannedBucket& b : plan.buckets) {
    h.AddValue<uint64_t>(b.tensors.size());
    for (uint32_t t : b.tensors) h.AddValue<uint32_t>(t);
    h.AddValue<uint64_t>(b.bytes);
    h.AddValue<int32_t>(static_cast<int32_t>(b.dtype));
  }
  return h.hash();
}

std::vector<uint32_t> ReverseRegistrationOrder(size_t n) {
  std::vector<uint32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(n - 1 - i);
  return order;
}

// A change to how this cuts buckets must raise kBucketCuttingRule
// (daemon/cluster/cluster_link.cc), which the nodes compare when a job forms.
BucketPlan PlanBuckets(const Layout& layout, const std::vector<uint32_t>& order,
                       const BucketCaps& caps) {
  // Like DDP: one open bucket per (dtype, device); each key's first bucket
  // uses the small first cap. Buckets are numbered in the order they close,
  // which is the order their last tensor arrives in `order`.
  struct Open {
    PlannedBucket bucket;
    bool first = true;
  };
  std::map<std::pair<int32_t, int32_t>, Open> open;
  BucketPlan plan;
  plan.bucket_of_tensor.assign(layout.size(), 0);
  auto close = [&plan](PlannedBucket& b) {
    b.id = static_cast<uint32_t>(plan.buckets.size());
    for (uint32_t t : b.tensors) plan.bucket_of_tensor[t] = b.id;
    plan.buckets.push_back(std::move(b));
    b = PlannedBucket{};
  };
  for (uint32_t t : order) {
    const TensorInfo& info = layout[t];
    Open& o = open[{static_cast<int32_t>(info.dtype), info.device}];
    const uint64_t cap = o.first ? caps.first_cap_bytes : caps.cap_bytes;
    if (!o.bucket.tensors.empty() && o.bucket.bytes + info.bytes() > cap) {
      close(o.bucket);
      o.first = false;
    }
    o.bucket.dtype = info.dtype;
    o.bucket.device = info.device;
    o.bucket.tensors.push_back(t);
    o.bucket.bytes += info.bytes();
    // A bucket that reached its cap closes now rather than when the next
    // tensor arrives, so its launch position follows its last tensor.
    if (o.bucket.bytes >= (o.first ? caps.first_cap_bytes : caps.cap_bytes)) {
      close(o.bucket);
      o.first = false;
    }
  }
  // The remaining open buckets, ordered by their last tensor's position.
  std::vector<std::pair<size_t, PlannedBucket*>> rest;
  std::vector<size_t> position(layout.size());
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  for (auto& [key, o] : open) {
    if (!o.bucket.tensors.empty()) rest.emplace_back(position[o.bucket.tensors.back()], &o.bucket);
  }
  std::sort(rest.begin(), rest.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [pos, b] : rest) close(*b);
  return plan;
}

}  // namespace gradsync
