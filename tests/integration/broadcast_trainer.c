/* broadcast_trainer: a trainer that only broadcasts, through the C ABI.
 *
 *   broadcast_trainer --socket=PATH [--sizes=0,1,4099] [--roots=0,3]
 *                     [--size-plus-rank] [--root-is-rank] [--stop-before-broadcast=R]
 *                     [--mark-first=R] [--repeat=N]
 *
 * LOCAL_RANK picks the local rank. It registers one small tensor, then for
 * every root and every size fills a buffer with a pattern of its own rank,
 * calls gs_broadcast and checks, byte for byte, that the buffer now holds
 * the root's pattern (a new one for every call, so that a reader that got
 * an earlier call's bytes fails). --repeat=N runs the roots and sizes N
 * times (back-to-back broadcasts reuse the daemon's two staging slots).
 * --size-plus-rank and --root-is-rank make trainers
 * disagree; --stop-before-broadcast=R makes global rank R raise SIGSTOP
 * instead of broadcasting (a test kills it there); --mark-first=R makes
 * rank R mark its tensor (mid-iteration) and wait instead of broadcasting.
 * Exits 10 + the gs_status that stopped it, after printing gs_last_error;
 * 2 when a byte differs.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under strict C */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/gradsync.h"

static double NowMs(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static uint8_t Pattern(int rank, unsigned call, size_t i) {
  return (uint8_t)(i * 131u + (unsigned)rank * 7u + call * 29u + 1u);
}

static size_t ParseList(const char* s, long long* out, size_t max) {
  size_t n = 0;
  while (s && *s && n < max) {
    char* end = NULL;
    out[n++] = strtoll(s, &end, 10);
    s = (*end == ',') ? end + 1 : end;
    if (end == s && *end != '\0') break;
  }
  return n;
}

static int Fail(gs_client* c, const char* what, gs_status st) {
  fprintf(stderr, "%s failed: status %d: %s\n", what, (int)st, gs_last_error(c));
  gs_close(c);
  return 10 + (int)st;
}

int main(int argc, char** argv) {
  const char* socket_path = NULL;
  long long sizes[16] = {0, 1, 4099};
  size_t num_sizes = 3;
  long long roots[8] = {0};
  size_t num_roots = 1;
  int size_plus_rank = 0, root_is_rank = 0, stop_rank = -1, mark_rank = -1, repeat = 1;
  for (int i = 1; i < argc; ++i) {
    if (strncmp(argv[i], "--socket=", 9) == 0) {
      socket_path = argv[i] + 9;
    } else if (strncmp(argv[i], "--sizes=", 8) == 0) {
      num_sizes = ParseList(argv[i] + 8, sizes, 16);
    } else if (strncmp(argv[i], "--roots=", 8) == 0) {
      num_roots = ParseList(argv[i] + 8, roots, 8);
    } else if (strcmp(argv[i], "--size-plus-rank") == 0) {
      size_plus_rank = 1;
    } else if (strcmp(argv[i], "--root-is-rank") == 0) {
      root_is_rank = 1;
    } else if (strncmp(argv[i], "--stop-before-broadcast=", 24) == 0) {
      stop_rank = atoi(argv[i] + 24);
    } else if (strncmp(argv[i], "--mark-first=", 13) == 0) {
      mark_rank = atoi(argv[i] + 13);
    } else if (strncmp(argv[i], "--repeat=", 9) == 0) {
      repeat = atoi(argv[i] + 9);
    } else {
      fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 1;
    }
  }
  gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
  o.socket_path = socket_path;
  gs_client* c = NULL;
  gs_status st = gs_connect(&o, &c);
  if (st != GS_OK) return Fail(c, "gs_connect", st);
  gs_tensor_spec spec = {"w", GS_FLOAT32, 4, -1, NULL};
  if ((st = gs_register(c, &spec, 1)) != GS_OK) return Fail(c, "gs_register", st);
  int rank = 0, world = 0;
  if ((st = gs_world(c, &rank, &world)) != GS_OK) return Fail(c, "gs_world", st);

  if (rank == mark_rank) {
    /* Mid-iteration: marked, then waiting for peers that broadcast instead. */
    if ((st = gs_mark_ready(c, 0)) != GS_OK) return Fail(c, "gs_mark_ready", st);
    if ((st = gs_wait(c, -1)) != GS_OK) return Fail(c, "gs_wait", st);
    gs_close(c);
    return 0;
  }
  if (rank == stop_rank) {
    printf("stopping before gs_broadcast\n");
    fflush(stdout);
    raise(SIGSTOP);
  }
  size_t largest = 0;
  for (size_t s = 0; s < num_sizes; ++s) {
    const size_t bytes = (size_t)sizes[s] + (size_plus_rank ? (size_t)rank : 0);
    if (bytes > largest) largest = bytes;
  }
  uint8_t* buf = (uint8_t*)malloc(largest > 0 ? largest : 1);
  if (buf == NULL) return 3;
  unsigned call = 0;
  for (int rep = 0; rep < repeat; ++rep) {
    for (size_t r = 0; r < num_roots; ++r) {
      const int root = root_is_rank ? rank : (int)roots[r];
      for (size_t s = 0; s < num_sizes; ++s, ++call) {
        const size_t bytes = (size_t)sizes[s] + (size_plus_rank ? (size_t)rank : 0);
        for (size_t i = 0; i < bytes; ++i) buf[i] = Pattern(rank, call, i);
        const double start = NowMs();
        if ((st = gs_broadcast(c, buf, bytes, root, -1)) != GS_OK) {
          free(buf);
          return Fail(c, "gs_broadcast", st);
        }
        for (size_t i = 0; i < bytes; ++i) {
          if (buf[i] != Pattern(root, call, i)) {
            fprintf(stderr, "rank %d: call %u: byte %zu of %zu is %u, root %d's is %u\n", rank,
                    call, i, bytes, buf[i], root, Pattern(root, call, i));
            free(buf);
            gs_close(c);
            return 2;
          }
        }
        const double ms = NowMs() - start; /* informational: the tests assert no time */
        printf("broadcast ok rank=%d bytes=%zu root=%d ms=%.1f\n", rank, bytes, root, ms);
      }
    }
  }
  /* An iteration after the broadcasts: they left the job usable. */
  float* grad = (float*)gs_grad_buffer(c, 0);
  for (int i = 0; i < 4; ++i) grad[i] = (float)rank;
  if ((st = gs_mark_ready(c, 0)) != GS_OK) return Fail(c, "gs_mark_ready", st);
  if ((st = gs_wait(c, -1)) != GS_OK) return Fail(c, "gs_wait", st);
  const float mean = (float)(world - 1) / 2.0f;
  if (grad[0] != mean) {
    fprintf(stderr, "rank %d: average %f, expected %f\n", rank, grad[0], mean);
    return 2;
  }
  printf("iteration ok rank=%d\n", rank);
  free(buf);
  gs_close(c);
  return 0;
}
