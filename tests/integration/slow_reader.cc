#include "tests/integration/slow_reader.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradsync::testing {
namespace {

constexpr uint8_t kData = 0x0, kHeaders = 0x1, kSettings = 0x4, kPing = 0x6;
constexpr uint8_t kEndStream = 0x1, kAck = 0x1, kEndHeaders = 0x4;
constexpr uint16_t kSettingsInitialWindowSize = 0x4;

std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  std::string f;
  const uint32_t n = static_cast<uint32_t>(payload.size());
  f.push_back(static_cast<char>(n >> 16));
  f.push_back(static_cast<char>(n >> 8));
  f.push_back(static_cast<char>(n));
  f.push_back(static_cast<char>(type));
  f.push_back(static_cast<char>(flags));
  for (int shift = 24; shift >= 0; shift -= 8) f.push_back(static_cast<char>(stream >> shift));
  return f + payload;
}

// An HPACK string: 7-bit prefix length (RFC 7541 5.1), no Huffman coding.
std::string HpackString(const std::string& s) {
  std::string out;
  size_t n = s.size();
  if (n < 127) {
    out.push_back(static_cast<char>(n));
  } else {
    out.push_back(static_cast<char>(127));
    n -= 127;
    while (n >= 128) {
      out.push_back(static_cast<char>((n & 0x7f) | 0x80));
      n >>= 7;
    }
    out.push_back(static_cast<char>(n));
  }
  return out + s;
}

// "Literal header field without indexing, new name": no dynamic table to keep.
std::string HpackLiteral(const std::string& name, const std::string& value) {
  return std::string(1, '\0') + HpackString(name) + HpackString(value);
}

bool ReadFull(int fd, char* buf, size_t n) {
  while (n > 0) {
    const ssize_t got = read(fd, buf, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    buf += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

}  // namespace

SlowReader::~SlowReader() {
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);  // ends the reader's read
  if (reader_.joinable()) reader_.join();
  if (fd_ >= 0) close(fd_);
}

absl::Status SlowReader::Connect(int port) {
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(errno)));
  }
  const int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::string settings;
  settings.push_back(static_cast<char>(kSettingsInitialWindowSize >> 8));
  settings.push_back(static_cast<char>(kSettingsInitialWindowSize & 0xff));
  settings.append(4, '\0');  // a window of 0 bytes for every stream
  if (absl::Status st = Send("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + Frame(kSettings, 0, 0, settings));
      !st.ok()) {
    return st;
  }
  reader_ = std::thread([this] { ReadLoop(); });
  return absl::OkStatus();
}

absl::Status SlowReader::Call(const std::string& method) {
  const uint32_t stream = next_stream_;
  next_stream_ += 2;
  const std::string headers =
      HpackLiteral(":method", "POST") + HpackLiteral(":scheme", "http") +
      HpackLiteral(":path", method) + HpackLiteral(":authority", "localhost") +
      HpackLiteral("content-type", "application/grpc") + HpackLiteral("te", "trailers");
  // One gRPC message: uncompressed, 0 bytes (an empty request).
  const std::string message(5, '\0');
  return Send(Frame(kHeaders, kEndHeaders, stream, headers) +
              Frame(kData, kEndStream, stream, message));
}

absl::Status SlowReader::Send(const std::string& bytes) {
  absl::MutexLock lock(&write_mu_);
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    off += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

void SlowReader::ReadLoop() {
  // Frames are read and dropped; only SETTINGS and PING get their ACK, as
  // any client's would. No WINDOW_UPDATE ever goes out.
  while (true) {
    char header[9];
    if (!ReadFull(fd_, header, sizeof(header))) break;
    const size_t length = (static_cast<uint8_t>(header[0]) << 16) |
                          (static_cast<uint8_t>(header[1]) << 8) | static_cast<uint8_t>(header[2]);
    const uint8_t type = static_cast<uint8_t>(header[3]);
    const uint8_t flags = static_cast<uint8_t>(header[4]);
    std::string payload(length, '\0');
    if (length > 0 && !ReadFull(fd_, payload.data(), length)) break;
    if (type == kSettings && !(flags & kAck)) {
      if (!Send(Frame(kSettings, kAck, 0, "")).ok()) break;
    } else if (type == kPing && !(flags & kAck)) {
      if (!Send(Frame(kPing, kAck, 0, payload)).ok()) break;
    }
  }
  closed_.store(true);
}

}  // namespace gradsync::testing
