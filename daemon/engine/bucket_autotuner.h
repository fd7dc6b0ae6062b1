// BucketAutotuner: the pure core of --autotune (no clock, no threads, no
// I/O), so its candidates, scoring and choice are unit-tested directly.
//
// The leader tries candidate (first bucket cap, bucket cap) pairs one after
// another, each for a few iterations, and scores each by the median of its
// iterations' step times (time between consecutive iteration completions),
// skipping the first iteration after each re-plan (the re-plan itself, cold
// staging). The lowest median wins; ties go to the earlier candidate, so the
// choice is deterministic given the same times.
#ifndef GRADSYNC_DAEMON_ENGINE_BUCKET_AUTOTUNER_H_
#define GRADSYNC_DAEMON_ENGINE_BUCKET_AUTOTUNER_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace gradsync {

struct CapsCandidate {
  double first_bucket_cap_mb = 0;
  double bucket_cap_mb = 0;
  bool operator==(const CapsCandidate& o) const {
    return first_bucket_cap_mb == o.first_bucket_cap_mb && bucket_cap_mb == o.bucket_cap_mb;
  }
};

// Log-spaced (factor 4) caps from min_mb up to max_mb (both included), each
// paired with first caps from the same series up to min(cap, 4 * min_mb).
// Caps at or above `gradient_mb` (the model's gradients, 0: unknown) all give
// one bucket, so only the smallest of them is kept.
std::vector<CapsCandidate> AutotuneCandidates(double min_mb = 0.25, double max_mb = 200,
                                              double gradient_mb = 0);

// The index of the lowest score, the first of equal ones; nullopt when empty.
std::optional<size_t> ChooseBest(const std::vector<double>& scores);

// The median (mean of the middle two for an even count); 0 when empty.
double Median(std::vector<double> values);

class BucketAutotuner {
 public:
  struct Result {
    CapsCandidate caps;
    uint64_t at_iteration = 0;   // the boundary it applied at (0: not yet placed)
    std::vector<double> step_s;  // the scored iterations' step times
    double score_s = 0;          // their median
  };

  // `skipped` iterations after each re-plan are not scored, then `scored` are.
  BucketAutotuner(std::vector<CapsCandidate> candidates, int skipped = 1, int scored = 3);

  // Iterations one candidate occupies.
  uint64_t span() const { return static_cast<uint64_t>(skipped_ + scored_); }
  // Candidate i applies at the boundary entering `at` (strictly increasing).
  void Place(size_t i, uint64_t at) { results_[i].at_iteration = at; }
  // Iteration `iteration` completed at `end_ns` (steady clock). Returns true
  // once every candidate has its scored iterations (then choice() is set).
  bool OnIterationDone(uint64_t iteration, int64_t end_ns);

  bool done() const { return choice_.has_value(); }
  std::optional<size_t> choice() const { return choice_; }
  const std::vector<Result>& results() const { return results_; }

 private:
  std::vector<Result> results_;
  int skipped_, scored_;
  std::optional<uint64_t> last_iteration_;
  int64_t last_end_ns_ = 0;
  std::optional<size_t> choice_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_BUCKET_AUTOTUNER_H_
