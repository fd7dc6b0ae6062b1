#include "daemon/backends/gloo_worker_process.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log_value.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "daemon/backends/gloo_worker.h"
#include "daemon/backends/worker_zygote.h"
#include "spdlog/spdlog.h"

extern char** environ;

namespace gradsync {
namespace {

// Debian 12's <sys/pidfd.h> lacks extern "C": the system call directly.
int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// Whether the process behind `pidfd` has exited (false when unknown).
bool Exited(int pidfd) {
  if (pidfd < 0) return false;
  pollfd exited{pidfd, POLLIN, 0};
  return poll(&exited, 1, 0) == 1;
}

struct Spare {
  absl::Mutex mu;
  std::vector<std::string> argv ABSL_GUARDED_BY(mu);
  std::optional<GlooWorkerProcess> process ABSL_GUARDED_BY(mu);
};

Spare& TheSpare() {
  static Spare* const spare = new Spare;  // never destroyed: used until exit
  return *spare;
}

}  // namespace

GlooWorkerProcess::GlooWorkerProcess(GlooWorkerProcess&& other) noexcept
    : pid(std::exchange(other.pid, 0)),
      pidfd(std::exchange(other.pidfd, -1)),
      channel(std::move(other.channel)),
      buffer_fd(std::exchange(other.buffer_fd, -1)) {}

GlooWorkerProcess::~GlooWorkerProcess() {
  channel.Close();  // its end of file: an idle worker exits at once
  if (pid > 0) {
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  if (pidfd >= 0) close(pidfd);
  if (buffer_fd >= 0) close(buffer_fd);
}

std::vector<std::string> ThisExecutableAsGlooWorker() {
  return {"/proc/self/exe", kGlooWorkerFlag};
}

absl::StatusOr<GlooWorkerProcess> SpawnGlooWorkerProcess(const std::vector<std::string>& argv) {
  ASSIGN_OR_RETURN(auto ends, WorkerChannel::CreatePair());  // (this end, the child's)
  GlooWorkerProcess worker;
  worker.buffer_fd = memfd_create("gradsync-gloo-buffer", MFD_CLOEXEC);
  if (worker.buffer_fd < 0) {
    return MakeError(v1::INTERNAL, absl::StrCat("memfd_create: ", std::strerror(errno)));
  }
  if (argv == ThisExecutableAsGlooWorker() && WorkerZygoteRunning()) {
    absl::StatusOr<pid_t> forked = ForkWorkerFromZygote(ends.second.fd(), worker.buffer_fd);
    if (forked.ok()) {
      worker.pid = *forked;
      worker.pidfd = PidfdOpen(worker.pid);
      worker.channel = std::move(ends.first);
      return worker;
    }
    spdlog::warn("event=gloo_worker_zygote_failed fallback=exec error={}",
                 LogValue(forked.status().message()));
  }
  // The worker finds its channel and buffer at fixed descriptors; dup2
  // clears close-on-exec there (and only there: the daemon's other
  // descriptors stay behind).
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, ends.second.fd(), kGlooWorkerChannelFd);
  posix_spawn_file_actions_adddup2(&actions, worker.buffer_fd, kGlooWorkerBufferFd);
  // The daemon blocks its stop signals for its signal thread: the worker
  // gets an empty mask and their default actions back.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGINT);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return MakeError(v1::INTERNAL, absl::StrCat("cannot start the Gloo worker ", argv[0], ": ",
                                                std::strerror(rc)));
  }
  worker.pid = pid;
  worker.pidfd = PidfdOpen(pid);
  worker.channel = std::move(ends.first);  // the child's end closes with `ends`
  return worker;
}

void PrepareSpareGlooWorker(const std::vector<std::string>& argv) {
  Spare& spare = TheSpare();
  absl::MutexLock lock(&spare.mu);
  if (spare.process.has_value() && spare.argv == argv && !Exited(spare.process->pidfd)) return;
  spare.process.reset();
  absl::StatusOr<GlooWorkerProcess> spawned = SpawnGlooWorkerProcess(argv);
  if (!spawned.ok()) {
    spdlog::warn("event=gloo_worker_spare_failed error={}", LogValue(spawned.status().message()));
    return;
  }
  spare.argv = argv;
  spare.process.emplace(*std::move(spawned));
}

std::optional<GlooWorkerProcess> TakeSpareGlooWorker(const std::vector<std::string>& argv) {
  Spare& spare = TheSpare();
  absl::MutexLock lock(&spare.mu);
  if (!spare.process.has_value() || spare.argv != argv) return std::nullopt;
  std::optional<GlooWorkerProcess> taken = std::move(spare.process);
  spare.process.reset();
  if (Exited(taken->pidfd)) {
    spdlog::warn("event=gloo_worker_spare_died pid={}", taken->pid);
    return std::nullopt;  // reaped as it goes
  }
  return taken;
}

}  // namespace gradsync
