// ControlAdmission: what callers of the Control service may make the daemon
// hold. Control's reads answer anyone by default (no token), so these bounds
// are what stands between an unauthenticated peer and the daemon's memory:
//   - calls in progress at once, in all and per peer address;
//   - bytes of replies built and not yet sent (a peer that stops reading
//     leaves its reply queued in the server);
//   - a deadline to send a reply: a call still in progress that long after
//     its reply was ready is cancelled, which frees its queued bytes and
//     its slot.
// A call over a bound gets RESOURCE_EXHAUSTED naming the RPC and the bound;
// refusals and overdue replies are logged, at most once per few seconds
// each (a flood must not flood the log too).
//
// Control runs on gRPC's callback API, so a held call keeps no thread: the
// --listen server's thread quota (server_limits.h) is the job's rendezvous.
//
// Threads: every method is thread-safe. One watchdog thread, started by the
// constructor and joined by the destructor, ends overdue calls. mu_ guards
// every field below it; it is a MonotonicMutex because the watchdog's timed
// wait must run on the monotonic clock (absl 20220623's timed waits sleep
// to a CLOCK_REALTIME deadline, which a wall-clock step stretches).
#ifndef GRADSYNC_DAEMON_CONTROL_ADMISSION_H_
#define GRADSYNC_DAEMON_CONTROL_ADMISSION_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/monotonic_mutex.h"

namespace gradsync {

struct ControlLimits {
  int max_calls = 32;                               // Control calls in progress on this daemon
  int max_calls_per_peer = 8;                       // of them from one peer address
  size_t max_reply_bytes = size_t{32} << 20;        // replies built, not yet sent
  std::chrono::milliseconds reply_deadline{10000};  // to send a reply once built
};

class ControlAdmission {
 public:
  // How the watchdog ends an overdue call. It runs under the admission's
  // lock, while the call is known to be alive (Leave has not returned), and
  // returns what ends the call, run once the lock is released (so a call
  // that completes inline cannot deadlock on the lock).
  using Overdue = std::function<std::function<void()>()>;

  explicit ControlAdmission(ControlLimits limits = {});
  ~ControlAdmission();
  ControlAdmission(const ControlAdmission&) = delete;
  ControlAdmission& operator=(const ControlAdmission&) = delete;

  // A call of `rpc` ("Control.GetTrace") from `peer` (PeerAddress) starts:
  // its id, or RESOURCE_EXHAUSTED naming the rpc and the bound it is over.
  absl::StatusOr<uint64_t> Enter(const std::string& peer, absl::string_view rpc)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Call `id`'s reply of `bytes` is built: it holds them until Leave, and is
  // ended by `overdue` if still in progress reply_deadline from now.
  // RESOURCE_EXHAUSTED naming the bound when the replies waiting to be sent
  // would exceed it: the call must then answer that instead (no bytes held;
  // its deadline still runs).
  absl::Status Reply(uint64_t id, size_t bytes, Overdue overdue) ABSL_LOCKS_EXCLUDED(mu_);
  // Call `id` is over (answered, failed or cancelled): frees what it held.
  void Leave(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // A bound the caller keeps itself refused call `id` (`why` names it):
  // counted and logged like the others; the RESOURCE_EXHAUSTED to answer.
  absl::Status Refused(uint64_t id, const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);

  struct Usage {
    int calls = 0;
    size_t reply_bytes = 0;
    uint64_t refused = 0;  // since start
    uint64_t overdue = 0;  // calls the watchdog ended, since start
  };
  Usage usage() const ABSL_LOCKS_EXCLUDED(mu_);
  const ControlLimits& limits() const { return limits_; }

 private:
  struct Call {
    std::string peer;
    std::string rpc;
    size_t bytes = 0;
    bool armed = false;  // Reply was called: `deadline` and `overdue` are set
    bool ended = false;  // the watchdog already ended it
    std::chrono::steady_clock::time_point deadline;
    Overdue overdue;
  };
  // Counts and logs (rate-limited) a refusal.
  absl::Status Refuse(absl::string_view rpc, const std::string& peer, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Watch() ABSL_LOCKS_EXCLUDED(mu_);

  const ControlLimits limits_;
  mutable MonotonicMutex mu_;
  MonotonicCondVar changed_;  // the watchdog waits on it until the next deadline
  std::map<uint64_t, Call> calls_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> per_peer_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  size_t reply_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t overdue_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_logged_ ABSL_GUARDED_BY(mu_) = 0;  // refused_ when last logged
  std::chrono::steady_clock::time_point refusal_logged_at_ ABSL_GUARDED_BY(mu_){};
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watchdog_;
};

// The address a Control caller connects from, without its port: what the
// per-peer bound counts by. `grpc_peer` is ServerContext::peer():
// "ipv4:10.0.0.5:4242", "ipv6:[::1]:4242", or "fd:N" for a connection our
// ConnectionAcceptor accepted (read back from the socket, which the
// connection keeps open while a call of it is in progress).
std::string PeerAddress(const std::string& grpc_peer);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CONTROL_ADMISSION_H_
