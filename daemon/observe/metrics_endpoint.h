// MetricsEndpoint: the daemon's Prometheus scrape target (--metrics-listen
// HOST:PORT). An HTTP server (cpp-httplib) whose GET /metrics answers the
// text exposition format 0.0.4 that `render` produces at each scrape; other
// paths are 404. It serves on its own thread until destroyed.
#ifndef GRADSYNC_DAEMON_OBSERVE_METRICS_ENDPOINT_H_
#define GRADSYNC_DAEMON_OBSERVE_METRICS_ENDPOINT_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace gradsync {

class MetricsEndpoint {
 public:
  using Render = std::function<std::string()>;

  // Binds `host_port` (port 0: any free port; "[::1]:9100" for IPv6) and
  // starts serving. UNAVAILABLE naming the address if it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& host_port,
                                                                Render render);
  ~MetricsEndpoint();  // stops serving and joins the thread

  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_OBSERVE_METRICS_ENDPOINT_H_
