// The C ABI (gradsync.h) over gradsync::Client. Every entry point catches
// everything: no C++ exception ever crosses into the trainer.
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "client/client.h"
#include "client/gradsync.h"
#include "common/defaults.h"
#include "common/status_code.h"

// C callers cannot see the C++ constant: the ABI's macro is a copy of it.
static_assert(std::string_view(GS_DEFAULT_SOCKET) == gradsync::kSystemSocketPath,
              "GS_DEFAULT_SOCKET must equal gradsync::kSystemSocketPath");

struct gs_client {
  std::unique_ptr<gradsync::Client> client;
  std::string last_error;
};

namespace {

gs_status Record(gs_client* c, const absl::Status& st) {
  if (st.ok()) return GS_OK;
  if (c) c->last_error = std::string(st.message());
  return static_cast<gs_status>(gradsync::CodeOf(st));
}

gs_status Internal(gs_client* c, const char* what) {
  if (c) c->last_error = std::string("internal error: ") + what;
  return GS_ERR_INTERNAL;
}

// The part of gs_connect_options that every caller has: the three original
// fields, then size. A size below it cannot be a sizeof of the struct.
constexpr size_t kSizedLayoutMin = offsetof(gs_connect_options, size) + sizeof(size_t);

// The fields a caller's options really contain, judged by their size.
gs_status ReadConnectOptions(gs_client* c, const gs_connect_options& opts,
                             gradsync::ConnectOptions* o) {
  const size_t size = opts.size;
  if (size != 0 && size < kSizedLayoutMin) {
    c->last_error = "gs_connect_options.size is " + std::to_string(size) +
                    ", smaller than any gs_connect_options (" + std::to_string(kSizedLayoutMin) +
                    "): start from GS_CONNECT_OPTIONS_INIT";
    return GS_ERR_INVALID_ARGUMENT;
  }
  if (size > sizeof(gs_connect_options)) {
    c->last_error = "gs_connect_options.size is " + std::to_string(size) +
                    ", larger than this libgradsync's (" +
                    std::to_string(sizeof(gs_connect_options)) + ", version " +
                    std::to_string(GS_VERSION) +
                    "): the caller was built against a newer gradsync.h";
    return GS_ERR_INVALID_ARGUMENT;
  }
  // Fields added after size are read only when size covers them.
  if (opts.socket_path) o->socket_path = opts.socket_path;
  o->local_rank = opts.local_rank;
  if (opts.timeout_ms > 0) o->timeout_ms = opts.timeout_ms;
  return GS_OK;
}

gs_status NotConnected(gs_client* c) {
  if (c) c->last_error = "not connected (gs_connect failed)";
  return GS_ERR_STATE;
}

}  // namespace

#define GS_GUARD(c)                          \
  catch (const std::exception& e) {          \
    return Internal(c, e.what());            \
  }                                          \
  catch (...) {                              \
    return Internal(c, "unknown exception"); \
  }

extern "C" {

int gs_version(void) { return GS_VERSION; }

gs_status gs_connect(const gs_connect_options* opts, gs_client** out) {
  if (out == nullptr) return GS_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  gs_client* c = new (std::nothrow) gs_client();
  if (c == nullptr) return GS_ERR_INTERNAL;
  *out = c;
  try {
    gradsync::ConnectOptions o;
    if (opts) {
      const gs_status st = ReadConnectOptions(c, *opts, &o);
      if (st != GS_OK) return st;
    }
    auto client = gradsync::Client::Connect(o);
    if (!client.ok()) return Record(c, client.status());
    c->client = std::move(*client);
    return GS_OK;
  }
  GS_GUARD(c)
}

gs_status gs_register(gs_client* c, const gs_tensor_spec* specs, size_t count) {
  if (c == nullptr || (specs == nullptr && count > 0)) return GS_ERR_INVALID_ARGUMENT;
  if (!c->client) return NotConnected(c);
  try {
    std::vector<gradsync::TensorSpec> v;
    v.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      const gs_tensor_spec& s = specs[i];
      if (s.name == nullptr || static_cast<int>(s.dtype) < 0 || static_cast<int>(s.dtype) > 3) {
        c->last_error = "tensor " + std::to_string(i) + ": missing name or bad dtype";
        return GS_ERR_INVALID_ARGUMENT;
      }
      v.push_back({s.name, static_cast<gradsync::DType>(s.dtype), s.numel, s.device, s.cuda_ptr});
    }
    return Record(c, c->client->Register(v));
  }
  GS_GUARD(c)
}

gs_status gs_world(gs_client* c, int* rank, int* world_size) {
  if (c == nullptr || rank == nullptr || world_size == nullptr) return GS_ERR_INVALID_ARGUMENT;
  if (!c->client) return NotConnected(c);
  if (c->client->world_size() <= 0) {
    c->last_error = "gs_world is known after gs_register";
    return GS_ERR_STATE;
  }
  *rank = c->client->rank();
  *world_size = c->client->world_size();
  return GS_OK;
}

// gs_job_info as first published: a caller's size below it cannot be one.
constexpr size_t kJobInfoMin = offsetof(gs_job_info, rank) + sizeof(int);

gs_status gs_get_job_info(gs_client* c, gs_job_info* info) {
  if (c == nullptr || info == nullptr) return GS_ERR_INVALID_ARGUMENT;
  if (!c->client) return NotConnected(c);
  const size_t size = info->size;
  if (size < kJobInfoMin) {
    c->last_error = "gs_job_info.size is " + std::to_string(size) +
                    ", smaller than any gs_job_info (" + std::to_string(kJobInfoMin) +
                    "): start from GS_JOB_INFO_INIT";
    return GS_ERR_INVALID_ARGUMENT;
  }
  if (c->client->world_size() <= 0) {
    c->last_error = "gs_get_job_info is known after gs_register";
    return GS_ERR_STATE;
  }
  const gradsync::JobInfo j = c->client->job_info();
  // Fields are written only where the caller's struct has them.
  info->iteration = j.iteration;
  info->world_size = j.world_size;
  info->rank = j.rank;
  if (size >= offsetof(gs_job_info, check_replicas_due) + sizeof(int)) {
    info->check_replicas_due = j.check_replicas_due ? 1 : 0;
  }
  if (size >= offsetof(gs_job_info, membership_changes) + sizeof(uint64_t)) {
    info->membership_changes = j.membership_changes;
  }
  if (size >= offsetof(gs_job_info, nodes_joined) + sizeof(uint64_t)) {
    info->nodes_joined = j.nodes_joined;
  }
  if (size >= offsetof(gs_job_info, joined_running_job) + sizeof(int)) {
    info->joined_running_job = j.joined_running_job ? 1 : 0;
  }
  if (size >= offsetof(gs_job_info, trainers_joined) + sizeof(uint64_t)) {
    info->trainers_joined = j.trainers_joined;
  }
  if (size >= offsetof(gs_job_info, catch_up_root) + sizeof(int)) {
    info->catch_up_root = j.catch_up_root;
  }
  info->size = size < sizeof(gs_job_info) ? size : sizeof(gs_job_info);
  return GS_OK;
}

gs_status gs_check_replicas(gs_client* c, const uint64_t* hashes, size_t count) {
  if (c == nullptr || (hashes == nullptr && count != 0)) return GS_ERR_INVALID_ARGUMENT;
  if (!c->client) return NotConnected(c);
  try {
    return Record(c, c->client->CheckReplicas(std::vector<uint64_t>(hashes, hashes + count)));
  }
  GS_GUARD(c)
}

void* gs_grad_buffer(gs_client* c, size_t index) {
  if (c == nullptr || !c->client) return nullptr;
  return c->client->GradBuffer(index);
}

gs_status gs_mark_ready(gs_client* c, size_t index) {
  if (c == nullptr) return GS_ERR_INVALID_ARGUMENT;
  if (!c->client) return NotConnected(c);
  try {
    return Record(c, c->client->MarkReady(index));
  }
  GS_GUARD(c)
}

gs_status gs_mark_unused(gs_client* c, size_t index) {
  if (c == nullptr) return GS_ERR_INVALID_ARGUMENT;
  if (!c->client) return NotConnected(c);
  try {
    return Record(c, c->client->MarkUnused(index));
  }
  GS_GUARD(c)
}

gs_status gs_wait(gs_client* c, int64_t timeout_ms) {
  if (c == nullptr) return GS_ERR_INVALID_ARGUMENT;
  if (!c->client) return NotConnected(c);
  try {
    return Record(c, c->client->Wait(timeout_ms));
  }
  GS_GUARD(c)
}

gs_status gs_set_sync(gs_client* c, int enabled) {
  if (c == nullptr) return GS_ERR_INVALID_ARGUMENT;
  if (!c->client) return NotConnected(c);
  try {
    return Record(c, c->client->SetSync(enabled != 0));
  }
  GS_GUARD(c)
}

gs_status gs_join(gs_client* c, int divide_by_initial_world_size) {
  if (c == nullptr) return GS_ERR_INVALID_ARGUMENT;
  if (!c->client) return NotConnected(c);
  try {
    return Record(c, c->client->Join(divide_by_initial_world_size != 0));
  }
  GS_GUARD(c)
}

gs_status gs_broadcast(gs_client* c, void* buf, size_t bytes, int root_rank, int64_t timeout_ms) {
  if (c == nullptr) return GS_ERR_INVALID_ARGUMENT;
  if (!c->client) return NotConnected(c);
  try {
    return Record(c, c->client->Broadcast(buf, bytes, root_rank, timeout_ms));
  }
  GS_GUARD(c)
}

gs_status gs_set_cuda_stream(gs_client* c, void* stream) {
  if (c == nullptr) return GS_ERR_INVALID_ARGUMENT;
  if (!c->client) return NotConnected(c);
  try {
    return Record(c, c->client->SetCudaStream(stream));
  }
  GS_GUARD(c)
}

int gs_iteration_skipped(const gs_client* c) {
  if (c == nullptr || !c->client) return 0;
  return c->client->step_skipped() ? 1 : 0;
}

const char* gs_last_error(const gs_client* c) {
  if (c == nullptr) return "null client";
  return c->last_error.c_str();
}

void gs_close(gs_client* c) {
  if (c == nullptr) return;
  try {
    if (c->client) c->client->Close().IgnoreError();
  } catch (...) {
  }
  delete c;
}

}  // extern "C"
