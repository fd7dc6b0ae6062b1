"""Detects the CUDA toolkit and NCCL under $CUDA_HOME or /usr/local/cuda.

`local_cuda(name = "local_cuda")` creates:
  @local_cuda//:cuda_headers                 the toolkit's headers (cuda.h for types too)
  @local_cuda//:cudart, @local_cuda//:nccl   cc_libraries (headers + link flags)
  @local_cuda//:cudart_static                the CUDA runtime linked statically
                                             (libcudart_static.a + -ldl -lrt -lpthread),
                                             so a binary needs only the driver at run time
  @local_cuda//:defs.bzl                     HAS_CUDA, CUDA_HOME, HAS_NVCC, NVCC
When CUDA or NCCL is missing the libraries are empty and HAS_CUDA is False,
so GPU targets are left out of `bazel build //...` cleanly. HAS_NVCC says
whether `bin/nvcc` exists too (kernels need it; the libraries do not).

Link one CUDA runtime per binary: :cudart (shared) and :cudart_static in
the same binary would give it two runtimes with separate state.
"""

def _local_cuda_impl(ctx):
    cuda_home = ctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    root = ctx.path(cuda_home)
    has_cuda = (root.get_child("include").get_child("cuda_runtime.h").exists and
                root.get_child("include").get_child("nccl.h").exists)
    libdir = None
    for candidate in ["lib64", "lib", "targets/x86_64-linux/lib"]:
        d = ctx.path(cuda_home + "/" + candidate)
        if d.get_child("libcudart.so").exists and d.get_child("libnccl.so").exists:
            libdir = cuda_home + "/" + candidate
            break
    has_cuda = has_cuda and libdir != None
    has_cudart_static = has_cuda and ctx.path(libdir + "/libcudart_static.a").exists
    nvcc = cuda_home + "/bin/nvcc"
    has_nvcc = has_cuda and ctx.path(nvcc).exists

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
        ctx.file("BUILD", """package(default_visibility = ["//visibility:public"])

exports_files(["defs.bzl"])

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"]),
    includes = ["include"],
)

cc_library(
    name = "cudart",
    linkopts = ["-L{libdir}", "-Wl,-rpath,{libdir}", "-lcudart"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "nccl",
    linkopts = ["-L{libdir}", "-Wl,-rpath,{libdir}", "-lnccl"],
    deps = [":cuda_headers", ":cudart"],
)
""".format(libdir = libdir) + cudart_static)
    else:
        ctx.file("BUILD", """package(default_visibility = ["//visibility:public"])

exports_files(["defs.bzl"])

# No CUDA toolkit with NCCL was found under {home}: GPU targets are skipped.
cc_library(name = "cuda_headers")

cc_library(name = "cudart")

cc_library(name = "cudart_static")

cc_library(name = "nccl")
""".format(home = cuda_home))

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    environ = ["CUDA_HOME"],
    local = True,
)
