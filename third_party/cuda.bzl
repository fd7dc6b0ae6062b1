"""Detects the CUDA toolkit under $CUDA_HOME (or /usr/local/cuda) and nccl.h.

`local_cuda(name = "local_cuda")` creates:
  @local_cuda//:cuda_headers                 the toolkit's headers and nccl.h
  @local_cuda//:cudart                       cc_library (headers + link flags)
  @local_cuda//:cudart_static                the CUDA runtime linked statically
                                             (libcudart_static.a + -ldl -lrt -lpthread),
                                             so a binary needs only the driver at run time
  @local_cuda//:defs.bzl                     HAS_CUDA, CUDA_HOME, HAS_NVCC, NVCC
nccl.h is looked for in $NCCL_HOME/include, $CUDA_HOME/include, then
/usr/include (a distro's libnccl-dev). No NCCL library is linked: the daemon
loads libnccl.so.2 at run time (gpu/nccl_loader.h), so only the header
counts here.

When CUDA or nccl.h is missing the libraries are empty and HAS_CUDA is False,
so GPU targets are left out of `bazel build //...` cleanly, unless a GPU
build was asked for (`--repo_env=GRADSYNC_GPU=1`): then the repository fails,
naming what is missing, rather than quietly giving a CPU-only daemon.
HAS_NVCC says whether `bin/nvcc` exists too (kernels need it; the libraries
do not).

Link one CUDA runtime per binary: :cudart (shared) and :cudart_static in
the same binary would give it two runtimes with separate state.
"""

# Where nccl.h may be, in order: an explicit NCCL first, then the toolkit's.
def _nccl_include_dirs(ctx, cuda_home):
    dirs = []
    nccl_home = ctx.os.environ.get("NCCL_HOME", "")
    if nccl_home:
        dirs.append(nccl_home + "/include")
    dirs.append(cuda_home + "/include")
    dirs.append("/usr/include")
    return dirs

def _find_nccl_include(ctx, cuda_home):
    for d in _nccl_include_dirs(ctx, cuda_home):
        if ctx.path(d + "/nccl.h").exists:
            return d
    return None

def _find_cudart_libdir(ctx, cuda_home):
    for candidate in ["lib64", "lib", "targets/x86_64-linux/lib"]:
        d = cuda_home + "/" + candidate
        if ctx.path(d + "/libcudart.so").exists or ctx.path(d + "/libcudart_static.a").exists:
            return d
    return None

def _local_cuda_impl(ctx):
    cuda_home = ctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    has_runtime_h = ctx.path(cuda_home + "/include/cuda_runtime.h").exists
    libdir = _find_cudart_libdir(ctx, cuda_home)
    nccl_include = _find_nccl_include(ctx, cuda_home)
    missing = []
    if not has_runtime_h:
        missing.append("cuda_runtime.h in %s/include" % cuda_home)
    if libdir == None:
        missing.append("libcudart under %s/{lib64,lib,targets/x86_64-linux/lib}" % cuda_home)
    if nccl_include == None:
        missing.append("nccl.h in " + ", ".join(_nccl_include_dirs(ctx, cuda_home)))
    has_cuda = not missing
    has_cudart_static = has_cuda and ctx.path(libdir + "/libcudart_static.a").exists
    nvcc = cuda_home + "/bin/nvcc"
    has_nvcc = has_cuda and ctx.path(nvcc).exists
    if ctx.os.environ.get("GRADSYNC_GPU", "") == "1":
        # The GPU daemon also needs the static runtime and nvcc (the
        # local-sum kernel); without them it would quietly build CPU-only.
        if libdir != None and not ctx.path(libdir + "/libcudart_static.a").exists:
            missing.append("libcudart_static.a in " + libdir)
        if not ctx.path(nvcc).exists:
            missing.append(nvcc)
        if missing:
            fail(("GRADSYNC_GPU=1 asks for a GPU build, but these are missing: %s. " +
                  "Set CUDA_HOME (the toolkit) and NCCL_HOME (where include/nccl.h is).") %
                 "; ".join(missing))

    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("defs.bzl", "HAS_CUDA = %s\nCUDA_HOME = %s\nHAS_NVCC = %s\nNVCC = %s\n" % (
        has_cuda,
        repr(cuda_home if has_cuda else ""),
        has_nvcc,
        repr(nvcc if has_nvcc else ""),
    ))
    cudart_static = """
# The CUDA runtime in the binary itself: only libcuda.so.1 (the driver) is
# needed where it runs. cudart_static uses dlopen, clock_gettime, threads.
cc_library(
    name = "cudart_static",
    linkopts = ["{libdir}/libcudart_static.a", "-ldl", "-lrt", "-lpthread"],
    deps = [":cuda_headers"],
)
""".format(libdir = libdir) if has_cudart_static else """
# No libcudart_static.a in the toolkit: targets that need it will not link.
cc_library(name = "cudart_static")
"""
    if has_cuda:
        ctx.symlink(cuda_home + "/include", "include")
        ctx.file("BUILD", _cuda_build(ctx, cuda_home, nccl_include, libdir) + cudart_static)
    else:
        ctx.file("BUILD", """package(default_visibility = ["//visibility:public"])

exports_files(["defs.bzl"])

# Not found ({missing}): GPU targets are skipped.
cc_library(name = "cuda_headers")

cc_library(name = "cudart")

cc_library(name = "cudart_static")
""".format(missing = "; ".join(missing)))

# The BUILD file of a found toolkit. An nccl.h outside the toolkit is linked
# in alone (not its whole directory: /usr/include would shadow the system's
# own headers), and searched first, as the compiler would with -I$NCCL_HOME.
def _cuda_build(ctx, cuda_home, nccl_include, libdir):
    includes = '["include"]'
    if nccl_include != cuda_home + "/include":
        ctx.symlink(nccl_include + "/nccl.h", "nccl_include/nccl.h")
        includes = '["nccl_include", "include"]'
    return """package(default_visibility = ["//visibility:public"])

exports_files(["defs.bzl"])

# nccl.h from {nccl_include}.
cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "nccl_include/*.h"]),
    includes = {includes},
)

cc_library(
    name = "cudart",
    linkopts = ["-L{libdir}", "-Wl,-rpath,{libdir}", "-lcudart"],
    deps = [":cuda_headers"],
)
""".format(nccl_include = nccl_include, includes = includes, libdir = libdir)

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    environ = ["CUDA_HOME", "NCCL_HOME", "GRADSYNC_GPU"],
    local = True,
)
