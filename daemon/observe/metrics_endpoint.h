// MetricsEndpoint: the daemon's Prometheus scrape target (--metrics-listen
// HOST:PORT). A small HTTP/1.1 server (Boost.Beast over Boost.Asio, header
// only, so a daemon pays no shared library for it at start-up) whose
// GET /metrics answers the text exposition format 0.0.4 that `render`
// produces at each scrape; HEAD /metrics the same headers; other methods on
// /metrics 405, other paths 404, a malformed request 400. Connections are
// kept alive as Prometheus expects.
//
// Serves on its own thread until destroyed. A client cannot hold it up: every
// read and write has a deadline, a request is at most a few KiB, and at most
// kMaxConnections are open at once (more are closed on accept).
#ifndef GRADSYNC_DAEMON_OBSERVE_METRICS_ENDPOINT_H_
#define GRADSYNC_DAEMON_OBSERVE_METRICS_ENDPOINT_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace gradsync {

class MetricsEndpoint {
 public:
  using Render = std::function<std::string()>;

  // A connection silent (or not reading) this long is closed.
  static constexpr std::chrono::seconds kIoDeadline{10};
  static constexpr int kMaxConnections = 64;

  // Binds `host_port` (port 0: any free port; "[::1]:9100" for IPv6; a host
  // name is resolved) and starts serving. INVALID_ARGUMENT for a malformed
  // HOST:PORT, UNAVAILABLE naming the address if it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& host_port,
                                                                Render render);
  ~MetricsEndpoint();  // stops serving, closes every connection, joins the thread

  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

  // What the serving thread owns; defined in the .cc so that Asio's types
  // stay out of every includer of this header.
  struct Server;

 private:
  MetricsEndpoint() = default;

  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_OBSERVE_METRICS_ENDPOINT_H_
