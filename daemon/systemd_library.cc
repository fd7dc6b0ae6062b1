#include "daemon/systemd_library.h"

#include <dlfcn.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-journal.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/log_value.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

constexpr char kSoname[] = "libsystemd.so.0";

absl::StatusOr<SystemdLibrary> Load() {
  // Never unloaded: the journal sink may log until the process exits.
  void* handle = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot load ", kSoname, ": ", dlerror()));
  }
  SystemdLibrary library;
  // The prototypes come from systemd's own headers, so a type mismatch
  // would not compile.
  library.notify = reinterpret_cast<decltype(&sd_notify)>(dlsym(handle, "sd_notify"));
  library.journal_sendv =
      reinterpret_cast<decltype(&sd_journal_sendv)>(dlsym(handle, "sd_journal_sendv"));
  if (library.notify == nullptr || library.journal_sendv == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(kSoname, " lacks sd_notify or sd_journal_sendv"));
  }
  return library;
}

}  // namespace

absl::StatusOr<const SystemdLibrary*> LoadSystemdLibrary() {
  static const absl::StatusOr<SystemdLibrary>* const library =
      new absl::StatusOr<SystemdLibrary>(Load());
  if (!library->ok()) return library->status();
  return &**library;
}

void NotifySystemd(const char* state) {
  if (std::getenv("NOTIFY_SOCKET") == nullptr) return;
  absl::StatusOr<const SystemdLibrary*> library = LoadSystemdLibrary();
  if (!library.ok()) {
    spdlog::error("event=systemd_notify_failed state={} error={}", LogValue(state),
                  LogValue(library.status().message()));
    return;
  }
  if (const int error = (*library)->notify(0, state); error < 0) {
    spdlog::error("event=systemd_notify_failed state={} error={}", LogValue(state),
                  LogValue(std::strerror(-error)));
  }
}

}  // namespace gradsync
