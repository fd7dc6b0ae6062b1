#include "tests/integration/harness.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "tests/testing/shm_entries.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {

namespace {

// The daemon's --shm-prefix: the last one on its command line wins, as a
// test may override the harness' own.
std::string ShmPrefixOf(const std::vector<std::string>& argv) {
  static const std::string kFlag = "--shm-prefix=";
  std::string prefix;
  for (const std::string& arg : argv) {
    if (arg.rfind(kFlag, 0) == 0) prefix = arg.substr(kFlag.size());
  }
  return prefix;
}

}  // namespace

Daemon::Daemon(int local_size, std::vector<std::string> args,
               const std::map<std::string, std::string>& env, const std::string& binary) {
  socket_ = dir_.File("gradsyncd.sock");
  shm_prefix_ = "gst" + std::to_string(getpid()) + "x" + std::to_string(rand() % 100000);
  std::vector<std::string> argv = {Runfile(binary), "--socket=" + socket_, "--listen=127.0.0.1:0",
                                   "--shm-prefix=" + shm_prefix_,
                                   "--local-size=" + std::to_string(local_size)};
  argv.insert(argv.end(), args.begin(), args.end());
  shm_prefix_ = ShmPrefixOf(argv);
  SpawnOptions options;
  options.env = env;
  process_ = Process::Spawn(argv, dir_.File("daemon.log"), options);
}

Daemon::~Daemon() {
  if (process_.Running()) Stop();
  if (process_.Running()) process_.Kill().IgnoreError();  // SIGTERM did not end it
  // A daemon the test SIGKILLed leaves its segments, and no later daemon
  // sweeps this test's prefix: remove them, now that it cannot make more.
  RemoveShmEntriesOfPrefix(shm_prefix_);
}

bool WaitForSocket(Process& process, const std::string& path, std::chrono::milliseconds timeout) {
  bool connected = false;
  WaitUntil(
      [&] {
        if (!process.Running()) return true;  // gave up: it will never answer
        const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
        connected = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
        close(fd);
        return connected;
      },
      timeout);
  return connected;
}

bool Daemon::WaitReady(std::chrono::milliseconds timeout) {
  return WaitForSocket(process_, socket_, timeout);
}

int Daemon::ListenPort(std::chrono::milliseconds timeout) {
  static const std::string kKey = "listen_port=";
  int port = 0;
  WaitUntil(
      [&] {
        const std::string log = process_.Log();
        const size_t started = log.find("event=started");
        if (started != std::string::npos) {
          const size_t at = log.find(kKey, started);
          const size_t eol = log.find('\n', started);
          if (at != std::string::npos && (eol == std::string::npos || at < eol)) {
            port = std::atoi(log.c_str() + at + kKey.size());
            return true;
          }
        }
        return !process_.Running();  // gave up: it will never log it
      },
      timeout);
  return port;
}

ExitStatus Daemon::Stop() {
  process_.Signal(SIGTERM);
  return process_.Wait(std::chrono::seconds(10));
}

namespace {

// Whether /proc/.../stat at `path` says state T (stopped).
bool StatSaysStopped(const std::string& path) {
  std::ifstream in(path);
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T';
}

// Whether every thread of `pid` is stopped (state T in each
// /proc/PID/task/TID/stat). A SIGSTOP sent with kill() is pending on the
// process, and only the thread the kernel picked to take it starts the
// group stop once it runs: on a loaded machine the other threads go on
// for milliseconds after kill() returned (a daemon's scheduler and RPC
// threads finishing whole iterations), so the main thread's state alone
// says nothing about the process.
bool IsStopped(pid_t pid) {
  const std::string task_dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(task_dir.c_str());
  if (d == nullptr) return false;
  bool any = false, all = true;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    any = true;
    all = all && StatSaysStopped(task_dir + "/" + e->d_name + "/stat");
  }
  closedir(d);
  return any && all;
}

}  // namespace

bool WaitStopped(Process& p, std::chrono::milliseconds timeout) {
  bool stopped = false;
  WaitUntil(
      [&] {
        stopped = IsStopped(p.pid());
        return stopped || !p.Running();
      },
      timeout);
  return stopped;
}

Process StartTrainer(const Daemon& daemon, int local_rank, const std::vector<std::string>& args,
                     const std::string& out_path) {
  std::vector<std::string> argv = {Runfile("tests/testing/fault_trainer"),
                                   "--socket=" + daemon.socket(), "--quiet"};
  if (!out_path.empty()) argv.push_back("--out=" + out_path);
  argv.insert(argv.end(), args.begin(), args.end());
  SpawnOptions options;
  options.env = {{"LOCAL_RANK", std::to_string(local_rank)}};
  return Process::Spawn(argv,
                        daemon.dir() + "/trainer" + std::to_string(local_rank) + "." +
                            std::to_string(rand() % 1000000) + ".log",
                        options);
}

void ExpectTrains(Daemon& daemon, int trainers, const std::string& why,
                  std::chrono::milliseconds bound, const std::vector<std::string>& args) {
  std::vector<Process> ps;
  for (int r = 0; r < trainers; ++r) ps.push_back(StartTrainer(daemon, r, args, ""));
  for (int r = 0; r < trainers; ++r) {
    const ExitStatus st = ps[r].Wait(bound);
    EXPECT_TRUE(st.exited && st.code == 0)
        << why << ": trainer " << r << " " << st.ToString() << "\n"
        << ps[r].Log() << "\ndaemon:\n"
        << daemon.process().Log();
  }
}

std::vector<double> LoadWeights(const std::string& path) {
  std::vector<double> out;
  std::ifstream in(path);
  std::string name;
  double v;
  while (in >> name >> v) out.push_back(v);
  return out;
}

std::vector<double> SingleProcessReference(const std::string& dir,
                                           const std::vector<std::string>& args) {
  std::vector<std::string> argv = {Runfile("tests/testing/fault_trainer"), "--single", "--quiet",
                                   "--out=" + dir + "/reference.txt"};
  argv.insert(argv.end(), args.begin(), args.end());
  Process p = Process::Spawn(argv, dir + "/reference.log");
  EXPECT_EQ(p.Wait(std::chrono::seconds(60)).code, 0) << p.Log();
  return LoadWeights(dir + "/reference.txt");
}

double RelativeDifference(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || b.empty()) return INFINITY;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

std::vector<std::string> SegmentsWithPrefix(const std::string& prefix) {
  std::vector<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (std::string(e->d_name).rfind(prefix, 0) == 0) out.push_back(e->d_name);
    }
    closedir(d);
  }
  return out;
}

std::string RebuildTo(const std::string& log, const std::string& caps) {
  for (size_t at = log.find("event=plan_rebuilt"); at != std::string::npos;
       at = log.find("event=plan_rebuilt", at + 1)) {
    const std::string line = log.substr(at, log.find('\n', at) - at);
    if (line.find(caps) != std::string::npos) return line;
  }
  return "none";
}

}  // namespace gradsync::testing
