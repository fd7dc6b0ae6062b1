// LoopbackPort: a port on 127.0.0.1 in one of the states a liveness probe
// (daemon/cluster/liveness_probe.h) tells apart, made with real sockets.
#ifndef GRADSYNC_TESTS_TESTING_LOOPBACK_PORT_H_
#define GRADSYNC_TESTS_TESTING_LOOPBACK_PORT_H_

#include <string>
#include <vector>

namespace gradsync::testing {

class LoopbackPort {
 public:
  // Something listens, as a live daemon's --listen server does whatever
  // its Gloo sockets do.
  static LoopbackPort Listening();
  // Bound but not listening: a connect is refused, as at a dead daemon's
  // port (held, so that nothing else takes the port meanwhile).
  static LoopbackPort Refusing();
  // Listening with a full accept queue, which drops new connects: they
  // time out, as towards a stalled or partitioned host.
  static LoopbackPort Unanswering();

  LoopbackPort(LoopbackPort&& other) noexcept;
  LoopbackPort& operator=(LoopbackPort&&) = delete;
  ~LoopbackPort();

  // "127.0.0.1:PORT"; empty when the sockets could not be made.
  const std::string& address() const { return address_; }

 private:
  LoopbackPort() = default;
  int fd_ = -1;
  std::vector<int> queued_;  // the connects that fill an Unanswering port's queue
  std::string address_;
};

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_TESTING_LOOPBACK_PORT_H_
