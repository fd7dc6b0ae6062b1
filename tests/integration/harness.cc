#include "tests/integration/harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace gradsync::testing {

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  if (srcdir != nullptr) {
    return std::string(srcdir) + "/" + (ws ? ws : "gradsync") + "/" + path;
  }
  return "bazel-bin/" + path;  // run by hand from the workspace root
}

std::string MakeTempDir() {
  char tmpl[] = "/tmp/gst.XXXXXX";
  char* d = mkdtemp(tmpl);
  return d ? std::string(d) : std::string("/tmp");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Process::Process(Process&& o) noexcept { *this = std::move(o); }

Process& Process::operator=(Process&& o) noexcept {
  if (this != &o) {
    if (pid_ > 0 && !reaped_) Wait(std::chrono::milliseconds(0));
    pid_ = o.pid_;
    log_path_ = std::move(o.log_path_);
    reaped_ = o.reaped_;
    status_ = o.status_;
    o.pid_ = -1;
    o.reaped_ = true;
  }
  return *this;
}

Process::~Process() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

Process Process::Start(const std::vector<std::string>& argv,
                       const std::map<std::string, std::string>& env,
                       const std::string& log_path) {
  Process p;
  p.log_path_ = log_path;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    execv(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  p.pid_ = pid;
  return p;
}

ExitStatus Process::Decode(int status) {
  ExitStatus st;
  if (WIFEXITED(status)) {
    st.exited = true;
    st.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    st.code = WTERMSIG(status);
  }
  return st;
}

ExitStatus Process::Wait(std::chrono::milliseconds timeout) {
  if (reaped_) return status_;
  ExitStatus st;
  if (pid_ <= 0) return st;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      st.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const bool timed_out = st.timed_out;
  st = Decode(status);
  st.timed_out = timed_out;
  reaped_ = true;
  status_ = st;
  return st;
}

void Process::Signal(int sig) {
  if (pid_ > 0 && !reaped_) kill(pid_, sig);
}

bool Process::Running() {
  if (pid_ <= 0 || reaped_) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  // Reaped here: keep the status for Wait (and never signal a reused pid).
  reaped_ = true;
  status_ = r == pid_ ? Decode(status) : ExitStatus{};
  return false;
}

Daemon::Daemon(int local_size, std::vector<std::string> args,
               const std::map<std::string, std::string>& env, const std::string& binary) {
  dir_ = MakeTempDir();
  socket_ = dir_ + "/gradsyncd.sock";
  shm_prefix_ = "gst" + std::to_string(getpid()) + "x" + std::to_string(rand() % 100000);
  std::vector<std::string> argv = {Runfile(binary),
                                   "--socket=" + socket_,
                                   "--listen=127.0.0.1:0",
                                   "--shm-prefix=" + shm_prefix_,
                                   "--local-size=" + std::to_string(local_size)};
  argv.insert(argv.end(), args.begin(), args.end());
  process_ = Process::Start(argv, env, dir_ + "/daemon.log");
}

Daemon::~Daemon() {
  if (process_.Running()) Stop();
}

bool Daemon::WaitReady(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!process_.Running()) return false;
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_.c_str(), sizeof(addr.sun_path) - 1);
    const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (ok) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

int Daemon::ListenPort(std::chrono::milliseconds timeout) {
  static const std::string kKey = "listen_port=";
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const std::string log = process_.Log();
    const size_t started = log.find("event=started");
    if (started != std::string::npos) {
      const size_t at = log.find(kKey, started);
      const size_t eol = log.find('\n', started);
      if (at != std::string::npos && (eol == std::string::npos || at < eol)) {
        return std::atoi(log.c_str() + at + kKey.size());
      }
    }
    if (std::chrono::steady_clock::now() >= deadline || !process_.Running()) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

ExitStatus Daemon::Stop() {
  process_.Signal(SIGTERM);
  return process_.Wait(std::chrono::seconds(10));
}

Process StartTrainer(const Daemon& daemon, int local_rank, const std::vector<std::string>& args,
                     const std::string& out_path) {
  std::vector<std::string> argv = {Runfile("examples/mlp_trainer"), "--socket=" + daemon.socket(),
                                   "--quiet"};
  if (!out_path.empty()) argv.push_back("--out=" + out_path);
  argv.insert(argv.end(), args.begin(), args.end());
  return Process::Start(argv, {{"LOCAL_RANK", std::to_string(local_rank)}},
                        daemon.dir() + "/trainer" + std::to_string(local_rank) + "." +
                            std::to_string(rand() % 1000000) + ".log");
}

std::vector<double> LoadWeights(const std::string& path) {
  std::vector<double> out;
  std::ifstream in(path);
  std::string name;
  double v;
  while (in >> name >> v) out.push_back(v);
  return out;
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

bool WaitForLog(const Process& process, const std::string& needle,
                std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (process.Log().find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
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

}  // namespace gradsync::testing
