#include "daemon/cluster/forming_watch.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log_value.h"
#include "common/status_code.h"
#include "daemon/cluster/liveness_probe.h"
#include "spdlog/spdlog.h"

namespace gradsync {

FormingWatch::FormingWatch(std::shared_ptr<JobRendezvous> client, int node_rank,
                           uint64_t generation, Backend* backend, std::chrono::milliseconds every,
                           std::vector<RendezvousPeer> joiners)
    : client_(std::move(client)),
      node_rank_(node_rank),
      generation_(generation),
      backend_(backend),
      every_(every),
      joiners_(std::move(joiners)) {
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

bool FormingWatch::JoinerDied() {
  if (joiners_.empty()) return false;
  std::vector<std::string> addresses;
  for (const RendezvousPeer& j : joiners_) addresses.push_back(j.listen_address);
  const std::vector<ProbeOutcome> probed = ProbeListeners(addresses);
  for (size_t i = 0; i < joiners_.size(); ++i) {
    if (addresses[i].empty() || probed[i].liveness != Liveness::kRefused) continue;
    const std::string reason = absl::StrCat(
        "joining node_rank=", joiners_[i].node_rank, " (host=", joiners_[i].host,
        ") died while generation ", generation_, " formed: ", RefusesConnections(addresses[i]));
    spdlog::warn("event=forming_joiner_dead node_rank={} generation={} joiner={} address={}",
                 node_rank_, generation_, joiners_[i].node_rank, addresses[i]);
    // First the rendezvous: its abort ends the store waits of this connect.
    HeartbeatParams report;
    report.node_rank = node_rank_;
    report.generation = generation_;
    report.node_error = MakeError(v1::PEER_FAILED, reason);
    client_->Heartbeat(report).IgnoreError();
    backend_->Abort(reason);
    return true;
  }
  return false;
}

void FormingWatch::Run() {
  while (true) {
    {
      MonotonicMutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(every_))) return;
    }
    if (AbortedAtLeader() || JoinerDied()) return;
  }
}

}  // namespace gradsync
