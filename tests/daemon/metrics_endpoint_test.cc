// MetricsEndpoint over real loopback sockets, spoken to byte by byte the way
// a Prometheus server (and a misbehaving client) does: scrapes on a kept-alive
// connection, wrong paths and methods, garbage, oversized and stalled
// requests, more connections than it keeps, and bind failures.
#include "daemon/observe/metrics_endpoint.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int kReceiveTimeoutS = 5;

// One client connection to 127.0.0.1:port.
class Client {
 public:
  explicit Client(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    const timeval wait{kReceiveTimeoutS, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
  }
  ~Client() {
    if (fd_ >= 0) close(fd_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool connected() const { return connected_; }

  bool Send(const std::string& bytes) {
    return send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }

  // One whole response (head and Content-Length body); "" if the server
  // closed or stayed silent first.
  std::string ReadResponse() {
    size_t head_end;
    while ((head_end = pending_.find("\r\n\r\n")) == std::string::npos) {
      if (!ReceiveMore()) return "";
    }
    const size_t body_start = head_end + 4;
    const size_t length = ContentLength(pending_.substr(0, head_end));
    while (pending_.size() < body_start + length) {
      if (!ReceiveMore()) return "";
    }
    std::string response = pending_.substr(0, body_start + length);
    pending_.erase(0, body_start + length);
    return response;
  }

  // True when the server closes the connection within the receive timeout.
  bool ClosedByServer() {
    char byte;
    while (true) {
      const ssize_t n = recv(fd_, &byte, 1, 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;  // a timeout is not a close
    }
  }

 private:
  static size_t ContentLength(const std::string& head) {
    const std::string lower = absl::AsciiStrToLower(head);
    const size_t at = lower.find("\r\ncontent-length:");
    size_t length = 0;
    if (at == std::string::npos) return 0;
    const size_t end = lower.find("\r\n", at + 2);
    std::string value = lower.substr(at + 17, end - at - 17);
    return absl::SimpleAtoi(absl::StripAsciiWhitespace(value), &length) ? length : 0;
  }

  bool ReceiveMore() {
    char buffer[65536];
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
    if (n <= 0) return false;
    pending_.append(buffer, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  std::string pending_;
};

std::string Get(const std::string& target) {
  return absl::StrCat("GET ", target, " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
}

std::string Body(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

// An endpoint on 127.0.0.1:<any port> whose scrape N answers "scrape N".
struct CountingEndpoint {
  CountingEndpoint() {
    auto started = MetricsEndpoint::Start(
        "127.0.0.1:0", [this] { return absl::StrCat("gradsync_test_scrapes ", ++scrapes, "\n"); });
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) endpoint = std::move(*started);
  }
  int port() const { return endpoint ? endpoint->port() : 0; }

  std::atomic<int> scrapes{0};
  std::unique_ptr<MetricsEndpoint> endpoint;
};

TEST(MetricsEndpointTest, AnswersEachScrapeWithFreshTextOnAKeptAliveConnection) {
  CountingEndpoint server;
  ASSERT_GT(server.port(), 0);
  Client client(server.port());
  ASSERT_TRUE(client.connected());
  for (int scrape = 1; scrape <= 3; ++scrape) {
    ASSERT_TRUE(client.Send(Get("/metrics")));
    const std::string response = client.ReadResponse();
    EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
    EXPECT_THAT(response,
                HasSubstr("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
    EXPECT_EQ(Body(response), absl::StrCat("gradsync_test_scrapes ", scrape, "\n"));
  }
  // A query string does not change the path.
  ASSERT_TRUE(client.Send(Get("/metrics?name[]=gradsync_test_scrapes")));
  EXPECT_EQ(Body(client.ReadResponse()), "gradsync_test_scrapes 4\n");
}

TEST(MetricsEndpointTest, OtherPathsAreNotFoundAndOtherMethodsNotAllowed) {
  CountingEndpoint server;
  Client client(server.port());
  ASSERT_TRUE(client.connected());
  for (const char* path : {"/", "/metrics/", "/metricsx", "/debug"}) {
    ASSERT_TRUE(client.Send(Get(path)));
    EXPECT_THAT(client.ReadResponse(), StartsWith("HTTP/1.1 404 Not Found\r\n")) << path;
  }
  ASSERT_TRUE(client.Send("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"));
  const std::string response = client.ReadResponse();
  EXPECT_THAT(response, StartsWith("HTTP/1.1 405 Method Not Allowed\r\n"));
  EXPECT_THAT(response, HasSubstr("\r\nAllow: GET\r\n"));
  EXPECT_EQ(server.scrapes.load(), 0);  // none of them rendered the metrics
}

TEST(MetricsEndpointTest, GarbageGetsBadRequestAndTheConnectionIsClosed) {
  CountingEndpoint server;
  Client client(server.port());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Send("\x01\x02 not http at all\r\n\r\n"));
  EXPECT_THAT(client.ReadResponse(), StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  EXPECT_TRUE(client.ClosedByServer());
}

TEST(MetricsEndpointTest, AnOversizedRequestGetsBadRequest) {
  CountingEndpoint server;
  Client client(server.port());
  ASSERT_TRUE(client.connected());
  // Headers of 64 KiB: far above what any scraper sends.
  ASSERT_TRUE(client.Send(absl::StrCat(
      "GET /metrics HTTP/1.1\r\nX-Filler: ", std::string(64 * 1024, 'a'), "\r\n\r\n")));
  EXPECT_THAT(client.ReadResponse(), StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  EXPECT_TRUE(client.ClosedByServer());
  EXPECT_EQ(server.scrapes.load(), 0);
}

TEST(MetricsEndpointTest, AStalledClientDoesNotHoldUpAnotherScrape) {
  CountingEndpoint server;
  Client stalled(server.port());
  ASSERT_TRUE(stalled.connected());
  ASSERT_TRUE(stalled.Send("GET /metr"));  // and nothing more
  Client scraper(server.port());
  ASSERT_TRUE(scraper.connected());
  ASSERT_TRUE(scraper.Send(Get("/metrics")));
  EXPECT_EQ(Body(scraper.ReadResponse()), "gradsync_test_scrapes 1\n");
}

TEST(MetricsEndpointTest, ConnectionsBeyondTheLimitAreClosedAndAFreedSlotServesAgain) {
  CountingEndpoint server;
  std::vector<std::unique_ptr<Client>> held;
  for (int i = 0; i < MetricsEndpoint::kMaxConnections; ++i) {
    held.push_back(std::make_unique<Client>(server.port()));
    ASSERT_TRUE(held.back()->connected()) << i;
    // Answered: the endpoint has accepted and counts this connection.
    ASSERT_TRUE(held.back()->Send(Get("/metrics")));
    ASSERT_THAT(held.back()->ReadResponse(), StartsWith("HTTP/1.1 200 OK\r\n")) << i;
  }
  Client refused(server.port());
  ASSERT_TRUE(refused.connected());  // the kernel accepts; the endpoint closes it
  EXPECT_TRUE(refused.ClosedByServer());

  held.pop_back();  // one slot frees once the endpoint sees the close
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kReceiveTimeoutS);
  std::string response;
  while (response.empty() && std::chrono::steady_clock::now() < deadline) {
    Client again(server.port());
    if (again.connected() && again.Send(Get("/metrics"))) response = again.ReadResponse();
    if (response.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST(MetricsEndpointTest, DestroyingItClosesOpenConnections) {
  CountingEndpoint server;
  Client client(server.port());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Send(Get("/metrics")));
  ASSERT_THAT(client.ReadResponse(), StartsWith("HTTP/1.1 200 OK\r\n"));
  server.endpoint.reset();
  EXPECT_TRUE(client.ClosedByServer());
}

TEST(MetricsEndpointTest, AMalformedAddressIsInvalidAndNamed) {
  for (const char* address :
       {"9100", ":9100", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:9x", "[::1:9100"}) {
    auto started = MetricsEndpoint::Start(address, [] { return std::string(); });
    ASSERT_FALSE(started.ok()) << address;
    EXPECT_EQ(started.status().code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_THAT(started.status().message(), HasSubstr(absl::StrCat("--metrics-listen ", address)));
  }
}

TEST(MetricsEndpointTest, ABusyPortIsUnavailableAndNamed) {
  CountingEndpoint first;
  ASSERT_GT(first.port(), 0);
  const std::string address = absl::StrCat("127.0.0.1:", first.port());
  auto second = MetricsEndpoint::Start(address, [] { return std::string(); });
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("cannot listen on --metrics-listen ", address, ": ")));
}

}  // namespace
}  // namespace gradsync
