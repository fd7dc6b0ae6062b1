// ChildProcess: a forked process that runs one function, for multi-process
// tests. The child never returns into the test framework (it `_exit`s with
// the function's result), dies of SIGALRM if it outlives its time limit and
// of SIGKILL if the test process dies; the parent kills and reaps it when
// the handle goes away, so a failing test can neither hang nor leave a
// process behind.
#ifndef GRADSYNC_TESTS_IPC_CHILD_PROCESS_H_
#define GRADSYNC_TESTS_IPC_CHILD_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradsync::testing {

class ChildProcess {
 public:
  // Forks; the child runs `body` and exits with its return value (0 means
  // success by convention). The kernel kills the child after `limit`.
  static absl::StatusOr<ChildProcess> Start(std::function<int()> body,
                                            std::chrono::seconds limit = std::chrono::seconds(60));

  ChildProcess() = default;
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();  // SIGKILLs and reaps a child still running

  pid_t pid() const { return pid_; }

  // Waits for the child to exit and returns its exit code. A child killed
  // by a signal is an error; so is one still running after `timeout`, which
  // is then killed.
  absl::StatusOr<int> Wait(std::chrono::milliseconds timeout);

  // SIGKILLs the child and reaps it. OK if it had already exited.
  absl::Status Kill();

  // Whether the child has exited (reaps it if so) without blocking.
  bool Exited();

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}

  pid_t pid_ = -1;       // -1: no child (moved from, or reaped)
  int wait_status_ = 0;  // valid once reaped_
  bool reaped_ = false;
};

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_IPC_CHILD_PROCESS_H_
