/* Stands in for the unversioned libgradsync.so that old binaries were linked
 * against: it only gives original_layout_caller unversioned references. */
typedef struct gs_client gs_client;
int gs_connect(const void* opts, gs_client** out) {
  (void)opts;
  (void)out;
  return 7;
}
const char* gs_last_error(const gs_client* c) {
  (void)c;
  return "stub";
}
void gs_close(gs_client* c) { (void)c; }
