#!/usr/bin/env bash
# scripts/install.sh lays out a prefix that a C program builds against with
# `pkg-config --cflags --libs gradsync` alone, and that program, linked to
# libgradsync.so.0, trains against the installed bin/gradsyncd.
set -euo pipefail
runfiles=$(cd "$(dirname "$(find -L "${TEST_SRCDIR:-.}" -path '*/scripts/install.sh' -print -quit)")/.." && pwd)
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/gsinst.XXXXXX")
daemon_pid=""
cleanup() {
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -f /dev/shm/gsinst$$x* 2>/dev/null
  [ -n "${sockdir:-}" ] && rm -rf "$sockdir"
  true
}
trap cleanup EXIT

prefix=$tmp/prefix
GRADSYNC_BUILD_DIR=$runfiles bash "$runfiles/scripts/install.sh" "$prefix"
for f in include/gradsync.h lib/pkgconfig/gradsync.pc bin/gradsyncd bin/gradsyncctl \
         lib/libgradsync.so.0.1.0; do
  [ -f "$prefix/$f" ] || { echo "install.sh did not install $f"; exit 1; }
done
[ "$(readlink "$prefix/lib/libgradsync.so.0")" = libgradsync.so.0.1.0 ] || { echo "bad libgradsync.so.0 link"; exit 1; }
[ "$(readlink "$prefix/lib/libgradsync.so")" = libgradsync.so.0 ] || { echo "bad libgradsync.so link"; exit 1; }

export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
[ "$(pkg-config --modversion gradsync)" = 0.1.0 ] || { echo "gradsync.pc version is $(pkg-config --modversion gradsync)"; exit 1; }
# shellcheck disable=SC2046  # pkg-config's flags are meant to split
cc -std=c99 -Wall -Werror -o "$tmp/trainer" "$runfiles/tests/client/installed_trainer.c" \
  $(pkg-config --cflags --libs gradsync)
needed=$(readelf -d "$tmp/trainer" | sed -n 's/.*Shared library: \[\(libgradsync[^]]*\)\]/\1/p')
[ "$needed" = libgradsync.so.0 ] || { echo "the trainer needs '$needed', expected libgradsync.so.0"; exit 1; }

sockdir=$(mktemp -d /tmp/gsi.XXXXXX)  # unix socket paths must stay < 100 bytes
sock=$sockdir/d.sock
"$prefix/bin/gradsyncd" --socket="$sock" --local-size=1 --listen=127.0.0.1:0 \
  --shm-prefix="gsinst$$x" > "$tmp/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 200); do  # wait (up to ~20 s) for the socket, not for a fixed time
  [ -S "$sock" ] && break
  kill -0 "$daemon_pid" 2>/dev/null || { echo "gradsyncd exited:"; cat "$tmp/daemon.log"; exit 1; }
  sleep 0.1
done
[ -S "$sock" ] || { echo "gradsyncd did not create $sock"; cat "$tmp/daemon.log"; exit 1; }

LD_LIBRARY_PATH=$prefix/lib "$tmp/trainer" "$sock" || { cat "$tmp/daemon.log"; exit 1; }
echo "installed tree builds and trains with pkg-config alone"
