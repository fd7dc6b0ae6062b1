#include "daemon/control_admission.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log_value.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// Refusals and overdue replies are logged at most this often.
constexpr std::chrono::seconds kLogEvery(5);

std::string Mib(size_t bytes) {
  return absl::StrCat(static_cast<double>(bytes) / (1 << 20), " MiB");
}

}  // namespace

ControlAdmission::ControlAdmission(ControlLimits limits)
    : limits_(limits), watchdog_([this] { Watch(); }) {}

ControlAdmission::~ControlAdmission() {
  {
    MonotonicMutexLock lock(&mu_);
    stop_ = true;
  }
  changed_.SignalAll();
  watchdog_.join();
}

absl::Status ControlAdmission::Refuse(absl::string_view rpc, const std::string& peer,
                                      const std::string& why) {
  ++refused_;
  const auto now = std::chrono::steady_clock::now();
  if (refused_logged_ == 0 || now - refusal_logged_at_ >= kLogEvery) {
    spdlog::warn("event=control_call_refused rpc={} peer={} reason={} refused_since_last_log={}",
                 std::string(rpc), LogValue(peer), LogValue(why), refused_ - refused_logged_);
    refused_logged_ = refused_;
    refusal_logged_at_ = now;
  }
  return absl::ResourceExhaustedError(absl::StrCat(rpc, " refused: ", why));
}

absl::StatusOr<uint64_t> ControlAdmission::Enter(const std::string& peer, absl::string_view rpc) {
  MonotonicMutexLock lock(&mu_);
  if (static_cast<int>(calls_.size()) >= limits_.max_calls) {
    return Refuse(rpc, peer,
                  absl::StrCat(calls_.size(),
                               " Control calls are in progress on this daemon, the "
                               "most it serves at once (max_control_calls); retry later"));
  }
  int& mine = per_peer_[peer];
  if (mine >= limits_.max_calls_per_peer) {
    return Refuse(rpc, peer,
                  absl::StrCat(mine, " Control calls from ", peer,
                               " are in progress, the most one peer address may have "
                               "(max_control_calls_per_peer); read their replies or retry later"));
  }
  ++mine;
  const uint64_t id = next_id_++;
  calls_[id].peer = peer;
  calls_[id].rpc = std::string(rpc);
  return id;
}

absl::Status ControlAdmission::Reply(uint64_t id, size_t bytes, Overdue overdue) {
  absl::Status status;
  {
    MonotonicMutexLock lock(&mu_);
    auto it = calls_.find(id);
    if (it == calls_.end()) return absl::InternalError("unknown Control call");
    Call& call = it->second;
    if (reply_bytes_ + bytes > limits_.max_reply_bytes) {
      status = Refuse(call.rpc, call.peer,
                      absl::StrCat("its reply of ", Mib(bytes), " would exceed the ",
                                   Mib(limits_.max_reply_bytes),
                                   " of Control replies this daemon holds unsent "
                                   "(max_control_reply_bytes; ",
                                   Mib(reply_bytes_), " wait now); retry later"));
    } else {
      call.bytes = bytes;
      reply_bytes_ += bytes;
    }
    call.armed = true;
    call.deadline = std::chrono::steady_clock::now() + limits_.reply_deadline;
    call.overdue = std::move(overdue);
  }
  changed_.SignalAll();
  return status;
}

void ControlAdmission::Leave(uint64_t id) {
  MonotonicMutexLock lock(&mu_);
  auto it = calls_.find(id);
  if (it == calls_.end()) return;
  reply_bytes_ -= it->second.bytes;
  auto peer = per_peer_.find(it->second.peer);
  if (peer != per_peer_.end() && --peer->second <= 0) per_peer_.erase(peer);
  calls_.erase(it);
}

absl::Status ControlAdmission::Refused(uint64_t id, const std::string& why) {
  MonotonicMutexLock lock(&mu_);
  auto it = calls_.find(id);
  if (it == calls_.end()) return absl::ResourceExhaustedError(why);
  return Refuse(it->second.rpc, it->second.peer, why);
}

ControlAdmission::Usage ControlAdmission::usage() const {
  MonotonicMutexLock lock(&mu_);
  return Usage{static_cast<int>(calls_.size()), reply_bytes_, refused_, overdue_};
}

void ControlAdmission::Watch() {
  std::chrono::steady_clock::time_point logged_at{};
  uint64_t overdue_logged = 0;
  // Locked by hand: the loop releases mu_ while it ends overdue calls.
  mu_.Lock();
  while (!stop_) {
    const auto now = std::chrono::steady_clock::now();
    auto next = std::chrono::steady_clock::time_point::max();
    std::vector<std::function<void()>> end;
    std::string first;
    for (auto& entry : calls_) {
      Call& call = entry.second;
      if (!call.armed || call.ended) continue;
      if (call.deadline > now) {
        next = std::min(next, call.deadline);
        continue;
      }
      call.ended = true;
      ++overdue_;
      if (first.empty()) first = absl::StrCat(call.rpc, " from ", call.peer);
      if (call.overdue) end.push_back(call.overdue());
    }
    if (!end.empty()) {
      if (overdue_logged == 0 || now - logged_at >= kLogEvery) {
        spdlog::warn(
            "event=control_reply_overdue calls={} first={} reply_deadline_ms={} "
            "overdue_since_last_log={} reason=\"the peer did not read its reply in time; "
            "the call is cancelled\"",
            end.size(), LogValue(first), limits_.reply_deadline.count(), overdue_ - overdue_logged);
        overdue_logged = overdue_;
        logged_at = now;
      }
      mu_.Unlock();
      for (auto& f : end) {
        if (f) f();
      }
      mu_.Lock();
      continue;
    }
    if (next == std::chrono::steady_clock::time_point::max()) {
      changed_.Wait(&mu_);
    } else {
      changed_.WaitWithTimeout(&mu_, absl::FromChrono(next - std::chrono::steady_clock::now()));
    }
  }
  mu_.Unlock();
}

std::string PeerAddress(const std::string& grpc_peer) {
  absl::string_view p = grpc_peer;
  int fd = -1;
  if (absl::ConsumePrefix(&p, "fd:") && absl::SimpleAtoi(p, &fd) && fd >= 0) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return grpc_peer;
    char text[INET6_ADDRSTRLEN] = {};
    if (addr.ss_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, text, sizeof(text));
      return text;
    }
    if (addr.ss_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, text, sizeof(text));
      return text;
    }
    return grpc_peer;
  }
  // "ipv4:ADDR:PORT", "ipv6:[ADDR]:PORT": the port goes.
  p = grpc_peer;
  if (absl::ConsumePrefix(&p, "ipv4:") || absl::ConsumePrefix(&p, "ipv6:")) {
    const size_t colon = p.rfind(':');
    if (colon != absl::string_view::npos) p = p.substr(0, colon);
    absl::ConsumePrefix(&p, "[");
    absl::ConsumeSuffix(&p, "]");
    return std::string(p);
  }
  return grpc_peer;
}

}  // namespace gradsync
