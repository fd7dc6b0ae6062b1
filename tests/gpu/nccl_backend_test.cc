// NcclBackend on the GPUs of this machine (at most 2), one process, all
// ranks in one local group. Skips without a CUDA device.
#include "daemon/backends/nccl_backend.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/cluster/rendezvous_client.h"
#include "daemon/cluster/rendezvous_service.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

constexpr char kJob[] = "nccl-test";
constexpr char kToken[] = "secret";

// The leader's key-value store, in process (no port).
class InProcessLeader {
 public:
  InProcessLeader() : service_(kJob, kToken, 1, absl::Seconds(30)) {
    grpc::ServerBuilder builder;
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    RendezvousClientOptions options;
    options.leader = "in-process";
    options.job_id = kJob;
    options.job_token = kToken;
    client_ = std::make_shared<RendezvousClient>(
        server_->InProcessChannel(grpc::ChannelArguments()), options);
  }
  ~InProcessLeader() { server_->Shutdown(); }

  std::shared_ptr<RendezvousClient> client() { return client_; }

 private:
  RendezvousService service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<RendezvousClient> client_;
};

#define CUDA_OK(expr)                                                         \
  do {                                                                        \
    cudaError_t err_ = (expr);                                                \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

class NcclBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device: " << (err == cudaSuccess ? "0 devices" : cudaGetErrorString(err));
    }
    num_devices_ = std::min(count, 2);
  }

  std::vector<NcclBackendOptions> Options(const std::string& prefix) {
    std::vector<NcclBackendOptions> options;
    for (int d = 0; d < num_devices_; ++d) {
      NcclBackendOptions o;
      o.rank = d;
      o.nranks = num_devices_;
      o.device = d;
      o.timeout = absl::Seconds(60);
      o.store = leader_.client();
      o.key_prefix = prefix;  // job-wide (no generation formed in this test)
      options.push_back(o);
    }
    return options;
  }

  // Rank r holds (r + 1) * (i % 7 + 1): small integers, so every average is
  // exact in float32 and float64.
  template <typename T>
  void RunAverage(std::vector<std::unique_ptr<NcclBackend>>& backends, size_t count, DType dtype) {
    std::vector<void*> device_ptrs(backends.size(), nullptr);
    std::vector<NcclDeviceBuffer> buffers;
    for (size_t r = 0; r < backends.size(); ++r) {
      std::vector<T> host(count);
      for (size_t i = 0; i < count; ++i) host[i] = static_cast<T>((r + 1) * (i % 7 + 1));
      CUDA_OK(cudaSetDevice(backends[r]->device()));
      CUDA_OK(cudaMalloc(&device_ptrs[r], count * sizeof(T)));
      CUDA_OK(cudaMemcpy(device_ptrs[r], host.data(), count * sizeof(T), cudaMemcpyHostToDevice));
      // A pageable copy may still be in flight on return, and the backend's
      // stream does not order after the default stream.
      CUDA_OK(cudaDeviceSynchronize());
      buffers.push_back(NcclDeviceBuffer{backends[r].get(), device_ptrs[r], count});
    }
    absl::Status status = NcclBackend::GroupAllreduceAvg(buffers, dtype);
    EXPECT_TRUE(status.ok()) << status;
    // mean of (r + 1) over n ranks = (n + 1) / 2.
    const double n = static_cast<double>(backends.size());
    for (size_t r = 0; r < backends.size(); ++r) {
      std::vector<T> host(count);
      CUDA_OK(cudaSetDevice(backends[r]->device()));
      CUDA_OK(cudaMemcpy(host.data(), device_ptrs[r], count * sizeof(T), cudaMemcpyDeviceToHost));
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) {
        const T want = static_cast<T>((n + 1) / 2 * static_cast<double>(i % 7 + 1));
        if (host[i] != want && wrong++ < 5) {
          ADD_FAILURE() << "rank " << r << " element " << i << ": " << host[i] << " != " << want;
        }
      }
      EXPECT_EQ(wrong, 0u) << "rank " << r << " count " << count;
      CUDA_OK(cudaFree(device_ptrs[r]));
    }
  }

  int num_devices_ = 0;
  InProcessLeader leader_;
};

TEST_F(NcclBackendTest, AveragesFloat32AndFloat64) {
  auto backends = NcclBackend::CreateLocalGroup(Options("t1/"));
  ASSERT_TRUE(backends.ok()) << backends.status();
  for (size_t count : {size_t{1}, size_t{(1 << 20) + 3}}) {
    RunAverage<float>(*backends, count, DType::kFloat32);
    RunAverage<double>(*backends, count, DType::kFloat64);
  }
}

TEST_F(NcclBackendTest, AbortMakesTheNextCallFailPromptly) {
  auto backends = NcclBackend::CreateLocalGroup(Options("t2/"));
  ASSERT_TRUE(backends.ok()) << backends.status();
  std::vector<void*> ptrs;
  std::vector<NcclDeviceBuffer> buffers;
  for (auto& b : *backends) {
    void* p = nullptr;
    CUDA_OK(cudaSetDevice(b->device()));
    CUDA_OK(cudaMalloc(&p, 1024 * sizeof(float)));
    ptrs.push_back(p);
    buffers.push_back(NcclDeviceBuffer{b.get(), p, 1024});
  }
  backends->front()->Abort("test abort");
  const absl::Time start = absl::Now();
  absl::Status status = NcclBackend::GroupAllreduceAvg(buffers, DType::kFloat32);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_NE(status.message().find("test abort"), absl::string_view::npos) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (size_t i = 0; i < ptrs.size(); ++i) {
    CUDA_OK(cudaSetDevice((*backends)[i]->device()));
    CUDA_OK(cudaFree(ptrs[i]));
  }
}

// Two threads, one rank each: the unique id goes through the store.
TEST_F(NcclBackendTest, ExchangesTheUniqueIdThroughTheStore) {
  if (num_devices_ < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  std::vector<NcclBackendOptions> options = Options("t3/");
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto backend = NcclBackend::Create(options[r]);
      if (!backend.ok()) {
        results[r] = backend.status();
        return;
      }
      void* p = nullptr;
      if (cudaSetDevice(r) != cudaSuccess || cudaMalloc(&p, 64 * sizeof(float)) != cudaSuccess ||
          cudaMemset(p, 0, 64 * sizeof(float)) != cudaSuccess ||
          cudaDeviceSynchronize() != cudaSuccess) {
        results[r] = absl::InternalError("cuda setup failed");
        return;
      }
      results[r] = (*backend)->AllreduceAvg(p, 64, DType::kFloat32);
      cudaFree(p);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
}

}  // namespace
}  // namespace gradsync
