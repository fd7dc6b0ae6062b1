#include "daemon/cluster/etcd/etcd_watch.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "spdlog/spdlog.h"

namespace gradsync {

absl::StatusOr<std::unique_ptr<EtcdWatch>> EtcdWatch::Start(EtcdClient* client, std::string prefix,
                                                            int64_t start_revision,
                                                            EventsCallback on_events,
                                                            EndCallback on_end) {
  if (prefix.empty()) return absl::InvalidArgumentError("etcd watch: an empty prefix");
  std::unique_ptr<EtcdWatch> watch(new EtcdWatch(client, std::move(prefix), start_revision,
                                                 std::move(on_events), std::move(on_end)));
  watch->thread_ = std::thread([w = watch.get()] { w->Run(); });
  absl::Status status;
  {
    MonotonicMutexLock lock(&watch->mu_);
    // The thread gives up on its own after call_timeout; the margin only
    // covers its last attempt.
    const bool done = watch->mu_.AwaitWithTimeout(
        absl::Condition(&watch->started_),
        client->options().call_timeout + client->options().attempt_timeout);
    status = done ? watch->start_status_
                  : absl::DeadlineExceededError(absl::StrCat(
                        client->Describe(), ": Watch of '", watch->prefix_, "' not created within ",
                        absl::FormatDuration(client->options().call_timeout)));
  }
  if (!status.ok()) {
    watch->Stop();
    return status;
  }
  return watch;
}

EtcdWatch::EtcdWatch(EtcdClient* client, std::string prefix, int64_t start_revision,
                     EventsCallback on_events, EndCallback on_end)
    : client_(client),
      prefix_(std::move(prefix)),
      on_events_(std::move(on_events)),
      on_end_(std::move(on_end)),
      next_revision_(start_revision) {}

EtcdWatch::~EtcdWatch() { Stop(); }

void EtcdWatch::Stop() {
  {
    MonotonicMutexLock lock(&mu_);
    stopping_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

std::string EtcdWatch::endpoint() const {
  MonotonicMutexLock lock(&mu_);
  return endpoint_;
}

void EtcdWatch::Run() {
  const EtcdClientOptions& options = client_->options();
  // When the watch last had a healthy stream: it ends once no member could
  // serve it for call_timeout since.
  absl::Time healthy = MonotonicNow();
  size_t offset = 0;
  std::vector<std::string> errors;
  absl::Status end;
  while (true) {
    {
      MonotonicMutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (MonotonicNow() - healthy > options.call_timeout) break;
    const EtcdClient::Member member = client_->MemberAt(offset);
    bool created = false;
    absl::Status status = Serve(member, &created);
    if (status.ok()) return;  // stopped
    if (status.code() == absl::StatusCode::kFailedPrecondition) {
      end = status;  // compacted: no member can serve it
      break;
    }
    if (created) {
      healthy = MonotonicNow();
      errors.clear();
    }
    errors.push_back(absl::StrCat(member.endpoint, ": ", status.message()));
    if (errors.size() > options.endpoints.size()) errors.erase(errors.begin());
    ++offset;
    if (offset % options.endpoints.size() == 0 && !created) {
      // Every member failed once: a short pause before the next round.
      MonotonicMutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100));
    }
  }
  if (end.ok()) {
    std::string joined;
    for (const std::string& e : errors) absl::StrAppend(&joined, joined.empty() ? "" : "; ", e);
    end = absl::UnavailableError(absl::StrCat(
        client_->Describe(), ": Watch of '", prefix_, "' could not be served by any member within ",
        absl::FormatDuration(options.call_timeout), " (", joined, ")"));
  }
  bool report;
  {
    MonotonicMutexLock lock(&mu_);
    report = started_ && !stopping_;
    if (!started_) {
      started_ = true;
      start_status_ = end;
    }
  }
  if (report && on_end_) on_end_(end);
}

absl::Status EtcdWatch::Serve(const EtcdClient::Member& member, bool* created) {
  const EtcdClientOptions& options = client_->options();
  // Streams have no deadline; connecting does.
  if (!member.channel->WaitForConnected(
          std::chrono::system_clock::now() +
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              absl::ToChronoNanoseconds(options.attempt_timeout)))) {
    return absl::UnavailableError("not reachable");
  }
  grpc::ClientContext context;
  client_->PrepareStreamContext(&context);
  {
    MonotonicMutexLock lock(&mu_);
    if (stopping_) return absl::OkStatus();
    context_ = &context;
    endpoint_ = member.endpoint;
  }
  auto stream = etcdserverpb::Watch::NewStub(member.channel)->Watch(&context);
  etcdserverpb::WatchRequest request;
  etcdserverpb::WatchCreateRequest* create = request.mutable_create_request();
  create->set_key(prefix_);
  create->set_range_end(EtcdPrefixEnd(prefix_));
  create->set_start_revision(next_revision_);
  absl::Status result;
  etcdserverpb::WatchResponse response;
  if (!stream->Write(request)) {
    result = absl::UnavailableError("the watch stream closed before the watch was created");
  }
  while (result.ok() && stream->Read(&response)) {
    if (response.created()) {
      if (next_revision_ == 0) {
        // "From now": pin it, so that a failover resumes from here.
        next_revision_ = response.header().revision() + 1;
      }
      *created = true;
      client_->MarkHealthy(member.index);
      if (!served_by_.empty() && served_by_ != member.endpoint) {
        spdlog::warn("event=etcd_failover from={} to={} op=Watch prefix={} revision={}",
                     LogValue(served_by_), LogValue(member.endpoint), LogValue(prefix_),
                     next_revision_);
      }
      served_by_ = member.endpoint;
      MonotonicMutexLock lock(&mu_);
      if (!started_) {
        started_ = true;
        start_status_ = absl::OkStatus();
      }
    }
    if (response.canceled()) {
      if (response.compact_revision() > 0) {
        result = absl::FailedPreconditionError(absl::StrCat(
            "etcd at ", member.endpoint, ": Watch of '", prefix_, "' from revision ",
            next_revision_, " canceled: compacted up to ", response.compact_revision()));
      } else {
        result = absl::UnavailableError(
            absl::StrCat("watch canceled by etcd: ", response.cancel_reason()));
      }
      break;
    }
    if (response.events_size() == 0) continue;
    std::vector<EtcdEvent> events;
    events.reserve(response.events_size());
    for (const mvccpb::Event& event : response.events()) {
      EtcdEvent out;
      out.type =
          event.type() == mvccpb::Event::DELETE ? EtcdEvent::Type::kDelete : EtcdEvent::Type::kPut;
      out.kv = EtcdKeyValueFromProto(event.kv());
      next_revision_ = std::max(next_revision_, out.kv.mod_revision + 1);
      events.push_back(std::move(out));
    }
    if (on_events_) on_events_(events);
  }
  {
    MonotonicMutexLock lock(&mu_);
    context_ = nullptr;
    endpoint_.clear();
    if (stopping_) {
      context.TryCancel();
      stream->Finish();
      return absl::OkStatus();
    }
  }
  context.TryCancel();
  grpc::Status finished = stream->Finish();
  if (!result.ok()) return result;
  return absl::UnavailableError(
      finished.ok() ? std::string("the watch stream ended")
                    : absl::StrCat("the watch stream broke: ", finished.error_message()));
}

}  // namespace gradsync
