#include "common/default_socket.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/defaults.h"

namespace gradsync {

std::string PerUserSocketDirectory() {
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg && xdg[0] == '/') {
    return absl::StrCat(xdg, "/gradsync");
  }
  return absl::StrCat("/tmp/gradsync-", geteuid());
}

std::string DaemonDefaultSocketPath() {
  // systemd may list several directories, separated by ':'.
  if (const char* runtime = std::getenv("RUNTIME_DIRECTORY"); runtime && runtime[0] == '/') {
    const absl::string_view all(runtime);
    return absl::StrCat(all.substr(0, all.find(':')), "/", kSocketFileName);
  }
  return absl::StrCat(PerUserSocketDirectory(), "/", kSocketFileName);
}

std::string ClientDefaultSocketPath() {
  struct stat st;
  if (lstat(kSystemSocketPath, &st) == 0 && S_ISSOCK(st.st_mode)) return kSystemSocketPath;
  return absl::StrCat(PerUserSocketDirectory(), "/", kSocketFileName);
}

absl::Status EnsurePrivateDirectory(const std::string& dir) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the socket directory ", dir, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("socket directory ", dir, ": ", std::strerror(errno)));
  }
  auto refuse = [&dir](const std::string& why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing the socket directory ", dir, ": ", why,
        " (remove it, or give --socket a path in a directory only this user can write)"));
  };
  if (S_ISLNK(st.st_mode)) return refuse("it is a symbolic link");
  if (!S_ISDIR(st.st_mode)) return refuse("it is not a directory");
  if (st.st_uid != geteuid()) {
    return refuse(absl::StrCat("it belongs to uid ", st.st_uid, ", not to uid ", geteuid()));
  }
  if ((st.st_mode & 077) != 0) {
    return refuse(absl::StrFormat("its mode is %04o, not 0700", st.st_mode & 07777));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
