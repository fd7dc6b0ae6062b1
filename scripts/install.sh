#!/usr/bin/env bash
# Installs a built gradsync under PREFIX:
#   PREFIX/include/gradsync.h
#   PREFIX/lib/libgradsync.so.0.<minor>.<patch>, libgradsync.so.0 (the SONAME)
#     and libgradsync.so (what -lgradsync links) as links to it
#   PREFIX/lib/pkgconfig/gradsync.pc
#   PREFIX/bin/gradsyncd, PREFIX/bin/gradsyncctl
#
# Usage: scripts/install.sh PREFIX
# Build first: bazel build //client:libgradsync.so //tools/gradsyncctl //daemon:gradsyncd
# $GRADSYNC_BUILD_DIR: where the built files are (default: the checkout's
# bazel-bin; a Bazel test passes its runfiles directory).
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: $0 PREFIX" >&2; exit 2; }
prefix=$1
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${GRADSYNC_BUILD_DIR:-$repo/bazel-bin}
header=$repo/client/gradsync.h

for f in "$build/client/libgradsync.so" "$build/tools/gradsyncctl/gradsyncctl" "$build/daemon/gradsyncd" "$header"; do
  [ -f "$f" ] || { echo "install.sh: $f is missing (bazel build it first)" >&2; exit 1; }
done

# The version comes from the header, the one place it is written.
version_part() {
  sed -n "s/^#define GS_VERSION_$1 \([0-9][0-9]*\)\$/\1/p" "$header"
}
major=$(version_part MAJOR)
minor=$(version_part MINOR)
patch=$(version_part PATCH)
[ -n "$major" ] && [ -n "$minor" ] && [ -n "$patch" ] ||
  { echo "install.sh: no GS_VERSION_MAJOR/MINOR/PATCH in $header" >&2; exit 1; }
version=$major.$minor.$patch

mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)  # absolute: the .pc file names it
install -d "$prefix/include" "$prefix/lib/pkgconfig" "$prefix/bin"
install -m 0644 "$header" "$prefix/include/gradsync.h"
install -m 0755 "$build/client/libgradsync.so" "$prefix/lib/libgradsync.so.$version"
ln -sfn "libgradsync.so.$version" "$prefix/lib/libgradsync.so.$major"
ln -sfn "libgradsync.so.$major" "$prefix/lib/libgradsync.so"
install -m 0755 "$build/daemon/gradsyncd" "$prefix/bin/gradsyncd"
install -m 0755 "$build/tools/gradsyncctl/gradsyncctl" "$prefix/bin/gradsyncctl"

cat > "$prefix/lib/pkgconfig/gradsync.pc" <<PC
prefix=$prefix
exec_prefix=\${prefix}
libdir=\${exec_prefix}/lib
includedir=\${prefix}/include

Name: gradsync
Description: Client library of gradsyncd, the per-node gradient-synchronization daemon
Version: $version
Libs: -L\${libdir} -lgradsync
Cflags: -I\${includedir}
PC
echo "install.sh: gradsync $version installed under $prefix"
