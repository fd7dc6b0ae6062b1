// gradsyncctl: the operator's CLI for a running gradsyncd, over its Control
// service and the standard grpc.health.v1.Health service on --listen.
//
// Exit status (scripts rely on it):
//   0  success
//   1  the daemon answered with an error (or health is not SERVING, or the
//      trace file could not be written)
//   2  usage error
//   3  the daemon cannot be reached
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/call_token.h"
#include "common/defaults.h"
#include "common/stats_format.h"
#include "common/tls_credentials.h"
#include "common/token_file.h"
#include "gradsync/v1/control.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace gradsync {
namespace {

constexpr double kDefaultTimeoutS = 5;
constexpr double kMaxTimeoutS = 1e6;

enum Exit { kOk = 0, kDaemonError = 1, kUsage = 2, kUnreachable = 3 };

constexpr char kUsageText[] =
    R"(usage: gradsyncctl [--addr HOST:PORT] [--timeout-s SECONDS] COMMAND [ARGS]

Asks a running gradsyncd (its Control and grpc.health.v1 services on the
daemon's --listen address) for stats, health, configuration and traces.

commands:
  stats                      node header, trainers, per-bucket sizes and
                             latencies in µs (last/p50/p99), totals
  stats --json               the same as protobuf JSON (control.proto field names)
  stats --prometheus         Prometheus text exposition format (gradsync_* metrics)
  health [SERVICE]           prints SERVING or NOT_SERVING; exit 0 only if SERVING
  config get [--json]        runtime configuration as KEY=VALUE lines
  config set KEY=VALUE...    changes runtime settings (keys as `config get` prints
                             them); prints the configuration after the change
  trace --out FILE.json      saves the flight recorder as Chrome trace-event JSON
                             (--out - for stdout); open it in ui.perfetto.dev
  drain                      asks the daemon to drain
  stragglers [ADDR...]       who is the straggler: each trainer's lateness (mean,
                             p99 in ms) behind the job's first trainer, share of
                             iterations it was last, its usual bucket; asks
                             --addr and every ADDR (one daemon per node gives the
                             whole job)
  stragglers --json          the same as protobuf JSON (GetStragglersResponse)

options:
  --addr HOST:PORT           the daemon's --listen address; default $GRADSYNC_ADDR,
                             else %s (any gRPC target works, e.g. unix:PATH)
  --timeout-s SECONDS        deadline of each call (default 5)
  --token-file FILE          the job token (mode 0600), sent with every call;
                             default $GRADSYNC_TOKEN_FILE. `config set` and
                             `drain` need it unless the daemon has no token and
                             this runs on its host, or a TLS client certificate
                             replaces it
  --tls-ca FILE              TLS: the CA that signed the daemon's certificate
  --tls-cert FILE, --tls-key FILE
                             TLS: this client's certificate (mutual TLS)
  -h, --help                 this text

exit status:
  0  success
  1  the daemon answered with an error (or refused the call: no or a wrong
     token), health is not SERVING, or the --out file could not be written
  2  usage error (or an unusable token or TLS file)
  3  the daemon cannot be reached
)";

struct Options {
  std::string addr;
  double timeout_s = kDefaultTimeoutS;
  std::string token_file;
  TlsFiles tls;
  bool json = false;
  bool prometheus = false;
  bool has_out = false;
  std::string out;
  std::vector<std::string> args;  // the command and its operands
};

int UsageError(const std::string& message) {
  std::cerr << "gradsyncctl: " << message << " (gradsyncctl --help for usage)\n";
  return kUsage;
}

// Fills `opts`; returns an exit code when parsing ends the program (--help,
// a usage error), nullopt to go on.
std::optional<int> ParseArgs(int argc, char** argv, Options* opts) {
  const char* env_addr = std::getenv("GRADSYNC_ADDR");
  opts->addr = env_addr != nullptr && *env_addr != '\0' ? env_addr : kDefaultListenAddress;
  const char* env_token = std::getenv("GRADSYNC_TOKEN_FILE");
  if (env_token != nullptr) opts->token_file = env_token;
  bool options_done = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (options_done || arg.empty() || arg[0] != '-' || arg == "-") {
      opts->args.push_back(arg);
      continue;
    }
    if (arg == "--") {
      options_done = true;
      continue;
    }
    if (arg == "-h" || arg == "--help") {
      std::cout << absl::StrFormat(kUsageText, kDefaultListenAddress);
      return kOk;
    }
    // --name VALUE or --name=VALUE.
    std::string name = arg;
    std::string value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    auto take_value = [&]() -> bool {
      if (has_value) return true;
      if (i + 1 >= argc) return false;
      value = argv[++i];
      return true;
    };
    if (name == "--addr") {
      if (!take_value() || value.empty()) return UsageError("--addr needs HOST:PORT");
      opts->addr = value;
    } else if (name == "--timeout-s") {
      // Bounded so the deadline arithmetic cannot overflow.
      if (!take_value() || !absl::SimpleAtod(value, &opts->timeout_s) ||
          !(opts->timeout_s > 0 && opts->timeout_s <= kMaxTimeoutS)) {
        return UsageError("--timeout-s needs a number of seconds in (0, 1000000]");
      }
    } else if (name == "--token-file") {
      if (!take_value() || value.empty()) return UsageError("--token-file needs a file name");
      opts->token_file = value;
    } else if (name == "--tls-ca" || name == "--tls-cert" || name == "--tls-key") {
      if (!take_value() || value.empty()) return UsageError(name + " needs a file name");
      (name == "--tls-ca"     ? opts->tls.ca
       : name == "--tls-cert" ? opts->tls.cert
                              : opts->tls.key) = value;
    } else if (name == "--out") {
      if (!take_value() || value.empty()) return UsageError("--out needs a file name (or -)");
      opts->out = value;
      opts->has_out = true;
    } else if (name == "--json" && !has_value) {
      opts->json = true;
    } else if (name == "--prometheus" && !has_value) {
      opts->prometheus = true;
    } else {
      return UsageError(absl::StrCat("unknown option ", arg));
    }
  }
  return std::nullopt;
}

// Why a connection failed, in a few words, from gRPC's status message.
std::string UnreachableReason(const grpc::Status& status) {
  const std::string m = absl::AsciiStrToLower(status.error_message());
  struct Hint {
    const char* needle;
    const char* reason;
  };
  static constexpr Hint kHints[] = {
      {"connection refused", "connection refused"},
      {"no such file or directory", "no such socket file"},
      {"permission denied", "permission denied"},
      {"dns resolution failed", "cannot resolve the host name"},
      {"name or service not known", "cannot resolve the host name"},
      {"network is unreachable", "network is unreachable"},
      {"no route to host", "no route to host"},
      {"connection reset", "connection reset"},
      {"socket closed", "connection closed"},
      {"end of tcp stream", "connection closed"},
  };
  for (const Hint& h : kHints) {
    if (absl::StrContains(m, h.needle)) return h.reason;
  }
  return status.error_message().empty() ? "unavailable" : status.error_message();
}

class Ctl {
 public:
  // `token`: sent with every call ("" for none); `credentials`: plaintext or TLS.
  Ctl(const Options& opts, std::string token, std::shared_ptr<grpc::ChannelCredentials> credentials)
      : opts_(opts), token_(std::move(token)) {
    grpc::ChannelArguments args;
    // An operator's CLI talks to a daemon on the cluster network: an
    // http_proxy set for package downloads must not capture it.
    args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
    channel_ = grpc::CreateCustomChannel(opts.addr, std::move(credentials), args);
    control_ = v1::Control::NewStub(channel_);
    health_ = grpc::health::v1::Health::NewStub(channel_);
  }

  int Stats() {
    v1::GetStatsResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    const grpc::Status status = control_->GetStats(&ctx, v1::GetStatsRequest(), &resp);
    if (int rc = Check(status, resp.error()); rc != kOk) return rc;
    if (opts_.json) return PrintJson(resp.stats());
    std::cout << (opts_.prometheus ? FormatStatsPrometheus(resp.stats())
                                   : FormatStatsTable(resp.stats()));
    return kOk;
  }

  int Health(const std::string& service) {
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    const grpc::Status status = health_->Check(&ctx, req, &resp);
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      // The health protocol's answer for a service name it does not know.
      std::cout << "SERVICE_UNKNOWN\n";
      std::cerr << "gradsyncctl: gradsyncd at " << opts_.addr << " has no health status for \""
                << service << "\"\n";
      return kDaemonError;
    }
    if (!status.ok()) return TransportFailure(status, "Health.Check");
    std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()) << "\n";
    return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? kOk : kDaemonError;
  }

  int ConfigGet() {
    v1::GetConfigResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    const grpc::Status status = control_->GetConfig(&ctx, v1::GetConfigRequest(), &resp);
    if (int rc = Check(status, resp.error()); rc != kOk) return rc;
    if (opts_.json) return PrintJson(resp.config());
    std::cout << FormatConfig(resp.config());
    return kOk;
  }

  int ConfigSet(const std::map<std::string, std::string>& values) {
    v1::SetConfigRequest req;
    req.mutable_values()->insert(values.begin(), values.end());
    v1::SetConfigResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    const grpc::Status status = control_->SetConfig(&ctx, req, &resp);
    if (int rc = Check(status, resp.error()); rc != kOk) return rc;
    std::cout << FormatConfig(resp.config());
    return kOk;
  }

  int Trace(const std::string& out) {
    v1::GetTraceResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    const grpc::Status status = control_->GetTrace(&ctx, v1::GetTraceRequest(), &resp);
    if (int rc = Check(status, resp.error()); rc != kOk) return rc;
    // Parsed only to check it and to say how much it holds.
    const nlohmann::json trace = nlohmann::json::parse(resp.trace_json(), nullptr, false);
    const bool valid = !trace.is_discarded() && trace.is_object() &&
                       trace.contains("traceEvents") && trace["traceEvents"].is_array();
    if (out == "-") {
      std::cout << resp.trace_json();
    } else {
      std::ofstream f(out, std::ios::binary | std::ios::trunc);
      f << resp.trace_json();
      f.close();
      if (!f) {
        std::cerr << "gradsyncctl: cannot write " << out << ": " << std::strerror(errno) << "\n";
        return kDaemonError;
      }
    }
    if (!valid) {
      std::cerr << "gradsyncctl: gradsyncd at " << opts_.addr
                << " returned a trace that is not Chrome trace-event JSON\n";
      return kDaemonError;
    }
    if (out != "-") {
      std::cerr << "gradsyncctl: wrote " << trace["traceEvents"].size() << " trace events to "
                << out << " (open it in https://ui.perfetto.dev or chrome://tracing)\n";
    }
    if (resp.dropped_events() > 0) {
      std::cerr << "gradsyncctl: the daemon left out the oldest " << resp.dropped_events()
                << " events to fit a gRPC message (4 MiB); the newest are all there\n";
    }
    return kOk;
  }

  // Adds this daemon's trainers to `merged` (its header too when empty).
  int Stragglers(v1::GetStragglersResponse* merged) {
    v1::GetStragglersResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    const grpc::Status status = control_->GetStragglers(&ctx, v1::GetStragglersRequest(), &resp);
    if (int rc = Check(status, resp.error()); rc != kOk) return rc;
    if (merged->job_id().empty()) {
      merged->set_job_id(resp.job_id());
      merged->set_node_rank(resp.node_rank());
      merged->set_num_nodes(resp.num_nodes());
      *merged->mutable_settings() = resp.settings();
    } else if (resp.job_id() != merged->job_id()) {
      std::cerr << "gradsyncctl: gradsyncd at " << opts_.addr << " serves job " << resp.job_id()
                << ", not " << merged->job_id() << "\n";
      return kDaemonError;
    }
    for (v1::TrainerLateness& t : *resp.mutable_trainers()) *merged->add_trainers() = std::move(t);
    return kOk;
  }

  int Drain() {
    v1::DrainResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    const grpc::Status status = control_->Drain(&ctx, v1::DrainRequest(), &resp);
    if (int rc = Check(status, resp.error()); rc != kOk) return rc;
    std::cout << "gradsyncd at " << opts_.addr << " is draining\n";
    return kOk;
  }

 private:
  void SetDeadline(grpc::ClientContext* ctx) const {
    AttachCallToken(ctx, token_);
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::duration_cast<std::chrono::system_clock::duration>(
                          std::chrono::duration<double>(opts_.timeout_s)));
  }

  int PrintJson(const google::protobuf::Message& m) {
    absl::StatusOr<std::string> json = FormatJson(m);
    if (!json.ok()) {
      std::cerr << "gradsyncctl: " << json.status().message() << "\n";
      return kDaemonError;
    }
    std::cout << *json;
    if (json->empty() || json->back() != '\n') std::cout << "\n";
    return kOk;
  }

  // Every gradsync response carries an Error; gRPC's status is only non-OK
  // when the transport failed. Call after the RPC has filled the response.
  int Check(const grpc::Status& status, const v1::Error& error) {
    if (!status.ok()) return TransportFailure(status, "the Control service");
    if (error.code() != v1::OK) {
      std::cerr << "gradsyncctl: gradsyncd at " << opts_.addr << ": " << v1::Code_Name(error.code())
                << ": " << error.message() << "\n";
      return kDaemonError;
    }
    return kOk;
  }

  int TransportFailure(const grpc::Status& status, const char* what) {
    switch (status.error_code()) {
      case grpc::StatusCode::UNAVAILABLE:
        std::cerr << "gradsyncctl: cannot reach gradsyncd at " << opts_.addr << " ("
                  << UnreachableReason(status) << "): is it running?\n";
        return kUnreachable;
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        // Never connected: unreachable. Connected but silent: a daemon problem.
        if (channel_->GetState(false) != GRPC_CHANNEL_READY) {
          std::cerr << "gradsyncctl: cannot reach gradsyncd at " << opts_.addr
                    << " (no connection within " << opts_.timeout_s << "s): is it running?\n";
          return kUnreachable;
        }
        std::cerr << "gradsyncctl: gradsyncd at " << opts_.addr << " did not answer within "
                  << opts_.timeout_s << "s\n";
        return kDaemonError;
      case grpc::StatusCode::UNAUTHENTICATED:
        std::cerr << "gradsyncctl: gradsyncd at " << opts_.addr
                  << " refused the call: " << status.error_message() << "\n";
        return kDaemonError;
      case grpc::StatusCode::UNIMPLEMENTED:
        std::cerr << "gradsyncctl: the server at " << opts_.addr << " does not serve " << what
                  << " (not gradsyncd, or an older one?)\n";
        return kDaemonError;
      default:
        std::cerr << "gradsyncctl: gradsyncd at " << opts_.addr << ": RPC failed ("
                  << status.error_code() << "): " << status.error_message() << "\n";
        return kDaemonError;
    }
  }

  const Options& opts_;
  const std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Control::Stub> control_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

int Run(int argc, char** argv) {
  Options opts;
  if (std::optional<int> rc = ParseArgs(argc, argv, &opts)) return *rc;
  if (opts.args.empty()) return UsageError("missing command");
  std::string token;
  if (!opts.token_file.empty()) {
    absl::StatusOr<std::string> read = ReadTokenFile(opts.token_file);
    if (!read.ok()) return UsageError(std::string(read.status().message()));
    token = std::move(*read);
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(opts.tls);
  if (!credentials.ok()) return UsageError(std::string(credentials.status().message()));
  auto ctl = [&] { return Ctl(opts, token, *credentials); };

  const std::string& cmd = opts.args[0];
  const size_t operands = opts.args.size() - 1;
  auto only = [&](bool json, bool prometheus, bool out) -> std::string {
    if (opts.json && !json) return "--json";
    if (opts.prometheus && !prometheus) return "--prometheus";
    if (opts.has_out && !out) return "--out";
    return "";
  };
  auto misplaced = [&](const std::string& flag) {
    return UsageError(absl::StrCat(flag, " does not apply to '", cmd, "'"));
  };

  if (cmd == "stats") {
    if (auto f = only(true, true, false); !f.empty()) return misplaced(f);
    if (opts.json && opts.prometheus) return UsageError("choose one of --json and --prometheus");
    if (operands != 0) return UsageError("stats takes no operands");
    return ctl().Stats();
  }
  if (cmd == "health") {
    if (auto f = only(false, false, false); !f.empty()) return misplaced(f);
    if (operands > 1) return UsageError("health takes at most one SERVICE name");
    return ctl().Health(operands == 1 ? opts.args[1] : "");
  }
  if (cmd == "config") {
    if (operands == 0) return UsageError("config needs 'get' or 'set KEY=VALUE...'");
    const std::string& sub = opts.args[1];
    if (sub == "get") {
      if (auto f = only(true, false, false); !f.empty()) return misplaced(f);
      if (operands != 1) return UsageError("config get takes no operands");
      return ctl().ConfigGet();
    }
    if (sub == "set") {
      if (auto f = only(false, false, false); !f.empty()) return misplaced(f);
      if (operands < 2) return UsageError("config set needs at least one KEY=VALUE");
      std::map<std::string, std::string> values;
      for (size_t i = 2; i < opts.args.size(); ++i) {
        const std::string& kv = opts.args[i];
        const size_t eq = kv.find('=');
        if (eq == std::string::npos || eq == 0) {
          return UsageError(absl::StrCat("'", kv, "' is not KEY=VALUE"));
        }
        if (!values.emplace(kv.substr(0, eq), kv.substr(eq + 1)).second) {
          return UsageError(absl::StrCat("key '", kv.substr(0, eq), "' given twice"));
        }
      }
      return ctl().ConfigSet(values);
    }
    return UsageError(absl::StrCat("unknown config subcommand '", sub, "'"));
  }
  if (cmd == "trace") {
    if (auto f = only(false, false, true); !f.empty()) return misplaced(f);
    if (!opts.has_out) return UsageError("trace needs --out FILE.json (or --out - for stdout)");
    if (operands != 0) return UsageError("trace takes no operands");
    return ctl().Trace(opts.out);
  }
  if (cmd == "stragglers") {
    if (auto f = only(true, false, false); !f.empty()) return misplaced(f);
    std::vector<std::string> addrs = {opts.addr};
    addrs.insert(addrs.end(), opts.args.begin() + 1, opts.args.end());
    v1::GetStragglersResponse merged;
    for (const std::string& addr : addrs) {
      Options one = opts;
      one.addr = addr;
      if (int rc = Ctl(one, token, *credentials).Stragglers(&merged); rc != kOk) return rc;
    }
    std::sort(merged.mutable_trainers()->begin(), merged.mutable_trainers()->end(),
              [](const v1::TrainerLateness& a, const v1::TrainerLateness& b) {
                return a.rank() < b.rank();
              });
    if (opts.json) {
      absl::StatusOr<std::string> json = FormatJson(merged);
      if (!json.ok()) {
        std::cerr << "gradsyncctl: " << json.status().message() << "\n";
        return kDaemonError;
      }
      std::cout << *json << (json->empty() || json->back() != '\n' ? "\n" : "");
      return kOk;
    }
    std::cout << FormatStragglersTable(merged);
    return kOk;
  }
  if (cmd == "drain") {
    if (auto f = only(false, false, false); !f.empty()) return misplaced(f);
    if (operands != 0) return UsageError("drain takes no operands");
    return ctl().Drain();
  }
  return UsageError(absl::StrCat("unknown command '", cmd, "'"));
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Run(argc, argv); }
