// SlowReader: a raw HTTP/2 client that asks a gRPC server for replies and
// never lets it send them. It opens a real TCP connection, advertises a
// stream flow-control window of 0 bytes (SETTINGS_INITIAL_WINDOW_SIZE) and
// never sends a WINDOW_UPDATE, so no DATA of any reply can leave the
// server: every call it opens stays in the server with its reply queued,
// as it would for a peer that stops reading. It still answers the server's
// SETTINGS and PINGs (a background thread reads and discards every frame),
// so the connection stays up for as long as the object lives.
#ifndef GRADSYNC_TESTS_INTEGRATION_SLOW_READER_H_
#define GRADSYNC_TESTS_INTEGRATION_SLOW_READER_H_

#include <atomic>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace gradsync::testing {

class SlowReader {
 public:
  SlowReader() = default;
  ~SlowReader();
  SlowReader(const SlowReader&) = delete;
  SlowReader& operator=(const SlowReader&) = delete;

  // Connects to 127.0.0.1:`port` and sends the HTTP/2 preface and settings.
  absl::Status Connect(int port);
  // Opens one unary call of `method` ("/gradsync.v1.Control/GetTrace") with
  // an empty request message.
  absl::Status Call(const std::string& method);
  // Calls opened so far.
  int calls() const { return next_stream_ / 2; }
  // Whether the server closed the connection (the reader thread saw EOF).
  bool closed() const { return closed_.load(); }

 private:
  absl::Status Send(const std::string& bytes) ABSL_LOCKS_EXCLUDED(write_mu_);
  void ReadLoop();

  int fd_ = -1;
  uint32_t next_stream_ = 1;
  absl::Mutex write_mu_;  // the writes of Call and of the reader's acks
  std::atomic<bool> closed_{false};
  std::thread reader_;
};

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_INTEGRATION_SLOW_READER_H_
