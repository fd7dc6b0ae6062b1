#include "common/secure_random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"

namespace gradsync {

uint64_t SecureRandom64() {
  uint64_t value = 0;
  auto* out = reinterpret_cast<unsigned char*>(&value);
  size_t got = 0;
  while (got < sizeof(value)) {
    const ssize_t n = getrandom(out + got, sizeof(value) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "gradsync: getrandom failed: %s\n", std::strerror(errno));
      std::abort();
    }
    got += static_cast<size_t>(n);
  }
  return value;
}

std::string SecureRandomHex() { return absl::StrFormat("%016x", SecureRandom64()); }

}  // namespace gradsync
