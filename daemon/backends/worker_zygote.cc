#include "daemon/backends/worker_zygote.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_code.h"
#include "daemon/backends/gloo_worker.h"

namespace gradsync {
namespace {

// The zygote forks twice per request; on a machine busy starting a whole
// job that can take a while, but never this long unless it is stopped.
constexpr int kReplyTimeoutMs = 5000;

// What the zygote answers for each request: the worker's pid, or errno.
struct Reply {
  int32_t pid = 0;
  int32_t error = 0;
};

struct ZygoteHandle {
  absl::Mutex mu;                   // one request at a time: replies carry no request id
  int fd ABSL_GUARDED_BY(mu) = -1;  // the daemon's end of the socket
  pid_t pid ABSL_GUARDED_BY(mu) = 0;
};

ZygoteHandle& TheZygote() {
  static ZygoteHandle* const zygote = new ZygoteHandle;  // used until exit
  return *zygote;
}

int CountThreads() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int threads = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++threads;
  }
  closedir(dir);
  return threads;
}

// In the worker: the descriptors, signals and name an exec'd worker would
// have, then the worker itself. Never returns.
[[noreturn]] void BecomeWorker(WorkerMain worker_main, int channel_fd, int buffer_fd) {
  prctl(PR_SET_NAME, "gloo-worker");
  // Moved above the fixed numbers first: either may sit at 3 or 4 now.
  const int channel = fcntl(channel_fd, F_DUPFD_CLOEXEC, kGlooWorkerBufferFd + 1);
  const int buffer = fcntl(buffer_fd, F_DUPFD_CLOEXEC, kGlooWorkerBufferFd + 1);
  if (channel < 0 || buffer < 0 || dup2(channel, kGlooWorkerChannelFd) < 0 ||
      dup2(buffer, kGlooWorkerBufferFd) < 0) {
    _exit(127);
  }
  close_range(kGlooWorkerBufferFd + 1, ~0U, 0);  // the zygote's socket among them
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  std::exit(worker_main());
}

// Forks the worker through an intermediate that exits at once (so the
// daemon, the subreaper, adopts the worker). The worker's pid, or -errno.
int32_t ForkWorker(WorkerMain worker_main, int channel_fd, int buffer_fd) {
  int pid_pipe[2];
  if (pipe2(pid_pipe, O_CLOEXEC) != 0) return -errno;
  const pid_t intermediate = fork();
  if (intermediate == 0) {
    close(pid_pipe[0]);
    const pid_t worker = fork();
    if (worker == 0) BecomeWorker(worker_main, channel_fd, buffer_fd);
    const int32_t result = worker > 0 ? worker : -errno;
    const bool told = write(pid_pipe[1], &result, sizeof(result)) == sizeof(result);
    _exit(told ? 0 : 1);
  }
  const int fork_errno = errno;
  close(pid_pipe[1]);
  int32_t result = -fork_errno;
  if (intermediate > 0) {
    if (read(pid_pipe[0], &result, sizeof(result)) != sizeof(result)) result = -EPIPE;
    while (waitpid(intermediate, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  close(pid_pipe[0]);
  return result;
}

// One request's two descriptors (received close-on-exec), or false.
bool ReceiveRequest(int sock, int fds[2]) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  while ((n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
  }
  if (n <= 0) return false;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(2 * sizeof(int))) {
    return false;  // only the daemon writes here: anything else ends the zygote
  }
  std::memcpy(fds, CMSG_DATA(c), 2 * sizeof(int));
  return true;
}

[[noreturn]] void ZygoteLoop(WorkerMain worker_main, int sock, pid_t daemon) {
  prctl(PR_SET_NAME, "gradsync-zygote");
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != daemon) _exit(0);  // the daemon died before prctl
  int fds[2];
  while (ReceiveRequest(sock, fds)) {
    Reply reply;
    const int32_t forked = ForkWorker(worker_main, fds[0], fds[1]);
    close(fds[0]);
    close(fds[1]);
    if (forked > 0) {
      reply.pid = forked;
    } else {
      reply.error = -forked;
    }
    if (send(sock, &reply, sizeof(reply), MSG_NOSIGNAL) != sizeof(reply)) break;
  }
  _exit(0);
}

// The zygote is not used again: it is killed (if it is only stopped) and
// reaped.
void DropZygote(ZygoteHandle& zygote) ABSL_EXCLUSIVE_LOCKS_REQUIRED(zygote.mu) {
  close(zygote.fd);
  zygote.fd = -1;
  kill(zygote.pid, SIGKILL);
  while (waitpid(zygote.pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  zygote.pid = 0;
}

absl::Status SendRequest(int sock, int channel_fd, int buffer_fd) {
  char byte = 'w';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(2 * sizeof(int));
  const int fds[2] = {channel_fd, buffer_fd};
  std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
  ssize_t n;
  while ((n = sendmsg(sock, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
  }
  if (n == 1) return absl::OkStatus();
  if (errno == EPIPE || errno == ECONNRESET) {
    return MakeError(v1::UNAVAILABLE, "the worker zygote exited");
  }
  return MakeError(v1::UNAVAILABLE,
                   absl::StrCat("the worker zygote's socket: ", std::strerror(errno)));
}

absl::StatusOr<Reply> AwaitReply(int sock) {
  pollfd readable{sock, POLLIN, 0};
  int ready;
  while ((ready = poll(&readable, 1, kReplyTimeoutMs)) < 0 && errno == EINTR) {
  }
  if (ready == 0) {
    return MakeError(v1::UNAVAILABLE, absl::StrCat("the worker zygote did not answer within ",
                                                   kReplyTimeoutMs, " ms"));
  }
  Reply reply;
  const ssize_t n = recv(sock, &reply, sizeof(reply), 0);
  if (n != sizeof(reply)) {
    return MakeError(v1::UNAVAILABLE, "the worker zygote exited");
  }
  return reply;
}

}  // namespace

absl::Status StartWorkerZygote(WorkerMain worker_main) {
  if (const int threads = CountThreads(); threads != 1) {
    return MakeError(v1::STATE, absl::StrCat("cannot fork a worker zygote from a process with ",
                                             threads, " threads"));
  }
  // Before the fork: the zygote's descendants inherit whether an ancestor
  // is a subreaper only from the moment it becomes one.
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    return MakeError(v1::INTERNAL,
                     absl::StrCat("prctl(PR_SET_CHILD_SUBREAPER): ", std::strerror(errno)));
  }
  int ends[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ends) != 0) {
    return MakeError(v1::INTERNAL, absl::StrCat("socketpair: ", std::strerror(errno)));
  }
  const pid_t daemon = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    close(ends[0]);
    ZygoteLoop(worker_main, ends[1], daemon);
  }
  const int fork_errno = errno;
  close(ends[1]);
  if (pid < 0) {
    close(ends[0]);
    return MakeError(v1::INTERNAL, absl::StrCat("fork: ", std::strerror(fork_errno)));
  }
  ZygoteHandle& zygote = TheZygote();
  absl::MutexLock lock(&zygote.mu);
  zygote.fd = ends[0];
  zygote.pid = pid;
  return absl::OkStatus();
}

bool WorkerZygoteRunning() {
  ZygoteHandle& zygote = TheZygote();
  absl::MutexLock lock(&zygote.mu);
  return zygote.fd >= 0;
}

absl::StatusOr<pid_t> ForkWorkerFromZygote(int channel_fd, int buffer_fd) {
  ZygoteHandle& zygote = TheZygote();
  absl::MutexLock lock(&zygote.mu);
  if (zygote.fd < 0) return MakeError(v1::UNAVAILABLE, "no worker zygote");
  const absl::Status sent = SendRequest(zygote.fd, channel_fd, buffer_fd);
  absl::StatusOr<Reply> reply = sent.ok() ? AwaitReply(zygote.fd) : absl::StatusOr<Reply>(sent);
  if (!reply.ok()) {
    DropZygote(zygote);
    return reply.status();
  }
  if (reply->pid <= 0) {
    return MakeError(v1::INTERNAL,
                     absl::StrCat("the worker zygote's fork: ", std::strerror(reply->error)));
  }
  return static_cast<pid_t>(reply->pid);
}

}  // namespace gradsync
