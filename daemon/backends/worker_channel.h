// WorkerChannel: protobuf messages between the daemon and a worker process
// it started, one message per record of a SOCK_SEQPACKET socketpair (the
// kernel keeps record boundaries, so there is no framing of our own, and a
// peer that dies shows up as end of file, never as a half message).
//
// Threads: Send may be called from several threads (one record is written
// atomically); Receive from one thread at a time.
#ifndef GRADSYNC_DAEMON_BACKENDS_WORKER_CHANNEL_H_
#define GRADSYNC_DAEMON_BACKENDS_WORKER_CHANNEL_H_

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/message_lite.h"

namespace gradsync {

class WorkerChannel {
 public:
  // The two connected ends, both close-on-exec.
  static absl::StatusOr<std::pair<WorkerChannel, WorkerChannel>> CreatePair();

  WorkerChannel() = default;
  explicit WorkerChannel(int fd) : fd_(fd) {}  // takes ownership
  WorkerChannel(WorkerChannel&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), buffer_(std::move(other.buffer_)) {}
  WorkerChannel& operator=(WorkerChannel&& other) noexcept;
  WorkerChannel(const WorkerChannel&) = delete;
  WorkerChannel& operator=(const WorkerChannel&) = delete;
  ~WorkerChannel() { Close(); }

  int fd() const { return fd_; }
  void Close();

  // UNAVAILABLE when the other end is gone.
  absl::Status Send(const google::protobuf::MessageLite& message);
  // Waits for the next message until `deadline` (a MonotonicNow() time; the
  // infinite future waits forever; a past one takes only what is already
  // there): UNAVAILABLE at end of file (the other
  // end closed or its process died), TIMEOUT past the deadline, INTERNAL
  // for a record that is not a `message`.
  absl::Status Receive(google::protobuf::MessageLite* message, absl::Time deadline);

  // The largest record either side sends (store values are Gloo addresses).
  static constexpr size_t kMaxRecordBytes = 1 << 20;

 private:
  int fd_ = -1;
  std::unique_ptr<char[]> buffer_;  // Receive's, kept: no allocation per message
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_WORKER_CHANNEL_H_
