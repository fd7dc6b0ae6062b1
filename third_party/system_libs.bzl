"""Exposes Debian's system libraries to Bazel, with flags asked of pkg-config.

`system_libs(name = "system")` creates `@system//:<lib>` cc_libraries
(grpc, grpc_reflection, protobuf, absl, spdlog, gloo, boost, gtest, gtest_main, gmock,
benchmark, systemd, json, httplib, crypto). Link flags and -D defines come from pkg-config at
fetch time, so nothing is pasted by hand and a newer Debian just works.
"""

# Bazel target name -> (pkg-config modules, extra linkopts).
_LIBS = {
    "absl": (["absl_status", "absl_statusor", "absl_strings", "absl_str_format",
              "absl_synchronization", "absl_time", "absl_flags", "absl_flags_parse",
              "absl_hash", "absl_raw_hash_set"], []),
    "protobuf": (["protobuf"], []),
    "grpc": (["grpc++", "protobuf"], []),
    # Server reflection, for the daemon only: the library carries its own
    # copy of the reflection messages, which clashes with a client that
    # generates them (no .pc file in Debian 12).
    "grpc_reflection": ([], ["-lgrpc++_reflection"]),
    "spdlog": (["spdlog"], []),
    "systemd": (["libsystemd"], []),
    "gtest": (["gtest"], []),
    "gtest_main": (["gtest_main"], []),
    "gmock": (["gmock"], []),
    "benchmark": (["benchmark"], []),
    # Debian's Gloo has no .pc file: /usr/lib/libgloo.so pulls its own deps.
    "gloo": ([], ["-L/usr/lib", "-lgloo"]),
    # Boost.Interprocess is header-only; POSIX shm needs librt.
    "boost": ([], ["-lrt", "-pthread"]),
    # cpp-httplib: the daemon's Prometheus /metrics endpoint.
    "httplib": (["cpp-httplib"], []),
    # OpenSSL's libcrypto: HMAC-SHA256, the job token's proof kept in etcd.
    "crypto": (["libcrypto"], []),
    # nlohmann-json is header-only.
    "json": ([], []),
}

def _pkg_config(ctx, args):
    result = ctx.execute(["pkg-config"] + args)
    if result.return_code != 0:
        fail("pkg-config %s failed: %s\nRun scripts/setup to install the system packages." %
             (" ".join(args), result.stderr))
    return result.stdout.strip().split(" ") if result.stdout.strip() else []

def _dedupe_keep_last(flags):
    # Static-order link flags: keep each library's last occurrence.
    seen = {}
    out = []
    for f in reversed(flags):
        if f in seen:
            continue
        seen[f] = True
        out.append(f)
    return list(reversed(out))

def _system_libs_impl(ctx):
    if not ctx.which("pkg-config"):
        fail("pkg-config not found: run scripts/setup first.")
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    for name, (modules, extra) in _LIBS.items():
        defines = []
        linkopts = []
        if modules:
            for flag in _pkg_config(ctx, ["--cflags"] + modules):
                if flag.startswith("-D"):
                    defines.append(flag[2:])
            linkopts = _dedupe_keep_last(_pkg_config(ctx, ["--libs"] + modules))
        linkopts = linkopts + extra
        build.append("cc_library(")
        build.append('    name = "%s",' % name)
        build.append("    defines = %s," % repr(_dedupe_keep_last(defines)))
        build.append("    linkopts = %s," % repr(linkopts))
        build.append(")")
        build.append("")
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("BUILD", "\n".join(build))

system_libs = repository_rule(
    implementation = _system_libs_impl,
    environ = ["PKG_CONFIG_PATH"],
    local = True,
)
