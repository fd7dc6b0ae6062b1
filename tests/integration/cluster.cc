#include "tests/integration/cluster.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradsync::testing {

using std::chrono::seconds;

Cluster::Cluster(ClusterOptions options) : options_(std::move(options)) {
  token_file_ = dir_.File("token");
  // A daemon refuses to start on a missing token file, naming it.
  WriteTokenFile(token_file_, options_.token);
  daemons_.resize(options_.nodes + options_.spare_nodes);
}

bool Cluster::Start() {
  for (int n = 0; n < options_.nodes; ++n) {
    if (!StartNode(n)) return false;
  }
  return true;
}

namespace {

// A port the kernel has just handed out on `host` (bound, read, closed).
int FreeTcpPort(const std::string& host) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  int port = 0;
  socklen_t len = sizeof(addr);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1 &&
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace

bool Cluster::StartNode(int n, const std::string& token_file) {
  std::vector<std::string> args = {
      absl::StrCat("--num-nodes=", options_.nodes), absl::StrCat("--node-rank=", n),
      "--job-id=" + options_.job_id,
      "--job-token-file=" + (token_file.empty() ? token_file_ : token_file)};
  // The leader's port is the kernel's choice at its first start, kept after.
  if (n == 0 && port_ == 0 && !options_.node0_leader_host.empty()) {
    port_ = FreeTcpPort(options_.leader_host);  // --leader must name it before the start
  }
  if (!options_.rendezvous.empty()) {
    args.push_back("--rendezvous=" + options_.rendezvous);
    args.push_back(absl::StrCat("--listen=", options_.leader_host, ":0"));
  } else {
    args.push_back(
        absl::StrCat(n == 0 ? "--listen=" : "--leader=", options_.leader_host, ":", port_));
  }
  if (n == 0 && !options_.node0_leader_host.empty()) {
    args.push_back(absl::StrCat("--leader=", options_.node0_leader_host, ":", port_));
  }
  args.insert(args.end(), options_.flags.begin(), options_.flags.end());
  if (n < static_cast<int>(options_.node_flags.size())) {
    args.insert(args.end(), options_.node_flags[n].begin(), options_.node_flags[n].end());
  }
  // A restarted node reuses the port and shm prefix, so the old daemon must
  // be gone first. Its object lives on until the cluster's end: destroying
  // it removes its prefix's segments, and what the new daemon's start-up
  // sweep has to remove must still be there for it.
  if (daemons_[n] != nullptr) {
    if (daemons_[n]->process().Running()) daemons_[n]->Stop();
    if (daemons_[n]->process().Running()) daemons_[n]->process().Kill().IgnoreError();
    replaced_.push_back(std::move(daemons_[n]));
  }
  daemons_[n] = std::make_unique<Daemon>(options_.local_size, args,
                                         n < static_cast<int>(options_.node_env.size())
                                             ? options_.node_env[n]
                                             : std::map<std::string, std::string>());
  if (!daemons_[n]->WaitReady(seconds(10))) return false;
  if (!options_.rendezvous.empty()) {
    const int port = daemons_[n]->ListenPort(seconds(10));
    if (n == 0) port_ = port;  // Control's, as the leader's is
    return port != 0;
  }
  if (n == 0 && port_ == 0) port_ = daemons_[0]->ListenPort(seconds(10));
  return port_ != 0;
}

std::vector<Process> Cluster::StartTrainers(const std::vector<std::string>& args,
                                            std::vector<std::string>* outs,
                                            const std::string& tag) {
  std::vector<Process> trainers;
  for (int n = 0; n < options_.nodes; ++n) {
    for (int r = 0; r < options_.local_size; ++r) {
      outs->push_back(absl::StrCat(dir(), "/", tag, n, ".", r, ".txt"));
      trainers.push_back(StartTrainer(node(n), r, args, outs->back()));
    }
  }
  return trainers;
}

std::string Cluster::DaemonLogs() const {
  std::string out;
  for (const auto& d : daemons_) {
    if (d) out += "---- " + d->dir() + "\n" + d->process().Log();
  }
  return out;
}

std::vector<std::vector<double>> ExpectTrainsLikeOneProcess(Cluster& cluster,
                                                            const std::vector<std::string>& args,
                                                            std::chrono::milliseconds bound,
                                                            const std::string& tag) {
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(args, &outs, tag);
  for (Process& t : trainers) {
    const ExitStatus st = t.Wait(bound);
    if (!st.exited || st.code != 0) {
      ADD_FAILURE() << "trainer " << st.ToString() << "\n" << t.Log() << cluster.DaemonLogs();
      return {};
    }
  }
  const std::vector<double> expected = SingleProcessReference(cluster.dir(), args);
  std::vector<std::vector<double>> weights;
  for (const std::string& out : outs) {
    weights.push_back(LoadWeights(out));
    EXPECT_LE(RelativeDifference(weights.back(), expected), 1e-12) << out;
  }
  return weights;
}

}  // namespace gradsync::testing
