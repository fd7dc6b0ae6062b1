#include "tests/ipc/segment_names.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "ipc/shared_segment.h"

namespace gradsync::testing {
namespace {

// Bazel ends a test that runs over its timeout with SIGTERM, which skips
// every destructor: the handler unlinks the live names itself. Fixed slots
// and plain unlink(2) keep it async-signal-safe.
struct Slot {
  std::atomic<bool> used{false};
  char path[160];
};
Slot g_slots[512];

void UnlinkAllAndDie(int sig) {
  for (Slot& slot : g_slots) {
    if (slot.used.load(std::memory_order_acquire)) unlink(slot.path);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void InstallHandlerOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = UnlinkAllAndDie;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
  });
}

Slot* Track(const std::string& name) {
  InstallHandlerOnce();
  const std::string path = absl::StrCat("/dev/shm/", name);
  if (path.size() >= sizeof(Slot::path)) return nullptr;
  for (Slot& slot : g_slots) {
    if (slot.used.load(std::memory_order_relaxed)) continue;
    std::memcpy(slot.path, path.c_str(), path.size() + 1);
    slot.used.store(true, std::memory_order_release);
    return &slot;
  }
  return nullptr;  // table full: the destructor still removes it
}

}  // namespace

std::string UniqueSegmentName(const std::string& tag) {
  static std::atomic<int> counter{0};
  return absl::StrCat("gstest_", tag, "_", getpid(), "_", counter.fetch_add(1));
}

SegmentCleanup::~SegmentCleanup() {
  for (size_t i = 0; i < names_.size(); ++i) {
    ipc::SharedSegment::Remove(names_[i]).IgnoreError();
    if (slots_[i] != nullptr) {
      static_cast<Slot*>(slots_[i])->used.store(false, std::memory_order_release);
    }
  }
}

std::string SegmentCleanup::Add(std::string name) {
  slots_.push_back(Track(name));
  names_.push_back(std::move(name));
  return names_.back();
}

bool SegmentExists(const std::string& name) {
  struct stat st;
  return stat(absl::StrCat("/dev/shm/", name).c_str(), &st) == 0;
}

}  // namespace gradsync::testing
