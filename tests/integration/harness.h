// Test harness for multi-process integration tests: real gradsyncd and real
// trainer processes, started from the test's runfiles (processes, logs and
// deadlines: tests/testing/process.h).
#ifndef GRADSYNC_TESTS_INTEGRATION_HARNESS_H_
#define GRADSYNC_TESTS_INTEGRATION_HARNESS_H_

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "tests/testing/files.h"
#include "tests/testing/process.h"

namespace gradsync::testing {

// A gradsyncd on a private socket and shm prefix.
class Daemon {
 public:
  // `args` are appended to --socket/--listen/--shm-prefix/--local-size;
  // `env` entries are added to the daemon's environment (e.g. LOGS_DIRECTORY).
  // `binary`: the daemon's runfile (the GPU tests run tests/gpu/gradsyncd_sim).
  explicit Daemon(int local_size, std::vector<std::string> args = {},
                  const std::map<std::string, std::string>& env = {},
                  const std::string& binary = "daemon/gradsyncd");
  // Stops the daemon if it still runs (SIGTERM, then SIGKILL), then removes
  // every /dev/shm entry of its shm prefix: what a daemon killed with
  // SIGKILL left, which no later daemon would sweep.
  ~Daemon();

  const std::string& socket() const { return socket_; }
  const std::string& dir() const { return dir_.path(); }
  // Its --shm-prefix (the harness' "gst<pid>x<n>" unless `args` set one).
  const std::string& shm_prefix() const { return shm_prefix_; }
  Process& process() { return process_; }
  const Process& process() const { return process_; }
  // Waits until the socket accepts connections (false on timeout / exit).
  bool WaitReady(std::chrono::milliseconds timeout);
  // The TCP port the daemon chose for --listen=127.0.0.1:0, read from its
  // "event=started ... listen_port=N" log line; 0 if it does not appear in
  // `timeout` (or the daemon exits).
  int ListenPort(std::chrono::milliseconds timeout);
  ExitStatus Stop();  // SIGTERM, then wait

 private:
  ScratchDir dir_;  // removed after process_ is gone
  std::string socket_, shm_prefix_;
  Process process_;
};

// Waits until the unix socket at `path` accepts connections; false past
// `timeout` or once `process` (the one that should listen) exited.
bool WaitForSocket(Process& process, const std::string& path, std::chrono::milliseconds timeout);

// Trainer flags and outputs for tests/testing/fault_trainer.
struct TrainerRun {
  std::vector<std::string> args;  // extra flags
  std::string out;                // weights file
};

// tests/testing/fault_trainer exits with 10 + the gs_status that stopped it
// (client/gradsync.h), so tests can assert the exact code.
inline constexpr int kExitInvalidArgument = 11;
inline constexpr int kExitUnavailable = 12;
inline constexpr int kExitMismatch = 13;
inline constexpr int kExitPeerFailed = 14;
inline constexpr int kExitTimeout = 15;
inline constexpr int kExitState = 16;
inline constexpr int kExitResourceExhausted = 18;

// Waits until `p` is stopped: every one of its threads in state T (it
// raised SIGSTOP at a pause point, or a test sent it one: kill() returns
// before the stop takes effect); false past `timeout` or once it exited.
bool WaitStopped(Process& p, std::chrono::milliseconds timeout);

// Starts tests/testing/fault_trainer with LOCAL_RANK=local_rank.
Process StartTrainer(const Daemon& daemon, int local_rank, const std::vector<std::string>& args,
                     const std::string& out_path);

// Starts `trainers` tests/testing/fault_trainer on `daemon` with `args` and expects
// each to succeed within `bound`; `why` names the job in a failure.
void ExpectTrains(Daemon& daemon, int trainers, const std::string& why,
                  std::chrono::milliseconds bound = std::chrono::seconds(60),
                  const std::vector<std::string>& args = {"--steps=5", "--batch=60"});

// Loads a weights file ("name value" per line).
std::vector<double> LoadWeights(const std::string& path);

// The weights tests/testing/fault_trainer --single reaches with `args`: one process
// training on the whole batch, what every distributed run must equal. Its
// files go to `dir`; a failed run is a test failure (and gives no weights).
std::vector<double> SingleProcessReference(const std::string& dir,
                                           const std::vector<std::string>& args);

// max |a - b| / max |b|: the normwise relative difference.
double RelativeDifference(const std::vector<double>& a, const std::vector<double>& b);

// Segment names under /dev/shm that start with `prefix`.
std::vector<std::string> SegmentsWithPrefix(const std::string& prefix);

// The line of the first "event=plan_rebuilt" in a daemon's `log` that names
// `caps` ("cap_mb=25.000 first_cap_mb=1.000"), from the event on; "none".
std::string RebuildTo(const std::string& log, const std::string& caps);

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_INTEGRATION_HARNESS_H_
