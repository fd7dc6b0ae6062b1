#!/usr/bin/env bash
# A binary built against the original gradsync.h (options without size) and
# linked before libgradsync had symbol versions keeps working with today's
# libgradsync.so: its gs_connect reads the 16-byte struct, not past it. The
# socket does not exist, so gs_connect must fail UNAVAILABLE naming the path
# it read from the struct.
set -euo pipefail
lib=$(find -L "${TEST_SRCDIR:-.}" -name libgradsync.so -print -quit)
src=$(dirname "$(find -L "${TEST_SRCDIR:-.}" -name original_layout_caller.c -print -quit)")
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/gsold.XXXXXX")
mkdir "$tmp/old" "$tmp/new"
cc -shared -fPIC -o "$tmp/old/libgradsync.so" "$src/original_layout_stub.c"
cc -std=c99 -o "$tmp/caller" "$src/original_layout_caller.c" -L"$tmp/old" -lgradsync
cp -L "$lib" "$tmp/new/libgradsync.so"
sock=/tmp/gsold.$$.absent/d.sock  # short (unix socket limit) and never created
out=$(LD_LIBRARY_PATH=$tmp/new "$tmp/caller" "$sock")
echo "$out"
case "$out" in
  "status=2 message="*"$sock"*) echo "the original layout is read as such" ;;
  *) echo "expected status=2 (GS_ERR_UNAVAILABLE) naming $sock"; exit 1 ;;
esac
