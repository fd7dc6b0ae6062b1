// NCCL, loaded at run time with dlopen.
//
// gradsyncd must start (and serve the CPU path) on machines without NCCL, and
// the GPU bundle must find whatever NCCL the GPU node has (there it lives in
// a Python wheel, not under /usr/local/cuda). So nothing links libnccl: the
// entry points the daemon uses are resolved with dlsym into an NcclApi table.
// Only nccl.h's types and constants are compiled in.
//
// Where it looks, in order (the first file that loads wins; the rest are not
// tried):
//   1. $NCCL_LIB                  a directory holding libnccl.so.2
//   2. $GRADSYNC_NCCL_PATH        directories separated by ':' (the launcher
//                                 scripts set it, e.g. to a Python
//                                 environment's site-packages/nvidia/nccl/lib;
//                                 the daemon never runs Python to find out)
//   3. $NCCL_HOME/lib, $NCCL_HOME/lib64
//   4. "libnccl.so.2"             the dynamic linker's own search
//                                 (LD_LIBRARY_PATH, ld.so.cache)
// A failure names every place tried and why each did not load.
//
// Checks on load: CheckNcclVersion (nccl_version.h: the same major as
// nccl.h, at least 2.19). Both versions are logged.
//
// Environment (NcclApi::Get sets it, before the first NCCL call of the
// process; NCCL reads it at init, and its nccl.conf files never override
// a variable that is already set):
//   NCCL_COMM_BLOCKING=0  forced: set to 1 it overrides config.blocking = 0
//                         and ncclGroupEnd would wait for every peer with no
//                         timeout.
// Call NcclApi::Get early, on the main thread, before other threads could
// read the environment (setenv is not thread-safe against getenv).
#ifndef GRADSYNC_GPU_NCCL_LOADER_H_
#define GRADSYNC_GPU_NCCL_LOADER_H_

#include <nccl.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/nccl_version.h"

namespace gradsync::gpu {

struct NcclSearch {
  std::vector<std::string> dirs;  // each tried as dir + "/libnccl.so.2"
  bool system = true;             // finally dlopen("libnccl.so.2")
};

// The search order above, from this process's environment.
NcclSearch NcclSearchFromEnv();

// The resolved entry points. Never unloaded: NCCL keeps threads running
// (proxy, bootstrap listeners) that must not lose their code.
struct NcclApi {
  std::string path;  // the file that was loaded
  int version = 0;   // ncclGetVersion of the loaded library

  ncclResult_t (*GetVersion)(int*) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;
  ncclResult_t (*CommFinalize)(ncclComm_t) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*CommCount)(const ncclComm_t, int*) = nullptr;
  ncclResult_t (*CommCuDevice)(const ncclComm_t, int*) = nullptr;
  ncclResult_t (*CommUserRank)(const ncclComm_t, int*) = nullptr;
  ncclResult_t (*CommRegister)(const ncclComm_t, void*, size_t, void**) = nullptr;
  ncclResult_t (*CommDeregister)(const ncclComm_t, void*) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  const char* (*GetLastError)(ncclComm_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t) = nullptr;

  // The process-wide NCCL: loaded once from NcclSearchFromEnv() (after
  // forcing NCCL_COMM_BLOCKING=0); later calls return the same table, or the
  // same error (kFailedPrecondition: not found, unusable or too old).
  static absl::StatusOr<const NcclApi*> Get();
};

// Loads from `search` without touching the environment or the process-wide
// table; for tests and nccl_probe. Each success leaks one library handle.
absl::StatusOr<NcclApi> LoadNccl(const NcclSearch& search);

}  // namespace gradsync::gpu

#endif  // GRADSYNC_GPU_NCCL_LOADER_H_
