#include "daemon/cluster/etcd/etcd_client.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "daemon/cluster/etcd/etcd_operation_deadline.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "spdlog/spdlog.h"

namespace gradsync {

EtcdKeyValue EtcdKeyValueFromProto(const mvccpb::KeyValue& kv) {
  EtcdKeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

namespace {

// etcd reads the auth token from this call metadata.
constexpr char kTokenMetadataKey[] = "token";

std::chrono::system_clock::time_point GrpcDeadline(absl::Duration timeout) {
  // gRPC wants a system_clock deadline and turns it into its own monotonic
  // one at once: taken right before the call, a clock step cannot land in
  // between.
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration())));
}

// Worth sending to another member (or to the same one again): the member
// is unreachable, died mid-call, or has no leader right now.
bool Retryable(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::UNKNOWN:
      return true;
    default:
      return false;
  }
}

etcdserverpb::Compare ToProto(const EtcdCompare& compare) {
  etcdserverpb::Compare out;
  out.set_key(compare.key);
  switch (compare.op) {
    case EtcdCompare::Op::kEqual:
      out.set_result(etcdserverpb::Compare::EQUAL);
      break;
    case EtcdCompare::Op::kNotEqual:
      out.set_result(etcdserverpb::Compare::NOT_EQUAL);
      break;
    case EtcdCompare::Op::kGreater:
      out.set_result(etcdserverpb::Compare::GREATER);
      break;
    case EtcdCompare::Op::kLess:
      out.set_result(etcdserverpb::Compare::LESS);
      break;
  }
  switch (compare.target) {
    case EtcdCompare::Target::kVersion:
      out.set_target(etcdserverpb::Compare::VERSION);
      out.set_version(compare.number);
      break;
    case EtcdCompare::Target::kCreateRevision:
      out.set_target(etcdserverpb::Compare::CREATE);
      out.set_create_revision(compare.number);
      break;
    case EtcdCompare::Target::kModRevision:
      out.set_target(etcdserverpb::Compare::MOD);
      out.set_mod_revision(compare.number);
      break;
    case EtcdCompare::Target::kValue:
      out.set_target(etcdserverpb::Compare::VALUE);
      out.set_value(compare.value);
      break;
  }
  return out;
}

etcdserverpb::RequestOp ToProto(const EtcdTxnOp& op) {
  etcdserverpb::RequestOp out;
  switch (op.kind) {
    case EtcdTxnOp::Kind::kGet:
      out.mutable_request_range()->set_key(op.key);
      break;
    case EtcdTxnOp::Kind::kPut: {
      etcdserverpb::PutRequest* put = out.mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      break;
    }
    case EtcdTxnOp::Kind::kDelete:
      out.mutable_request_delete_range()->set_key(op.key);
      break;
  }
  return out;
}

std::string GrpcMessage(const grpc::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                      ": ", status.error_message());
}

const char* StateName(grpc_connectivity_state state) {
  switch (state) {
    case GRPC_CHANNEL_IDLE:
      return "idle";
    case GRPC_CHANNEL_CONNECTING:
      return "connecting";
    case GRPC_CHANNEL_READY:
      return "ready";
    case GRPC_CHANNEL_TRANSIENT_FAILURE:
      return "failing";
    case GRPC_CHANNEL_SHUTDOWN:
      return "shut down";
  }
  return "unknown";
}

}  // namespace

std::string EtcdPrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(EtcdClientOptions options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("etcd client: no endpoint given");
  }
  for (const std::string& endpoint : options.endpoints) {
    if (endpoint.empty()) return absl::InvalidArgumentError("etcd client: an endpoint is empty");
  }
  if (options.user.empty() && !options.password.empty()) {
    return absl::InvalidArgumentError("etcd client: a password without a user");
  }
  if (options.call_timeout <= absl::ZeroDuration() ||
      options.attempt_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("etcd client: timeouts must be positive");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.tls.any()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> tls =
        MakeChannelCredentials(options.tls);
    if (!tls.ok()) {
      return absl::Status(tls.status().code(),
                          absl::StrCat("etcd client: ", tls.status().message()));
    }
    credentials = *std::move(tls);
  }
  if (options.member_order == nullptr) {
    options.member_order = std::make_shared<EtcdMemberOrder>(options.endpoints.size());
  } else if (options.member_order->members() != options.endpoints.size()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd client: the shared member order is for ",
                                                   options.member_order->members(),
                                                   " endpoints, not ", options.endpoints.size()));
  }
  std::unique_ptr<EtcdClient> client(new EtcdClient(std::move(options)));
  for (size_t i = 0; i < client->options_.endpoints.size(); ++i) {
    grpc::ChannelArguments args;
    // A member that comes back should be tried again within a second, not
    // after gRPC's default reconnect backoff (up to two minutes). The
    // minimum backoff is left alone: gRPC also takes it as the connect
    // timeout, and a loaded etcd may take over a second to answer the
    // HTTP/2 handshake.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // A watch stream to a member behind a dead network must end: pings, no
    // more often than etcd's default --grpc-keepalive-min-time (5 s) allows.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    Member member;
    member.index = i;
    member.endpoint = client->options_.endpoints[i];
    member.channel = grpc::CreateCustomChannel(member.endpoint, credentials, args);
    client->members_.push_back(std::move(member));
  }
  if (!client->options_.user.empty()) {
    absl::Status auth = client->Authenticate(MonotonicNow() + client->options_.call_timeout);
    if (!auth.ok()) return auth;
  }
  return client;
}

EtcdClient::EtcdClient(EtcdClientOptions options)
    : options_(std::move(options)), order_(options_.member_order) {}

std::string EtcdClient::Describe() const {
  return absl::StrCat("etcd at ", absl::StrJoin(options_.endpoints, ","));
}

EtcdClient::Member EtcdClient::MemberAt(size_t offset) const {
  return members_[(order_->preferred() + offset) % members_.size()];
}

void EtcdClient::MarkHealthy(size_t index) { order_->MarkHealthy(index); }

void EtcdClient::MarkFailed(size_t index) { order_->MarkFailed(index); }

std::string EtcdClient::preferred_endpoint() const {
  return members_[order_->preferred()].endpoint;
}

std::string EtcdClient::Token() const {
  absl::MutexLock lock(&mu_);
  return token_;
}

void EtcdClient::PrepareStreamContext(grpc::ClientContext* context) const {
  const std::string token = Token();
  if (!token.empty()) context->AddMetadata(kTokenMetadataKey, token);
  // A member cut off from the cluster's leader cancels the watch instead of
  // leaving it silently stale: the watch then moves to another member.
  context->AddMetadata("hasleader", "true");
}

absl::Status EtcdClient::WithFailover(const char* what, const Attempt& attempt,
                                      absl::Time deadline) {
  const absl::Time started = MonotonicNow();
  CallBound bound = BoundOf(started, deadline);
  const size_t n = members_.size();
  const size_t start = order_->preferred();
  std::vector<std::string> last_error(n);
  bool reauthenticated = false;
  size_t position = 0;
  while (true) {
    // A shutdown that began while this call ran cuts it too.
    if (!bound.shutdown) bound = BoundOf(started, deadline);
    const absl::Duration left = bound.deadline - MonotonicNow();
    if (left <= absl::ZeroDuration()) break;
    const Member& member = members_[(start + position) % n];
    grpc::ClientContext context;
    context.set_deadline(GrpcDeadline(std::min(left, options_.attempt_timeout)));
    // First round: fail fast on a member gRPC knows to be down, so that the
    // call moves on to a live one at once. Later rounds wait (within the
    // attempt's deadline) for a member to come back: a channel in
    // TRANSIENT_FAILURE may otherwise sit out its reconnect backoff while
    // every fail-fast call to it is refused.
    context.set_wait_for_ready(position >= n);
    const std::string token = Token();
    if (!token.empty()) context.AddMetadata(kTokenMetadataKey, token);
    const grpc::Status status = attempt(member, &context);
    if (status.ok()) {
      MarkHealthy(member.index);
      if (member.index != start) {
        spdlog::warn("event=etcd_failover from={} to={} op={} attempts={} after_ms={} error={}",
                     LogValue(members_[start].endpoint), LogValue(member.endpoint), what,
                     position + 1, absl::ToInt64Milliseconds(MonotonicNow() - started),
                     LogValue(last_error[start]));
      }
      return absl::OkStatus();
    }
    last_error[member.index] = absl::StrCat(GrpcMessage(status), " (connection ",
                                            StateName(member.channel->GetState(false)), ")");
    // etcd forgets tokens (a restart, a token's TTL): authenticate again,
    // once per call, and retry on the same member.
    if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED && !options_.user.empty() &&
        !reauthenticated) {
      reauthenticated = true;
      absl::Status auth = Authenticate(bound.deadline);
      if (!auth.ok()) return auth;
      continue;
    }
    if (!Retryable(status)) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat("etcd at ", member.endpoint, ": ", what,
                                       " failed: ", status.error_message()));
    }
    MarkFailed(member.index);
    ++position;
    if (position % n == 0) {
      // Every member failed once: a short pause before the next round, so
      // that a cluster that refuses connections is not spun on.
      absl::SleepFor(std::min(absl::Milliseconds(100), bound.deadline - MonotonicNow()));
    }
  }
  return AllMembersFailed(what, std::max(bound.deadline - started, absl::ZeroDuration()), bound,
                          last_error);
}

EtcdClient::CallBound EtcdClient::BoundOf(absl::Time started, absl::Time deadline) const {
  CallBound bound{std::min(deadline, started + options_.call_timeout), "", false};
  // An operation bounded by one call budget, whose first call starts a
  // moment after it did, cuts nothing worth naming.
  constexpr absl::Duration kNegligibleCut = absl::Milliseconds(1);
  if (const EtcdOperationDeadline* op = EtcdOperationDeadline::Current();
      op != nullptr && op->deadline() < bound.deadline - kNegligibleCut) {
    bound.deadline = op->deadline();
    bound.cut_by = absl::StrCat(
        ", all that was left of the ", op->operation(), "'s ",
        absl::FormatDuration(absl::Trunc(op->budget(), absl::Milliseconds(1))), " deadline");
  }
  if (options_.shutdown != nullptr && options_.shutdown->deadline() < bound.deadline) {
    bound.deadline = options_.shutdown->deadline();
    bound.cut_by = ", all that was left of the daemon's shutdown budget";
    bound.shutdown = true;
  }
  return bound;
}

absl::Status EtcdClient::AllMembersFailed(const char* what, absl::Duration budget,
                                          const CallBound& bound,
                                          const std::vector<std::string>& last_error) const {
  std::vector<std::string> per_member;
  for (size_t i = 0; i < members_.size(); ++i) {
    per_member.push_back(absl::StrCat(members_[i].endpoint, ": ",
                                      last_error[i].empty() ? "not tried" : last_error[i]));
  }
  absl::Status failed = absl::UnavailableError(
      absl::StrCat(Describe(), ": ", what, " failed on every member within ",
                   absl::FormatDuration(absl::Trunc(budget, absl::Milliseconds(1))), bound.cut_by,
                   " (", absl::StrJoin(per_member, "; "), ")"));
  if (bound.shutdown)
    options_.shutdown->NoteSkipped(what, Describe(), std::string(failed.message()));
  return failed;
}

absl::Status EtcdClient::Authenticate(absl::Time deadline) {
  const size_t n = members_.size();
  const size_t start = order_->preferred();
  std::vector<std::string> errors;
  for (size_t position = 0; MonotonicNow() < deadline; ++position) {
    const Member& member = members_[(start + position) % n];
    grpc::ClientContext context;
    context.set_deadline(
        GrpcDeadline(std::min(deadline - MonotonicNow(), options_.attempt_timeout)));
    context.set_wait_for_ready(position >= n);  // as in WithFailover
    etcdserverpb::AuthenticateRequest request;
    request.set_name(options_.user);
    request.set_password(options_.password);
    etcdserverpb::AuthenticateResponse response;
    const grpc::Status status =
        etcdserverpb::Auth::NewStub(member.channel)->Authenticate(&context, request, &response);
    if (status.ok()) {
      {
        absl::MutexLock lock(&mu_);
        token_ = response.token();
      }
      MarkHealthy(member.index);
      return absl::OkStatus();
    }
    if (!Retryable(status)) {
      // A wrong user or password: etcd's own code and words.
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat("etcd at ", member.endpoint, ": authenticating as user '",
                                       options_.user, "' failed: ", status.error_message()));
    }
    if (errors.size() < n)
      errors.push_back(absl::StrCat(member.endpoint, ": ", GrpcMessage(status)));
    if ((position + 1) % n == 0) {
      absl::SleepFor(std::min(absl::Milliseconds(100), deadline - MonotonicNow()));
    }
  }
  return absl::UnavailableError(absl::StrCat(Describe(), ": authenticating as user '",
                                             options_.user, "' failed on every member (",
                                             absl::StrJoin(errors, "; "), ")"));
}

absl::StatusOr<std::optional<EtcdKeyValue>> EtcdClient::Get(const std::string& key) {
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  etcdserverpb::RangeResponse response;
  absl::Status status = WithFailover("Range", [&](const Member& m, grpc::ClientContext* context) {
    return etcdserverpb::KV::NewStub(m.channel)->Range(context, request, &response);
  });
  if (!status.ok()) return status;
  if (response.kvs_size() == 0) return std::optional<EtcdKeyValue>();
  return std::optional<EtcdKeyValue>(EtcdKeyValueFromProto(response.kvs(0)));
}

absl::StatusOr<EtcdRange> EtcdClient::GetPrefix(const std::string& prefix) {
  if (prefix.empty())
    return absl::InvalidArgumentError("etcd client: GetPrefix of an empty prefix");
  etcdserverpb::RangeRequest request;
  request.set_key(prefix);
  request.set_range_end(EtcdPrefixEnd(prefix));
  request.set_sort_order(etcdserverpb::RangeRequest::ASCEND);
  request.set_sort_target(etcdserverpb::RangeRequest::KEY);
  etcdserverpb::RangeResponse response;
  absl::Status status = WithFailover("Range", [&](const Member& m, grpc::ClientContext* context) {
    return etcdserverpb::KV::NewStub(m.channel)->Range(context, request, &response);
  });
  if (!status.ok()) return status;
  EtcdRange range;
  range.revision = response.header().revision();
  for (const mvccpb::KeyValue& kv : response.kvs()) range.kvs.push_back(EtcdKeyValueFromProto(kv));
  return range;
}

absl::StatusOr<std::vector<std::optional<EtcdKeyValue>>> EtcdClient::GetMany(
    const std::vector<std::string>& keys) {
  etcdserverpb::TxnRequest request;
  for (const std::string& key : keys) {
    *request.add_success() = ToProto(EtcdTxnOp{EtcdTxnOp::Kind::kGet, key, "", 0});
  }
  etcdserverpb::TxnResponse response;
  absl::Status status = WithFailover("Txn", [&](const Member& m, grpc::ClientContext* context) {
    return etcdserverpb::KV::NewStub(m.channel)->Txn(context, request, &response);
  });
  if (!status.ok()) return status;
  if (response.responses_size() != static_cast<int>(keys.size())) {
    return absl::InternalError(absl::StrCat("etcd answered ", response.responses_size(),
                                            " reads for ", keys.size(), " keys"));
  }
  std::vector<std::optional<EtcdKeyValue>> out;
  for (const etcdserverpb::ResponseOp& op : response.responses()) {
    if (op.has_response_range() && op.response_range().kvs_size() > 0) {
      out.push_back(EtcdKeyValueFromProto(op.response_range().kvs(0)));
    } else {
      out.push_back(std::nullopt);
    }
  }
  return out;
}

absl::StatusOr<int64_t> EtcdClient::Put(const std::string& key, const std::string& value,
                                        int64_t lease) {
  etcdserverpb::PutRequest request;
  request.set_key(key);
  request.set_value(value);
  request.set_lease(lease);
  etcdserverpb::PutResponse response;
  absl::Status status = WithFailover("Put", [&](const Member& m, grpc::ClientContext* context) {
    return etcdserverpb::KV::NewStub(m.channel)->Put(context, request, &response);
  });
  if (!status.ok()) return status;
  return response.header().revision();
}

absl::StatusOr<bool> EtcdClient::Delete(const std::string& key) {
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(key);
  etcdserverpb::DeleteRangeResponse response;
  absl::Status status =
      WithFailover("DeleteRange", [&](const Member& m, grpc::ClientContext* context) {
        return etcdserverpb::KV::NewStub(m.channel)->DeleteRange(context, request, &response);
      });
  if (!status.ok()) return status;
  return response.deleted() > 0;
}

absl::StatusOr<int64_t> EtcdClient::DeletePrefix(const std::string& prefix) {
  if (prefix.empty()) {
    return absl::InvalidArgumentError("etcd client: DeletePrefix of an empty prefix");
  }
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(prefix);
  request.set_range_end(EtcdPrefixEnd(prefix));
  etcdserverpb::DeleteRangeResponse response;
  absl::Status status =
      WithFailover("DeleteRange", [&](const Member& m, grpc::ClientContext* context) {
        return etcdserverpb::KV::NewStub(m.channel)->DeleteRange(context, request, &response);
      });
  if (!status.ok()) return status;
  return response.deleted();
}

absl::StatusOr<EtcdTxnResult> EtcdClient::Txn(const std::vector<EtcdCompare>& compares,
                                              const std::vector<EtcdTxnOp>& success,
                                              const std::vector<EtcdTxnOp>& failure) {
  etcdserverpb::TxnRequest request;
  for (const EtcdCompare& compare : compares) *request.add_compare() = ToProto(compare);
  for (const EtcdTxnOp& op : success) *request.add_success() = ToProto(op);
  for (const EtcdTxnOp& op : failure) *request.add_failure() = ToProto(op);
  etcdserverpb::TxnResponse response;
  absl::Status status = WithFailover("Txn", [&](const Member& m, grpc::ClientContext* context) {
    return etcdserverpb::KV::NewStub(m.channel)->Txn(context, request, &response);
  });
  if (!status.ok()) return status;
  EtcdTxnResult result;
  result.succeeded = response.succeeded();
  result.revision = response.header().revision();
  // The helpers' failure branch is one Get of the key: its record, if any.
  if (!response.succeeded() && response.responses_size() == 1 &&
      response.responses(0).has_response_range() &&
      response.responses(0).response_range().kvs_size() > 0) {
    result.current = EtcdKeyValueFromProto(response.responses(0).response_range().kvs(0));
  }
  return result;
}

absl::StatusOr<EtcdTxnResult> EtcdClient::CreateIfAbsent(const std::string& key,
                                                         const std::string& value, int64_t lease) {
  EtcdCompare absent;
  absent.key = key;
  absent.target = EtcdCompare::Target::kCreateRevision;
  absent.op = EtcdCompare::Op::kEqual;
  absent.number = 0;
  EtcdTxnOp put{EtcdTxnOp::Kind::kPut, key, value, lease};
  EtcdTxnOp get{EtcdTxnOp::Kind::kGet, key, "", 0};
  return Txn({absent}, {put}, {get});
}

absl::StatusOr<EtcdTxnResult> EtcdClient::UpdateIfModRevision(const std::string& key,
                                                              const std::string& value,
                                                              int64_t mod_revision, int64_t lease) {
  EtcdCompare unchanged;
  unchanged.key = key;
  unchanged.target = EtcdCompare::Target::kModRevision;
  unchanged.op = EtcdCompare::Op::kEqual;
  unchanged.number = mod_revision;
  EtcdTxnOp put{EtcdTxnOp::Kind::kPut, key, value, lease};
  EtcdTxnOp get{EtcdTxnOp::Kind::kGet, key, "", 0};
  return Txn({unchanged}, {put}, {get});
}

absl::StatusOr<EtcdLease> EtcdClient::GrantLease(absl::Duration ttl) {
  if (ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("etcd client: a lease's TTL must be positive");
  }
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(ttl))));
  etcdserverpb::LeaseGrantResponse response;
  absl::Status status =
      WithFailover("LeaseGrant", [&](const Member& m, grpc::ClientContext* context) {
        return etcdserverpb::Lease::NewStub(m.channel)->LeaseGrant(context, request, &response);
      });
  if (!status.ok()) return status;
  if (!response.error().empty()) {
    return absl::UnavailableError(
        absl::StrCat(Describe(), ": LeaseGrant refused: ", response.error()));
  }
  return EtcdLease{response.id(), absl::Seconds(response.ttl())};
}

absl::Status EtcdClient::RevokeLease(int64_t id, absl::Time deadline) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(id);
  etcdserverpb::LeaseRevokeResponse response;
  return WithFailover(
      "LeaseRevoke",
      [&](const Member& m, grpc::ClientContext* context) {
        return etcdserverpb::Lease::NewStub(m.channel)->LeaseRevoke(context, request, &response);
      },
      deadline);
}

absl::StatusOr<absl::Duration> EtcdClient::KeepAliveOnce(int64_t id, absl::Time deadline) {
  etcdserverpb::LeaseKeepAliveResponse response;
  absl::Status status = WithFailover(
      "LeaseKeepAlive",
      [&](const Member& m, grpc::ClientContext* context) {
        auto stream = etcdserverpb::Lease::NewStub(m.channel)->LeaseKeepAlive(context);
        etcdserverpb::LeaseKeepAliveRequest request;
        request.set_id(id);
        if (!stream->Write(request) || !stream->Read(&response)) {
          grpc::Status finished = stream->Finish();
          if (finished.ok()) {
            return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the keepalive stream ended");
          }
          return finished;
        }
        // One renewal per stream: the keeper calls again ttl/3 later, then
        // possibly on another member.
        stream->WritesDone();
        context->TryCancel();
        stream->Finish();
        return grpc::Status::OK;
      },
      deadline);
  if (!status.ok()) return status;
  if (response.ttl() <= 0) {
    return absl::NotFoundError(
        absl::StrCat(Describe(), ": lease ", id, " no longer exists (expired or revoked)"));
  }
  return absl::Seconds(response.ttl());
}

}  // namespace gradsync
