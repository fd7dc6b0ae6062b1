// Liveness probes: proving a node's daemon gone in milliseconds instead of
// presuming it dead after seconds of silence.
//
// A host that is up answers a TCP connect to a port nothing listens on with
// a reset (ECONNREFUSED): a daemon whose listening port refuses connections
// is no longer running. A stalled, overloaded or partitioned node lets the
// connect time out instead (or its network reports the host unreachable);
// such a probe proves nothing and the silence rule decides, as before.
// The port probed is the daemon's --listen (gRPC) server, which a live
// daemon keeps open for its whole life, whatever its Gloo sockets do: a
// node that only closed its Gloo connections is never probed dead.
#ifndef GRADSYNC_DAEMON_CLUSTER_LIVENESS_PROBE_H_
#define GRADSYNC_DAEMON_CLUSTER_LIVENESS_PROBE_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/monotonic_mutex.h"

namespace gradsync {

// Long enough for a connect across a data centre on a loaded machine, short
// enough that a survivor waiting on it loses no noticeable time.
inline constexpr absl::Duration kLivenessProbeTimeout = absl::Milliseconds(150);

enum class Liveness {
  kListening,  // the connect succeeded: the daemon is up (it may be stalled)
  kRefused,    // ECONNREFUSED: nothing listens there, the daemon is gone
  kUnknown,    // timed out, unreachable, or a bad address: proves nothing
};

struct ProbeOutcome {
  Liveness liveness = Liveness::kUnknown;
  std::string detail;  // why, for the logs: "connection refused", "timed out after 150 ms"
};

// Connects to every address (HOST:PORT, HOST a numeric IPv4 or bracketed
// IPv6 address: a name is never looked up) at once and closes each
// connection; outcomes by position. Blocks up to `timeout`.
std::vector<ProbeOutcome> ProbeListeners(const std::vector<std::string>& addresses,
                                         absl::Duration timeout = kLivenessProbeTimeout);

// How errors and logs say what a refused probe proves.
std::string RefusesConnections(const std::string& address);

// Runs ProbeListeners on a thread of its own, so that a caller holding a
// lock (the leader's) never waits on the network. Batches run one after the
// other, each calling `done` with its outcomes on that thread. Thread-safe.
class BackgroundProber {
 public:
  using Done = std::function<void(std::vector<ProbeOutcome>)>;

  explicit BackgroundProber(absl::Duration timeout = kLivenessProbeTimeout);
  // Waits for the batch in flight (bounded by the timeout); batches still
  // queued are dropped without their `done`.
  ~BackgroundProber();

  BackgroundProber(const BackgroundProber&) = delete;
  BackgroundProber& operator=(const BackgroundProber&) = delete;

  void Probe(std::vector<std::string> addresses, Done done) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration timeout_;
  MonotonicMutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::pair<std::vector<std::string>, Done>> queue_ ABSL_GUARDED_BY(mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);  // started by the first Probe
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_LIVENESS_PROBE_H_
