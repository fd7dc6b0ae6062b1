#include "gpu/nccl_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/log_value.h"
#include "spdlog/spdlog.h"

namespace gradsync::gpu {
namespace {

constexpr char kLibName[] = "libnccl.so.2";

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

// Resolves `name` into `*fn`; on failure appends to `missing`.
template <typename Fn>
void Resolve(void* handle, const char* name, Fn* fn, std::vector<std::string>* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn == nullptr) missing->push_back(name);
}

// One candidate: dlopen + dlsym of every entry point. The handle is kept
// only when the table is complete.
absl::StatusOr<NcclApi> TryLoad(const std::string& file) {
  // RTLD_LOCAL: NCCL's symbols stay out of the global namespace, so they
  // cannot clash with anything else the process loads.
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return absl::NotFoundError(err != nullptr ? err : "dlopen failed");
  }
  NcclApi api;
  std::vector<std::string> missing;
  Resolve(handle, "ncclGetVersion", &api.GetVersion, &missing);
  Resolve(handle, "ncclGetUniqueId", &api.GetUniqueId, &missing);
  Resolve(handle, "ncclCommInitRankConfig", &api.CommInitRankConfig, &missing);
  Resolve(handle, "ncclCommFinalize", &api.CommFinalize, &missing);
  Resolve(handle, "ncclCommDestroy", &api.CommDestroy, &missing);
  Resolve(handle, "ncclCommAbort", &api.CommAbort, &missing);
  Resolve(handle, "ncclCommGetAsyncError", &api.CommGetAsyncError, &missing);
  Resolve(handle, "ncclCommCount", &api.CommCount, &missing);
  Resolve(handle, "ncclCommCuDevice", &api.CommCuDevice, &missing);
  Resolve(handle, "ncclCommUserRank", &api.CommUserRank, &missing);
  Resolve(handle, "ncclCommRegister", &api.CommRegister, &missing);
  Resolve(handle, "ncclCommDeregister", &api.CommDeregister, &missing);
  Resolve(handle, "ncclGetErrorString", &api.GetErrorString, &missing);
  Resolve(handle, "ncclGetLastError", &api.GetLastError, &missing);
  Resolve(handle, "ncclGroupStart", &api.GroupStart, &missing);
  Resolve(handle, "ncclGroupEnd", &api.GroupEnd, &missing);
  Resolve(handle, "ncclAllReduce", &api.AllReduce, &missing);
  Resolve(handle, "ncclBroadcast", &api.Broadcast, &missing);
  if (!missing.empty()) {
    dlclose(handle);  // nothing of it ran yet, so unloading is safe
    return absl::FailedPreconditionError(
        absl::StrCat("missing symbols ", absl::StrJoin(missing, ", "), " (too old an NCCL?)"));
  }
  // Where the dynamic linker actually found a bare name.
  api.path = file;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(api.GetVersion), &info) != 0 && info.dli_fname != nullptr) {
    api.path = info.dli_fname;
  }
  if (ncclResult_t r = api.GetVersion(&api.version); r != ncclSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("ncclGetVersion failed: ", r));
  }
  // From here the library may hold state; it stays loaded for the process.
  if (absl::Status s = CheckNcclVersion(api.version, NCCL_VERSION_CODE); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(api.path, ": ", s.message()));
  }
  return api;
}

}  // namespace

NcclSearch NcclSearchFromEnv() {
  NcclSearch search;
  if (const char* dir = Env("NCCL_LIB")) search.dirs.push_back(dir);
  if (const char* list = Env("GRADSYNC_NCCL_PATH")) {
    for (absl::string_view dir : absl::StrSplit(list, ':', absl::SkipEmpty())) {
      search.dirs.emplace_back(dir);
    }
  }
  if (const char* home = Env("NCCL_HOME")) {
    search.dirs.push_back(absl::StrCat(home, "/lib"));
    search.dirs.push_back(absl::StrCat(home, "/lib64"));
  }
  search.system = true;
  return search;
}

absl::StatusOr<NcclApi> LoadNccl(const NcclSearch& search) {
  std::vector<std::string> tried;
  std::vector<std::string> files;
  for (const std::string& dir : search.dirs) files.push_back(absl::StrCat(dir, "/", kLibName));
  if (search.system) files.push_back(kLibName);
  for (const std::string& file : files) {
    absl::StatusOr<NcclApi> api = TryLoad(file);
    if (api.ok()) return api;
    // A library that loaded but is unusable stops the search: silently
    // falling back to another NCCL would hide the misconfiguration.
    if (api.status().code() != absl::StatusCode::kNotFound) {
      return absl::FailedPreconditionError(
          absl::StrCat("NCCL at ", file, " is unusable: ", api.status().message()));
    }
    tried.push_back(absl::StrCat(file, " (", api.status().message(), ")"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "NCCL not found; tried: ", tried.empty() ? "nothing" : absl::StrJoin(tried, "; "),
      ". Set NCCL_LIB to the directory holding ", kLibName,
      " (or GRADSYNC_NCCL_PATH to a ':'-separated list of directories)"));
}

absl::StatusOr<const NcclApi*> NcclApi::Get() {
  // A function-local static: loaded exactly once, thread-safe.
  static const absl::StatusOr<NcclApi>* const loaded = [] {
    if (const char* blocking = std::getenv("NCCL_COMM_BLOCKING");
        blocking != nullptr && std::string(blocking) != "0") {
      spdlog::warn(
          "event=nccl_env_override NCCL_COMM_BLOCKING={} replaced by 0 (blocking communicators "
          "would wait for dead peers without a timeout)",
          blocking);
    }
    setenv("NCCL_COMM_BLOCKING", "0", 1);
    auto* api = new absl::StatusOr<NcclApi>(LoadNccl(NcclSearchFromEnv()));
    if (api->ok()) {
      spdlog::info("event=nccl_loaded path={} library={} header={}", (*api)->path,
                   NcclVersionString((*api)->version), NcclVersionString(NCCL_VERSION_CODE));
      // An older library is accepted: ncclConfig_t carries its size and
      // version, and NCCL reads only the fields it knows.
      if ((*api)->version < NCCL_VERSION_CODE) {
        spdlog::warn("event=nccl_older_than_header library={} header={}",
                     NcclVersionString((*api)->version), NcclVersionString(NCCL_VERSION_CODE));
      }
    } else {
      spdlog::error("event=nccl_unavailable header={} error={}",
                    NcclVersionString(NCCL_VERSION_CODE), LogValue(api->status().message()));
    }
    return api;
  }();
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace gradsync::gpu
