#include "daemon/engine/gpu_reducer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/half.h"
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

// One element of `dtype` at `p`, as a double (NaN and Inf kept).
double ElementValue(const uint8_t* p, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, p, sizeof v);
      return v;
    }
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, p, sizeof v);
      return v;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t v;
      std::memcpy(&v, p, sizeof v);
      return dtype == DType::kFloat16 ? Float16ToFloat(v) : BFloat16ToFloat(v);
    }
  }
  return 0;
}

// A quiet NaN of `dtype` at `p`.
void WriteNaN(DType dtype, uint8_t* p) {
  const float f = std::numeric_limits<float>::quiet_NaN();
  const double d = std::numeric_limits<double>::quiet_NaN();
  const uint16_t half = 0x7e00, bf16 = 0x7fc0;
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(p, &f, sizeof f);
      return;
    case DType::kFloat64:
      std::memcpy(p, &d, sizeof d);
      return;
    case DType::kFloat16:
      std::memcpy(p, &half, sizeof half);
      return;
    case DType::kBFloat16:
      std::memcpy(p, &bf16, sizeof bf16);
      return;
  }
}

}  // namespace

GpuReducer::GpuReducer(GpuSession* session, const Layout& layout, int world_size,
                       bool skip_event_wait, bool keep_sums)
    : session_(session),
      layout_(layout),
      world_size_(world_size),
      skip_event_wait_(skip_event_wait),
      keep_sums_(keep_sums),
      active_(session->num_trainers(), true),
      trainers_on_device_(session->devices().size()) {
  for (size_t t = 0; t < session->num_trainers(); ++t) {
    trainers_on_device_[session->device_index(t)].push_back(t);
  }
  buffers_.reserve(session->devices().size());
  srcs_.reserve(session->num_trainers());
  pending_.reserve(session->num_trainers() * layout.size());
}

void GpuReducer::DeactivateTrainer(size_t t) {
  if (t >= active_.size() || !active_[t]) return;
  active_[t] = false;
  std::vector<size_t>& here = trainers_on_device_[session_->device_index(t)];
  here.erase(std::remove(here.begin(), here.end(), t), here.end());
}

absl::Status GpuReducer::ReplaceTrainer(size_t t, const GpuTrainerSpec& spec,
                                        const std::string& name) {
  if (t >= active_.size() || active_[t]) {
    return MakeError(v1::INTERNAL,
                     absl::StrCat(name, ": local rank ", t, " is not a dead trainer's slot"));
  }
  if (absl::Status st = session_->ReplaceTrainer(t, spec, name, layout_); !st.ok()) {
    device_error_ = st;
    return st;
  }
  active_[t] = true;
  // In session order, as at the start: every GPU sums its trainers alike.
  std::vector<size_t>& here = trainers_on_device_[session_->device_index(t)];
  here.insert(std::upper_bound(here.begin(), here.end(), t), t);
  return absl::OkStatus();
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
  uint64_t kept = 0;
  kept_offset_.assign(plan.buckets.size(), 0);
  kept_world_.assign(plan.buckets.size(), 0);
  for (const PlannedBucket& b : plan.buckets) {
    Pieces(b, flat_spans[b.id], &pieces_);
    if (pieces_.empty()) continue;
    const uint64_t bytes = pieces_.back().staging_offset + pieces_.back().bytes;
    if (keep_sums_) {
      kept_offset_[b.id] = kept;
      kept += bytes;
    }
    if (pieces_.size() <= 1 && !keep_sums_) continue;  // reduced in place
    staging = std::max(staging, bytes);
  }
  if (keep_sums_) RETURN_IF_ERROR(session_->EnsureKeptSums(kept));
  kept_bytes_ = kept;
  // Laid out like the kept sums: a bucket's input at its kept offset.
  if (keep_sums_ && keep_inputs_) RETURN_IF_ERROR(session_->EnsureInputCopies(kept));
  return session_->EnsureStaging(staging);
}

absl::Status GpuReducer::SetKeepInputs(bool keep, absl::Time deadline) {
  if (keep) {
    keep_inputs_ = true;
    if (!keep_sums_ || kept_bytes_ == 0) return absl::OkStatus();  // Prepare allocates
    absl::Status st = session_->EnsureInputCopies(kept_bytes_);
    if (!st.ok()) keep_inputs_ = false;
    return st;
  }
  keep_inputs_ = false;
  // The last reduction's copies may still be queued on the streams.
  RETURN_IF_ERROR(WaitStreams(deadline, "the input copies' last writes"));
  session_->FreeInputCopies();
  return absl::OkStatus();
}

absl::Status GpuReducer::WaitEvents(const PlannedBucket& bucket, absl::Time deadline,
                                    int* culprit) {
  pending_.clear();
  for (size_t t = 0; t < session_->num_trainers(); ++t) {
    if (!active_[t]) continue;
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

absl::Status GpuReducer::SumTrainers(const PlannedBucket& bucket, size_t d, uint8_t* dst,
                                     bool in_place, const gpu::NonFiniteCheck& check) {
  const size_t elem = DTypeSize(bucket.dtype);
  // In double: fp64 buckets are scaled in fp64; the kernel rounds it to fp32
  // for the other types.
  const double scale = 1.0 / static_cast<double>(world_size_);
  for (const Piece& p : pieces_) {
    srcs_.clear();
    for (size_t t : trainers_on_device_[d]) srcs_.push_back(At(t, p));
    void* out = in_place ? static_cast<void*>(dst) : dst + p.staging_offset;
    if (srcs_.empty()) {
      // Every trainer on this GPU died: it still takes part in the collective.
      RETURN_IF_ERROR(
          session_->device().ZeroAsync(out, p.bytes, session_->stream(static_cast<int>(d))));
      continue;
    }
    RETURN_IF_ERROR(session_->device().SumAsync(out, srcs_, p.bytes / elem, bucket.dtype, scale,
                                                check, session_->stream(static_cast<int>(d))));
  }
  return absl::OkStatus();
}

absl::Status GpuReducer::CopyInputs(const PlannedBucket& bucket, size_t d) {
  gpu::Stream* stream = session_->stream(static_cast<int>(d));
  for (size_t t : trainers_on_device_[d]) {
    uint8_t* copy = session_->input_copy(t) + kept_offset_[bucket.id];
    for (const Piece& p : pieces_) {
      RETURN_IF_ERROR(
          session_->device().CopyAsync(copy + p.staging_offset, At(t, p), p.bytes, stream));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> GpuReducer::RestoreInputs(
    const BucketPlan& plan, const std::vector<std::vector<ReduceSpan>>& flat_spans,
    absl::Time deadline) {
  device_error_ = absl::OkStatus();
  size_t restored = 0;
  for (const PlannedBucket& b : plan.buckets) {
    if (!keep_inputs_ || kept_world_[b.id] == 0) continue;
    // Its kept sum holds the dead trainer's part: summed again instead.
    kept_world_[b.id] = 0;
    ++restored;
    RETURN_IF_ERROR(RestoreBucket(b, flat_spans[b.id]));
  }
  RETURN_IF_ERROR(WaitStreams(deadline, "restoring the survivors' gradients"));
  return restored;
}

absl::Status GpuReducer::RestoreBucket(const PlannedBucket& bucket,
                                       const std::vector<ReduceSpan>& flat_spans) {
  // Only the active trainers: a dead one's memory is never written again.
  Pieces(bucket, flat_spans, &pieces_);
  for (size_t d = 0; d < trainers_on_device_.size(); ++d) {
    gpu::Stream* stream = session_->stream(static_cast<int>(d));
    for (size_t t : trainers_on_device_[d]) {
      const uint8_t* copy = session_->input_copy(t) + kept_offset_[bucket.id];
      for (const Piece& p : pieces_) {
        if (absl::Status st =
                session_->device().CopyAsync(At(t, p), copy + p.staging_offset, p.bytes, stream);
            !st.ok()) {
          device_error_ = st;
          return MakeError(v1::INTERNAL,
                           absl::StrCat("restoring bucket ", bucket.id, " of ",
                                        session_->trainer_name(t), ": ", st.message()));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status GpuReducer::LaunchSums(const PlannedBucket& bucket, bool in_place, uint32_t token) {
  gpu::DaemonDevice& device = session_->device();
  const size_t elem = DTypeSize(bucket.dtype);
  const uint64_t total = pieces_.back().staging_offset + pieces_.back().bytes;
  const int kept_world = keep_sums_ ? kept_world_[bucket.id] : 0;
  const size_t active_count = ActiveTrainers();
  buffers_.clear();
  for (size_t d = 0; d < trainers_on_device_.size(); ++d) {
    const std::vector<size_t>& here = trainers_on_device_[d];
    gpu::Stream* stream = session_->stream(static_cast<int>(d));
    uint8_t* dst = in_place ? static_cast<uint8_t*>(At(here[0], pieces_[0])) : session_->staging(d);
    uint8_t* kept =
        keep_sums_ ? session_->kept_sums(static_cast<int>(d)) + kept_offset_[bucket.id] : nullptr;
    gpu::NonFiniteCheck check;
    if (token != 0) check = {session_->nonfinite_flag(static_cast<int>(d)), token};
    absl::Status st;
    if (kept_world > 0) {
      // The redo: the kept sum was pre-scaled by 1/kept_world; the
      // trainers' memory may hold an average already.
      srcs_.assign(1, kept);
      st = device.SumAsync(dst, srcs_, total / elem, bucket.dtype,
                           static_cast<double>(kept_world) / world_size_, check, stream);
    } else {
      // Ahead of the sum on the same stream: the trainers' inputs as summed.
      if (keep_inputs_ && active_count >= 2) st = CopyInputs(bucket, d);
      if (st.ok()) st = SumTrainers(bucket, d, dst, in_place, check);
      // Behind the sum on the same stream: complete once WaitStreams saw it.
      if (st.ok() && kept != nullptr) st = device.CopyAsync(kept, dst, total, stream);
    }
    if (!st.ok()) {
      device_error_ = st;
      return MakeError(v1::INTERNAL, absl::StrCat("summing bucket ", bucket.id, " on ",
                                                  session_->devices()[d], ": ", st.message()));
    }
    // Behind the sums on the same stream: read once WaitStreams saw it done.
    if (token != 0) {
      if (absl::Status st = device.CopyToHostAsync(&session_->host_window().flags[d], check.flag,
                                                   sizeof(uint32_t), stream);
          !st.ok()) {
        device_error_ = st;
        return MakeError(v1::INTERNAL, absl::StrCat("reading the non-finite flag on ",
                                                    session_->devices()[d], ": ", st.message()));
      }
    }
    buffers_.push_back({static_cast<int>(d), dst, total / elem});
  }
  return absl::OkStatus();
}

absl::Status GpuReducer::CheckSums(const PlannedBucket& bucket, uint32_t token, absl::Time deadline,
                                   GpuNonFiniteReport* report) {
  const GpuSession::HostWindow& w = session_->host_window();
  bool any = false;
  for (size_t d = 0; d < buffers_.size(); ++d) any = any || w.flags[d] == token;
  if (!any) return absl::OkStatus();
  std::vector<bool> hit(buffers_.size());  // rare from here on: allocating is fine
  for (size_t d = 0; d < buffers_.size(); ++d) hit[d] = w.flags[d] == token;
  RETURN_IF_ERROR(FindCulprit(bucket, hit, deadline, report));
  // A NaN in the collective's input: every node's result holds one, so
  // every node sees this bucket fail (or skip) alike, whatever it summed.
  const size_t elem = DTypeSize(bucket.dtype);
  WriteNaN(bucket.dtype, w.nan);
  for (size_t d = 0; d < buffers_.size(); ++d) {
    if (!hit[d]) continue;
    gpu::Stream* stream = session_->stream(static_cast<int>(d));
    absl::Status st = session_->device().CopyFromHostAsync(buffers_[d].data, w.nan, elem, stream);
    // A redo from the kept sum must carry the mark too.
    if (st.ok() && keep_sums_) {
      st = session_->device().CopyFromHostAsync(
          session_->kept_sums(static_cast<int>(d)) + kept_offset_[bucket.id], w.nan, elem, stream);
    }
    if (!st.ok()) {
      device_error_ = st;
      return MakeError(v1::INTERNAL,
                       absl::StrCat("marking bucket ", bucket.id, " not finite: ", st.message()));
    }
  }
  RETURN_IF_ERROR(WaitStreams(deadline, "marking the bucket not finite"));
  report->result_non_finite = true;
  return absl::OkStatus();
}

absl::Status GpuReducer::FindCulprit(const PlannedBucket& bucket, const std::vector<bool>& hit,
                                     absl::Time deadline, GpuNonFiniteReport* report) {
  // Rare: read the gradients through the host window, piece by piece in the
  // bucket's order. Where a result was not finite, a trainer summed into in
  // place still holds its own input (the kernel keeps it); elsewhere it
  // holds a finite sum, as its input was.
  const GpuSession::HostWindow& w = session_->host_window();
  const size_t elem = DTypeSize(bucket.dtype);
  const uint64_t window = GpuSession::kSearchBytes / elem * elem;
  for (const Piece& p : pieces_) {
    for (uint64_t from = 0; from < p.bytes; from += window) {
      const uint64_t bytes = std::min(window, p.bytes - from);
      bool found = false;
      uint64_t first = 0;
      for (size_t t = 0; t < session_->num_trainers(); ++t) {
        if (!active_[t]) continue;                      // not summed
        if (!hit[session_->device_index(t)]) continue;  // its GPU's sum was finite
        gpu::Stream* stream = session_->stream(session_->device_index(t));
        if (absl::Status st = session_->device().CopyToHostAsync(
                w.search, static_cast<const uint8_t*>(At(t, p)) + from, bytes, stream);
            !st.ok()) {
          device_error_ = st;
          return MakeError(v1::INTERNAL, absl::StrCat("reading ", session_->trainer_name(t),
                                                      "'s gradients: ", st.message()));
        }
        RETURN_IF_ERROR(WaitStreams(deadline, "reading gradients for the non-finite search"));
        const uint64_t limit = found ? first : bytes;
        for (uint64_t at = 0; at < limit; at += elem) {
          const double v = ElementValue(w.search + at, bucket.dtype);
          if (std::isfinite(v)) continue;
          found = true;
          first = at;
          report->local = true;
          report->trainer = t;
          report->value = v;
          break;
        }
      }
      if (found) {
        Locate(bucket, p, from + first, report);
        return absl::OkStatus();
      }
    }
  }
  return absl::OkStatus();
}

void GpuReducer::Locate(const PlannedBucket& bucket, const Piece& p, uint64_t at,
                        GpuNonFiniteReport* report) const {
  const size_t elem = DTypeSize(bucket.dtype);
  if (!session_->flat()) {
    report->tensor = p.tensor;
    report->element = at / elem;
    return;
  }
  // Flat mode: which of the bucket's tensors holds that flat offset.
  const uint64_t flat = p.flat_offset + at;
  const uint8_t* base = session_->flat_base(report->trainer);
  for (uint32_t i : bucket.tensors) {
    const uint64_t begin = static_cast<const uint8_t*>(session_->tensor(report->trainer, i)) - base;
    if (flat < begin || flat >= begin + layout_[i].bytes()) continue;
    report->tensor = i;
    report->element = (flat - begin) / elem;
    return;
  }
}

absl::Status GpuReducer::WriteBack(const PlannedBucket& bucket, bool in_place) {
  gpu::DaemonDevice& device = session_->device();
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
  return absl::OkStatus();
}

absl::Status GpuReducer::KeepResult(const PlannedBucket& bucket, bool in_place,
                                    KeptResultSink* sink) {
  sink->written = true;  // the result kept before is gone from here on
  gpu::DaemonDevice& device = session_->device();
  for (size_t d = 0; d < buffers_.size(); ++d) {
    gpu::Stream* stream = session_->stream(static_cast<int>(d));
    const uint8_t* result = static_cast<const uint8_t*>(buffers_[d].data);
    uint8_t* kept = session_->kept_result(static_cast<int>(d));
    for (const Piece& p : pieces_) {
      const uint8_t* from = in_place ? result : result + p.staging_offset;
      if (absl::Status st = device.CopyAsync(kept + KeptOffset(p), from, p.bytes, stream);
          !st.ok()) {
        device_error_ = st;
        return MakeError(v1::INTERNAL, absl::StrCat("keeping bucket ", bucket.id, "'s result on ",
                                                    session_->devices()[d], ": ", st.message()));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status GpuReducer::KeepResults(std::vector<uint64_t> tensor_offsets, uint64_t flat_bytes) {
  kept_tensor_offsets_ = std::move(tensor_offsets);
  if (absl::Status st = session_->EnsureKeptResult(flat_bytes); !st.ok()) {
    device_error_ = st;
    return st;
  }
  kept_result_bytes_ = flat_bytes;
  return absl::OkStatus();
}

absl::Status GpuReducer::BroadcastKeptResult(int root) {
  device_error_ = absl::OkStatus();
  buffers_.clear();
  for (size_t d = 0; d < session_->devices().size(); ++d) {
    buffers_.push_back(
        {static_cast<int>(d), session_->kept_result(static_cast<int>(d)), kept_result_bytes_});
  }
  absl::Status st = session_->collectives().Broadcast(buffers_, root);
  if (!st.ok()) device_error_ = st;
  return st;
}

absl::Status GpuReducer::WriteTrainers(
    const PlannedBucket& bucket, const std::vector<ReduceSpan>& flat_spans, const char* what,
    const std::function<absl::Status(void*, const Piece&, int)>& write) {
  device_error_ = absl::OkStatus();
  Pieces(bucket, flat_spans, &pieces_);
  for (size_t d = 0; d < trainers_on_device_.size(); ++d) {
    for (size_t t : trainers_on_device_[d]) {
      for (const Piece& p : pieces_) {
        if (absl::Status st = write(At(t, p), p, static_cast<int>(d)); !st.ok()) {
          device_error_ = st;
          return MakeError(v1::INTERNAL,
                           absl::StrCat(what, " over bucket ", bucket.id, " of ",
                                        session_->trainer_name(t), ": ", st.message()));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status GpuReducer::WriteKeptResult(const PlannedBucket& bucket,
                                         const std::vector<ReduceSpan>& flat_spans) {
  return WriteTrainers(
      bucket, flat_spans, "writing the kept result", [this](void* dst, const Piece& p, int d) {
        return session_->device().CopyAsync(dst, session_->kept_result(d) + KeptOffset(p), p.bytes,
                                            session_->stream(d));
      });
}

absl::Status GpuReducer::OverwriteWithOnes(const PlannedBucket& bucket,
                                           const std::vector<ReduceSpan>& flat_spans) {
  uint8_t* ones = session_->host_window().search;
  std::memset(ones, 0xFF, GpuSession::kSearchBytes);
  return WriteTrainers(
      bucket, flat_spans, "overwriting with all-ones bytes", [&](void* dst, const Piece& p, int d) {
        for (uint64_t at = 0; at < p.bytes; at += GpuSession::kSearchBytes) {
          const uint64_t n = std::min<uint64_t>(GpuSession::kSearchBytes, p.bytes - at);
          RETURN_IF_ERROR(session_->device().CopyFromHostAsync(static_cast<uint8_t*>(dst) + at,
                                                               ones, n, session_->stream(d)));
        }
        return absl::OkStatus();
      });
}

absl::Status GpuReducer::Reduce(const PlannedBucket& bucket,
                                const std::vector<ReduceSpan>& flat_spans, absl::Time deadline,
                                ReduceTimings* timings, int* culprit, GpuNonFiniteReport* nonfinite,
                                KeptResultSink* kept_result) {
  *culprit = kNoCulprit;
  device_error_ = absl::OkStatus();
  const int64_t start = MonotonicNowNs();
  // TEST ONLY when skipped (gradsyncd_sim --unsafe-skip-event-wait): the
  // reduction then races the trainers' streams, which the tests must see.
  if (!skip_event_wait_) {
    RETURN_IF_ERROR(WaitEvents(bucket, deadline, culprit));
  }
  Pieces(bucket, flat_spans, &pieces_);
  // Kept sums: the trainers' memory is written only by the write-back.
  // (Only elastic jobs deactivate trainers, and they keep sums: a GPU
  // summed in place always has an active trainer.)
  const bool in_place = pieces_.size() == 1 && !keep_sums_;
  uint32_t token = 0;
  if (nonfinite != nullptr) {
    *nonfinite = GpuNonFiniteReport();
    if (++last_token_ == 0) ++last_token_;  // 0 is the flags' initial value
    token = last_token_;
  }
  RETURN_IF_ERROR(LaunchSums(bucket, in_place, token));
  // The collective never waits on our stream: it starts once the sums are seen done.
  RETURN_IF_ERROR(WaitStreams(deadline, "the local sum"));
  if (token != 0) RETURN_IF_ERROR(CheckSums(bucket, token, deadline, nonfinite));
  // The kept sum is complete (the stream passed its copy): from now on a
  // redo of this iteration starts from it.
  if (keep_sums_ && kept_world_[bucket.id] == 0) kept_world_[bucket.id] = world_size_;
  const int64_t summed = MonotonicNowNs();

  if (absl::Status st = session_->collectives().AllreduceSum(buffers_, bucket.dtype); !st.ok()) {
    device_error_ = st;
    *culprit = kCollective;
    return st;
  }
  const int64_t reduced = MonotonicNowNs();

  const GpuSession::HostWindow& w = session_->host_window();
  if (token != 0) {
    // The result's first element, behind the collective: another node's
    // NaN (CheckSums) arrives there.
    if (absl::Status st = session_->device().CopyToHostAsync(
            w.probe, buffers_[0].data, DTypeSize(bucket.dtype), session_->stream(0));
        !st.ok()) {
      device_error_ = st;
      return MakeError(v1::INTERNAL,
                       absl::StrCat("reading bucket ", bucket.id, "'s result: ", st.message()));
    }
  }
  RETURN_IF_ERROR(WriteBack(bucket, in_place));
  if (kept_result != nullptr && kept_result_bytes_ > 0) {
    RETURN_IF_ERROR(KeepResult(bucket, in_place, kept_result));
  }
  RETURN_IF_ERROR(WaitStreams(deadline, "writing the result back"));
  if (token != 0 && !std::isfinite(ElementValue(w.probe, bucket.dtype))) {
    nonfinite->result_non_finite = true;
  }
  const int64_t done = MonotonicNowNs();
  timings->local_reduce_ns = (summed - start) + (done - reduced);
  timings->collective_ns = reduced - summed;
  timings->write_back_ns = done - reduced;
  return absl::OkStatus();
}

}  // namespace gradsync
