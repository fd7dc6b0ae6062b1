// local_reduce_bench: the local reduction against the machine's physical
// limit. Prints memcpy and `a += b` bandwidth (1 and 2 threads) and the
// LocalReducer's time for 100 MB (fp32 unless told) across 2 and 4 trainers' buffers,
// with its bandwidth as a fraction of `a += b`, without and with the fused
// non-finite check. A table, not a test.
//
//   local_reduce_bench [--dtype=float32|float64|float16|bfloat16]
//                      [--trainers=2,4] [--nodes=1|2] [--worker-staging] [--mb=100]
// The gradients' dtype (default float32; the references stay fp32 over the
// same bytes), the trainer counts of the LocalReducer rows, and --nodes=2:
// the cross-node path's local part (sum into staging or trainer 0's
// memory, then divide and write back, in pipelined pieces) with a backend
// that stands for other nodes contributing zeros, so the collective costs
// nothing; its traffic column still counts the one-node minimum 2Lx; and
// with what an elastic job keeps besides (KeptSums: each bucket's local
// sum; KeptResult: each bucket's average; both written by the passes that
// sum and write back). --worker-staging: that backend
// offers its own buffer as staging, as the Gloo worker offers its shared
// buffer, so the local sum goes there instead of into trainer 0's memory
// (the path every multi-node CPU job takes with the Gloo worker).
//
// Two bandwidths: payload (one buffer's bytes per second, as in
// docs/PERFORMANCE.md; for the reduction one trainer's gradient bytes, what
// nccl-tests calls algbw) and memory traffic (every byte read or written:
// memcpy 2x, a += b 3x, the reduction of L trainers 2Lx: L reads and L
// write-backs). The ratio to `a += b` is on traffic: how close the
// reduction runs to the memory system's limit.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/half.h"
#include "daemon/backends/backend.h"
#include "daemon/engine/kept_result.h"
#include "daemon/engine/local_reducer.h"

namespace {

using Clock = std::chrono::steady_clock;
// Each trainer's gradient (--mb; the software fp16 path takes seconds for 100 MB).
size_t g_bytes = 100u << 20;
constexpr int kReps = 7;

// Page-populated buffers, like the shared-memory arenas (touched once).
float* Alloc(size_t bytes, float value) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  auto* f = static_cast<float*>(p);
  std::fill(f, f + bytes / sizeof(float), value);
  return f;
}

// A trainer's gradient of g_bytes in `dtype`, every element `value`.
uint8_t* AllocGradient(gradsync::DType dtype, float value) {
  auto* p = reinterpret_cast<uint8_t*>(Alloc(g_bytes, 0.0f));
  const size_t n = g_bytes / gradsync::DTypeSize(dtype);
  switch (dtype) {
    case gradsync::DType::kFloat32:
      std::fill_n(reinterpret_cast<float*>(p), n, value);
      break;
    case gradsync::DType::kFloat64:
      std::fill_n(reinterpret_cast<double*>(p), n, double(value));
      break;
    case gradsync::DType::kFloat16:
      std::fill_n(reinterpret_cast<uint16_t*>(p), n, gradsync::FloatToFloat16(value));
      break;
    case gradsync::DType::kBFloat16:
      std::fill_n(reinterpret_cast<uint16_t*>(p), n, gradsync::FloatToBFloat16(value));
      break;
  }
  return p;
}

struct Options {
  gradsync::DType dtype = gradsync::DType::kFloat32;
  std::vector<int> trainers = {2, 4};
  int nodes = 1;
  bool worker_staging = false;
};

// --nodes=2: every other node contributes zeros, so the allreduce's sum is
// this node's own (nothing to add) and the local part is all that is timed.
class OtherNodesContributeZeros final : public gradsync::Backend {
 public:
  std::string name() const override { return "zeros-from-other-nodes"; }
  int num_nodes() const override { return 2; }
  absl::Status AllreduceSum(void*, size_t, gradsync::DType) override { return absl::OkStatus(); }
  void Abort(const std::string&) override {}
  // --worker-staging: a buffer of its own, like the Gloo worker's shared one.
  uint8_t* Staging(uint64_t bytes) override {
    if (!offers_staging) return nullptr;
    if (staging.size() < bytes) staging.resize(bytes);
    return staging.data();
  }
  bool offers_staging = false;
  std::vector<uint8_t> staging;
};

bool ParseOptions(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--dtype=", 0) == 0) {
      bool known = false;
      for (int d = 0; d <= 3; ++d) {
        if (arg.substr(8) == gradsync::DTypeName(gradsync::DType(d))) {
          options->dtype = gradsync::DType(d);
          known = true;
        }
      }
      if (!known) return false;
    } else if (arg == "--nodes=1" || arg == "--nodes=2") {
      options->nodes = arg.back() - '0';
    } else if (arg.rfind("--mb=", 0) == 0) {
      const long mb = std::strtol(arg.c_str() + 5, nullptr, 10);
      if (mb < 1 || mb > 4096) return false;
      g_bytes = size_t(mb) << 20;
    } else if (arg == "--worker-staging") {
      options->worker_staging = true;
    } else if (arg.rfind("--trainers=", 0) == 0) {
      options->trainers.clear();
      for (const char* p = arg.c_str() + 11; *p != 0;) {
        char* end = nullptr;
        const long t = std::strtol(p, &end, 10);
        if (end == p || t < 1 || t > 8) return false;
        options->trainers.push_back(int(t));
        p = *end == ',' ? end + 1 : end;
      }
    } else {
      return false;
    }
  }
  return !options->trainers.empty() && (options->nodes == 2 || !options->worker_staging);
}

template <typename Fn>
double MedianSeconds(Fn fn) {
  std::vector<double> t;
  fn();  // warm-up
  for (int i = 0; i < kReps; ++i) {
    const auto a = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Medians of a and b, run alternately.
template <typename A, typename B>
std::pair<double, double> MedianSecondsPair(A a, B b) {
  std::vector<double> ta, tb;
  a();
  b();  // warm-up
  for (int i = 0; i < kReps; ++i) {
    auto t0 = Clock::now();
    a();
    ta.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    t0 = Clock::now();
    b();
    tb.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

template <typename Fn>
void Parallel(int threads, size_t n, Fn fn) {
  std::vector<std::thread> ts;
  for (int i = 1; i < threads; ++i)
    ts.emplace_back([&, i] { fn(n * i / threads, n * (i + 1) / threads); });
  fn(0, n / threads);
  for (auto& t : ts) t.join();
}

// An elastic job with several trainers on a node also copies each
// trainer's input (LocalReducer::Reduce's input_copies, so that a trainer
// dying mid-iteration leaves its node in): against the elastic reduction
// without them, interleaved.
template <typename Elastic>
void InputCopyRow(gradsync::LocalReducer& reducer, const std::vector<uint8_t*>& arenas,
                  gradsync::DType dtype, int world, gradsync::Backend& backend, int threads,
                  Elastic elastic) {
  const std::vector<gradsync::ReduceSpan> spans = {{0, g_bytes}};
  std::vector<std::vector<uint8_t>> buffers(arenas.size(), std::vector<uint8_t>(g_bytes));
  std::vector<uint8_t*> copies;
  for (auto& b : buffers) copies.push_back(b.data());
  std::vector<uint8_t> sums(gradsync::LocalReducer::StagingBytes(g_bytes, dtype));
  gradsync::KeptSums kept_sums{sums.data(), 0};
  gradsync::KeptResult kept;
  kept.Resize(g_bytes);
  auto with_copies = [&] {
    kept_sums.pieces = 0;
    reducer
        .Reduce(arenas, spans, dtype, world, backend, nullptr, 0, nullptr, &kept_sums, kept.sink(),
                &copies)
        .IgnoreError();
    kept.Kept(0, 0);
  };
  const auto [t0, t] = MedianSecondsPair(elastic, with_copies);
  std::printf(
      "| gradsync LocalReducer + kept sums + kept result + input copies (elastic), %d trainers "
      "| %d | %.1f | %.1f | | (%+.1f%% time vs the row above) |\n",
      static_cast<int>(arenas.size()), threads, t * 1e3, g_bytes / 1e9 / t, 100.0 * (t - t0) / t0);
}

// An elastic job also keeps each bucket's local sum (KeptSums, reset per
// iteration) and each bucket's average (KeptResult), both written by the
// reducer's own passes.
// Each against the plain reduction, interleaved.
void ElasticRows(gradsync::LocalReducer& reducer, const std::vector<uint8_t*>& arenas,
                 gradsync::DType dtype, int world, gradsync::Backend& backend, int threads) {
  const std::vector<gradsync::ReduceSpan> spans = {{0, g_bytes}};
  const double gb = g_bytes / 1e9;
  std::vector<uint8_t> sums(gradsync::LocalReducer::StagingBytes(g_bytes, dtype));
  gradsync::KeptSums kept_sums{sums.data(), 0};
  gradsync::KeptResult kept;
  kept.Resize(g_bytes);
  auto plain = [&] { reducer.Reduce(arenas, spans, dtype, world, backend, nullptr).IgnoreError(); };
  auto with_sums = [&] {
    kept_sums.pieces = 0;  // a new iteration: nothing summed yet
    reducer.Reduce(arenas, spans, dtype, world, backend, nullptr, 0, nullptr, &kept_sums)
        .IgnoreError();
  };
  auto elastic = [&] {
    kept_sums.pieces = 0;
    reducer
        .Reduce(arenas, spans, dtype, world, backend, nullptr, 0, nullptr, &kept_sums, kept.sink())
        .IgnoreError();
    kept.Kept(0, 0);
  };
  const int trainers = static_cast<int>(arenas.size());
  const auto [ts0, ts] = MedianSecondsPair(plain, with_sums);
  std::printf(
      "| gradsync LocalReducer + kept sums (elastic), %d trainers | %d | %.1f | %.1f | | "
      "(%+.1f%% time) |\n",
      trainers, threads, ts * 1e3, gb / ts, 100.0 * (ts - ts0) / ts0);
  const auto [te0, te] = MedianSecondsPair(plain, elastic);
  std::printf(
      "| gradsync LocalReducer + kept sums + kept result (elastic), %d trainers | %d | %.1f | "
      "%.1f | | (%+.1f%% time) |\n",
      trainers, threads, te * 1e3, gb / te, 100.0 * (te - te0) / te0);
  InputCopyRow(reducer, arenas, dtype, world, backend, threads, elastic);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (!ParseOptions(argc, argv, &options)) {
    std::fprintf(stderr,
                 "usage: local_reduce_bench [--dtype=float32|float64|float16|bfloat16] "
                 "[--trainers=2,4] [--nodes=1|2] [--worker-staging (with --nodes=2)] [--mb=100]\n");
    return 2;
  }
  const gradsync::DType dtype = options.dtype;
  const size_t n = g_bytes / sizeof(float);
  float* a = Alloc(g_bytes, 1.0f);
  float* b = Alloc(g_bytes, 2.0f);
  const double gb = g_bytes / 1e9;

  std::printf("## Local reduction, %zu MB %s, %s%s (median of %d)\n\n", g_bytes >> 20,
              gradsync::DTypeName(dtype), options.nodes == 1 ? "one node" : "two nodes' local part",
              options.worker_staging ? ", summed into the worker's staging" : "", kReps);
  std::printf(
      "| what | threads | time ms | GB/s payload | GB/s memory traffic | traffic vs `a += b` |\n");
  std::printf("|---|---|---|---|---|---|\n");
  double add_bw[3] = {0, 0, 0};
  for (int threads : {1, 2}) {
    const double tm = MedianSeconds([&] {
      Parallel(threads, n,
               [&](size_t lo, size_t hi) { std::memcpy(a + lo, b + lo, (hi - lo) * 4); });
    });
    std::printf("| memcpy (reference) | %d | %.1f | %.1f | %.1f | |\n", threads, tm * 1e3, gb / tm,
                2 * gb / tm);
    const double ta = MedianSeconds([&] {
      Parallel(threads, n, [&](size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; ++i) a[i] += b[i];
      });
    });
    add_bw[threads] = 3 * gb / ta;
    std::printf("| `a += b` (reference) | %d | %.1f | %.1f | %.1f | 100%% |\n", threads, ta * 1e3,
                gb / ta, 3 * gb / ta);
  }
  for (int trainers : options.trainers) {
    std::vector<uint8_t*> arenas;
    for (int t = 0; t < trainers; ++t) arenas.push_back(AllocGradient(dtype, float(t)));
    for (int threads : {1, 2}) {
      gradsync::LocalReducer reducer(
          threads, options.nodes == 1 ? 0 : gradsync::LocalReducer::StagingBytes(g_bytes, dtype));
      gradsync::LocalBackend one_node;
      OtherNodesContributeZeros two_nodes;
      two_nodes.offers_staging = options.worker_staging;
      gradsync::Backend& backend =
          options.nodes == 1 ? static_cast<gradsync::Backend&>(one_node) : two_nodes;
      const int world = trainers * options.nodes;
      const std::vector<gradsync::ReduceSpan> spans = {{0, g_bytes}};
      gradsync::NonFiniteReport report;
      // Plain and checked runs interleaved, so a load change on a shared
      // machine hits both alike.
      const auto [tr, tc] = MedianSecondsPair(
          [&] { reducer.Reduce(arenas, spans, dtype, world, backend, nullptr).IgnoreError(); },
          [&] {
            reducer.Reduce(arenas, spans, dtype, world, backend, nullptr, 0, &report).IgnoreError();
          });
      const double traffic = 2.0 * trainers * gb / tr;
      std::printf("| gradsync LocalReducer, %d trainers | %d | %.1f | %.1f | %.1f | %.0f%% |\n",
                  trainers, threads, tr * 1e3, gb / tr, traffic, 100.0 * traffic / add_bw[threads]);
      // The same with the non-finite check fused in (--nonfinite=error|skip).
      const double traffic_c = 2.0 * trainers * gb / tc;
      std::printf(
          "| gradsync LocalReducer + non-finite check, %d trainers | %d | %.1f | %.1f | %.1f | "
          "%.0f%% (%+.1f%% time) |\n",
          trainers, threads, tc * 1e3, gb / tc, traffic_c, 100.0 * traffic_c / add_bw[threads],
          100.0 * (tc - tr) / tr);
      if (options.nodes == 1) continue;
      ElasticRows(reducer, arenas, dtype, world, backend, threads);
    }
    for (uint8_t* p : arenas) munmap(p, g_bytes);
  }
  std::printf(
      "\nTarget (docs/PERFORMANCE.md): local reduction bandwidth >= 75%% of `a += b` "
      "(memory traffic).\n");
  return 0;
}
