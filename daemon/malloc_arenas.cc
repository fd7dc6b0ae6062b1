#include "daemon/malloc_arenas.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace gradsync {

void LimitMallocArenas() {
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr) return;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "arena_max") != nullptr) return;
  constexpr int kArenas = 2;  // the main one and one for the other threads
  mallopt(M_ARENA_MAX, kArenas);
}

}  // namespace gradsync
