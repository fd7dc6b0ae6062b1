#include "daemon/cluster/rendezvous_client.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/call_token.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/time.h"

namespace gradsync {

std::unique_ptr<RendezvousClient> RendezvousClient::Connect(RendezvousClientOptions options) {
  grpc::ChannelArguments args;
  // A leader that starts after its followers should be found within a second,
  // not after gRPC's default reconnect backoff (up to two minutes).
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      options.credentials ? options.credentials : grpc::InsecureChannelCredentials();
  auto channel = grpc::CreateCustomChannel(options.leader, credentials, args);
  return std::make_unique<RendezvousClient>(std::move(channel), std::move(options));
}

RendezvousClient::RendezvousClient(std::shared_ptr<grpc::Channel> channel,
                                   RendezvousClientOptions options)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(v1::Rendezvous::NewStub(channel_)) {}

bool RendezvousClient::AwaitLeaderConnectionDown(absl::Duration limit) {
  if (channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) {
    channel_->WaitForStateChange(
        GRPC_CHANNEL_READY,
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                     gpr_time_from_millis(absl::ToInt64Milliseconds(limit), GPR_TIMESPAN)));
  }
  return channel_->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY;
}

void RendezvousClient::PrepareContext(grpc::ClientContext* context, absl::Duration timeout) const {
  // Bounded, so that an "infinite" wait still gets a representable deadline.
  // A deadline on gRPC's monotonic clock: one taken from the wall clock
  // expires at once when the clock steps forward between this line and the
  // call's start (a preempted thread on a loaded machine is enough).
  const int64_t ms = absl::ToInt64Milliseconds(std::min(timeout, absl::Hours(24 * 7)));
  context->set_deadline(
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN)));
  // Wait for the channel to (re)connect within the deadline instead of
  // failing at once: followers may start before the leader listens.
  context->set_wait_for_ready(true);
  AttachCallToken(context, options_.job_token);
}

absl::Status RendezvousClient::TransportError(const char* rpc, const grpc::Status& status) const {
  std::string message = absl::StrCat("rendezvous ", rpc, " to leader ", options_.leader,
                                     " failed: ", status.error_message());
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return MakeError(v1::TIMEOUT, message);
  }
  // The leader's own refusals: the caller must see what it refused.
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return absl::UnauthenticatedError(message);
  }
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    return absl::ResourceExhaustedError(message);
  }
  return MakeError(v1::UNAVAILABLE, message);
}

namespace {

template <typename Request>
void SetCredentials(const RendezvousClientOptions& options, Request* request) {
  request->mutable_job()->set_job_id(options.job_id);
}

}  // namespace

absl::StatusOr<JoinResult> RendezvousClient::Join(const JoinParams& params) {
  if (params.timeout <= absl::ZeroDuration()) {
    return MakeError(v1::INVALID_ARGUMENT, "rendezvous Join: timeout must be positive");
  }
  v1::JoinRequest request;
  SetCredentials(options_, &request);
  request.set_node_rank(params.node_rank);
  request.set_num_nodes(params.num_nodes);
  request.set_local_size(params.local_size);
  request.set_host(params.host);
  request.set_listen_address(params.listen_address);
  request.set_timeout_ms(absl::ToInt64Milliseconds(params.timeout));
  request.set_resume_generation(params.resume_generation);
  request.set_resume_iteration(params.resume_iteration);
  v1::JoinResponse response;
  grpc::ClientContext context;
  PrepareContext(&context, params.timeout + options_.rpc_timeout);
  const grpc::Status status = stub_->Join(&context, request, &response);
  if (!status.ok()) return TransportError("Join", status);
  RETURN_IF_ERROR(FromProto(response.error()));
  incarnation_.store(response.incarnation(), std::memory_order_release);
  JoinResult result;
  result.incarnation = response.incarnation();
  result.generation = response.generation();
  result.world_size = response.world_size();
  result.start_iteration = response.start_iteration();
  for (const v1::Peer& peer : response.peers()) {
    result.peers.push_back(RendezvousPeer{peer.node_rank(), peer.host(), peer.local_size(),
                                          peer.listen_address(), peer.rank_offset(),
                                          peer.joins_running()});
  }
  return result;
}

absl::Status RendezvousClient::Set(std::string_view key, std::string_view value) {
  v1::SetRequest request;
  SetCredentials(options_, &request);
  request.set_incarnation(incarnation());
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  v1::SetResponse response;
  grpc::ClientContext context;
  PrepareContext(&context, options_.rpc_timeout);
  const grpc::Status status = stub_->Set(&context, request, &response);
  if (!status.ok()) return TransportError("Set", status);
  return FromProto(response.error());
}

absl::StatusOr<std::optional<std::string>> RendezvousClient::Get(std::string_view key) {
  v1::GetRequest request;
  SetCredentials(options_, &request);
  request.set_incarnation(incarnation());
  request.set_key(std::string(key));
  v1::GetResponse response;
  grpc::ClientContext context;
  PrepareContext(&context, options_.rpc_timeout);
  const grpc::Status status = stub_->Get(&context, request, &response);
  if (!status.ok()) return TransportError("Get", status);
  RETURN_IF_ERROR(FromProto(response.error()));
  if (!response.found()) return std::optional<std::string>();
  return std::optional<std::string>(std::move(*response.mutable_value()));
}

absl::Status RendezvousClient::CallWait(const std::vector<std::string>& keys,
                                        const std::vector<std::string>& read_keys,
                                        absl::Duration timeout, bool return_values,
                                        v1::WaitResponse* response) {
  if (timeout <= absl::ZeroDuration()) {
    return MakeError(v1::INVALID_ARGUMENT, "rendezvous Wait: timeout must be positive");
  }
  v1::WaitRequest request;
  SetCredentials(options_, &request);
  request.set_incarnation(incarnation());
  for (const std::string& key : keys) request.add_keys(key);
  for (const std::string& key : read_keys) request.add_read_keys(key);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  request.set_return_values(return_values);
  grpc::ClientContext context;
  PrepareContext(&context, timeout + options_.rpc_timeout);
  const grpc::Status status = stub_->Wait(&context, request, response);
  if (!status.ok()) return TransportError("Wait", status);
  return FromProto(response->error());
}

absl::Status RendezvousClient::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  v1::WaitResponse response;
  return CallWait(keys, {}, timeout, /*return_values=*/false, &response);
}

absl::StatusOr<std::map<std::string, std::string>> RendezvousClient::WaitForValues(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  return WaitForValues(keys, {}, timeout);
}

absl::StatusOr<std::map<std::string, std::string>> RendezvousClient::WaitForValues(
    const std::vector<std::string>& keys, const std::vector<std::string>& read_keys,
    absl::Duration timeout) {
  v1::WaitResponse response;
  RETURN_IF_ERROR(CallWait(keys, read_keys, timeout, /*return_values=*/true, &response));
  std::map<std::string, std::string> values;
  for (v1::KeyValue& kv : *response.mutable_values()) {
    values[kv.key()] = std::move(*kv.mutable_value());
  }
  for (const std::string& key : keys) {
    if (values.count(key) != 0) continue;
    ASSIGN_OR_RETURN(std::optional<std::string> value, Get(key));
    // Keys are removed only with their generation, which would fail the Get.
    if (!value.has_value()) {
      return MakeError(v1::INTERNAL,
                       absl::StrCat("rendezvous key ", key, " vanished right after Wait saw it"));
    }
    values[key] = *std::move(value);
  }
  for (const std::string& key : read_keys) {
    if (values.count(key) != 0) continue;
    // Not set, past the size bound, or a leader that sends no values.
    ASSIGN_OR_RETURN(std::optional<std::string> value, Get(key));
    if (value.has_value()) values[key] = *std::move(value);
  }
  return values;
}

absl::StatusOr<HeartbeatResult> RendezvousClient::Heartbeat(const HeartbeatParams& params) {
  v1::HeartbeatRequest request;
  SetCredentials(options_, &request);
  request.set_incarnation(incarnation());
  request.set_node_rank(params.node_rank);
  request.set_generation(params.generation);
  request.set_iteration(params.iteration);
  request.set_last_launched_bucket(params.last_launched_bucket);
  if (!params.node_error.ok()) ToProto(params.node_error, request.mutable_node_error());
  request.set_stall_report(params.stall_report);
  v1::HeartbeatResponse response;
  grpc::ClientContext context;
  PrepareContext(&context, options_.rpc_timeout);
  const grpc::Status status = stub_->Heartbeat(&context, request, &response);
  if (!status.ok()) return TransportError("Heartbeat", status);
  RETURN_IF_ERROR(FromProto(response.error()));
  HeartbeatResult result;
  result.generation = response.generation();
  result.abort = response.abort();
  result.abort_reason = response.abort_reason();
  result.abort_error = FromProto(response.abort_error());
  result.config_version = response.config_version();
  for (const v1::SilentMember& m : response.silent_members()) {
    result.silent_members.push_back(SilentMember{m.node_rank(), m.host(),
                                                 absl::Milliseconds(m.silent_ms()), m.departed(),
                                                 m.refuses_connections(), m.listen_address()});
  }
  return result;
}

std::string RendezvousClient::Describe() const {
  return absl::StrCat("the leader daemon at ", options_.leader);
}

absl::Status RendezvousClient::Leave(int node_rank, uint64_t generation, std::string_view reason) {
  return SendLeave(node_rank, generation, reason, /*departing=*/false);
}

absl::Status RendezvousClient::Depart(int node_rank, uint64_t generation, std::string_view reason) {
  return SendLeave(node_rank, generation, reason, /*departing=*/true);
}

absl::Status RendezvousClient::SendLeave(int node_rank, uint64_t generation,
                                         std::string_view reason, bool departing) {
  v1::LeaveRequest request;
  request.set_departing(departing);
  SetCredentials(options_, &request);
  request.set_incarnation(incarnation());
  request.set_node_rank(node_rank);
  request.set_generation(generation);
  request.set_reason(std::string(reason));
  v1::LeaveResponse response;
  grpc::ClientContext context;
  PrepareContext(&context, options_.rpc_timeout);
  const grpc::Status status = stub_->Leave(&context, request, &response);
  if (!status.ok()) return TransportError("Leave", status);
  return FromProto(response.error());
}

}  // namespace gradsync
