#include "tests/testing/wait.h"

#include <thread>

namespace gradsync::testing {

bool WaitUntil(const std::function<bool()>& pred, std::chrono::nanoseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    // Short enough not to slow a test down, long enough not to load the
    // machine the awaited process runs on.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace gradsync::testing
