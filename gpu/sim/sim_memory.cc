#include "gpu/sim/sim_memory.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/secure_random.h"
#include "common/status_macros.h"

namespace gradsync::gpu::sim {
namespace {

constexpr char kHandleMagic[4] = {'G', 'S', 'I', 'M'};
constexpr size_t kNameOffset = 8;

// The header page in front of every allocation's data. A page keeps the
// data page-aligned, like cudaMalloc's 256-byte (or better) alignment.
constexpr size_t kHeaderBytes = 4096;
constexpr uint64_t kMemoryMagic = 0x314d454d4d495347ull;  // "GSIMMEM1"

// Processes that map an allocation, one slot each (0: free). CUDA keeps
// this bookkeeping in the driver; a dead process's mappings go with it, so
// a slot whose pid is dead counts as unmapped.
constexpr int kMaxImporters = 64;

struct MemoryHeader {
  uint64_t magic;
  uint64_t size;
  int32_t device_index;
  int32_t owner_pid;
  std::atomic<int32_t> importers[kMaxImporters];
};
static_assert(sizeof(MemoryHeader) <= kHeaderBytes, "the header fits its page");
static_assert(std::atomic<int32_t>::is_always_lock_free, "shared slots must be lock-free");

MemoryHeader* HeaderOf(const Region& region) {
  return static_cast<MemoryHeader*>(region.segment.data());
}

// Counts this process among the allocation's importers (its first Open).
absl::Status AddImporter(MemoryHeader* header, const std::string& name) {
  const int32_t self = getpid();
  for (auto& slot : header->importers) {
    int32_t expected = 0;
    if (slot.compare_exchange_strong(expected, self, std::memory_order_acq_rel)) {
      return absl::OkStatus();
    }
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("allocation ", name, " is mapped by ", kMaxImporters, " processes already"));
}

void RemoveImporter(MemoryHeader* header) {
  const int32_t self = getpid();
  for (auto& slot : header->importers) {
    int32_t expected = self;
    if (slot.compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) return;
  }
}

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

}  // namespace

IpcHandle EncodeHandle(HandleKind kind, const std::string& segment_name) {
  IpcHandle h;
  std::memcpy(h.bytes.data(), kHandleMagic, sizeof(kHandleMagic));
  h.bytes[4] = static_cast<unsigned char>(kind);
  // Names come from NewSegmentName and are far shorter than the 55 bytes
  // available; one that is not stays truncated and fails to open.
  const size_t n = std::min(segment_name.size(), IpcHandle::kSize - kNameOffset - 1);
  std::memcpy(h.bytes.data() + kNameOffset, segment_name.data(), n);
  return h;
}

absl::StatusOr<std::string> DecodeHandle(HandleKind kind, const IpcHandle& handle) {
  const char expected = static_cast<char>(kind);
  if (std::memcmp(handle.bytes.data(), kHandleMagic, sizeof(kHandleMagic)) != 0 ||
      handle.bytes[4] != static_cast<unsigned char>(expected) || handle.bytes[5] != 0 ||
      handle.bytes[6] != 0 || handle.bytes[7] != 0) {
    return absl::InvalidArgumentError(absl::StrCat("not a simulated ",
                                                   kind == HandleKind::kMemory ? "memory" : "event",
                                                   " handle (bad magic or kind)"));
  }
  std::string name;
  size_t i = kNameOffset;
  for (; i < IpcHandle::kSize && handle.bytes[i] != 0; ++i) {
    const char c = static_cast<char>(handle.bytes[i]);
    if (!IsNameChar(c)) return absl::InvalidArgumentError("simulated handle: bad segment name");
    name.push_back(c);
  }
  if (name.empty() || i == IpcHandle::kSize) {
    return absl::InvalidArgumentError("simulated handle: empty or unterminated segment name");
  }
  for (; i < IpcHandle::kSize; ++i) {
    if (handle.bytes[i] != 0) {
      return absl::InvalidArgumentError("simulated handle: garbage after the segment name");
    }
  }
  return name;
}

std::string NewSegmentName(const std::string& prefix, const std::string& tag) {
  static std::atomic<uint64_t> counter{0};
  // The random part: a pid reused after a killed trainer (whose segments
  // may still be there) must not collide with its leftovers. 32 bits keep
  // the name well inside the handle.
  return ipc::SegmentName(
      prefix, getpid(),
      absl::StrCat(tag, counter.fetch_add(1), ".", SecureRandomHex().substr(0, 8)));
}

std::string PointerString(const void* p) { return absl::StrFormat("%p", p); }

bool ProcessAlive(pid_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno != EPERM) return false;
  // A zombie (killed, not yet reaped) runs nothing any more.
  const int fd = open(absl::StrCat("/proc/", pid, "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  char buf[512];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return true;
  // "pid (comm) S ...": the state follows the last ')'.
  const absl::string_view stat(buf, static_cast<size_t>(n));
  const size_t paren = stat.rfind(')');
  return !(paren != absl::string_view::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z');
}

Registry& Registry::Get() {
  static Registry* registry = new Registry();
  return *registry;
}

absl::StatusOr<std::shared_ptr<Region>> Registry::Allocate(const std::string& prefix,
                                                           int device_index, size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("cannot allocate 0 bytes of device memory");
  const std::string name = NewSegmentName(prefix, "m");
  ASSIGN_OR_RETURN(ipc::SharedSegment seg, ipc::SharedSegment::Create(name, kHeaderBytes + bytes));
  auto region = std::make_shared<Region>();
  region->segment = std::move(seg);
  // Mappings stay valid after unlink; the name lives until Free so that
  // other processes can open it.
  auto* header = static_cast<MemoryHeader*>(region->segment.data());
  header->magic = kMemoryMagic;
  header->size = bytes;
  header->device_index = device_index;
  header->owner_pid = getpid();
  region->name = name;
  region->base = static_cast<char*>(region->segment.data()) + kHeaderBytes;
  region->size = bytes;
  region->device_index = device_index;
  region->owned = true;
  absl::MutexLock lock(&mu_);
  by_base_[reinterpret_cast<uintptr_t>(region->base)] = region;
  return region;
}

absl::Status Registry::Free(void* base) {
  std::shared_ptr<Region> region;
  {
    absl::MutexLock lock(&mu_);
    auto it = by_base_.find(reinterpret_cast<uintptr_t>(base));
    if (it == by_base_.end() || !it->second->owned) {
      return absl::InvalidArgumentError(
          absl::StrCat("Free: ", PointerString(base),
                       " is not the base of a device allocation of this process"));
    }
    region = it->second;
    by_base_.erase(it);
  }
  ipc::SharedSegment::Remove(region->name).IgnoreError();
  // CUDA: "calling cudaFree on an exported memory region before calling
  // cudaIpcCloseMemHandle in the importing context will result in undefined
  // behavior" (cudaIpcOpenMemHandle). The importer keeps a dangling
  // mapping; here it keeps the pages, and the caller hears of it.
  for (const auto& slot : HeaderOf(*region)->importers) {
    const int32_t pid = slot.load(std::memory_order_acquire);
    if (pid != 0 && ProcessAlive(pid)) {
      return absl::FailedPreconditionError(
          absl::StrCat("Free: allocation ", region->name, " freed while mapped by process ", pid,
                       " (it has not closed its IPC mapping; CUDA leaves it a dangling one)"));
    }
  }
  return absl::OkStatus();  // unmapped when the last queued operation lets go
}

absl::StatusOr<std::shared_ptr<Region>> Registry::Open(const IpcHandle& handle, int device_index) {
  ASSIGN_OR_RETURN(std::string name, DecodeHandle(HandleKind::kMemory, handle));
  absl::MutexLock lock(&mu_);
  if (auto it = opened_.find(name); it != opened_.end()) {
    if (it->second->device_index != device_index) {
      return absl::InvalidArgumentError(absl::StrCat("memory handle ", name, " is on sim GPU ",
                                                     it->second->device_index, ", not ",
                                                     device_index));
    }
    ++it->second->open_count;
    return it->second;
  }
  absl::StatusOr<ipc::SharedSegment> seg = ipc::SharedSegment::Open(name, 0600);
  if (!seg.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory handle names no live allocation: ", seg.status().message()));
  }
  if (seg->size() < kHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("segment ", name, " is not sim device memory"));
  }
  const auto* header = static_cast<const MemoryHeader*>(seg->data());
  if (header->magic != kMemoryMagic || header->size > seg->size() - kHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("segment ", name, " is not sim device memory"));
  }
  if (header->device_index != device_index) {
    return absl::InvalidArgumentError(absl::StrCat("memory handle ", name, " is on sim GPU ",
                                                   header->device_index, ", not ", device_index));
  }
  if (header->owner_pid == getpid()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory handle ", name, " was exported by this process (pid ", header->owner_pid,
        "): CUDA refuses to open an IPC handle in the process that created it "
        "(cudaIpcOpenMemHandle: cudaErrorInvalidContext)"));
  }
  auto region = std::make_shared<Region>();
  region->size = header->size;
  region->device_index = header->device_index;
  region->segment = *std::move(seg);
  region->name = name;
  region->base = static_cast<char*>(region->segment.data()) + kHeaderBytes;
  region->owned = false;
  region->open_count = 1;
  RETURN_IF_ERROR(AddImporter(HeaderOf(*region), name));
  opened_[name] = region;
  by_base_[reinterpret_cast<uintptr_t>(region->base)] = region;
  return region;
}

absl::Status Registry::Close(void* base) {
  absl::MutexLock lock(&mu_);
  auto it = by_base_.find(reinterpret_cast<uintptr_t>(base));
  if (it == by_base_.end() || it->second->owned) {
    return absl::InvalidArgumentError(absl::StrCat("CloseMemory: ", PointerString(base),
                                                   " is not the base of an opened memory handle"));
  }
  if (--it->second->open_count > 0) return absl::OkStatus();
  RemoveImporter(HeaderOf(*it->second));
  opened_.erase(it->second->name);
  by_base_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Region>> Registry::Find(const void* ptr, size_t bytes) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  absl::MutexLock lock(&mu_);
  auto it = by_base_.upper_bound(p);
  if (it != by_base_.begin()) {
    --it;
    const Region& r = *it->second;
    const uintptr_t end = it->first + r.size;
    if (p < end && bytes <= end - p) return it->second;
    if (p < end) {
      return absl::InvalidArgumentError(absl::StrCat(
          bytes, " bytes at ", PointerString(ptr), " run past the end of device allocation ",
          r.name, " (", p - it->first, " + ", bytes, " > ", r.size, ")"));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(PointerString(ptr), " is not simulated device memory of this process"));
}

absl::StatusOr<std::shared_ptr<Region>> Registry::FindOwnedBase(const void* base) {
  absl::MutexLock lock(&mu_);
  auto it = by_base_.find(reinterpret_cast<uintptr_t>(base));
  if (it == by_base_.end() || !it->second->owned) {
    return absl::InvalidArgumentError(absl::StrCat(
        PointerString(base), " is not the base of a device allocation of this process"));
  }
  return it->second;
}

}  // namespace gradsync::gpu::sim
