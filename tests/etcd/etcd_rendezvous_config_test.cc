// The daemon's EtcdRendezvous objects (ConnectEtcdRendezvous: one per
// formation, the config and tuner ones) share which etcd member calls start
// at, against a real 3-member etcd cluster: the one made for a re-formation
// starts where the last one left off, not at a blackholed first member.
#include "daemon/cluster/etcd_rendezvous_config.h"

#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/etcd/etcd_cluster.h"

namespace gradsync {
namespace {

using ::gradsync::testing::EtcdCluster;

// The daemon's log lines while it lives.
class CapturedLog {
 public:
  CapturedLog() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~CapturedLog() { spdlog::default_logger()->sinks().pop_back(); }
  std::string Text() {
    spdlog::default_logger()->flush();
    return out_.str();
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

TEST(EtcdRendezvousConfig, AReformationsRendezvousStartsAtTheMemberThatAnsweredLast) {
  const std::string missing = ::gradsync::testing::EtcdMissingReason();
  if (!missing.empty()) GTEST_SKIP() << missing;
  EtcdCluster etcd(3);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  DaemonConfig config;
  config.rendezvous = absl::StrCat("etcd://", absl::StrJoin(etcd.endpoints(), ","), "/gs");
  config.job_id = "job1";
  config.job_token = "the-job-token";
  config.num_nodes = 2;
  config.timeout_ms = 10000;
  absl::StatusOr<std::shared_ptr<EtcdRendezvous>> first = ConnectEtcdRendezvous(config);
  ASSERT_TRUE(first.ok()) << first.status();
  etcd.Stop(0);
  {
    CapturedLog log;
    ASSERT_TRUE((*first)->Set("a", "1").ok());
    EXPECT_NE(log.Text().find(absl::StrCat("event=etcd_failover from=\"", etcd.endpoints()[0])),
              std::string::npos)
        << log.Text();
  }
  first->reset();

  absl::StatusOr<std::shared_ptr<EtcdRendezvous>> next = ConnectEtcdRendezvous(config);
  ASSERT_TRUE(next.ok()) << next.status();
  CapturedLog log;
  ASSERT_TRUE((*next)->Set("b", "2").ok());
  EXPECT_EQ(log.Text().find("event=etcd_failover"), std::string::npos)
      << "the new rendezvous started at the stopped member again:\n"
      << log.Text();
  etcd.Continue(0);
}

}  // namespace
}  // namespace gradsync
