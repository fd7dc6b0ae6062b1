#!/usr/bin/env bash
# libgradsync.so exports exactly the C ABI of client/gradsync.h: every gs_*
# function at its symbol version (client/gradsync.lds), and nothing else (no
# C++, gRPC or absl symbols leak to trainers); its SONAME is libgradsync.so.0.
set -euo pipefail
lib=$(find -L "${TEST_SRCDIR:-.}" -name libgradsync.so -print -quit)
[ -n "$lib" ] || { echo "libgradsync.so not in runfiles"; exit 1; }
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtWDdBbRr]$/ {print $3}' | sort)
expected="gs_broadcast@@GRADSYNC_0.3
gs_check_replicas@@GRADSYNC_0.4
gs_close@@GRADSYNC_0
gs_connect@@GRADSYNC_0.1
gs_connect@GRADSYNC_0
gs_get_job_info@@GRADSYNC_0.4
gs_grad_buffer@@GRADSYNC_0
gs_iteration_skipped@@GRADSYNC_0.4
gs_join@@GRADSYNC_0.2
gs_last_error@@GRADSYNC_0
gs_mark_ready@@GRADSYNC_0
gs_mark_unused@@GRADSYNC_0
gs_register@@GRADSYNC_0
gs_set_cuda_stream@@GRADSYNC_0
gs_set_sync@@GRADSYNC_0
gs_version@@GRADSYNC_0.1
gs_wait@@GRADSYNC_0
gs_world@@GRADSYNC_0"
if [ "$exported" != "$expected" ]; then
  echo "libgradsync.so exports:"; echo "$exported"
  echo "expected exactly:"; echo "$expected"
  exit 1
fi
soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
if [ "$soname" != "libgradsync.so.0" ]; then
  echo "libgradsync.so has SONAME '$soname', expected libgradsync.so.0"; exit 1
fi
echo "libgradsync.so exports exactly the versioned gs_* C ABI, SONAME $soname"
