// Binaries built against the original gradsync.h, whose gs_connect_options
// had no size field, call gs_connect with that 16-byte struct. Reading a
// size past its end would read the caller's unrelated memory, so their
// (unversioned) references bind to this gs_connect@GRADSYNC_0 instead: the
// dynamic loader resolves an unversioned reference to a symbol's oldest
// version (client/gradsync.lds). Only libgradsync.so links this file.
#include "client/gradsync.h"

namespace {

// gs_connect_options as the original gradsync.h declared it.
struct OriginalConnectOptions {
  const char* socket_path;
  int local_rank;
  int timeout_ms;
};

}  // namespace

extern "C" {

// Named outside gs_* so that the version script does not export it by name.
GS_API gs_status GsConnectOriginalLayout(const OriginalConnectOptions* opts, gs_client** out) {
  if (opts == nullptr) return gs_connect(nullptr, out);
  gs_connect_options sized = GS_CONNECT_OPTIONS_INIT;
  sized.socket_path = opts->socket_path;
  sized.local_rank = opts->local_rank;
  sized.timeout_ms = opts->timeout_ms;
  return gs_connect(&sized, out);
}

}  // extern "C"

__asm__(".symver GsConnectOriginalLayout, gs_connect@GRADSYNC_0");
