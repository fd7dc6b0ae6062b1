#include "tests/multinode/test_support.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

extern char** environ;

namespace gradsync::testing {

TestLeader::TestLeader(const std::string& job_id, const std::string& job_token, int num_nodes,
                       absl::Duration default_timeout, absl::Duration heartbeat_timeout)
    : service_(std::make_unique<RendezvousService>(job_id, job_token, num_nodes, default_timeout,
                                                   heartbeat_timeout)) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ != nullptr && port > 0) address_ = "127.0.0.1:" + std::to_string(port);
}

TestLeader::~TestLeader() {
  // Cancels calls still blocked in Join/Wait; they notice within 100 ms.
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
}

Child::Child(const std::string& binary, const std::vector<std::string>& args,
             const std::string& log_path)
    : log_path_(log_path) {
  std::vector<std::string> argv_storage;
  argv_storage.push_back(binary);
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path_.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  if (posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ) == 0) {
    pid_ = pid;
  }
  posix_spawn_file_actions_destroy(&actions);
}

Child::~Child() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

bool Child::Poll() {
  if (pid_ <= 0) return true;
  if (exited_) return true;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r != pid_) return false;
  exited_ = true;
  if (WIFEXITED(status)) {
    exit_code_ = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    exit_code_ = -WTERMSIG(status);
  }
  return true;
}

void Child::Kill(int signal) {
  if (running()) ::kill(pid_, signal);
}

std::string Child::Log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool WaitAll(const std::vector<Child*>& children, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    bool all = true;
    for (Child* c : children) all = c->Poll() && all;
    if (all) return true;
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (Child* c : children) {
    c->Kill(SIGKILL);
    while (!c->Poll()) absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

bool WaitForFile(const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  struct stat st;
  while (::stat(path.c_str(), &st) != 0) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

std::string HelperPath(const std::string& name) {
  struct stat st;
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    const char* workspace = std::getenv("TEST_WORKSPACE");
    const std::string path = std::string(srcdir) + "/" + (workspace ? workspace : "gradsync") +
                             "/tests/multinode/" + name;
    if (::stat(path.c_str(), &st) == 0) return path;
  }
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return name;
  std::string dir(self, static_cast<size_t>(n));
  dir = dir.substr(0, dir.rfind('/'));
  return dir + "/" + name;
}

ScratchDir::ScratchDir() {
  char templ[] = "/tmp/gsmn.XXXXXX";
  if (::mkdtemp(templ) != nullptr) path_ = templ;
}

ScratchDir::~ScratchDir() {
  if (path_.empty()) return;
  if (DIR* dir = ::opendir(path_.c_str())) {
    while (struct dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      ::unlink((path_ + "/" + name).c_str());
    }
    ::closedir(dir);
  }
  ::rmdir(path_.c_str());
}

}  // namespace gradsync::testing
