// Two real GlooBackends of one job, node ranks 0 and 1, each created on a
// thread of its own in this process: real TCP on loopback, Gloo's
// in-memory HashStore for the rendezvous. What the tests of the backend's
// collectives start from.
#ifndef GRADSYNC_TESTS_MULTINODE_TWO_GLOO_BACKENDS_H_
#define GRADSYNC_TESTS_MULTINODE_TWO_GLOO_BACKENDS_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "daemon/backends/gloo_backend.h"
#include "gtest/gtest.h"

namespace gradsync::testing {

// Runs run(0) and run(1) at once, on two fresh threads, and waits for both.
void OnBothNodes(const std::function<void(int)>& run);

// Connects both nodes into backends[0] and backends[1]; created[r] is node
// r's outcome. `on_creating_thread(r)`, if given, runs on node r's thread
// right after its Create returned.
void CreateTwoGlooBackends(std::unique_ptr<GlooBackend> (&backends)[2], absl::Status (&created)[2],
                           const std::function<void(int)>& on_creating_thread = nullptr);

// A suite whose tests share two backends, connected once for the suite.
class TwoGlooBackendsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();

  static std::unique_ptr<GlooBackend> backends_[2];
};

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_MULTINODE_TWO_GLOO_BACKENDS_H_
