#include "tests/multinode/two_gloo_backends.h"

#include <thread>
#include <utility>

#include "gloo/rendezvous/hash_store.h"

namespace gradsync::testing {

void OnBothNodes(const std::function<void(int)>& run) {
  std::thread node0(run, 0);
  std::thread node1(run, 1);
  node0.join();
  node1.join();
}

void CreateTwoGlooBackends(std::unique_ptr<GlooBackend> (&backends)[2], absl::Status (&created)[2],
                           const std::function<void(int)>& on_creating_thread) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  OnBothNodes([&](int rank) {
    GlooBackendOptions options;
    options.node_rank = rank;
    options.num_nodes = 2;
    options.host = "127.0.0.1";
    options.generation = 1;
    options.store_prefix = "gloo";
    options.timeout = absl::Seconds(60);
    options.world_size = 2;
    options.store = store;
    absl::StatusOr<std::unique_ptr<GlooBackend>> backend = GlooBackend::Create(options);
    created[rank] = backend.status();
    if (backend.ok()) backends[rank] = std::move(*backend);
    if (on_creating_thread) on_creating_thread(rank);
  });
}

std::unique_ptr<GlooBackend> TwoGlooBackendsTest::backends_[2];

void TwoGlooBackendsTest::SetUpTestSuite() {
  absl::Status created[2];
  CreateTwoGlooBackends(backends_, created);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(created[rank].ok()) << "rank " << rank << ": " << created[rank];
  }
}

void TwoGlooBackendsTest::TearDownTestSuite() {
  for (auto& backend : backends_) backend.reset();
}

}  // namespace gradsync::testing
