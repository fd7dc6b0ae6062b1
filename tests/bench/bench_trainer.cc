// bench_trainer: a trainer that only synchronizes, for sync_bench.py,
// broadcast_bench.py and join_bench.py.
//   --op=allreduce (default): registers --tensors tensors of
//     --bytes/--tensors bytes (fp32), then for --iters iterations marks
//     every tensor ready and waits, timing each iteration from its first
//     mark_ready to gs_wait's return;
//   --op=broadcast: registers one small tensor (the job forms), then times
//     --iters gs_broadcast calls of --bytes bytes from global rank 0;
//   --op=memcpy: no daemon; times --iters memcpy of --bytes bytes between
//     two page-populated buffers (broadcast_bench's one-node reference).
// Prints one line:
//   result rank=R iters=N p50_us=.. p99_us=.. mean_us=.. p10_us=.. p90_us=..
//     first_done_mono_us=..
// first_done_mono_us: when the first operation (warm-up included) returned,
// on the monotonic clock (CLOCK_MONOTONIC, Python's time.monotonic()), so a
// driver can time the job's start-up from outside.
// --samples-out=FILE also writes every timed iteration (µs, one per line)
// for the latency CDF.
#include <getopt.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client/gradsync.h"

int main(int argc, char** argv) {
  std::string socket, samples_out, op = "allreduce";
  uint64_t bytes = 4096;
  int tensors = 1, iters = 100, warmup = 10, connect_timeout_ms = 10000;
  static option opts[] = {{"socket", required_argument, nullptr, 's'},
                          {"bytes", required_argument, nullptr, 'b'},
                          {"tensors", required_argument, nullptr, 't'},
                          {"iters", required_argument, nullptr, 'i'},
                          {"warmup", required_argument, nullptr, 'w'},
                          {"samples-out", required_argument, nullptr, 'o'},
                          {"op", required_argument, nullptr, 'p'},
                          {"connect-timeout-ms", required_argument, nullptr, 'c'},
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
      case 'p':
        op = optarg;
        break;
      case 'c':
        connect_timeout_ms = std::atoi(optarg);
        break;
      default:
        return 2;
    }
  }
  if (op != "allreduce" && op != "broadcast" && op != "memcpy") {
    std::fprintf(stderr, "--op must be allreduce, broadcast or memcpy, not %s\n", op.c_str());
    return 2;
  }
  std::vector<double> us;
  double first_done_mono_us = 0;
  // Times one operation; the first one's end is also first_done_mono_us.
  auto timed = [&](int it, auto&& fn) {
    const auto start = std::chrono::steady_clock::now();
    if (!fn()) return false;
    const auto end = std::chrono::steady_clock::now();
    if (it == 0) {
      first_done_mono_us =
          std::chrono::duration<double, std::micro>(end.time_since_epoch()).count();
    }
    if (it >= warmup) us.push_back(std::chrono::duration<double, std::micro>(end - start).count());
    return true;
  };
  gs_client* c = nullptr;
  int rank = 0, world = 1;
  if (op == "memcpy") {
    std::vector<uint8_t> src(bytes, 1), dst(bytes, 2);  // pages touched once
    for (int it = 0; it < warmup + iters; ++it) {
      timed(it, [&] {
        std::memcpy(dst.data(), src.data(), bytes);
        return true;
      });
    }
    // Read the copy, so no optimizer may drop the copies into a dead buffer.
    if (bytes > 0 && dst[bytes / 2] != 1) return 1;
  } else {
    gs_connect_options co = GS_CONNECT_OPTIONS_INIT;
    co.socket_path = socket.empty() ? nullptr : socket.c_str();
    co.timeout_ms = connect_timeout_ms;  // retried until the daemon listens
    if (gs_connect(&co, &c) != GS_OK) {
      std::fprintf(stderr, "connect: %s\n", gs_last_error(c));
      return 1;
    }
    // A broadcast needs a formed job, not gradients: one small tensor.
    if (op == "broadcast") tensors = 1;
    const uint64_t tensor_bytes = op == "broadcast" ? 4096 : bytes / tensors;
    std::vector<std::string> names;
    std::vector<gs_tensor_spec> specs;
    for (int t = 0; t < tensors; ++t) names.push_back("grad" + std::to_string(t));
    for (int t = 0; t < tensors; ++t) {
      specs.push_back({names[t].c_str(), GS_FLOAT32, tensor_bytes / 4, -1, nullptr});
    }
    if (gs_register(c, specs.data(), specs.size()) != GS_OK) {
      std::fprintf(stderr, "register: %s\n", gs_last_error(c));
      return 1;
    }
    gs_world(c, &rank, &world);
    for (int t = 0; t < tensors; ++t) {
      float* g = static_cast<float*>(gs_grad_buffer(c, t));
      std::fill(g, g + specs[t].numel, 1.0f);  // touch the pages once
    }
    if (op == "broadcast") {
      std::vector<uint8_t> buf(bytes, static_cast<uint8_t>(rank));  // pages touched once
      for (int it = 0; it < warmup + iters; ++it) {
        const bool ok =
            timed(it, [&] { return gs_broadcast(c, buf.data(), bytes, 0, -1) == GS_OK; });
        if (!ok) {
          std::fprintf(stderr, "broadcast: %s\n", gs_last_error(c));
          return 1;
        }
      }
    } else {
      for (int it = 0; it < warmup + iters; ++it) {
        const bool ok = timed(it, [&] {
          for (int t = tensors - 1; t >= 0; --t) {
            if (gs_mark_ready(c, t) != GS_OK) return false;
          }
          return gs_wait(c, -1) == GS_OK;
        });
        if (!ok) {
          std::fprintf(stderr, "iteration %d: %s\n", it, gs_last_error(c));
          return 1;
        }
      }
    }
  }
  if (us.empty()) {
    std::fprintf(stderr, "--iters must be > 0\n");
    return 2;
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
      "p90_us=%.2f first_done_mono_us=%.0f\n",
      rank, world, us.size(), us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)],
      sum / us.size(), us[us.size() / 10], us[std::min(us.size() - 1, us.size() * 9 / 10)],
      first_done_mono_us);
  std::fflush(stdout);
  if (c != nullptr) gs_close(c);
  return 0;
}
