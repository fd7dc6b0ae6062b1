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
  if ((st.st_mode & 077) != 0) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrFormat("token file %s has mode %04o: group or others may access it (chmod 600 %s)",
                        path, st.st_mode & 07777, path));
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
