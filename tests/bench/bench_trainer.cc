// bench_trainer: a trainer that only synchronizes, for sync_bench.py.
// Registers --tensors tensors of --bytes/--tensors bytes (fp32), then for
// --iters iterations marks every tensor ready and waits, timing each
// iteration from its first mark_ready to gs_wait's return. Prints one line:
//   result rank=R iters=N p50_us=.. p99_us=.. mean_us=.. p10_us=.. p90_us=..
// --samples-out=FILE also writes every timed iteration (µs, one per line)
// for the latency CDF.
#include <getopt.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "client/gradsync.h"

int main(int argc, char** argv) {
  std::string socket, samples_out;
  uint64_t bytes = 4096;
  int tensors = 1, iters = 100, warmup = 10;
  static option opts[] = {{"socket", required_argument, nullptr, 's'},
                          {"bytes", required_argument, nullptr, 'b'},
                          {"tensors", required_argument, nullptr, 't'},
                          {"iters", required_argument, nullptr, 'i'},
                          {"warmup", required_argument, nullptr, 'w'},
                          {"samples-out", required_argument, nullptr, 'o'},
                          {nullptr, 0, nullptr, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "", opts, nullptr)) != -1) {
    switch (ch) {
      case 's':
        socket = optarg;
        break;
      case 'b':
        bytes = std::strtoull(optarg, nullptr, 10);
        break;
      case 't':
        tensors = std::atoi(optarg);
        break;
      case 'i':
        iters = std::atoi(optarg);
        break;
      case 'w':
        warmup = std::atoi(optarg);
        break;
      case 'o':
        samples_out = optarg;
        break;
      default:
        return 2;
    }
  }
  gs_connect_options co = GS_CONNECT_OPTIONS_INIT;
  co.socket_path = socket.empty() ? nullptr : socket.c_str();
  co.timeout_ms = 10000;
  gs_client* c = nullptr;
  if (gs_connect(&co, &c) != GS_OK) {
    std::fprintf(stderr, "connect: %s\n", gs_last_error(c));
    return 1;
  }
  std::vector<std::string> names;
  std::vector<gs_tensor_spec> specs;
  for (int t = 0; t < tensors; ++t) names.push_back("grad" + std::to_string(t));
  for (int t = 0; t < tensors; ++t) {
    specs.push_back({names[t].c_str(), GS_FLOAT32, bytes / tensors / 4, -1, nullptr});
  }
  if (gs_register(c, specs.data(), specs.size()) != GS_OK) {
    std::fprintf(stderr, "register: %s\n", gs_last_error(c));
    return 1;
  }
  int rank = 0, world = 0;
  gs_world(c, &rank, &world);
  for (int t = 0; t < tensors; ++t) {
    float* g = static_cast<float*>(gs_grad_buffer(c, t));
    std::fill(g, g + specs[t].numel, 1.0f);  // touch the pages once
  }
  std::vector<double> us;
  for (int it = 0; it < warmup + iters; ++it) {
    const auto start = std::chrono::steady_clock::now();
    for (int t = tensors - 1; t >= 0; --t) {
      if (gs_mark_ready(c, t) != GS_OK) {
        std::fprintf(stderr, "mark: %s\n", gs_last_error(c));
        return 1;
      }
    }
    if (gs_wait(c, -1) != GS_OK) {
      std::fprintf(stderr, "wait: %s\n", gs_last_error(c));
      return 1;
    }
    const double d =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (it >= warmup) us.push_back(d);
  }
  if (!samples_out.empty()) {
    FILE* f = std::fopen(samples_out.c_str(), "w");
    if (f == nullptr) {
      std::perror(samples_out.c_str());
      return 1;
    }
    for (double v : us) std::fprintf(f, "%.3f\n", v);
    std::fclose(f);
  }
  std::sort(us.begin(), us.end());
  double sum = 0;
  for (double v : us) sum += v;
  std::printf(
      "result rank=%d world=%d iters=%zu p50_us=%.2f p99_us=%.2f mean_us=%.2f p10_us=%.2f "
      "p90_us=%.2f\n",
      rank, world, us.size(), us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)],
      sum / us.size(), us[us.size() / 10], us[std::min(us.size() - 1, us.size() * 9 / 10)]);
  gs_close(c);
  return 0;
}
