#include "daemon/engine/gpu_reducer.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

// Between polls of events and streams: short, since a bucket's latency is
// the poll granularity, but long enough not to starve the device thread
// of a simulated device (or a trainer) on a small machine.
constexpr auto kPollPause = std::chrono::microseconds(20);

absl::Status Aborted() {
  return MakeError(v1::PEER_FAILED, "the job failed while this bucket was being reduced");
}

}  // namespace

GpuReducer::GpuReducer(GpuSession* session, const Layout& layout, int world_size,
                       bool skip_event_wait)
    : session_(session),
      layout_(layout),
      world_size_(world_size),
      skip_event_wait_(skip_event_wait),
      trainers_on_device_(session->devices().size()) {
  for (size_t t = 0; t < session->num_trainers(); ++t) {
    trainers_on_device_[session->device_index(t)].push_back(t);
  }
  buffers_.reserve(session->devices().size());
  srcs_.reserve(session->num_trainers());
  pending_.reserve(session->num_trainers() * layout.size());
}

void GpuReducer::Pieces(const PlannedBucket& bucket, const std::vector<ReduceSpan>& flat_spans,
                        std::vector<Piece>* out) const {
  out->clear();
  uint64_t staged = 0;
  if (session_->flat()) {
    for (const ReduceSpan& s : flat_spans) {
      out->push_back({s.offset, 0, s.bytes, staged});
      staged += s.bytes;
    }
  } else {
    // The bucket's own tensor order: identical in every trainer (and node).
    for (uint32_t i : bucket.tensors) {
      out->push_back({0, i, layout_[i].bytes(), staged});
      staged += layout_[i].bytes();
    }
  }
}

void* GpuReducer::At(size_t trainer, const Piece& p) const {
  return session_->flat() ? static_cast<void*>(session_->flat_base(trainer) + p.flat_offset)
                          : session_->tensor(trainer, p.tensor);
}

absl::Status GpuReducer::Prepare(const BucketPlan& plan,
                                 const std::vector<std::vector<ReduceSpan>>& flat_spans) {
  uint64_t staging = 0;
  for (const PlannedBucket& b : plan.buckets) {
    Pieces(b, flat_spans[b.id], &pieces_);
    if (pieces_.size() <= 1) continue;  // reduced in place
    staging = std::max(staging, pieces_.back().staging_offset + pieces_.back().bytes);
  }
  return session_->EnsureStaging(staging);
}

absl::Status GpuReducer::WaitEvents(const PlannedBucket& bucket, absl::Time deadline,
                                    int* culprit) {
  pending_.clear();
  for (size_t t = 0; t < session_->num_trainers(); ++t) {
    for (uint32_t i : bucket.tensors) pending_.emplace_back(t, i);
  }
  gpu::DaemonDevice& device = session_->device();
  const absl::Time start = MonotonicNow();
  bool stall_reported = false;
  while (true) {
    size_t kept = 0;
    for (const auto& [t, i] : pending_) {
      absl::StatusOr<gpu::Completion> c = device.QueryEvent(session_->event(t, i));
      if (!c.ok()) {
        device_error_ = c.status();
        // The trainer's context died or its event is bad: its fault alone.
        *culprit = static_cast<int>(t);
        return MakeError(
            v1::INTERNAL,
            absl::StrCat(session_->trainer_name(t), ": the readiness event of tensor ", i, " '",
                         layout_[i].name, "' failed: ", c.status().message()));
      }
      if (*c == gpu::Completion::kPending) pending_[kept++] = {t, i};
    }
    pending_.resize(kept);
    if (pending_.empty()) return absl::OkStatus();
    if (session_->aborted()) return Aborted();
    const absl::Time now = MonotonicNow();
    if (!stall_reported && stall_ && now - start >= absl::Seconds(stall_threshold_s_)) {
      stall_reported = true;
      const auto& [t, i] = pending_.front();
      stall_(
          bucket.id, absl::ToDoubleSeconds(now - start),
          absl::StrCat(
              session_->trainer_name(t), "'s readiness event of tensor '", layout_[i].name,
              "' is pending",
              pending_.size() > 1 ? absl::StrCat(" (", pending_.size() - 1, " more events)") : ""));
    }
    if (now >= deadline) {
      const auto& [t, i] = pending_.front();
      return MakeError(
          v1::TIMEOUT,
          absl::StrCat(
              session_->trainer_name(t), " marked tensor ", i, " '", layout_[i].name,
              "' ready but its readiness event never completed (the work "
              "queued before gs_mark_ready on its stream is stuck)",
              pending_.size() > 1 ? absl::StrCat("; ", pending_.size() - 1, " more pending") : ""));
    }
    std::this_thread::sleep_for(kPollPause);
  }
}

absl::Status GpuReducer::WaitStreams(absl::Time deadline, const char* what) {
  gpu::DaemonDevice& device = session_->device();
  for (size_t d = 0; d < session_->devices().size(); ++d) {
    while (true) {
      absl::StatusOr<gpu::Completion> c = device.QueryStream(session_->stream(d));
      if (!c.ok()) {
        device_error_ = c.status();
        return MakeError(v1::INTERNAL, absl::StrCat(what, " on ", session_->devices()[d],
                                                    " failed: ", c.status().message()));
      }
      if (*c == gpu::Completion::kDone) break;
      if (session_->aborted()) return Aborted();
      if (MonotonicNow() >= deadline) {
        return MakeError(v1::TIMEOUT, absl::StrCat(what, " on ", session_->devices()[d],
                                                   " did not finish in time"));
      }
      std::this_thread::sleep_for(kPollPause);
    }
  }
  return absl::OkStatus();
}

absl::Status GpuReducer::Reduce(const PlannedBucket& bucket,
                                const std::vector<ReduceSpan>& flat_spans, absl::Time deadline,
                                ReduceTimings* timings, int* culprit) {
  *culprit = kNoCulprit;
  device_error_ = absl::OkStatus();
  const int64_t start = MonotonicNowNs();
  // TEST ONLY when skipped (gradsyncd_sim --unsafe-skip-event-wait): the
  // reduction then races the trainers' streams, which the tests must see.
  if (!skip_event_wait_) {
    RETURN_IF_ERROR(WaitEvents(bucket, deadline, culprit));
  }
  gpu::DaemonDevice& device = session_->device();
  Pieces(bucket, flat_spans, &pieces_);
  const bool in_place = pieces_.size() == 1;
  const size_t elem = DTypeSize(bucket.dtype);
  const uint64_t total = pieces_.back().staging_offset + pieces_.back().bytes;
  // In double: fp64 buckets are scaled in fp64; the kernel rounds it to fp32
  // for the other types.
  const double scale = 1.0 / static_cast<double>(world_size_);

  buffers_.clear();
  for (size_t d = 0; d < trainers_on_device_.size(); ++d) {
    const std::vector<size_t>& here = trainers_on_device_[d];
    gpu::Stream* stream = session_->stream(static_cast<int>(d));
    uint8_t* dst = in_place ? static_cast<uint8_t*>(At(here[0], pieces_[0])) : session_->staging(d);
    for (const Piece& p : pieces_) {
      srcs_.clear();
      for (size_t t : here) srcs_.push_back(At(t, p));
      void* out = in_place ? static_cast<void*>(dst) : dst + p.staging_offset;
      if (absl::Status st =
              device.SumAsync(out, srcs_, p.bytes / elem, bucket.dtype, scale, stream);
          !st.ok()) {
        device_error_ = st;
        return MakeError(v1::INTERNAL, absl::StrCat("summing bucket ", bucket.id, " on ",
                                                    session_->devices()[d], ": ", st.message()));
      }
    }
    buffers_.push_back({static_cast<int>(d), dst, total / elem});
  }
  // The collective never waits on our stream: it starts once the sums are seen done.
  RETURN_IF_ERROR(WaitStreams(deadline, "the local sum"));
  const int64_t summed = MonotonicNowNs();

  if (absl::Status st = session_->collectives().AllreduceSum(buffers_, bucket.dtype); !st.ok()) {
    device_error_ = st;
    *culprit = kCollective;
    return st;
  }
  const int64_t reduced = MonotonicNowNs();

  for (size_t d = 0; d < trainers_on_device_.size(); ++d) {
    const std::vector<size_t>& here = trainers_on_device_[d];
    gpu::Stream* stream = session_->stream(static_cast<int>(d));
    const uint8_t* result = static_cast<const uint8_t*>(buffers_[d].data);
    for (size_t k = in_place ? 1 : 0; k < here.size(); ++k) {
      for (const Piece& p : pieces_) {
        const void* from = in_place ? static_cast<const void*>(result) : result + p.staging_offset;
        if (absl::Status st = device.CopyAsync(At(here[k], p), from, p.bytes, stream); !st.ok()) {
          device_error_ = st;
          return MakeError(v1::INTERNAL,
                           absl::StrCat("writing bucket ", bucket.id, " back to ",
                                        session_->trainer_name(here[k]), ": ", st.message()));
        }
      }
    }
  }
  RETURN_IF_ERROR(WaitStreams(deadline, "writing the result back"));
  const int64_t done = MonotonicNowNs();
  timings->local_reduce_ns = (summed - start) + (done - reduced);
  timings->collective_ns = reduced - summed;
  timings->write_back_ns = done - reduced;
  return absl::OkStatus();
}

}  // namespace gradsync
