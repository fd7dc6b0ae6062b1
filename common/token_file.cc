#include "common/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gradsync {
namespace {

std::string ReadLink(const std::string& path) {
  char target[4096];
  const ssize_t n = readlink(path.c_str(), target, sizeof(target));
  return n <= 0 ? std::string() : std::string(target, static_cast<size_t>(n));
}

// The kubelet's atomic-writer layout of a Secret volume: DIR/NAME is a
// symlink to ..data/NAME, and DIR/..data a symlink to a ..<timestamp>
// directory beside it. The kubelet alone writes it, and gives the files
// the Pod's fsGroup on purpose; nobody makes this layout by mistake.
bool InKubernetesSecretVolume(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty() || ReadLink(path) != "..data/" + name) return false;
  const std::string data = ReadLink(dir + "/..data");
  return data.size() > 2 && data.rfind("..", 0) == 0 && data.find('/') == std::string::npos &&
         data != "..data";
}

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  // Opened once and checked through the descriptor: the mode checked is the
  // mode of the file read.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, ": cannot open it: ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is not a regular file"));
  }
  // Group read only is allowed in a Secret volume: fsGroup makes its files
  // 0440/0640, and the group is the Pod's. Others, or a group that may
  // write, are always refused.
  const mode_t allowed = InKubernetesSecretVolume(path) ? S_IRGRP : 0;
  if ((st.st_mode & 077 & ~allowed) != 0) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrFormat(
        "token file %s has mode %04o: %s may access it (chmod 600 %s%s)", path, st.st_mode & 07777,
        allowed != 0 ? "others or a writing group" : "group or others", path,
        allowed != 0 ? "; a Secret volume may be group-readable (defaultMode 0440), no more" : ""));
  }
  std::string content;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat("token file ", path, ": cannot read it: ", std::strerror(error)));
    }
    if (n == 0) break;
    content.append(buffer, static_cast<size_t>(n));
    if (content.size() > 64 * 1024) {
      close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat("token file ", path, " is larger than 64 KiB: not a token"));
    }
  }
  close(fd);
  const std::string token(absl::StripAsciiWhitespace(content));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, " is empty or holds only whitespace"));
  }
  return token;
}

}  // namespace gradsync
