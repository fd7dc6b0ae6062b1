#!/usr/bin/env bash
# Builds the GPU bundle: one folder (at most 60 MiB) holding everything
# scripts/gpu-check.sh needs on a GPU node that has the NVIDIA driver, CUDA 13,
# NCCL (Python's nvidia/nccl/lib) and python3 with a CUDA build of torch, but
# no Bazel, gRPC, Gloo, Debian -dev packages or network (docs/GPU.md).
#
#   scripts/gpu-bundle.sh [DIR]      # default: ./gpu-bundle
#
# Layout of DIR:
#   bin/      gradsyncd, gradsyncctl, the GPU tests and benchmarks
#   lib/      every shared library they need that is not glibc, libstdc++,
#             libgcc, the NVIDIA driver or NCCL (NCCL is found at run time)
#   python/   the gradsync package, with lib/libgradsync.so inside it
#   gpu-check.sh, MANIFEST (what was built from which commit)
# Every ELF file gets RUNPATH $ORIGIN-relative to lib/, so nothing needs
# LD_LIBRARY_PATH (which would leak into torch's own library lookups).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-$ROOT/gpu-bundle}
LIMIT_MIB=60

scripts/setup || { echo "gpu-bundle: setup failed" >&2; exit 1; }
if [ ! -f /usr/local/cuda/include/cuda_runtime.h ]; then
  echo "gpu-bundle: no CUDA toolkit in /usr/local/cuda: the GPU targets cannot be built here" >&2
  exit 1
fi

# The programs the bundle ships (bin/) and the shared library (python/).
BINARIES=(
  //daemon:gradsyncd
  //tools/gradsyncctl:gradsyncctl
  //daemon/backends:nccl_probe
)
# Tests and their helper programs that run on a real GPU carry the tag
# "gpu_bundle" (tests/gpu/BUILD); the simulated-device tests stay here.
# GRADSYNC_GPU=1: a toolkit or nccl.h that is not found fails the build
# (third_party/cuda.bzl) instead of giving a CPU-only gradsyncd. The queries
# take it too, so the CUDA repository is not fetched twice.
GPU_REPO_ENV=--repo_env=GRADSYNC_GPU=1
GPU_TEST_TARGETS=$(bazel query --color=no "$GPU_REPO_ENV" 'attr(tags, "gpu_bundle", kind("cc_test", //tests/...))')
GPU_TOOL_TARGETS=$(bazel query --color=no "$GPU_REPO_ENV" 'attr(tags, "gpu_bundle", kind("cc_binary", //tests/...))')

BAZEL_FLAGS=(-c opt --color=no --curses=no "$GPU_REPO_ENV")
[ "${CI:-}" = "true" ] && BAZEL_FLAGS+=(--show_progress_rate_limit=30)
echo "== bazel build -c opt (gradsyncd, libgradsync.so, gradsyncctl, GPU tests and tools)"
# shellcheck disable=SC2086
bazel build "${BAZEL_FLAGS[@]}" "${BINARIES[@]}" //client:libgradsync.so \
  $GPU_TEST_TARGETS $GPU_TOOL_TARGETS

BIN_DIR=$(bazel info "${BAZEL_FLAGS[@]}" bazel-bin 2>/dev/null)
label_path() {  # //a/b:c -> $BIN_DIR/a/b/c
  local l=${1#//}
  echo "$BIN_DIR/${l%%:*}/${l##*:}"
}

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/python"
ORIGINALS=("$(label_path //client:libgradsync.so)")
# shellcheck disable=SC2086
for t in "${BINARIES[@]}" $GPU_TEST_TARGETS $GPU_TOOL_TARGETS; do
  install -m 0755 "$(label_path "$t")" "$OUT/bin/"
  ORIGINALS+=("$(label_path "$t")")
done
cp -r client/python/gradsync "$OUT/python/"
mkdir -p "$OUT/python/gradsync/lib"
install -m 0755 "$(label_path //client:libgradsync.so)" "$OUT/python/gradsync/lib/"
cp scripts/gpu-check.sh "$OUT/gpu-check.sh"
cp -r tests/gpu/check "$OUT/check"
rm -f "$OUT/check/BUILD"
# The tests find their programs as Bazel runfiles ($TEST_SRCDIR/gradsync/
# PACKAGE/NAME, see tests/testing/files.h): relative links into bin/.
# shellcheck disable=SC2086
for t in //daemon:gradsyncd $GPU_TOOL_TARGETS; do
  l=${t#//}
  mkdir -p "$OUT/runfiles/gradsync/${l%%:*}"
  depth=$(echo "runfiles/gradsync/${l%%:*}" | tr -cd / | wc -c)
  ln -s "$(printf '../%.0s' $(seq 0 "$depth"))bin/${l##*:}" "$OUT/runfiles/gradsync/${l%%:*}/${l##*:}"
done

# Libraries the node provides itself: glibc, the C++ runtime, the NVIDIA
# driver and NCCL (loaded at run time from $NCCL_LIB, Python's
# nvidia/nccl/lib, or the system).
is_provided() {
  case "$(basename "$1")" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|\
    libresolv.so*|libutil.so*|libstdc++.so*|libgcc_s.so*|libcuda.so*|libnvidia*|libnccl.so*)
      return 0 ;;
  esac
  return 1
}

# The closure of what the shipped ELF files need, by ldd on Bazel's own
# outputs (where every library resolves, Bazel's internal _solib ones too;
# the copies' $ORIGIN-relative paths do not resolve until RUNPATH is set).
collect() {
  local f dep
  for f in "${ORIGINALS[@]}"; do
    if ldd "$f" | grep -q "not found"; then
      echo "gpu-bundle: $f has unresolved libraries here:" >&2; ldd "$f" | grep "not found" >&2
      exit 1
    fi
    ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
  done | sort -u | while read -r dep; do
    is_provided "$dep" && continue
    [ -e "$OUT/lib/$(basename "$dep")" ] || install -m 0644 "$(readlink -f "$dep")" "$OUT/lib/$(basename "$dep")"
  done
}
collect

# Smaller and self-locating: strip debug info, point RUNPATH at lib/.
for f in "$OUT"/bin/* "$OUT"/lib/*; do
  strip --strip-unneeded "$f" 2>/dev/null || true
done
for f in "$OUT"/bin/*; do patchelf --set-rpath '$ORIGIN/../lib' "$f"; done
for f in "$OUT"/lib/*; do patchelf --set-rpath '$ORIGIN' "$f"; done
so="$OUT/python/gradsync/lib/libgradsync.so"
strip --strip-unneeded "$so"
patchelf --set-rpath '$ORIGIN/../../../lib' "$so"

find "$OUT" -name __pycache__ -prune -exec rm -rf {} +

# Every library must resolve, and nothing may resolve outside the bundle
# to a library the node does not provide.
missing=0
for f in "$OUT"/bin/* "$OUT"/lib/* "$so"; do
  if ldd "$f" 2>/dev/null | grep -q "not found"; then
    echo "gpu-bundle: $f: $(ldd "$f" | grep "not found" | tr -s ' \t' ' ')" >&2
    missing=1
  fi
  while read -r dep; do
    is_provided "$dep" && continue
    case "$dep" in "$OUT"/*) ;; *) echo "gpu-bundle: $f needs $dep from outside the bundle" >&2; missing=1 ;; esac
  done < <(ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}')
done
[ $missing -eq 0 ] || exit 1

{
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release; echo "$PRETTY_NAME")"
  echo "needs: GLIBC $(for f in "$OUT"/bin/* "$OUT"/lib/* "$so"; do objdump -T "$f" 2>/dev/null; done |
    grep -o 'GLIBC_2\.[0-9]*' | sort -uV | tail -1 | cut -d_ -f2)," \
    "GLIBCXX $(for f in "$OUT"/bin/* "$OUT"/lib/* "$so"; do objdump -T "$f" 2>/dev/null; done |
    grep -o 'GLIBCXX_3\.4\.[0-9]*' | sort -uV | tail -1 | cut -d_ -f2)"
  echo "programs: $(cd "$OUT/bin" && echo *)"
} > "$OUT/MANIFEST"

size_kib=$(du -sk "$OUT" | cut -f1)
echo "== gpu bundle: $OUT, $((size_kib / 1024)) MiB (limit $LIMIT_MIB MiB)"
cat "$OUT/MANIFEST"
if [ "$size_kib" -gt $((LIMIT_MIB * 1024)) ]; then
  echo "gpu-bundle: the bundle is larger than $LIMIT_MIB MiB" >&2
  exit 1
fi
