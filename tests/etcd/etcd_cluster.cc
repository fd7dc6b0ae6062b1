#include "tests/etcd/etcd_cluster.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

// Ports the kernel hands out now; each socket stays bound until all are
// picked, so that the list has no duplicate. A port taken again before
// etcd binds it makes that start fail, and Start tries again.
std::vector<int> FreePorts(int n) {
  std::vector<int> fds;
  std::vector<int> ports;
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ports.push_back(0);
    } else {
      ports.push_back(ntohs(addr.sin_port));
    }
    if (fd >= 0) fds.push_back(fd);
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

}  // namespace

std::string EtcdMissingReason() {
  if (::access(kEtcdBinary, X_OK) != 0) {
    return absl::StrCat(kEtcdBinary, " is not installed (Debian's etcd-server; scripts/setup)");
  }
  return "";
}

EtcdCluster::EtcdCluster(int members, EtcdServerTls tls)
    : members_(members), tls_(std::move(tls)) {}

EtcdCluster::~EtcdCluster() = default;

TlsFiles EtcdCluster::ClientTls() const {
  TlsFiles files;
  files.ca = tls_.ca;
  return files;
}

void EtcdCluster::Kill(int i) { (void)processes_[i].Kill(); }

void EtcdCluster::Stop(int i) { processes_[i].Signal(SIGSTOP); }

void EtcdCluster::Continue(int i) { processes_[i].Signal(SIGCONT); }

std::string EtcdCluster::Logs() const {
  std::string logs;
  for (size_t i = 0; i < processes_.size(); ++i) {
    absl::StrAppend(&logs, "--- etcd member ", i, " ---\n", processes_[i].Log(), "\n");
  }
  return logs;
}

absl::Status EtcdCluster::Start() {
  absl::Status status;
  for (int tries = 0; tries < 3; ++tries) {
    status = StartOnce();
    if (status.ok()) return status;
  }
  return status;
}

absl::Status EtcdCluster::StartOnce() {
  for (Process& p : processes_) (void)p.Kill();
  processes_.clear();
  endpoints_.clear();
  ++attempt_;
  const std::vector<int> ports = FreePorts(2 * members_);
  const std::string scheme = tls_.cert.empty() ? "http" : "https";
  std::vector<std::string> peers;
  for (int i = 0; i < members_; ++i) {
    peers.push_back(absl::StrCat("m", i, "=http://127.0.0.1:", ports[2 * i + 1]));
    endpoints_.push_back(absl::StrCat("127.0.0.1:", ports[2 * i]));
  }
  for (int i = 0; i < members_; ++i) {
    const std::string client_url = absl::StrCat(scheme, "://", endpoints_[i]);
    const std::string peer_url = absl::StrCat("http://127.0.0.1:", ports[2 * i + 1]);
    std::vector<std::string> argv = {
        kEtcdBinary,
        absl::StrCat("--name=m", i),
        "--data-dir=" + dir_.File(absl::StrCat("data", attempt_, "-", i)),
        "--listen-client-urls=" + client_url,
        "--advertise-client-urls=" + client_url,
        "--listen-peer-urls=" + peer_url,
        "--initial-advertise-peer-urls=" + peer_url,
        "--initial-cluster=" + absl::StrJoin(peers, ","),
        "--initial-cluster-state=new",
        absl::StrCat("--initial-cluster-token=gs", attempt_),
        // The machine is loaded: a generous election timeout keeps a
        // healthy cluster from re-electing under load.
        "--heartbeat-interval=100",
        "--election-timeout=1000",
        "--logger=zap",
        "--log-outputs=stderr",
    };
    if (!tls_.cert.empty()) {
      argv.push_back("--cert-file=" + tls_.cert);
      argv.push_back("--key-file=" + tls_.key);
      argv.push_back("--trusted-ca-file=" + tls_.ca);
      argv.push_back("--client-cert-auth");
    }
    processes_.push_back(
        Process::Spawn(argv, dir_.File(absl::StrCat("etcd", attempt_, "-", i, ".log"))));
    if (!processes_.back().started()) {
      return absl::InternalError(absl::StrCat("etcd did not start: ", Logs()));
    }
  }
  // Ready: a write through each member commits (so the cluster has a
  // leader and that member reaches it).
  for (int i = 0; i < members_; ++i) {
    EtcdClientOptions options;
    options.endpoints = {endpoints_[i]};
    options.tls = ClientTls();
    if (!tls_.cert.empty()) {
      options.tls.cert = tls_.cert;  // the member's certificate doubles as a client's
      options.tls.key = tls_.key;
    }
    options.call_timeout = absl::Seconds(2);
    options.attempt_timeout = absl::Seconds(2);
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(options);
    if (!client.ok()) return client.status();
    bool died = false;
    const bool ready = WaitUntil(
        [&] {
          for (Process& p : processes_) died = died || !p.Running();
          return died || (*client)->Put("/gs-test-ready", "1").ok();
        },
        std::chrono::seconds(60));
    if (died || !ready) {
      return absl::UnavailableError(absl::StrCat(
          "etcd member ", i, " not ready (", died ? "a member exited" : "timeout", "):\n", Logs()));
    }
  }
  return absl::OkStatus();
}

}  // namespace gradsync::testing
