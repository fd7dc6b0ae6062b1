#include "daemon/engine/bucket_autotuner.h"

#include <algorithm>

namespace gradsync {

std::vector<CapsCandidate> AutotuneCandidates(double min_mb, double max_mb, double gradient_mb) {
  std::vector<double> caps;
  for (double cap = min_mb; cap < max_mb * 1.0001; cap *= 4) caps.push_back(cap);
  if (caps.empty() || caps.back() < max_mb) caps.push_back(max_mb);
  std::vector<CapsCandidate> out;
  for (double cap : caps) {
    for (double first = min_mb; first <= std::min(cap, 4 * min_mb) * 1.0001; first *= 4) {
      out.push_back({std::min(first, cap), cap});
    }
    if (gradient_mb > 0 && cap >= gradient_mb) break;  // larger caps: the same one bucket
  }
  return out;
}

std::optional<size_t> ChooseBest(const std::vector<double>& scores) {
  if (scores.empty()) return std::nullopt;
  size_t best = 0;
  for (size_t i = 1; i < scores.size(); ++i) {
    if (scores[i] < scores[best]) best = i;
  }
  return best;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

BucketAutotuner::BucketAutotuner(std::vector<CapsCandidate> candidates, int skipped, int scored)
    : skipped_(std::max(0, skipped)), scored_(std::max(1, scored)) {
  for (const CapsCandidate& c : candidates) results_.push_back(Result{c, 0, {}, 0});
}

bool BucketAutotuner::OnIterationDone(uint64_t iteration, int64_t end_ns) {
  if (choice_) return true;
  // A step's time needs the previous completion; a gap (a missed report)
  // just loses that one step.
  const bool consecutive = last_iteration_ && *last_iteration_ + 1 == iteration;
  const double step_s = consecutive ? (end_ns - last_end_ns_) * 1e-9 : 0;
  last_iteration_ = iteration;
  last_end_ns_ = end_ns;
  if (!consecutive) return false;
  for (size_t i = 0; i < results_.size(); ++i) {
    Result& r = results_[i];
    if (r.at_iteration == 0) continue;
    const uint64_t first_scored = r.at_iteration + static_cast<uint64_t>(skipped_);
    // The next candidate's boundary ends this one's window early.
    const bool superseded = i + 1 < results_.size() && results_[i + 1].at_iteration != 0 &&
                            iteration >= results_[i + 1].at_iteration;
    if (iteration >= first_scored && !superseded &&
        r.step_s.size() < static_cast<size_t>(scored_)) {
      r.step_s.push_back(step_s);
      r.score_s = Median(r.step_s);
    }
  }
  for (const Result& r : results_) {
    if (r.step_s.size() < static_cast<size_t>(scored_)) return false;
  }
  std::vector<double> scores;
  for (const Result& r : results_) scores.push_back(r.score_s);
  choice_ = ChooseBest(scores);
  return true;
}

}  // namespace gradsync
