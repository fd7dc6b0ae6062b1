// Fuzzes the leader's Rendezvous service with the requests a node (or
// anyone reaching --listen) sends: a RendezvousService built in-process for
// each input gets a sequence of Join / Set / Get / Wait / Heartbeat / Leave
// calls whose requests are decoded from the input. Failures are answered
// in the response's Error; the only non-OK gRPC status is RESOURCE_EXHAUSTED
// for a Set over a store bound (rendezvous_service.h).
//
// Input: byte 0 picks num_nodes (1 or 2); then calls, each one byte (the
// RPC), two bytes of little-endian length and that many bytes of serialized
// request. Timeouts are forced to the service's default (1 ms) so a blocked
// Join or Wait ends at once.
#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "daemon/auth/call_auth.h"
#include "daemon/cluster/rendezvous_service.h"
#include "google/protobuf/stubs/logging.h"
#include "gradsync/v1/rendezvous.pb.h"
#include "grpcpp/server_context.h"
#include "spdlog/spdlog.h"
#include "tests/fuzz/fuzz_check.h"

namespace gradsync {
namespace {

constexpr char kJobId[] = "fuzz-job";

void ExpectAnswered(const grpc::Status& st, bool is_set) {
  if (st.ok()) return;
  FUZZ_CHECK(is_set && st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED, st.error_message());
}

template <typename Request>
bool Decode(const uint8_t* data, size_t size, Request* request) {
  return request->ParseFromArray(data, static_cast<int>(size));
}

}  // namespace
}  // namespace gradsync

// Every refusal is logged, and protobuf logs every string field that is
// not UTF-8: at fuzzing speed, only noise.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync;
  if (size == 0) return 0;
  CallAuthPolicy policy;
  policy.insecure = true;  // no token: the handlers themselves are under test
  RendezvousStoreLimits limits;
  limits.max_value_bytes = 1024;  // small bounds, so inputs can reach them
  limits.max_total_bytes = 16 << 10;
  limits.max_job_wide_keys = 8;
  RendezvousService service(kJobId, CallAuth(policy), 1 + data[0] % 2, absl::Milliseconds(1),
                            absl::Seconds(30), MonotonicNow, limits);
  size_t at = 1;
  while (at + 3 <= size) {
    const uint8_t rpc = data[at] % 6;
    const size_t length = std::min<size_t>(data[at + 1] | (data[at + 2] << 8), size - at - 3);
    const uint8_t* payload = data + at + 3;
    at += 3 + length;
    grpc::ServerContext context;
    switch (rpc) {
      case 0: {
        v1::JoinRequest request;
        v1::JoinResponse response;
        if (!Decode(payload, length, &request)) break;
        request.set_timeout_ms(0);
        ExpectAnswered(service.Join(&context, &request, &response), false);
        break;
      }
      case 1: {
        v1::SetRequest request;
        v1::SetResponse response;
        if (!Decode(payload, length, &request)) break;
        ExpectAnswered(service.Set(&context, &request, &response), true);
        break;
      }
      case 2: {
        v1::GetRequest request;
        v1::GetResponse response;
        if (!Decode(payload, length, &request)) break;
        ExpectAnswered(service.Get(&context, &request, &response), false);
        break;
      }
      case 3: {
        v1::WaitRequest request;
        v1::WaitResponse response;
        if (!Decode(payload, length, &request)) break;
        request.set_timeout_ms(0);
        ExpectAnswered(service.Wait(&context, &request, &response), false);
        break;
      }
      case 4: {
        v1::HeartbeatRequest request;
        v1::HeartbeatResponse response;
        if (!Decode(payload, length, &request)) break;
        ExpectAnswered(service.Heartbeat(&context, &request, &response), false);
        break;
      }
      case 5: {
        v1::LeaveRequest request;
        v1::LeaveResponse response;
        if (!Decode(payload, length, &request)) break;
        ExpectAnswered(service.Leave(&context, &request, &response), false);
        break;
      }
    }
  }
  // The status view must stay consistent with what was answered.
  const RendezvousStatus status = service.GetStatus();
  FUZZ_CHECK(status.incarnation == service.incarnation(), "incarnation changed");
  return 0;
}
