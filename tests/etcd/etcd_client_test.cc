// The etcd client against real etcd members on loopback ports: reads,
// writes and transactions (races between two clients), leases and their
// keeper, prefix watches, an unreachable etcd, a 3-member cluster losing a
// member, a stopped (blackholed) member and a cluster without quorum, etcd
// auth and mutual TLS.
#include "daemon/cluster/etcd/etcd_client.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/monotonic.h"
#include "daemon/cluster/etcd/etcd_lease_keeper.h"
#include "daemon/cluster/etcd/etcd_member_order.h"
#include "daemon/cluster/etcd/etcd_operation_deadline.h"
#include "daemon/cluster/etcd/etcd_shutdown_budget.h"
#include "daemon/cluster/etcd/etcd_watch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/etcd/etcd_cluster.h"
#include "tests/integration/test_pki.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace gradsync {
namespace {

using ::gradsync::testing::EtcdCluster;
using ::gradsync::testing::WaitUntil;
using ::testing::HasSubstr;

constexpr auto kWait = std::chrono::seconds(60);

#define SKIP_WITHOUT_ETCD()                                              \
  do {                                                                   \
    const std::string reason = ::gradsync::testing::EtcdMissingReason(); \
    if (!reason.empty()) GTEST_SKIP() << reason;                         \
  } while (0)

std::unique_ptr<EtcdClient> ConnectOrDie(const std::vector<std::string>& endpoints,
                                         absl::Duration call_timeout = absl::Seconds(10)) {
  EtcdClientOptions options;
  options.endpoints = endpoints;
  options.call_timeout = call_timeout;
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// Events a watch delivered, read by the test thread.
class EventLog {
 public:
  void Add(const std::vector<EtcdEvent>& events) {
    absl::MutexLock lock(&mu_);
    events_.insert(events_.end(), events.begin(), events.end());
  }
  std::vector<EtcdEvent> Get() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  bool HasPut(const std::string& key, const std::string& value) const {
    for (const EtcdEvent& e : Get()) {
      if (e.type == EtcdEvent::Type::kPut && e.kv.key == key && e.kv.value == value) return true;
    }
    return false;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<EtcdEvent> events_;
};

TEST(EtcdClientTest, PutGetPrefixAndDelete) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  auto client = ConnectOrDie(etcd.endpoints());
  ASSERT_NE(client, nullptr);

  absl::StatusOr<int64_t> rev = client->Put("/job/a/1", "one");
  ASSERT_TRUE(rev.ok()) << rev.status();
  ASSERT_TRUE(client->Put("/job/a/2", "two").ok());
  ASSERT_TRUE(client->Put("/job/b/1", "other").ok());
  // A key whose last byte is 0xff: the prefix end must carry over.
  ASSERT_TRUE(client->Put(std::string("/job/a\xff") + "x", "edge").ok());

  absl::StatusOr<std::optional<EtcdKeyValue>> got = client->Get("/job/a/1");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->value, "one");
  EXPECT_EQ((*got)->mod_revision, *rev);
  EXPECT_EQ((*got)->create_revision, *rev);
  EXPECT_EQ((*got)->version, 1);

  absl::StatusOr<std::optional<EtcdKeyValue>> missing = client->Get("/job/a/3");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->has_value());

  absl::StatusOr<EtcdRange> range = client->GetPrefix("/job/a/");
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_EQ(range->kvs.size(), 2u);
  EXPECT_EQ(range->kvs[0].key, "/job/a/1");
  EXPECT_EQ(range->kvs[1].key, "/job/a/2");
  EXPECT_EQ(range->kvs[1].value, "two");
  EXPECT_GE(range->revision, *rev);

  absl::StatusOr<EtcdRange> edge = client->GetPrefix("/job/a\xff");
  ASSERT_TRUE(edge.ok()) << edge.status();
  ASSERT_EQ(edge->kvs.size(), 1u);
  EXPECT_EQ(edge->kvs[0].value, "edge");

  absl::StatusOr<bool> deleted = client->Delete("/job/a/1");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_TRUE(*deleted);
  deleted = client->Delete("/job/a/1");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_FALSE(*deleted);

  absl::StatusOr<int64_t> removed = client->DeletePrefix("/job/");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 3);
}

TEST(EtcdClientTest, CreateIfAbsentRaceHasExactlyOneWinner) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  auto a = ConnectOrDie(etcd.endpoints());
  auto b = ConnectOrDie(etcd.endpoints());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);

  constexpr int kKeys = 20;
  std::vector<absl::StatusOr<EtcdTxnResult>> results_a(kKeys), results_b(kKeys);
  std::atomic<int> ready{0};
  auto race = [&](EtcdClient* client, const std::string& who,
                  std::vector<absl::StatusOr<EtcdTxnResult>>* results) {
    ready.fetch_add(1);
    while (ready.load() < 2) {
    }
    for (int k = 0; k < kKeys; ++k) {
      (*results)[k] = client->CreateIfAbsent(absl::StrCat("/race/", k), who);
    }
  };
  std::thread ta(race, a.get(), "a", &results_a);
  std::thread tb(race, b.get(), "b", &results_b);
  ta.join();
  tb.join();

  for (int k = 0; k < kKeys; ++k) {
    ASSERT_TRUE(results_a[k].ok()) << results_a[k].status();
    ASSERT_TRUE(results_b[k].ok()) << results_b[k].status();
    EXPECT_NE(results_a[k]->succeeded, results_b[k]->succeeded) << "key " << k;
    const EtcdTxnResult& loser = results_a[k]->succeeded ? *results_b[k] : *results_a[k];
    const std::string winner = results_a[k]->succeeded ? "a" : "b";
    ASSERT_TRUE(loser.current.has_value()) << "key " << k;
    EXPECT_EQ(loser.current->value, winner);
    absl::StatusOr<std::optional<EtcdKeyValue>> stored = a->Get(absl::StrCat("/race/", k));
    ASSERT_TRUE(stored.ok() && stored->has_value());
    EXPECT_EQ((*stored)->value, winner);
  }
}

TEST(EtcdClientTest, UpdateIfModRevisionRaceHasExactlyOneWinner) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  auto a = ConnectOrDie(etcd.endpoints());
  auto b = ConnectOrDie(etcd.endpoints());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(a->Put("/gen", "0").ok());
  for (int round = 1; round <= 10; ++round) {
    // Both read the same record, then both try to replace it.
    absl::StatusOr<std::optional<EtcdKeyValue>> read_a = a->Get("/gen");
    absl::StatusOr<std::optional<EtcdKeyValue>> read_b = b->Get("/gen");
    ASSERT_TRUE(read_a.ok() && read_a->has_value());
    ASSERT_TRUE(read_b.ok() && read_b->has_value());
    ASSERT_EQ((*read_a)->mod_revision, (*read_b)->mod_revision);
    absl::StatusOr<EtcdTxnResult> ra, rb;
    std::thread ta([&] { ra = a->UpdateIfModRevision("/gen", "a", (*read_a)->mod_revision); });
    std::thread tb([&] { rb = b->UpdateIfModRevision("/gen", "b", (*read_b)->mod_revision); });
    ta.join();
    tb.join();
    ASSERT_TRUE(ra.ok()) << ra.status();
    ASSERT_TRUE(rb.ok()) << rb.status();
    EXPECT_NE(ra->succeeded, rb->succeeded) << "round " << round;
    const EtcdTxnResult& winner = ra->succeeded ? *ra : *rb;
    const EtcdTxnResult& loser = ra->succeeded ? *rb : *ra;
    ASSERT_TRUE(loser.current.has_value());
    EXPECT_EQ(loser.current->mod_revision, winner.revision);
    EXPECT_EQ(loser.current->value, ra->succeeded ? "a" : "b");
  }
  // A compare on a deleted key fails and reports no current record.
  absl::StatusOr<std::optional<EtcdKeyValue>> last = a->Get("/gen");
  ASSERT_TRUE(last.ok() && last->has_value());
  ASSERT_TRUE(a->Delete("/gen").ok());
  absl::StatusOr<EtcdTxnResult> stale = a->UpdateIfModRevision("/gen", "x", (*last)->mod_revision);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_FALSE(stale->succeeded);
  EXPECT_FALSE(stale->current.has_value());
}

TEST(EtcdClientTest, LeaseExpiryRemovesItsKeyAndTheKeeperKeepsItsOwn) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  auto client = ConnectOrDie(etcd.endpoints());
  ASSERT_NE(client, nullptr);

  // `kept` is granted first: without its keeper it would expire no later
  // than `dropped`.
  absl::StatusOr<EtcdLease> kept = client->GrantLease(absl::Seconds(2));
  absl::StatusOr<EtcdLease> dropped = client->GrantLease(absl::Seconds(2));
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  ASSERT_TRUE(client->Put("/alive/kept", "1", kept->id).ok());
  ASSERT_TRUE(client->Put("/alive/dropped", "1", dropped->id).ok());
  std::atomic<bool> lost{false};
  EtcdLeaseKeeper keeper(client.get(), *kept, [&](absl::Status) { lost = true; });

  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<std::optional<EtcdKeyValue>> kv = client->Get("/alive/dropped");
        return kv.ok() && !kv->has_value();
      },
      kWait))
      << "the key of a lease nobody renews was never removed";
  absl::StatusOr<std::optional<EtcdKeyValue>> alive = client->Get("/alive/kept");
  ASSERT_TRUE(alive.ok()) << alive.status();
  EXPECT_TRUE(alive->has_value()) << "the kept lease's key was removed";
  EXPECT_GT(keeper.renewals(), 0);
  EXPECT_FALSE(lost.load());

  // Revoking ends the lease at once, and takes its key with it.
  keeper.Stop();
  ASSERT_TRUE(client->RevokeLease(kept->id).ok());
  alive = client->Get("/alive/kept");
  ASSERT_TRUE(alive.ok()) << alive.status();
  EXPECT_FALSE(alive->has_value());
}

TEST(EtcdClientTest, KeeperReportsALeaseRevokedElsewhere) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  auto client = ConnectOrDie(etcd.endpoints());
  auto other = ConnectOrDie(etcd.endpoints());
  ASSERT_NE(client, nullptr);
  ASSERT_NE(other, nullptr);
  absl::StatusOr<EtcdLease> lease = client->GrantLease(absl::Seconds(3));
  ASSERT_TRUE(lease.ok()) << lease.status();

  absl::Mutex mu;
  std::optional<absl::Status> reason;
  EtcdLeaseKeeper keeper(client.get(), *lease, [&](absl::Status s) {
    absl::MutexLock lock(&mu);
    reason = s;
  });
  ASSERT_TRUE(other->RevokeLease(lease->id).ok());
  ASSERT_TRUE(WaitUntil([&] { return keeper.lost(); }, kWait));
  absl::MutexLock lock(&mu);
  ASSERT_TRUE(reason.has_value());
  EXPECT_EQ(reason->code(), absl::StatusCode::kNotFound) << *reason;
  EXPECT_THAT(reason->message(), HasSubstr("etcd at " + etcd.endpoints()[0]));
  EXPECT_THAT(reason->message(), HasSubstr(absl::StrCat("lease ", lease->id)));
}

TEST(EtcdClientTest, WatchSeesPutsFromNowAndFromARevision) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  auto client = ConnectOrDie(etcd.endpoints());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<int64_t> first = client->Put("/w/early", "0");
  ASSERT_TRUE(first.ok()) << first.status();

  EventLog now_log, history_log;
  absl::StatusOr<std::unique_ptr<EtcdWatch>> from_now = EtcdWatch::Start(
      client.get(), "/w/", 0, [&](const std::vector<EtcdEvent>& e) { now_log.Add(e); }, nullptr);
  ASSERT_TRUE(from_now.ok()) << from_now.status();
  absl::StatusOr<std::unique_ptr<EtcdWatch>> from_rev = EtcdWatch::Start(
      client.get(), "/w/", *first, [&](const std::vector<EtcdEvent>& e) { history_log.Add(e); },
      nullptr);
  ASSERT_TRUE(from_rev.ok()) << from_rev.status();

  ASSERT_TRUE(client->Put("/w/k", "v").ok());
  ASSERT_TRUE(client->Put("/elsewhere", "x").ok());
  ASSERT_TRUE(client->Delete("/w/k").ok());
  ASSERT_TRUE(WaitUntil(
      [&] {
        std::vector<EtcdEvent> events = now_log.Get();
        return !events.empty() && events.back().type == EtcdEvent::Type::kDelete;
      },
      kWait));
  std::vector<EtcdEvent> events = now_log.Get();
  ASSERT_EQ(events.size(), 2u);  // the put and the delete, not /w/early nor /elsewhere
  EXPECT_EQ(events[0].type, EtcdEvent::Type::kPut);
  EXPECT_EQ(events[0].kv.key, "/w/k");
  EXPECT_EQ(events[0].kv.value, "v");
  EXPECT_EQ(events[1].kv.key, "/w/k");

  ASSERT_TRUE(WaitUntil([&] { return history_log.Get().size() == 3u; }, kWait));
  EXPECT_TRUE(history_log.HasPut("/w/early", "0"));
  EXPECT_TRUE(history_log.HasPut("/w/k", "v"));
}

TEST(EtcdClientTest, UnreachableEtcdFailsWithinTheDeadlineNamingIt) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  const std::string endpoint = etcd.endpoints()[0];
  auto client = ConnectOrDie(etcd.endpoints(), absl::Seconds(2));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("/k", "v").ok());
  absl::StatusOr<EtcdLease> lease = client->GrantLease(absl::Seconds(2));
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::Mutex mu;
  std::optional<absl::Status> lost;
  EtcdLeaseKeeper keeper(client.get(), *lease, [&](absl::Status s) {
    absl::MutexLock lock(&mu);
    lost = s;
  });
  EventLog log;
  absl::Mutex end_mu;
  std::optional<absl::Status> watch_end;
  absl::StatusOr<std::unique_ptr<EtcdWatch>> watch = EtcdWatch::Start(
      client.get(), "/", 0, [&](const std::vector<EtcdEvent>& e) { log.Add(e); },
      [&](absl::Status s) {
        absl::MutexLock lock(&end_mu);
        watch_end = s;
      });
  ASSERT_TRUE(watch.ok()) << watch.status();

  etcd.Kill(0);

  // Every kind of call returns (its deadline is 2 s) with an error naming
  // etcd and the member.
  absl::StatusOr<std::optional<EtcdKeyValue>> got = client->Get("/k");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("etcd at " + endpoint));
  EXPECT_THAT(got.status().message(), HasSubstr("Range failed on every member"));
  absl::StatusOr<EtcdTxnResult> txn = client->CreateIfAbsent("/k2", "v");
  ASSERT_FALSE(txn.ok());
  EXPECT_EQ(txn.status().code(), absl::StatusCode::kUnavailable) << txn.status();
  EXPECT_THAT(txn.status().message(), HasSubstr("etcd at " + endpoint));

  // The keeper cannot renew for a whole TTL: the lease is reported lost.
  ASSERT_TRUE(WaitUntil([&] { return keeper.lost(); }, kWait));
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(lost->code(), absl::StatusCode::kUnavailable) << *lost;
    EXPECT_THAT(lost->message(), HasSubstr("etcd at " + endpoint));
    EXPECT_THAT(lost->message(), HasSubstr(absl::StrCat("lease ", lease->id)));
  }
  // The watch ends, saying why.
  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::MutexLock lock(&end_mu);
        return watch_end.has_value();
      },
      kWait));
  absl::MutexLock lock(&end_mu);
  EXPECT_EQ(watch_end->code(), absl::StatusCode::kUnavailable) << *watch_end;
  EXPECT_THAT(watch_end->message(), HasSubstr("etcd at " + endpoint));
}

TEST(EtcdClientTest, NothingListeningFailsConnectFreeCallsNamingEtcd) {
  SKIP_WITHOUT_ETCD();
  // A cluster started and killed: its port is known to have nobody on it.
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  etcd.Kill(0);
  auto client = ConnectOrDie(etcd.endpoints(), absl::Seconds(1));
  ASSERT_NE(client, nullptr);
  absl::StatusOr<int64_t> put = client->Put("/k", "v");
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), absl::StatusCode::kUnavailable) << put.status();
  EXPECT_THAT(put.status().message(), HasSubstr("etcd at " + etcd.endpoints()[0]));
  absl::StatusOr<std::unique_ptr<EtcdWatch>> watch =
      EtcdWatch::Start(client.get(), "/", 0, nullptr, nullptr);
  ASSERT_FALSE(watch.ok());
  EXPECT_EQ(watch.status().code(), absl::StatusCode::kUnavailable) << watch.status();
  EXPECT_THAT(watch.status().message(), HasSubstr("etcd at " + etcd.endpoints()[0]));
}

TEST(EtcdClientTest, ThreeMemberClusterKeepsServingWhenOneMemberIsKilled) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(3);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  // Long enough for the two survivors to elect a leader on a loaded machine.
  auto client = ConnectOrDie(etcd.endpoints(), absl::Seconds(30));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("/c/before", "1").ok());
  EventLog log;
  absl::StatusOr<std::unique_ptr<EtcdWatch>> watch = EtcdWatch::Start(
      client.get(), "/c/", 0, [&](const std::vector<EtcdEvent>& e) { log.Add(e); }, nullptr);
  ASSERT_TRUE(watch.ok()) << watch.status();
  // The member serving the watch is the one the client's calls go to: the
  // one to kill.
  const std::string victim = (*watch)->endpoint();
  int victim_index = -1;
  for (int i = 0; i < 3; ++i) {
    if (etcd.endpoints()[i] == victim) victim_index = i;
  }
  ASSERT_GE(victim_index, 0) << "watch served by '" << victim << "'";
  // `lease` is kept alive, `control` (granted after it) is not.
  absl::StatusOr<EtcdLease> lease = client->GrantLease(absl::Seconds(5));
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::StatusOr<EtcdLease> control = client->GrantLease(absl::Seconds(5));
  ASSERT_TRUE(control.ok()) << control.status();
  std::atomic<bool> lost{false};
  EtcdLeaseKeeper keeper(client.get(), *lease, [&](absl::Status) { lost = true; });
  ASSERT_TRUE(client->Put("/c/leased", "1", lease->id).ok());
  ASSERT_TRUE(client->Put("/c/control", "1", control->id).ok());

  etcd.Kill(victim_index);

  absl::StatusOr<int64_t> put = client->Put("/c/after", "2");
  ASSERT_TRUE(put.ok()) << put.status();
  absl::StatusOr<std::optional<EtcdKeyValue>> got = client->Get("/c/before");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->value, "1");
  absl::StatusOr<EtcdTxnResult> created = client->CreateIfAbsent("/c/once", "x");
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(created->succeeded);
  // The watch moved to a survivor and missed nothing.
  ASSERT_TRUE(
      WaitUntil([&] { return log.HasPut("/c/after", "2") && log.HasPut("/c/once", "x"); }, kWait));
  EXPECT_NE((*watch)->endpoint(), victim);
  // The kept lease lives on through the survivors past the control's expiry.
  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<std::optional<EtcdKeyValue>> kv = client->Get("/c/control");
        return kv.ok() && !kv->has_value();
      },
      kWait));
  EXPECT_FALSE(lost.load());
  absl::StatusOr<std::optional<EtcdKeyValue>> leased = client->Get("/c/leased");
  ASSERT_TRUE(leased.ok()) << leased.status();
  EXPECT_TRUE(leased->has_value());
}

std::unique_ptr<EtcdClient> ConnectWithAttempts(const std::vector<std::string>& endpoints,
                                                absl::Duration call_timeout,
                                                absl::Duration attempt_timeout) {
  EtcdClientOptions options;
  options.endpoints = endpoints;
  options.call_timeout = call_timeout;
  options.attempt_timeout = attempt_timeout;
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// A SIGSTOPped member answers nothing: a call whose own deadline allows
// one attempt fails on it, naming it, and the next call starts at another
// member instead of waiting on it again.
TEST(EtcdClientTest, ABlackholedMemberCostsOneAttemptAndCallsMoveOn) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(3);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  auto client = ConnectWithAttempts(etcd.endpoints(), absl::Seconds(30), absl::Seconds(1));
  ASSERT_NE(client, nullptr);
  absl::StatusOr<EtcdLease> lease = client->GrantLease(absl::Seconds(30));
  ASSERT_TRUE(lease.ok()) << lease.status();
  // The member calls start at: the one to stop.
  const std::string victim = client->preferred_endpoint();
  int victim_index = -1;
  for (int i = 0; i < 3; ++i) {
    if (etcd.endpoints()[i] == victim) victim_index = i;
  }
  ASSERT_GE(victim_index, 0) << victim;

  etcd.Stop(victim_index);
  absl::StatusOr<absl::Duration> renewed =
      client->KeepAliveOnce(lease->id, MonotonicNow() + absl::Seconds(1));
  ASSERT_FALSE(renewed.ok());
  EXPECT_EQ(renewed.status().code(), absl::StatusCode::kUnavailable) << renewed.status();
  EXPECT_THAT(renewed.status().message(), HasSubstr(victim + ": DEADLINE_EXCEEDED"));
  EXPECT_NE(client->preferred_endpoint(), victim);

  // The next call starts elsewhere (the cluster may first elect a leader
  // if the stopped member led it).
  renewed = client->KeepAliveOnce(lease->id);
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_GT(*renewed, absl::ZeroDuration());
  EXPECT_NE(client->preferred_endpoint(), victim);
  etcd.Continue(victim_index);
}

// Two of three members stopped: etcd has no quorum. A call keeps trying
// the members until its deadline: one given 3 s fails UNAVAILABLE naming
// every member; one still trying when a member comes back succeeds.
TEST(EtcdClientTest, LostQuorumFailsWithinTheDeadlineAndACallOutlastingItSucceeds) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(3);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  auto brief = ConnectWithAttempts(etcd.endpoints(), absl::Seconds(3), absl::Seconds(1));
  auto patient = ConnectWithAttempts(etcd.endpoints(), absl::Seconds(60), absl::Seconds(1));
  ASSERT_NE(brief, nullptr);
  ASSERT_NE(patient, nullptr);
  ASSERT_TRUE(brief->Put("/q/before", "1").ok());

  etcd.Stop(0);
  etcd.Stop(1);
  absl::StatusOr<int64_t> lost = brief->Put("/q/lost", "x");
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable) << lost.status();
  EXPECT_THAT(lost.status().message(), HasSubstr("Put failed on every member within 3s"));
  for (const std::string& endpoint : etcd.endpoints()) {
    EXPECT_THAT(lost.status().message(), HasSubstr(endpoint + ": ")) << endpoint;
  }

  absl::StatusOr<int64_t> put;
  std::thread writer([&] { put = patient->Put("/q/after", "2"); });
  // Longer than the brief client's whole budget.
  absl::SleepFor(absl::Milliseconds(3500));
  etcd.Continue(1);
  writer.join();
  ASSERT_TRUE(put.ok()) << put.status();
  absl::StatusOr<std::optional<EtcdKeyValue>> got = patient->Get("/q/after");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->value, "2");
  etcd.Continue(0);
}

// A client built later with the same member order (as a daemon builds one
// per re-formation) starts at the member that answered last, not at the
// first endpoint, which here is blackholed.
TEST(EtcdClientTest, MemberPreferenceOutlivesTheClientThatLearnedIt) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(3);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  EtcdClientOptions options;
  options.endpoints = etcd.endpoints();
  options.call_timeout = absl::Seconds(30);
  options.attempt_timeout = absl::Seconds(1);
  options.member_order = std::make_shared<EtcdMemberOrder>(etcd.endpoints().size());
  absl::StatusOr<std::unique_ptr<EtcdClient>> first = EtcdClient::Connect(options);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ((*first)->preferred_endpoint(), etcd.endpoints()[0]);
  etcd.Stop(0);
  ASSERT_TRUE((*first)->Put("/order/a", "1").ok());
  const std::string answered = (*first)->preferred_endpoint();
  ASSERT_NE(answered, etcd.endpoints()[0]);
  first->reset();

  absl::StatusOr<std::unique_ptr<EtcdClient>> next = EtcdClient::Connect(options);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ((*next)->preferred_endpoint(), answered);
  ASSERT_TRUE((*next)->Put("/order/b", "2").ok());
  EXPECT_EQ((*next)->preferred_endpoint(), answered);
  // A client with an order of its own starts at the first endpoint again.
  EtcdClientOptions own = options;
  own.member_order = nullptr;
  absl::StatusOr<std::unique_ptr<EtcdClient>> fresh = EtcdClient::Connect(own);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ((*fresh)->preferred_endpoint(), etcd.endpoints()[0]);
  // An order made for another cluster's size is refused.
  EtcdClientOptions mismatched = options;
  mismatched.member_order = std::make_shared<EtcdMemberOrder>(2);
  absl::StatusOr<std::unique_ptr<EtcdClient>> refused = EtcdClient::Connect(mismatched);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("member order is for 2 endpoints, not 3"));
  etcd.Continue(0);
}

// A Put on a thread of its own (made by `put`), read once it is done.
class BackgroundPut {
 public:
  explicit BackgroundPut(std::function<absl::StatusOr<int64_t>()> put)
      : thread_([this, put = std::move(put)] {
          absl::StatusOr<int64_t> r = put();
          absl::MutexLock lock(&mu_);
          result_ = std::move(r);
          done_ = true;
        }) {}
  ~BackgroundPut() { thread_.join(); }
  // Whether it ended within `limit`.
  bool EndsWithin(absl::Duration limit) {
    return testing::WaitUntil(
        [this] {
          absl::MutexLock lock(&mu_);
          return done_;
        },
        limit);
  }
  absl::StatusOr<int64_t> Result() {
    absl::MutexLock lock(&mu_);
    return result_;
  }

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusOr<int64_t> result_ ABSL_GUARDED_BY(mu_) = absl::UnknownError("not done");
  std::thread thread_;
};

// A call made inside an operation ends with the operation's deadline (1 s)
// rather than its own budget (10 s, longer than this test waits), naming
// etcd's member and the operation.
TEST(EtcdClientTest, AnOperationsDeadlineCutsItsCallsAndIsNamed) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  std::shared_ptr<EtcdClient> client =
      ConnectWithAttempts(etcd.endpoints(), absl::Seconds(10), absl::Milliseconds(1500));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("/op/before", "1").ok());
  etcd.Stop(0);
  {
    BackgroundPut put([client] {
      EtcdOperationDeadline bound("join", MonotonicNow() + absl::Seconds(1), absl::Seconds(1));
      return client->Put("/op/during", "2");
    });
    ASSERT_TRUE(put.EndsWithin(absl::Seconds(5)))
        << "the Put ran past its operation's 1 s deadline";
    absl::StatusOr<int64_t> r = put.Result();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat("etcd at ", etcd.endpoints()[0])));
    EXPECT_THAT(r.status().message(), HasSubstr("all that was left of the join's 1s deadline"));
    EXPECT_THAT(r.status().message(), HasSubstr(etcd.endpoints()[0] + ": DEADLINE_EXCEEDED"));
  }
  etcd.Continue(0);
}

// Once the shutdown budget started, a call ends within it (1 s here, its
// own budget 10 s), naming the shutdown.
TEST(EtcdClientTest, TheShutdownBudgetCutsEveryCall) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  EtcdClientOptions options;
  options.endpoints = etcd.endpoints();
  options.call_timeout = absl::Seconds(10);
  options.attempt_timeout = absl::Milliseconds(1500);
  options.shutdown = std::make_shared<EtcdShutdownBudget>();
  absl::StatusOr<std::unique_ptr<EtcdClient>> connected = EtcdClient::Connect(options);
  ASSERT_TRUE(connected.ok()) << connected.status();
  std::shared_ptr<EtcdClient> client = *std::move(connected);
  ASSERT_TRUE(client->Put("/bye/before", "1").ok());
  etcd.Stop(0);
  options.shutdown->Begin(absl::Seconds(1));
  {
    BackgroundPut put([client] { return client->Put("/bye/during", "2"); });
    ASSERT_TRUE(put.EndsWithin(absl::Seconds(5))) << "the Put ran past the shutdown budget";
    absl::StatusOr<int64_t> r = put.Result();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat("etcd at ", etcd.endpoints()[0])));
    EXPECT_THAT(r.status().message(), HasSubstr("the daemon's shutdown budget"));
  }
  // Spent: later calls fail at once, trying no member.
  absl::StatusOr<int64_t> late = client->Put("/bye/late", "3");
  ASSERT_FALSE(late.ok());
  EXPECT_THAT(late.status().message(), HasSubstr(etcd.endpoints()[0] + ": not tried"));
  etcd.Continue(0);
}

// etcd's auth: the token from Authenticate on every call.
TEST(EtcdClientTest, AuthenticatesAndSendsTheTokenOnEveryCall) {
  SKIP_WITHOUT_ETCD();
  if (::access(testing::kEtcdctlBinary, X_OK) != 0) {
    GTEST_SKIP() << testing::kEtcdctlBinary << " is not installed (Debian's etcd-client)";
  }
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  testing::ScratchDir dir("gsetcdctl");
  auto etcdctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {testing::kEtcdctlBinary, "--endpoints=" + etcd.endpoints()[0]});
    testing::SpawnOptions spawn;
    spawn.env["ETCDCTL_API"] = "3";
    testing::Process p = testing::Process::Spawn(args, dir.File("etcdctl.log"), spawn);
    const testing::ExitStatus st = p.Wait(std::chrono::seconds(60));
    return st.exited && st.code == 0 ? std::string() : st.ToString() + ": " + p.Log();
  };
  ASSERT_EQ(etcdctl({"user", "add", "root:s3cret"}), "");
  ASSERT_EQ(etcdctl({"auth", "enable"}), "");

  EtcdClientOptions options;
  options.endpoints = etcd.endpoints();
  options.call_timeout = absl::Seconds(10);
  options.user = "root";
  options.password = "s3cret";
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Put("/secured", "v").ok());
  absl::StatusOr<std::optional<EtcdKeyValue>> got = (*client)->Get("/secured");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->value, "v");

  options.password = "wrong";
  absl::StatusOr<std::unique_ptr<EtcdClient>> wrong = EtcdClient::Connect(options);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument) << wrong.status();
  EXPECT_THAT(wrong.status().message(), HasSubstr("etcd at " + etcd.endpoints()[0]));
  EXPECT_THAT(wrong.status().message(), HasSubstr("user 'root'"));

  auto anonymous = ConnectOrDie(etcd.endpoints());
  ASSERT_NE(anonymous, nullptr);
  absl::StatusOr<int64_t> put = anonymous->Put("/secured", "x");
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument) << put.status();
  EXPECT_THAT(put.status().message(), HasSubstr("etcd at " + etcd.endpoints()[0]));
  EXPECT_THAT(put.status().message(), HasSubstr("Put failed"));
}

// Mutual TLS: etcd with --client-cert-auth serves a client whose certificate
// its CA signed, and refuses one signed by another CA.
TEST(EtcdClientTest, MutualTls) {
  SKIP_WITHOUT_ETCD();
  testing::TestPki pki;
  ASSERT_TRUE(pki.Generate().ok());
  EtcdCluster etcd(1, {pki.File("node.pem"), pki.File("node.key"), pki.File("ca.pem")});
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();

  EtcdClientOptions options;
  options.endpoints = etcd.endpoints();
  options.call_timeout = absl::Seconds(3);
  options.tls.ca = pki.File("ca.pem");
  options.tls.cert = pki.File("operator.pem");
  options.tls.key = pki.File("operator.key");
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Put("/tls", "v").ok());

  options.tls.cert = pki.File("stranger.pem");
  options.tls.key = pki.File("stranger.key");
  absl::StatusOr<std::unique_ptr<EtcdClient>> stranger = EtcdClient::Connect(options);
  ASSERT_TRUE(stranger.ok()) << stranger.status();
  absl::StatusOr<int64_t> put = (*stranger)->Put("/tls", "x");
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), absl::StatusCode::kUnavailable) << put.status();
  EXPECT_THAT(put.status().message(), HasSubstr("etcd at " + etcd.endpoints()[0]));

  // A missing file is named before anything is sent.
  options.tls.key = pki.File("absent.key");
  absl::StatusOr<std::unique_ptr<EtcdClient>> broken = EtcdClient::Connect(options);
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument) << broken.status();
  EXPECT_THAT(broken.status().message(), HasSubstr("absent.key"));
}

}  // namespace
}  // namespace gradsync
