// Test harness for multi-process integration tests: real gradsyncd and real
// trainer processes, started from the test's runfiles, with logs captured
// to files and every wait bounded (a hung child is killed, never waited on
// forever).
#ifndef GRADSYNC_TESTS_INTEGRATION_HARNESS_H_
#define GRADSYNC_TESTS_INTEGRATION_HARNESS_H_

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace gradsync::testing {

// Path of a binary in this test's runfiles, e.g. "daemon/gradsyncd".
std::string Runfile(const std::string& workspace_relative);

// A short fresh directory under /tmp (unix socket paths are limited).
std::string MakeTempDir();

std::string ReadFile(const std::string& path);

struct ExitStatus {
  bool exited = false;  // false: killed by a signal (or timed out)
  int code = -1;        // exit code, or the signal number
  bool timed_out = false;
};

class Process {
 public:
  Process() = default;
  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;
  ~Process();  // kills the process if still running

  // Starts argv[0] with extra environment entries; stdout+stderr -> log_path.
  static Process Start(const std::vector<std::string>& argv,
                       const std::map<std::string, std::string>& env, const std::string& log_path);

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  std::string Log() const { return ReadFile(log_path_); }

  // Waits for exit up to `timeout`; on timeout kills it (SIGKILL). Once
  // reaped (here or by Running), returns the same status again.
  ExitStatus Wait(std::chrono::milliseconds timeout);
  void Signal(int sig);
  bool Running();

 private:
  static ExitStatus Decode(int wait_status);

  pid_t pid_ = -1;
  std::string log_path_;
  bool reaped_ = false;
  ExitStatus status_;  // valid once reaped_
};

// A gradsyncd on a private socket and shm prefix.
class Daemon {
 public:
  // `args` are appended to --socket/--listen/--shm-prefix/--local-size;
  // `env` entries are added to the daemon's environment (e.g. LOGS_DIRECTORY).
  // `binary`: the daemon's runfile (the GPU tests run tests/gpu/gradsyncd_sim).
  explicit Daemon(int local_size, std::vector<std::string> args = {},
                  const std::map<std::string, std::string>& env = {},
                  const std::string& binary = "daemon/gradsyncd");
  ~Daemon();

  const std::string& socket() const { return socket_; }
  const std::string& dir() const { return dir_; }
  const std::string& shm_prefix() const { return shm_prefix_; }
  Process& process() { return process_; }
  // Waits until the socket accepts connections (false on timeout / exit).
  bool WaitReady(std::chrono::milliseconds timeout);
  // The TCP port the daemon chose for --listen=127.0.0.1:0, read from its
  // "event=started ... listen_port=N" log line; 0 if it does not appear in
  // `timeout` (or the daemon exits).
  int ListenPort(std::chrono::milliseconds timeout);
  ExitStatus Stop();  // SIGTERM, then wait

 private:
  std::string dir_, socket_, shm_prefix_;
  Process process_;
};

// Trainer flags and outputs for examples/mlp_trainer.
struct TrainerRun {
  std::vector<std::string> args;  // extra flags
  std::string out;                // weights file
};

// Starts examples/mlp_trainer with LOCAL_RANK=local_rank.
Process StartTrainer(const Daemon& daemon, int local_rank, const std::vector<std::string>& args,
                     const std::string& out_path);

// Loads a weights file ("name value" per line).
std::vector<double> LoadWeights(const std::string& path);

// max |a - b| / max |b|: the normwise relative difference.
double RelativeDifference(const std::vector<double>& a, const std::vector<double>& b);

// Waits until the process's log contains `needle` (false on timeout):
// tests wait for a state ("event=job_running") instead of guessing a delay.
bool WaitForLog(const Process& process, const std::string& needle,
                std::chrono::milliseconds timeout);

// Segment names under /dev/shm that start with `prefix`.
std::vector<std::string> SegmentsWithPrefix(const std::string& prefix);

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_INTEGRATION_HARNESS_H_
