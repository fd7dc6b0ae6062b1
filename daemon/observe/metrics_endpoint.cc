#include "daemon/observe/metrics_endpoint.h"

#include <httplib.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gradsync {

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& host_port, Render render) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen ", host_port, " must be HOST:PORT", why));
  };
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("");
  absl::string_view host(host_port.data(), colon);
  // httplib takes an IPv6 literal without its brackets.
  if (absl::ConsumePrefix(&host, "[") && !absl::ConsumeSuffix(&host, "]")) return bad("");
  const std::string port_text = host_port.substr(colon + 1);
  int port = -1;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 0 || port > 65535) {
    return bad(" (port in [0, 65535])");
  }

  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  endpoint->server_ = std::make_unique<httplib::Server>();
  endpoint->server_->Get("/metrics", [render = std::move(render)](const httplib::Request&,
                                                                  httplib::Response& response) {
    response.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  const std::string bind_host(host);
  if (port == 0) {
    endpoint->port_ = endpoint->server_->bind_to_any_port(bind_host);
  } else if (endpoint->server_->bind_to_port(bind_host, port)) {
    endpoint->port_ = port;
  }
  if (endpoint->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on --metrics-listen ", host_port, ": ", std::strerror(errno)));
  }
  httplib::Server* server = endpoint->server_.get();
  endpoint->thread_ = std::thread([server] { server->listen_after_bind(); });
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace gradsync
