// Process: a child process of a multi-process test, started either from a
// binary (Spawn) or by forking this one to run a function (Fork). Every
// wait has a deadline past which the child is killed, and a child still
// running when its handle goes away is killed (SIGKILL) and reaped: a
// failing test can neither hang nor leave a process behind.
#ifndef GRADSYNC_TESTS_TESTING_PROCESS_H_
#define GRADSYNC_TESTS_TESTING_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradsync::testing {

// How a process ended.
struct ExitStatus {
  bool exited = false;     // false: killed by a signal, timed out or never started
  int code = -1;           // the exit code, or the signal number
  bool timed_out = false;  // it outlived the wait and was killed

  // The exit code; an error saying why there is none otherwise.
  absl::StatusOr<int> ExitCode() const;
  // "exit 3", "signal 9 (Killed)", ...
  std::string ToString() const;
};

struct SpawnOptions {
  // Entries added to (or replacing those of) this process's environment.
  // Under Bazel LOGS_DIRECTORY is $TEST_TMPDIR unless set here or unset: a
  // gradsyncd's stall and timeout traces stay in the test's own directory.
  std::map<std::string, std::string> env;
  // Variables removed from it.
  std::vector<std::string> unset_env;
  // Where stderr goes when it is not to share the log.
  std::string err_path;
  // stdin and stdout become pipes to the test (SendLine, ReadLine); the log
  // then holds stderr only.
  bool pipes = false;
};

class Process {
 public:
  // Starts the binary argv[0] (a path; PATH is not searched) with posix_spawn,
  // which is safe in a process that runs gRPC threads; its stdout and stderr
  // go to `log_path` (empty: ours). If it cannot start, started() is false
  // and the reason is written to the log.
  static Process Spawn(const std::vector<std::string>& argv, const std::string& log_path,
                       const SpawnOptions& options = {});

  // Forks; the child runs `body` and exits with its result (0: success by
  // convention), never returning into the test framework. It dies with the
  // test process, and of SIGALRM once it outlives `limit`. Only for tests
  // without gRPC threads: those must Spawn.
  static absl::StatusOr<Process> Fork(std::function<int()> body,
                                      std::chrono::seconds limit = std::chrono::seconds(60));

  Process() = default;
  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process();  // kills (SIGKILL) and reaps a child still running

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  std::string Log() const;  // the log so far ("" without one)
  // How it ended, once reaped (by Running, Wait or Kill); nullopt before.
  std::optional<ExitStatus> exit_status() const;

  // Whether it is still running; reaps it (without blocking) if not.
  bool Running();
  // Waits for the exit up to `timeout`, past which it is killed (SIGKILL).
  // Once reaped, returns the same status again.
  ExitStatus Wait(std::chrono::milliseconds timeout);
  // Sends `sig` unless it has been reaped (never signals a reused pid).
  void Signal(int sig);
  // SIGKILLs and reaps it; OK if it had already exited.
  absl::Status Kill();

  // With SpawnOptions::pipes: writes `line` and a newline to its stdin...
  bool SendLine(const std::string& line);
  // ...and reads the next line from its stdout, without the newline; "" at
  // its exit or past `timeout`.
  std::string ReadLine(std::chrono::milliseconds timeout = std::chrono::seconds(60));

 private:
  void Reaped(int wait_status);
  void ClosePipes();

  pid_t pid_ = -1;
  int stdin_fd_ = -1;  // SpawnOptions::pipes only
  int stdout_fd_ = -1;
  std::string stdout_buffer_;  // read, not yet returned by ReadLine
  std::string log_path_;
  bool reaped_ = false;
  ExitStatus status_;  // valid once reaped_
};

// Waits until every process has exited; past `timeout` kills the rest and
// returns false.
bool WaitAll(const std::vector<Process*>& processes, std::chrono::milliseconds timeout);

// Waits until the process's log contains `needle` (false on timeout): tests
// wait for a state ("event=job_running") instead of guessing a delay.
bool WaitForLog(const Process& process, const std::string& needle,
                std::chrono::milliseconds timeout);

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_TESTING_PROCESS_H_
