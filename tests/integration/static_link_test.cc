// The release gradsyncd carries gRPC, Abseil and Protobuf (and re2, upb,
// c-ares, gpr, address_sorting, OpenSSL and zlib) linked in, not as ~70
// shared objects: the dynamic loader's work was most of a daemon's start-up
// CPU, paid by each of the 16 daemons a node-heavy job starts at once. A
// shared copy next to the static one would also mean two Abseils (or two
// OpenSSLs) in one process. See third_party/system_libs.bzl. libsystemd is
// loaded only when systemd runs the daemon (daemon/systemd_library.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

constexpr auto kBound = std::chrono::seconds(30);

// The file-backed objects /proc/<pid>/maps lists for `pid`, once each.
std::vector<std::string> MappedFiles(pid_t pid) {
  std::istringstream maps(ReadFile(absl::StrCat("/proc/", pid, "/maps")));
  std::vector<std::string> files;
  for (std::string line; std::getline(maps, line);) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string file = line.substr(slash);
    if (files.empty() || files.back() != file) files.push_back(file);
  }
  return files;
}

bool Maps(const std::vector<std::string>& files, const std::string& name) {
  return std::any_of(files.begin(), files.end(),
                     [&](const std::string& f) { return absl::StrContains(f, name); });
}

TEST(StaticLinkTest, AServingDaemonMapsNoSharedGrpcAbseilProtobufOrOpenSsl) {
  Daemon daemon(1);
  ASSERT_TRUE(daemon.WaitReady(kBound)) << daemon.process().Log();
  const std::vector<std::string> files = MappedFiles(daemon.process().pid());
  // What it does map shared (Gloo): the list is real, not empty for want of
  // permission.
  EXPECT_TRUE(Maps(files, "libgloo.so")) << ::testing::PrintToString(files);
  for (const std::string& file : files) {
    for (const char* linked_in :
         {"libabsl_", "libgrpc", "libprotobuf", "libre2.", "libupb.", "libcares.", "libgpr.",
          "libaddress_sorting.", "libssl.", "libcrypto.", "libz.", "libcpp-httplib"}) {
      EXPECT_FALSE(absl::StrContains(file, linked_in))
          << "gradsyncd maps " << file << ": it should carry " << linked_in
          << "* linked in (is Debian's static archive installed? see the DEBUG line "
             "third_party/system_libs.bzl prints)";
    }
  }
  // Not run by systemd ($NOTIFY_SOCKET unset, text logs): no libsystemd.
  EXPECT_FALSE(Maps(files, "libsystemd.")) << ::testing::PrintToString(files);
  EXPECT_TRUE(daemon.Stop().exited) << daemon.process().Log();
}

// The datagram socket systemd gives a Type=notify service ($NOTIFY_SOCKET).
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    path.copy(addr.sun_path, sizeof(addr.sun_path) - 1);
    bound_ = fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    const timeval wait{static_cast<time_t>(kBound.count()), 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
  }
  ~NotifySocket() {
    if (fd_ >= 0) close(fd_);
  }
  bool bound() const { return bound_; }
  // The next message, "" past kBound.
  std::string Receive() {
    char buffer[4096];
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
    return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : std::string();
  }

 private:
  int fd_ = -1;
  bool bound_ = false;
};

TEST(StaticLinkTest, UnderSystemdTheDaemonLoadsLibsystemdAndNotifiesReadyThenStopping) {
  ScratchDir dir;
  const std::string notify_path = dir.File("notify");
  NotifySocket notify(notify_path);
  ASSERT_TRUE(notify.bound()) << notify_path;
  Daemon daemon(1, {}, {{"NOTIFY_SOCKET", notify_path}});
  // READY=1 comes once the trainer socket serves: it is there when the message is.
  EXPECT_EQ(notify.Receive(), "READY=1") << daemon.process().Log();
  EXPECT_EQ(access(daemon.socket().c_str(), F_OK), 0) << daemon.socket();
  EXPECT_TRUE(Maps(MappedFiles(daemon.process().pid()), "libsystemd."))
      << ::testing::PrintToString(MappedFiles(daemon.process().pid()));
  EXPECT_TRUE(daemon.Stop().exited) << daemon.process().Log();
  EXPECT_EQ(notify.Receive(), "STOPPING=1") << daemon.process().Log();
}

}  // namespace
}  // namespace gradsync::testing
