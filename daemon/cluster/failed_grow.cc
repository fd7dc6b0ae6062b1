#include "daemon/cluster/failed_grow.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/log_value.h"
#include "common/status_code.h"
#include "daemon/cluster/liveness_probe.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// Carries the blamed joiners' node ranks ("2,3") on the agreement's error.
constexpr absl::string_view kJoinerFaultPayload = "gradsync.joiner_fault";

std::vector<int> Blamed(const absl::Status& error) {
  std::vector<int> ranks;
  const auto payload = error.GetPayload(kJoinerFaultPayload);
  if (!payload.has_value()) return ranks;
  for (absl::string_view part : absl::StrSplit(std::string(*payload), ',', absl::SkipEmpty())) {
    int rank = 0;
    if (absl::SimpleAtoi(part, &rank)) ranks.push_back(rank);
  }
  return ranks;
}

bool Contains(const std::vector<DroppedJoiner>& dropped, int node_rank) {
  return std::any_of(dropped.begin(), dropped.end(),
                     [node_rank](const DroppedJoiner& d) { return d.node_rank == node_rank; });
}

// Joiners the rendezvous names departed once it aborted the generation (a
// joiner's Depart aborts it).
void AddDeparted(JobRendezvous& client, int node_rank, const GrowAttempt& attempt,
                 std::vector<DroppedJoiner>* dropped) {
  HeartbeatParams hb;
  hb.node_rank = node_rank;
  hb.generation = attempt.generation;
  const absl::StatusOr<HeartbeatResult> r = client.Heartbeat(hb);
  if (!r.ok() || !r->abort) return;
  for (const SilentMember& m : r->silent_members) {
    if (!m.departed || Contains(*dropped, m.node_rank)) continue;
    for (const RendezvousPeer& j : attempt.joiners) {
      if (j.node_rank != m.node_rank) continue;
      // Its Depart's abort names it ("node_rank=2 (host=H) left the job: ...").
      const bool named =
          absl::StartsWith(r->abort_reason, absl::StrCat("node_rank=", j.node_rank, " "));
      dropped->push_back({j.node_rank, j.host, named ? r->abort_reason : "it left the job"});
    }
  }
}

}  // namespace

GrowAttempt AttemptOf(const JoinResult& joined, int node_rank) {
  GrowAttempt attempt;
  attempt.generation = joined.generation;
  for (const RendezvousPeer& p : joined.peers) {
    if (p.local_size <= 0 || !p.joins_running) continue;
    if (p.node_rank == node_rank) {
      attempt.joins_running = true;
    } else {
      attempt.joiners.push_back(p);
    }
  }
  return attempt;
}

absl::Status BlameJoiners(absl::Status error, const std::vector<int>& culprits) {
  if (!culprits.empty())
    error.SetPayload(kJoinerFaultPayload, absl::Cord(absl::StrJoin(culprits, ",")));
  return error;
}

std::vector<DroppedJoiner> CulpritJoiners(JobRendezvous& client, int node_rank,
                                          const GrowAttempt& attempt, const absl::Status& error) {
  std::vector<DroppedJoiner> dropped;
  if (attempt.generation == 0 || attempt.joiners.empty()) return dropped;
  const std::vector<int> blamed = Blamed(error);
  std::vector<std::string> addresses;
  for (const RendezvousPeer& j : attempt.joiners) addresses.push_back(j.listen_address);
  // A dead joiner's port refuses: proof, whatever symptom the mesh saw.
  const std::vector<ProbeOutcome> probed = ProbeListeners(addresses);
  for (size_t i = 0; i < attempt.joiners.size(); ++i) {
    const RendezvousPeer& j = attempt.joiners[i];
    if (std::find(blamed.begin(), blamed.end(), j.node_rank) != blamed.end()) {
      dropped.push_back({j.node_rank, j.host, std::string(error.message())});
    } else if (!j.listen_address.empty() && probed[i].liveness == Liveness::kRefused) {
      dropped.push_back({j.node_rank, j.host,
                         absl::StrCat("it died while generation ", attempt.generation,
                                      " formed: ", RefusesConnections(j.listen_address))});
    }
  }
  AddDeparted(client, node_rank, attempt, &dropped);
  return dropped;
}

void DropJoiners(JobRendezvous& client, int node_rank, uint64_t generation,
                 const std::vector<DroppedJoiner>& dropped) {
  std::vector<std::string> named;
  for (const DroppedJoiner& d : dropped) {
    spdlog::warn("event=joiner_dropped generation={} joiner={} host={} cause={}", generation,
                 d.node_rank, d.host, LogValue(d.cause));
    named.push_back(absl::StrCat("node_rank=", d.node_rank, " (host=", d.host, "): ", d.cause));
  }
  // The members' re-formation resumes an aborted generation; whichever
  // member reports first aborts it, the others' reports change nothing.
  HeartbeatParams report;
  report.node_rank = node_rank;
  report.generation = generation;
  report.node_error = MakeError(
      v1::PEER_FAILED, absl::StrCat("dropping the joining node(s) ", absl::StrJoin(named, "; ")));
  if (absl::StatusOr<HeartbeatResult> r = client.Heartbeat(report); !r.ok()) {
    spdlog::warn("event=joiner_drop_report_failed generation={} error={}", generation,
                 LogValue(r.status().message()));
  }
}

absl::Status DepartFailedJoiner(JobRendezvous& client, int node_rank, uint64_t generation,
                                const absl::Status& error) {
  spdlog::warn("event=joiner_departing generation={} node_rank={} cause={}", generation, node_rank,
               LogValue(error.message()));
  if (absl::Status st = client.Depart(node_rank, generation, std::string(error.message()));
      !st.ok()) {
    spdlog::warn("event=depart_failed generation={} error={}", generation, LogValue(st.message()));
  }
  return error;
}

}  // namespace gradsync
