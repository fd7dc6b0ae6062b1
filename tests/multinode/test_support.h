// Support for the multi-node tests: a leader (RendezvousService on a real
// gRPC server on 127.0.0.1, port picked by the kernel), helper processes
// started with posix_spawn (a gRPC process must not fork without exec) that
// are always reaped or killed, and a short scratch directory under /tmp.
#ifndef GRADSYNC_TESTS_MULTINODE_TEST_SUPPORT_H_
#define GRADSYNC_TESTS_MULTINODE_TEST_SUPPORT_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/cluster/rendezvous_service.h"
#include "grpcpp/server.h"

namespace gradsync::testing {

class TestLeader {
 public:
  TestLeader(const std::string& job_id, const std::string& job_token, int num_nodes,
             absl::Duration default_timeout, absl::Duration heartbeat_timeout);
  ~TestLeader();

  // "127.0.0.1:PORT".
  const std::string& address() const { return address_; }
  RendezvousService& service() { return *service_; }

 private:
  std::unique_ptr<RendezvousService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

// A helper process; killed (SIGKILL) and reaped on destruction if running.
class Child {
 public:
  // stdout and stderr go to `log_path`.
  Child(const std::string& binary, const std::vector<std::string>& args,
        const std::string& log_path);
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !exited_; }
  // Non-blocking; true once the process has exited (and was reaped).
  bool Poll();
  void Kill(int signal);
  // Exit code, or -signal when killed by a signal.
  int exit_code() const { return exit_code_; }
  std::string Log() const;
  const std::string& log_path() const { return log_path_; }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int exit_code_ = -1000;
  std::string log_path_;
};

// Waits until every child has exited; past `timeout` kills the rest and
// returns false.
bool WaitAll(const std::vector<Child*>& children, absl::Duration timeout);

// Waits until `path` exists; false past `timeout`.
bool WaitForFile(const std::string& path, absl::Duration timeout);

// The helper binary named `name` in this test's runfiles (or next to it).
std::string HelperPath(const std::string& name);

// mkdtemp under /tmp (short paths), removed with its files on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_MULTINODE_TEST_SUPPORT_H_
