/* A C trainer built against an installed gradsync with nothing but
 * `pkg-config --cflags --libs gradsync` (tests/client/install_test.sh).
 * Usage: installed_trainer SOCKET. Prints one line per check; exits 1 on the
 * first failure. */
#include <gradsync.h>
#include <stdio.h>
#include <string.h>

static int fail(const char* what, gs_status st, gs_client* c) {
  printf("FAIL %s: status=%d message=%s\n", what, (int)st, gs_last_error(c));
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  if (gs_version() != GS_VERSION) {
    printf("FAIL gs_version()=%d, header GS_VERSION=%d\n", gs_version(), GS_VERSION);
    return 1;
  }

  /* A caller built against a newer header: its larger size is refused. */
  gs_connect_options newer = GS_CONNECT_OPTIONS_INIT;
  newer.socket_path = argv[1];
  newer.size = sizeof(gs_connect_options) + 8;
  gs_client* c = NULL;
  gs_status st = gs_connect(&newer, &c);
  if (st != GS_ERR_INVALID_ARGUMENT || !strstr(gs_last_error(c), "gs_connect_options.size"))
    return fail("larger size", st, c);
  printf("ok larger size refused: %s\n", gs_last_error(c));
  gs_close(c);

  /* A positional initializer from before the size field: size 0. */
  gs_connect_options positional = {argv[1], 0, 10000};
  st = gs_connect(&positional, &c);
  if (st != GS_OK) return fail("size 0 connect", st, c);
  gs_close(c);
  printf("ok size 0 connects\n");

  gs_connect_options opts = GS_CONNECT_OPTIONS_INIT;
  opts.socket_path = argv[1];
  opts.local_rank = 0;
  st = gs_connect(&opts, &c);
  if (st != GS_OK) return fail("connect", st, c);
  gs_tensor_spec spec = {"w", GS_FLOAT32, 4, -1, NULL};
  if ((st = gs_register(c, &spec, 1)) != GS_OK) return fail("register", st, c);
  float* grad = (float*)gs_grad_buffer(c, 0);
  for (int step = 1; step <= 3; ++step) {
    for (int i = 0; i < 4; ++i) grad[i] = (float)(step * 10 + i);
    if ((st = gs_mark_ready(c, 0)) != GS_OK) return fail("mark_ready", st, c);
    if ((st = gs_wait(c, 20000)) != GS_OK) return fail("wait", st, c);
    /* One trainer in the job: the average is its own gradient. */
    for (int i = 0; i < 4; ++i) {
      if (grad[i] != (float)(step * 10 + i)) {
        printf("FAIL step %d grad[%d]=%g\n", step, i, grad[i]);
        return 1;
      }
    }
  }
  gs_close(c);
  printf("ok trained 3 steps against the installed gradsyncd\n");
  return 0;
}
