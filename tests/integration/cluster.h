// A job of several real gradsyncd on this machine: node 0 leads and listens
// on a port the kernel picks, the others join it with the job's token; or,
// with ClusterOptions::rendezvous, every node meets the others in etcd.
#ifndef GRADSYNC_TESTS_INTEGRATION_CLUSTER_H_
#define GRADSYNC_TESTS_INTEGRATION_CLUSTER_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace gradsync::testing {

struct ClusterOptions {
  int nodes = 2;
  // Node ranks from `nodes` on that Start leaves out: StartNode starts
  // them (nodes joining a running job, --max-nodes).
  int spare_nodes = 0;
  int local_size = 1;  // trainers per node
  std::string job_id = "job";
  std::string token = "s3cret";
  std::string leader_host = "127.0.0.1";             // node 0 listens on this address only
  std::vector<std::string> flags;                    // for every node
  std::vector<std::vector<std::string>> node_flags;  // node_flags[n]: node n only, after `flags`
  // node_env[n]: added to node n's environment (e.g. a faked clock).
  std::vector<std::map<std::string, std::string>> node_env;
  // When set (etcd://HOST:PORT/PREFIX), every node is given --rendezvous
  // with it and listens on a port of its own: no node leads.
  std::string rendezvous;
  // When set, node 0 is also given --leader=<this host>:<its own port>, as
  // every node of the k8s manifest is; its port is then chosen before start.
  std::string node0_leader_host;
};

class Cluster {
 public:
  explicit Cluster(ClusterOptions options);

  // Starts every node; false as soon as one does not accept connections.
  bool Start();
  // Starts node n, replacing (stopping first) the one there; `token_file`
  // overrides the job's. The leader keeps its port across restarts.
  bool StartNode(int n, const std::string& token_file = "");

  // Starts local_size trainers (tests/testing/fault_trainer) on every node with
  // `args`, node-major; each writes its weights to its own file in dir(),
  // named after `tag`, and `outs` gets those paths in the same order.
  std::vector<Process> StartTrainers(const std::vector<std::string>& args,
                                     std::vector<std::string>* outs, const std::string& tag = "w");

  Daemon& node(int n) { return *daemons_[n]; }
  // The leader's (on etcd: node 0's --listen); 0 before it started.
  int port() const { return port_; }
  const std::string& dir() const { return dir_.path(); }
  const std::string& token_file() const { return token_file_; }
  std::string DaemonLogs() const;

 private:
  ClusterOptions options_;
  ScratchDir dir_;  // removed after the daemons are gone
  std::string token_file_;
  int port_ = 0;
  std::vector<std::unique_ptr<Daemon>> daemons_;
  std::vector<std::unique_ptr<Daemon>> replaced_;  // stopped, by StartNode
};

// Starts the cluster's trainers with `args` (StartTrainers, files named
// after `tag`) and expects each to succeed within `bound` and to end with
// the weights of one process training on the whole batch (normwise relative
// difference at most 1e-12): what every job must equal. Their weights,
// node-major; none once a trainer failed (the rest are then killed).
std::vector<std::vector<double>> ExpectTrainsLikeOneProcess(Cluster& cluster,
                                                            const std::vector<std::string>& args,
                                                            std::chrono::milliseconds bound,
                                                            const std::string& tag = "w");

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_INTEGRATION_CLUSTER_H_
