#!/usr/bin/env bash
# Builds the gradsync Python wheel with libgradsync.so inside
# (gradsync/lib/libgradsync.so), offline: Debian's pip, setuptools and wheel,
# no build isolation, no index ($PYTHON, default Debian's /usr/bin/python3). The checkout is not written to: the package
# is copied to a scratch directory first.
#
# Usage: scripts/build-wheel.sh OUTDIR   (after bazel build //client:libgradsync.so)
# $GRADSYNC_LIB: the library to bundle (default: the checkout's bazel-bin).
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
out=$1
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lib=${GRADSYNC_LIB:-$repo/bazel-bin/client/libgradsync.so}
[ -f "$lib" ] || { echo "build-wheel.sh: $lib is missing (bazel build //client:libgradsync.so)" >&2; exit 1; }

scratch=$(mktemp -d "${TMPDIR:-/tmp}/gswheel.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
cp -r "$repo/client/python/." "$scratch/"
rm -rf "$scratch/build" "$scratch"/*.egg-info
find "$scratch" -name __pycache__ -prune -exec rm -rf {} +
install -D -m 0755 "$lib" "$scratch/gradsync/lib/libgradsync.so"
mkdir -p "$out"
"${PYTHON:-/usr/bin/python3}" -m pip wheel --quiet --no-deps --no-build-isolation --no-index -w "$out" "$scratch"
ls "$out"/gradsync-*.whl
