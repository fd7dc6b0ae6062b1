#include "daemon/cluster/forming_watch.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log_value.h"
#include "spdlog/spdlog.h"

namespace gradsync {

FormingWatch::FormingWatch(std::shared_ptr<JobRendezvous> client, int node_rank,
                           uint64_t generation, Backend* backend, std::chrono::milliseconds every)
    : client_(std::move(client)),
      node_rank_(node_rank),
      generation_(generation),
      backend_(backend),
      every_(every) {
  // The first look before the connect starts: a generation already
  // aborted is never connected at all.
  if (!AbortedAtLeader()) thread_ = std::thread([this] { Run(); });
}

FormingWatch::~FormingWatch() {
  {
    MonotonicMutexLock lock(&mu_);
    stop_ = true;  // the unlock wakes Run's wait
  }
  if (thread_.joinable()) thread_.join();
}

bool FormingWatch::AbortedAtLeader() {
  HeartbeatParams hb;
  hb.node_rank = node_rank_;
  hb.generation = generation_;
  // A failed RPC proves nothing: the connect goes on, bounded by its own
  // timeout, and the job's heartbeat thread judges the leader later.
  const absl::StatusOr<HeartbeatResult> r = client_->Heartbeat(hb);
  if (!r.ok() || (!r->abort && r->generation == generation_)) return false;
  const std::string reason =
      absl::StrCat("the job was aborted by the leader while this node connected: ",
                   r->abort_reason.empty() ? "a newer generation formed" : r->abort_reason);
  spdlog::warn("event=forming_aborted node_rank={} generation={} reason={}", node_rank_,
               generation_, LogValue(reason));
  backend_->Abort(reason);
  return true;
}

void FormingWatch::Run() {
  while (true) {
    {
      MonotonicMutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(every_))) return;
    }
    if (AbortedAtLeader()) return;
  }
}

}  // namespace gradsync
