/* job_info_trainer: a trainer that prints what gs_get_job_info says after
 * every iteration, through the C ABI.
 *
 *   job_info_trainer --socket=PATH --join-steps=S0,S1,... [--divide-by-active]
 *
 * LOCAL_RANK picks the local rank. It registers one tensor of 4 floats and
 * runs S[rank] synchronized iterations contributing rank + 1 to every
 * element, then calls gs_join (divide_by_initial_world_size = 0 with
 * --divide-by-active, else 1). Before the first iteration and after each it
 * prints
 *
 *   job rank=R iteration=I world_size=W average=A
 *
 * (A: the averaged gradient's first element; 0 before the first
 * iteration), so a test can check the reported world size against the
 * divisor the daemon really used. Exits 10 + the gs_status that stopped it,
 * after printing gs_last_error.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/gradsync.h"

static int Fail(gs_client* c, const char* what, gs_status st) {
  fprintf(stderr, "%s failed: status %d: %s\n", what, (int)st, gs_last_error(c));
  gs_close(c);
  return 10 + (int)st;
}

static int Print(gs_client* c, double average) {
  gs_job_info info = GS_JOB_INFO_INIT;
  const gs_status st = gs_get_job_info(c, &info);
  if (st != GS_OK) return Fail(c, "gs_get_job_info", st);
  printf("job rank=%d iteration=%llu world_size=%d average=%g\n", info.rank,
         (unsigned long long)info.iteration, info.world_size, average);
  fflush(stdout);
  return 0;
}

int main(int argc, char** argv) {
  const char* socket_path = NULL;
  long steps[64];
  size_t num_steps = 0;
  int divide_by_active = 0;
  for (int i = 1; i < argc; ++i) {
    if (strncmp(argv[i], "--socket=", 9) == 0) {
      socket_path = argv[i] + 9;
    } else if (strncmp(argv[i], "--join-steps=", 13) == 0) {
      const char* s = argv[i] + 13;
      while (*s && num_steps < 64) {
        char* end = NULL;
        steps[num_steps++] = strtol(s, &end, 10);
        if (end == s) break;
        s = (*end == ',') ? end + 1 : end;
      }
    } else if (strcmp(argv[i], "--divide-by-active") == 0) {
      divide_by_active = 1;
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
  if ((size_t)rank >= num_steps) {
    fprintf(stderr, "--join-steps has no entry for rank %d\n", rank);
    gs_close(c);
    return 1;
  }
  int rc = Print(c, 0);
  if (rc != 0) return rc;
  float* grad = (float*)gs_grad_buffer(c, 0);
  for (long it = 0; it < steps[rank]; ++it) {
    for (int i = 0; i < 4; ++i) grad[i] = (float)(rank + 1);
    if ((st = gs_mark_ready(c, 0)) != GS_OK) return Fail(c, "gs_mark_ready", st);
    if ((st = gs_wait(c, -1)) != GS_OK) return Fail(c, "gs_wait", st);
    if ((rc = Print(c, grad[0])) != 0) return rc;
  }
  if ((st = gs_join(c, divide_by_active ? 0 : 1)) != GS_OK) return Fail(c, "gs_join", st);
  printf("joined rank=%d\n", rank);
  gs_close(c);
  return 0;
}
