/* replica_trainer: a trainer whose parameters a daemon run with
 * --check-replicas-every compares, through the C ABI.
 *
 *   replica_trainer --socket=PATH --steps=N [--drift-rank=R[:T] ... --drift-at=K]
 *                   [--stop-before-check=R]
 *
 * LOCAL_RANK picks the local rank. It registers three tensors ("embed.weight",
 * "fc.weight", "fc.bias"), keeps a parameter copy of each (equal on every
 * trainer at start), and every step contributes a gradient of its own rank,
 * waits, and applies SGD with the average: the replicas stay equal. Each
 * global rank R given (the flag repeats) adds 1e-3 to element 1 of tensor
 * T (default 1, fc.weight) after step K (a drifted replica). --stop-before-check=R makes global
 * rank R raise SIGSTOP instead of its first check (a test kills it there). When gs_job_info says a
 * check is due it hashes each parameter (FNV-1a of its bytes) and calls gs_check_replicas, printing
 * "check ok iteration=I". Exits 10 + the gs_status that stopped it, after printing gs_last_error.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/gradsync.h"

#define NUM_TENSORS 3

static int Fail(gs_client* c, const char* what, gs_status st) {
  fprintf(stderr, "%s failed: status %d: %s\n", what, (int)st, gs_last_error(c));
  fflush(stderr);
  gs_close(c);
  return 10 + (int)st;
}

static uint64_t Fnv1a(const void* data, size_t bytes) {
  const unsigned char* p = (const unsigned char*)data;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

int main(int argc, char** argv) {
  const char* socket_path = NULL;
  long steps = 0, drift_at = -1, stop_rank = -1;
  long drift_ranks[8], drift_tensors[8];
  int num_drift_ranks = 0;
  for (int i = 1; i < argc; ++i) {
    if (strncmp(argv[i], "--socket=", 9) == 0) {
      socket_path = argv[i] + 9;
    } else if (strncmp(argv[i], "--steps=", 8) == 0) {
      steps = strtol(argv[i] + 8, NULL, 10);
    } else if (strncmp(argv[i], "--drift-rank=", 13) == 0 && num_drift_ranks < 8) {
      char* end = NULL;
      drift_ranks[num_drift_ranks] = strtol(argv[i] + 13, &end, 10);
      drift_tensors[num_drift_ranks++] = *end == ':' ? strtol(end + 1, NULL, 10) % NUM_TENSORS : 1;
    } else if (strncmp(argv[i], "--stop-before-check=", 20) == 0) {
      stop_rank = strtol(argv[i] + 20, NULL, 10);
    } else if (strncmp(argv[i], "--drift-at=", 11) == 0) {
      drift_at = strtol(argv[i] + 11, NULL, 10);
    } else {
      fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 1;
    }
  }
  static const char* const kNames[NUM_TENSORS] = {"embed.weight", "fc.weight", "fc.bias"};
  static const uint64_t kNumel[NUM_TENSORS] = {16, 8, 2};
  float params[NUM_TENSORS][16];
  gs_tensor_spec specs[NUM_TENSORS];
  for (int t = 0; t < NUM_TENSORS; ++t) {
    specs[t] = (gs_tensor_spec){kNames[t], GS_FLOAT32, kNumel[t], -1, NULL};
    for (uint64_t i = 0; i < kNumel[t]; ++i) params[t][i] = (float)(t + 1) * 0.5f + (float)i;
  }
  gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
  o.socket_path = socket_path;
  gs_client* c = NULL;
  gs_status st = gs_connect(&o, &c);
  if (st != GS_OK) return Fail(c, "gs_connect", st);
  if ((st = gs_register(c, specs, NUM_TENSORS)) != GS_OK) return Fail(c, "gs_register", st);
  int rank = 0, world = 0;
  if ((st = gs_world(c, &rank, &world)) != GS_OK) return Fail(c, "gs_world", st);
  for (long step = 1; step <= steps; ++step) {
    for (int t = 0; t < NUM_TENSORS; ++t) {
      float* g = (float*)gs_grad_buffer(c, (size_t)t);
      for (uint64_t i = 0; i < kNumel[t]; ++i) g[i] = (float)(rank + 1) * 0.25f + (float)i;
      if ((st = gs_mark_ready(c, (size_t)t)) != GS_OK) return Fail(c, "gs_mark_ready", st);
    }
    if ((st = gs_wait(c, -1)) != GS_OK) return Fail(c, "gs_wait", st);
    for (int t = 0; t < NUM_TENSORS; ++t) {
      const float* g = (const float*)gs_grad_buffer(c, (size_t)t);
      for (uint64_t i = 0; i < kNumel[t]; ++i) params[t][i] -= 0.1f * g[i];
    }
    for (int d = 0; d < num_drift_ranks; ++d) {
      if (rank == drift_ranks[d] && step == drift_at) params[drift_tensors[d]][1] += 1e-3f;
    }
    gs_job_info info = GS_JOB_INFO_INIT;
    if ((st = gs_get_job_info(c, &info)) != GS_OK) return Fail(c, "gs_get_job_info", st);
    if (!info.check_replicas_due) continue;
    if (rank == stop_rank) raise(SIGSTOP);
    uint64_t hashes[NUM_TENSORS];
    for (int t = 0; t < NUM_TENSORS; ++t) {
      hashes[t] = Fnv1a(params[t], kNumel[t] * sizeof(float));
    }
    if ((st = gs_check_replicas(c, hashes, NUM_TENSORS)) != GS_OK) {
      return Fail(c, "gs_check_replicas", st);
    }
    printf("check ok rank=%d iteration=%llu\n", rank, (unsigned long long)info.iteration);
    fflush(stdout);
  }
  gs_close(c);
  return 0;
}
