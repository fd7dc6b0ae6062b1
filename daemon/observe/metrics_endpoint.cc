#include "daemon/observe/metrics_endpoint.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace gradsync {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr char kExpositionFormat[] = "text/plain; version=0.0.4; charset=utf-8";
// A scrape is a request line and a few headers; nothing legitimate is bigger.
constexpr uint32_t kHeaderLimit = 8 * 1024;
constexpr uint64_t kBodyLimit = 8 * 1024;
// After a failed accept (EMFILE, say), retry after this instead of spinning.
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

struct HostPort {
  std::string host;  // without an IPv6 literal's brackets
  std::string port;
};

absl::StatusOr<HostPort> ParseHostPort(const std::string& host_port) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen ", host_port, " must be HOST:PORT", why));
  };
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("");
  absl::string_view host(host_port.data(), colon);
  if (absl::ConsumePrefix(&host, "[") && !absl::ConsumeSuffix(&host, "]")) return bad("");
  const std::string port_text = host_port.substr(colon + 1);
  int port = -1;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 0 || port > 65535) {
    return bad(" (port in [0, 65535])");
  }
  return HostPort{std::string(host), port_text};
}

Response Answer(const Request& request, const MetricsEndpoint::Render& render) {
  Response response;
  response.version(request.version());
  response.keep_alive(request.keep_alive());
  absl::string_view target(request.target().data(), request.target().size());
  target = target.substr(0, target.find('?'));
  if (target != "/metrics") {
    response.result(http::status::not_found);
    response.set(http::field::content_type, "text/plain");
    response.body() = "only /metrics is served here\n";
  } else if (request.method() != http::verb::get) {
    response.result(http::status::method_not_allowed);
    response.set(http::field::allow, "GET");
    response.set(http::field::content_type, "text/plain");
    response.body() = "/metrics answers GET\n";
  } else {
    response.result(http::status::ok);
    response.set(http::field::content_type, kExpositionFormat);
    response.body() = render();
  }
  response.prepare_payload();
  return response;
}

}  // namespace

// Everything the serving thread touches. Members are destroyed in reverse
// order: the acceptor and timer first, then the io_context (which destroys
// the connections its pending handlers own), then what those connections
// point at.
struct MetricsEndpoint::Server {
  explicit Server(Render render_scrape) : render(std::move(render_scrape)) {}

  Render render;
  int open_connections = 0;  // only the serving thread touches it
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
};

namespace {

// One client's connection: read a request, answer it, and again while the
// client keeps the connection alive. Owned by its pending handler.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, const MetricsEndpoint::Render& render, int& open_connections)
      : stream_(std::move(socket)), render_(render), open_connections_(open_connections) {
    ++open_connections_;
  }
  ~Connection() { --open_connections_; }

  void ReadRequest() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(kBodyLimit);
    stream_.expires_after(MetricsEndpoint::kIoDeadline);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code error, size_t) { self->OnRequest(error); });
  }

 private:
  void OnRequest(beast::error_code error) {
    if (error) {
      // A request Beast could not parse gets a 400; a closed, reset or
      // silent connection just ends.
      if (error.category() == http::make_error_code(http::error::bad_target).category() &&
          error != http::error::end_of_stream && error != http::error::partial_message) {
        Send(BadRequest());
      } else {
        Close();
      }
      return;
    }
    Send(Answer(parser_->get(), render_));
  }

  static Response BadRequest() {
    Response response{http::status::bad_request, 11};
    response.set(http::field::content_type, "text/plain");
    response.keep_alive(false);
    response.body() = "malformed HTTP request\n";
    response.prepare_payload();
    return response;
  }

  void Send(Response response) {
    response_ = std::move(response);
    stream_.expires_after(MetricsEndpoint::kIoDeadline);
    http::async_write(stream_, response_,
                      [self = shared_from_this()](beast::error_code error, size_t) {
                        if (error || !self->response_.keep_alive()) {
                          self->Close();
                        } else {
                          self->ReadRequest();
                        }
                      });
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Response response_;
  const MetricsEndpoint::Render& render_;
  int& open_connections_;
};

void AcceptNext(MetricsEndpoint::Server& server);

void OnAccept(MetricsEndpoint::Server& server, beast::error_code error, tcp::socket socket) {
  if (error == asio::error::operation_aborted) return;  // the endpoint is closing
  if (error) {
    server.accept_retry.expires_after(kAcceptRetry);
    server.accept_retry.async_wait([&server](beast::error_code waited) {
      if (!waited) AcceptNext(server);
    });
    return;
  }
  if (server.open_connections >= MetricsEndpoint::kMaxConnections) {
    beast::error_code ignored;
    socket.close(ignored);
  } else {
    std::make_shared<Connection>(std::move(socket), server.render, server.open_connections)
        ->ReadRequest();
  }
  AcceptNext(server);
}

void AcceptNext(MetricsEndpoint::Server& server) {
  server.acceptor.async_accept([&server](beast::error_code error, tcp::socket socket) {
    OnAccept(server, error, std::move(socket));
  });
}

// Opens, binds and listens `server`'s acceptor on `where`; the error names why not.
beast::error_code Listen(MetricsEndpoint::Server& server, const HostPort& where) {
  beast::error_code error;
  tcp::resolver resolver(server.io);
  const auto endpoints = resolver.resolve(
      where.host, where.port, tcp::resolver::passive | tcp::resolver::numeric_service, error);
  if (error) return error;
  if (endpoints.empty()) return asio::error::host_not_found;
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  if (server.acceptor.open(endpoint.protocol(), error)) return error;
  // A restarted daemon can take its port back while old connections linger.
  if (server.acceptor.set_option(tcp::acceptor::reuse_address(true), error)) return error;
  if (server.acceptor.bind(endpoint, error)) return error;
  server.acceptor.listen(asio::socket_base::max_listen_connections, error);
  return error;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& host_port, Render render) {
  absl::StatusOr<HostPort> where = ParseHostPort(host_port);
  if (!where.ok()) return where.status();
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  endpoint->server_ = std::make_unique<Server>(std::move(render));
  Server& server = *endpoint->server_;
  if (const beast::error_code error = Listen(server, *where)) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on --metrics-listen ", host_port, ": ", error.message()));
  }
  endpoint->port_ = server.acceptor.local_endpoint().port();
  AcceptNext(server);
  endpoint->thread_ = std::thread([&server] { server.io.run(); });
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (server_) server_->io.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace gradsync
