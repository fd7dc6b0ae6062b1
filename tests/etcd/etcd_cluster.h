// EtcdCluster: real etcd members (Debian's /usr/bin/etcd) on loopback ports
// with a scratch data directory, for the etcd client's tests. One member or
// several forming one cluster; any member can be SIGKILLed or SIGSTOPped.
#ifndef GRADSYNC_TESTS_ETCD_ETCD_CLUSTER_H_
#define GRADSYNC_TESTS_ETCD_ETCD_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/tls_credentials.h"
#include "tests/testing/files.h"
#include "tests/testing/process.h"

namespace gradsync::testing {

inline constexpr char kEtcdBinary[] = "/usr/bin/etcd";
inline constexpr char kEtcdctlBinary[] = "/usr/bin/etcdctl";

// Why the etcd tests cannot run here ("" when they can).
std::string EtcdMissingReason();

struct EtcdServerTls {
  std::string cert;  // the members' server certificate and key
  std::string key;
  std::string ca;  // clients must present a certificate this CA signed
};

class EtcdCluster {
 public:
  explicit EtcdCluster(int members, EtcdServerTls tls = {});
  ~EtcdCluster();

  // Starts every member and waits until the cluster serves writes through
  // each one; an error holds the members' logs.
  absl::Status Start();

  // HOST:PORT of every member's client URL, in member order.
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  // The files a client needs to reach a TLS cluster (its own certificate
  // left to the caller).
  TlsFiles ClientTls() const;

  // SIGKILLs member `i` and reaps it.
  void Kill(int i);
  // SIGSTOPs member `i`: its sockets stay open and nothing answers on them,
  // so every call to it waits out its deadline (a blackholed member).
  void Stop(int i);
  // SIGCONTs a stopped member.
  void Continue(int i);
  std::string Logs() const;

 private:
  absl::Status StartOnce();

  const int members_;
  const EtcdServerTls tls_;
  ScratchDir dir_{"gsetcd"};
  std::vector<std::string> endpoints_;
  std::vector<Process> processes_;
  int attempt_ = 0;
};

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_ETCD_ETCD_CLUSTER_H_
