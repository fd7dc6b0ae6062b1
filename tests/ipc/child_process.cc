#include "tests/ipc/child_process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradsync::testing {

absl::StatusOr<ChildProcess> ChildProcess::Start(std::function<int()> body,
                                                 std::chrono::seconds limit) {
  // Flush so buffered output is not written twice (once by each process).
  std::fflush(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    // Die with the test process (killed by a timeout, say), and of SIGALRM's
    // default action if hung: a child can never outlive the test.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    alarm(static_cast<unsigned>(limit.count()));
    const int code = body();
    std::fflush(nullptr);
    _exit(code);  // no atexit handlers, no gtest teardown in the child
  }
  return ChildProcess(pid);
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept { *this = std::move(other); }

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    Kill().IgnoreError();
    pid_ = std::exchange(other.pid_, -1);
    wait_status_ = other.wait_status_;
    reaped_ = std::exchange(other.reaped_, false);
  }
  return *this;
}

ChildProcess::~ChildProcess() { Kill().IgnoreError(); }

bool ChildProcess::Exited() {
  if (pid_ < 0) return false;
  if (reaped_) return true;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    wait_status_ = status;
    reaped_ = true;
  }
  return reaped_;
}

absl::StatusOr<int> ChildProcess::Wait(std::chrono::milliseconds timeout) {
  if (pid_ < 0) return absl::FailedPreconditionError("no child process");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!Exited()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      const pid_t pid = pid_;
      Kill().IgnoreError();
      return absl::DeadlineExceededError(
          absl::StrCat("child ", pid, " still running after ", timeout.count(), " ms: killed"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (WIFSIGNALED(wait_status_)) {
    return absl::AbortedError(absl::StrCat("child ", pid_, " was killed by signal ",
                                           WTERMSIG(wait_status_), " (",
                                           strsignal(WTERMSIG(wait_status_)), ")"));
  }
  return WEXITSTATUS(wait_status_);
}

absl::Status ChildProcess::Kill() {
  if (pid_ < 0 || reaped_) return absl::OkStatus();
  if (kill(pid_, SIGKILL) != 0 && errno != ESRCH) {
    return absl::InternalError(absl::StrCat("kill ", pid_, ": ", std::strerror(errno)));
  }
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    wait_status_ = status;
    reaped_ = true;
  }
  return absl::OkStatus();
}

}  // namespace gradsync::testing
