// Bucket planner: which gradients are reduced together, with DDP's rules.
//
// Tensors are taken in `order` (reverse registration order initially, since
// backward produces the last layers' gradients first; later the observed
// ready order). A bucket closes when adding the next tensor would exceed the
// cap (the first bucket has its own, smaller cap so the first collective
// starts early), a tensor is never split (one larger than the cap gets a
// bucket of its own), and a bucket never mixes dtypes or devices.
#ifndef GRADSYNC_DAEMON_ENGINE_BUCKET_PLANNER_H_
#define GRADSYNC_DAEMON_ENGINE_BUCKET_PLANNER_H_

#include <cstdint>
#include <vector>

#include "common/defaults.h"
#include "common/layout.h"

namespace gradsync {

struct PlannedBucket {
  uint32_t id = 0;                // launch order
  std::vector<uint32_t> tensors;  // registration indices, in ready order
  uint64_t bytes = 0;             // payload (no padding)
  DType dtype = DType::kFloat32;
  int32_t device = -1;
};

struct BucketPlan {
  std::vector<PlannedBucket> buckets;
  std::vector<uint32_t> bucket_of_tensor;  // by registration index
};

struct BucketCaps {
  uint64_t cap_bytes = uint64_t{kDefaultBucketCapMib} << 20;
  uint64_t first_cap_bytes = uint64_t{kDefaultFirstBucketCapMib} << 20;
};

// A node's plan as decided at an iteration boundary, what the nodes of a
// job compare (they must be equal field by field on every node).
struct PlanStamp {
  uint64_t plan_version = 0;    // plan decisions so far (1: the initial plan)
  uint64_t fingerprint = 0;     // PlanFingerprint
  uint64_t iteration = 0;       // the first iteration run with it
  uint64_t config_version = 0;  // the last job-wide config version applied
};

// The plan the members of a running job follow, what a node joining it
// must plan with to issue the same collectives: the ready order, the caps
// in force and the plan decisions counted so far.
struct RunningPlan {
  std::vector<uint32_t> order;
  BucketCaps caps;
  uint64_t plan_version = 0;
  // The rank the joiners' trainers receive the job's state from (the
  // lowest rank alive and a member in the iteration before they join).
  int catch_up_root = 0;
};

// `order` must be a permutation of 0..layout.size()-1.
BucketPlan PlanBuckets(const Layout& layout, const std::vector<uint32_t>& order,
                       const BucketCaps& caps);

// What a plan is, as a number every node computes alike (FNV-1a over each
// bucket's tensors in launch order): equal fingerprints, same collectives.
uint64_t PlanFingerprint(const BucketPlan& plan);

// n-1, n-2, ..., 0: the initial order.
std::vector<uint32_t> ReverseRegistrationOrder(size_t n);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_BUCKET_PLANNER_H_
