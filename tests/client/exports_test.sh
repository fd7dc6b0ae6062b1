#!/usr/bin/env bash
# libgradsync.so exports exactly the C ABI of client/gradsync.h: every gs_*
# function, and nothing else (no C++, gRPC or absl symbols leak to trainers).
set -euo pipefail
lib=$(find -L "${TEST_SRCDIR:-.}" -name libgradsync.so -print -quit)
[ -n "$lib" ] || { echo "libgradsync.so not in runfiles"; exit 1; }
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtWDdBbRr]$/ {print $3}' | sort)
expected="gs_close
gs_connect
gs_grad_buffer
gs_last_error
gs_mark_ready
gs_mark_unused
gs_register
gs_set_cuda_stream
gs_set_sync
gs_wait
gs_world"
if [ "$exported" != "$expected" ]; then
  echo "libgradsync.so exports:"; echo "$exported"
  echo "expected exactly:"; echo "$expected"
  exit 1
fi
echo "libgradsync.so exports exactly the gs_* C ABI"
