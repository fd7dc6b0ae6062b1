/* A trainer built against the original gradsync.h, whose gs_connect_options
 * had no size field (tests/client/original_layout_test.sh links it to an
 * unversioned stand-in library, as binaries were linked before libgradsync
 * had symbol versions). Usage: original_layout_caller SOCKET */
#include <stdio.h>
#include <string.h>

typedef struct gs_client gs_client;
typedef struct {
  const char* socket_path;
  int local_rank;
  int timeout_ms;
} gs_connect_options; /* the original layout */
int gs_connect(const gs_connect_options* opts, gs_client** out);
const char* gs_last_error(const gs_client* c);
void gs_close(gs_client* c);

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  /* What follows the struct in the caller's memory is not the library's to
   * read: 0xff bytes, which a size field read past the end would see. */
  struct {
    gs_connect_options opts;
    unsigned char after[32];
  } mem;
  memset(&mem, 0xff, sizeof mem);
  mem.opts.socket_path = argv[1];
  mem.opts.local_rank = 0;
  mem.opts.timeout_ms = 500;
  gs_client* c = NULL;
  int st = gs_connect(&mem.opts, &c);
  printf("status=%d message=%s\n", st, gs_last_error(c));
  gs_close(c);
  return 0;
}
