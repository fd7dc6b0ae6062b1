#include "tests/testing/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/testing/files.h"
#include "tests/testing/wait.h"

extern char** environ;

namespace gradsync::testing {
namespace {

constexpr auto kPollEvery = std::chrono::milliseconds(2);

// gradsyncd writes the traces of stalls and timeouts to $LOGS_DIRECTORY,
// else to /tmp/gradsync: under Bazel a child gets the test's own temp dir
// there, so no test leaves files behind or reads another run's.
std::map<std::string, std::string> WithTraceDirectory(const SpawnOptions& options) {
  std::map<std::string, std::string> env = options.env;
  const char* test_tmpdir = std::getenv("TEST_TMPDIR");
  const bool unset = std::find(options.unset_env.begin(), options.unset_env.end(),
                               "LOGS_DIRECTORY") != options.unset_env.end();
  if (test_tmpdir != nullptr && *test_tmpdir != '\0' && !unset) {
    env.emplace("LOGS_DIRECTORY", test_tmpdir);  // a test's own choice stays
  }
  return env;
}

// This process's environment, changed as `options` says, as KEY=VALUE.
std::vector<std::string> ChildEnvironment(const SpawnOptions& options) {
  const std::map<std::string, std::string> env = WithTraceDirectory(options);
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('='));
    const bool unset = std::find(options.unset_env.begin(), options.unset_env.end(), key) !=
                       options.unset_env.end();
    if (!unset && env.count(key) == 0) out.push_back(entry);
  }
  for (const auto& [key, value] : env) out.push_back(key + "=" + value);
  return out;
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Where the child's stdin, stdout and stderr go (see SpawnOptions).
void RedirectStdio(posix_spawn_file_actions_t* actions, const std::string& log_path,
                   const SpawnOptions& options, int stdin_pipe, int stdout_pipe) {
  constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC;
  if (options.pipes) {
    posix_spawn_file_actions_adddup2(actions, stdin_pipe, STDIN_FILENO);
    posix_spawn_file_actions_adddup2(actions, stdout_pipe, STDOUT_FILENO);
  } else if (!log_path.empty()) {
    posix_spawn_file_actions_addopen(actions, STDOUT_FILENO, log_path.c_str(), kFlags, 0644);
  }
  if (!options.err_path.empty()) {
    posix_spawn_file_actions_addopen(actions, STDERR_FILENO, options.err_path.c_str(), kFlags,
                                     0644);
  } else if (options.pipes && !log_path.empty()) {
    posix_spawn_file_actions_addopen(actions, STDERR_FILENO, log_path.c_str(), kFlags, 0644);
  } else if (!log_path.empty()) {
    posix_spawn_file_actions_adddup2(actions, STDOUT_FILENO, STDERR_FILENO);
  }
}

// waitpid, retried on EINTR.
pid_t WaitPid(pid_t pid, int* status, int flags) {
  pid_t r;
  do {
    r = waitpid(pid, status, flags);
  } while (r < 0 && errno == EINTR);
  return r;
}

}  // namespace

absl::StatusOr<int> ExitStatus::ExitCode() const {
  if (exited) return code;
  return absl::AbortedError(ToString());
}

std::string ExitStatus::ToString() const {
  if (exited) return absl::StrCat("exit ", code);
  if (code < 0) return "never started";
  return absl::StrCat(timed_out ? "timed out, killed by signal " : "killed by signal ", code, " (",
                      strsignal(code), ")");
}

Process Process::Spawn(const std::vector<std::string>& argv, const std::string& log_path,
                       const SpawnOptions& options) {
  Process p;
  p.log_path_ = log_path;
  std::vector<std::string> args = argv, env = ChildEnvironment(options);
  std::vector<char*> arg_ptrs = Pointers(args), env_ptrs = Pointers(env);

  int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
  int rc = args.empty() ? EINVAL : 0;
  if (rc == 0 && options.pipes &&
      (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0)) {
    rc = errno;
  }

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  RedirectStdio(&actions, log_path, options, to_child[0], from_child[1]);
  pid_t pid = -1;
  if (rc == 0) {
    rc = posix_spawn(&pid, args[0].c_str(), &actions, nullptr, arg_ptrs.data(), env_ptrs.data());
  }
  posix_spawn_file_actions_destroy(&actions);
  // The child's ends (and on failure ours too).
  for (int fd : {to_child[0], from_child[1]}) {
    if (fd >= 0) close(fd);
  }
  p.stdin_fd_ = to_child[1];
  p.stdout_fd_ = from_child[0];
  if (rc != 0) {
    p.ClosePipes();
    const std::string why = absl::StrCat("cannot start ", args.empty() ? "(no argv)" : args[0],
                                         ": ", std::strerror(rc), "\n");
    if (!log_path.empty()) {
      std::ofstream(log_path) << why;
    } else {
      std::fputs(why.c_str(), stderr);
    }
    return p;
  }
  p.pid_ = pid;
  return p;
}

absl::StatusOr<Process> Process::Fork(std::function<int()> body, std::chrono::seconds limit) {
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
  Process p;
  p.pid_ = pid;
  return p;
}

Process::Process(Process&& other) noexcept { *this = std::move(other); }

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    Kill().IgnoreError();
    ClosePipes();
    stdin_fd_ = std::exchange(other.stdin_fd_, -1);
    stdout_fd_ = std::exchange(other.stdout_fd_, -1);
    stdout_buffer_ = std::move(other.stdout_buffer_);
    pid_ = std::exchange(other.pid_, -1);
    log_path_ = std::move(other.log_path_);
    reaped_ = std::exchange(other.reaped_, false);
    status_ = other.status_;
  }
  return *this;
}

Process::~Process() {
  ClosePipes();
  Kill().IgnoreError();
}

void Process::ClosePipes() {
  for (int* fd : {&stdin_fd_, &stdout_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

bool Process::SendLine(const std::string& line) {
  if (stdin_fd_ < 0) return false;
  const std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(stdin_fd_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

std::string Process::ReadLine(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (stdout_fd_ >= 0) {
    const size_t newline = stdout_buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = stdout_buffer_.substr(0, newline);
      stdout_buffer_.erase(0, newline + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd readable{stdout_fd_, POLLIN, 0};
    if (poll(&readable, 1, static_cast<int>(left.count())) <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // its exit closed the pipe
    stdout_buffer_.append(chunk, static_cast<size_t>(n));
  }
  return "";
}

std::string Process::Log() const { return log_path_.empty() ? "" : ReadFile(log_path_); }

std::optional<ExitStatus> Process::exit_status() const {
  if (!reaped_) return std::nullopt;
  return status_;
}

void Process::Reaped(int wait_status) {
  reaped_ = true;
  status_ = ExitStatus{};
  if (WIFEXITED(wait_status)) {
    status_.exited = true;
    status_.code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    status_.code = WTERMSIG(wait_status);
  }
}

bool Process::Running() {
  if (pid_ <= 0 || reaped_) return false;
  int status = 0;
  const pid_t r = WaitPid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  if (r == pid_) {
    Reaped(status);
  } else {
    reaped_ = true;  // not our child any more: never signal a reused pid
  }
  return false;
}

ExitStatus Process::Wait(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return ExitStatus{};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (Running()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      Kill().IgnoreError();
      status_.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(kPollEvery);
  }
  return status_;
}

void Process::Signal(int sig) {
  if (pid_ > 0 && !reaped_) kill(pid_, sig);
}

absl::Status Process::Kill() {
  if (pid_ <= 0 || reaped_) return absl::OkStatus();
  if (kill(pid_, SIGKILL) != 0 && errno != ESRCH) {
    return absl::InternalError(absl::StrCat("kill ", pid_, ": ", std::strerror(errno)));
  }
  int status = 0;
  if (WaitPid(pid_, &status, 0) == pid_) {
    Reaped(status);
  } else {
    reaped_ = true;
  }
  return absl::OkStatus();
}

bool WaitAll(const std::vector<Process*>& processes, std::chrono::milliseconds timeout) {
  const bool ended = WaitUntil(
      [&] {
        return std::none_of(processes.begin(), processes.end(),
                            [](Process* p) { return p->Running(); });
      },
      timeout);
  if (!ended) {
    for (Process* p : processes) p->Kill().IgnoreError();
  }
  return ended;
}

bool WaitForLog(const Process& process, const std::string& needle,
                std::chrono::milliseconds timeout) {
  return WaitUntil([&] { return process.Log().find(needle) != std::string::npos; }, timeout);
}

}  // namespace gradsync::testing
