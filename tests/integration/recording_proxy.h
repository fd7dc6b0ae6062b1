// RecordingProxy: a TCP forwarder on 127.0.0.1 that keeps every byte it
// carries, in both directions: what anyone on the path between two daemons
// would see (the capture test puts it between a node and its leader).
//
// Threads: one accepting, two per connection; all stop in the destructor.
#ifndef GRADSYNC_TESTS_INTEGRATION_RECORDING_PROXY_H_
#define GRADSYNC_TESTS_INTEGRATION_RECORDING_PROXY_H_

#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gradsync::testing {

class RecordingProxy {
 public:
  // Forwards connections to 127.0.0.1:upstream_port.
  explicit RecordingProxy(int upstream_port);
  ~RecordingProxy();
  RecordingProxy(const RecordingProxy&) = delete;
  RecordingProxy& operator=(const RecordingProxy&) = delete;

  int port() const { return port_; }  // 0 if it could not listen
  std::string Recorded() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Accept();
  void Pump(int from, int to) ABSL_LOCKS_EXCLUDED(mu_);

  const int upstream_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string recorded_ ABSL_GUARDED_BY(mu_);
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_INTEGRATION_RECORDING_PROXY_H_
