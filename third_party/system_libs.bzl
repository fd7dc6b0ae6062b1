"""Exposes Debian's system libraries to Bazel, with flags asked of pkg-config.

`system_libs(name = "system")` creates `@system//:<lib>` cc_libraries
(grpc, grpc_reflection, protobuf, absl, spdlog, gloo, boost, gtest, gtest_main, gmock,
benchmark, json, crypto). Link flags and -D defines come from pkg-config at
fetch time, so nothing is pasted by hand and a newer Debian just works.

`@system//:static_grpc_absl_protobuf` makes an executable that depends on it
link Debian's static archives of gRPC, Abseil, Protobuf and their own
dependencies (re2, upb, c-ares, gpr, address_sorting, and OpenSSL's libssl
and libcrypto and zlib, which gRPC links) instead of ~70 shared objects: the
dynamic loader's symbol lookups and relocations were most of a daemon's
start-up CPU. It is all or nothing: a library is linked statically only
when every library of that set has its archive (two copies of Abseil, one
static and one reached through a shared gRPC, would break), and nothing
the executables link shared depends on them (spdlog, Gloo, libsystemd do
not; keep it so: a shared library that needs libssl.so would bring a second
OpenSSL into the process). Executables only: Debian's archives are not
position-independent enough for a shared library (libgradsync.so stays
dynamic).
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
    "gtest": (["gtest"], []),
    "gtest_main": (["gtest_main"], []),
    "gmock": (["gmock"], []),
    "benchmark": (["benchmark"], []),
    # Debian's Gloo has no .pc file: /usr/lib/libgloo.so pulls its own deps.
    "gloo": ([], ["-L/usr/lib", "-lgloo"]),
    # Boost.Interprocess is header-only; POSIX shm needs librt.
    "boost": ([], ["-lrt", "-pthread"]),
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

# The libraries linked statically by @system//:static_grpc_absl_protobuf:
# every -l name of these targets' flags that matches one of the prefixes.
_STATIC_TARGETS = ["absl", "protobuf", "grpc", "grpc_reflection"]
_STATIC_PREFIXES = ["absl_", "grpc", "gpr", "upb", "address_sorting", "re2", "cares", "protobuf"]
_STATIC_NAMES = ["ssl", "crypto", "z"]

def _static_set(all_linkopts):
    names = []
    for target in _STATIC_TARGETS:
        for flag in all_linkopts[target]:
            if not flag.startswith("-l"):
                continue
            name = flag[2:]
            if name in names:
                continue
            if name in _STATIC_NAMES:
                names.append(name)
                continue
            for prefix in _STATIC_PREFIXES:
                if name.startswith(prefix):
                    names.append(name)
                    break
    return names

def _static_archives(ctx, all_linkopts):
    """A static-<hash>/ directory holding every archive of the set (the linker
    searches -L directories before its default ones, so each -lNAME of the
    set finds NAME's archive there), or None with the first one missing."""
    archives = {}
    for name in _static_set(all_linkopts):
        # Where the compiler's linker finds it; the bare name when it finds none.
        cc = ctx.os.environ.get("CC", "gcc")
        found = ctx.execute([cc, "-print-file-name=lib%s.a" % name]).stdout.strip()
        if not found.startswith("/"):
            return None, "lib%s.a" % name
        archives[name] = found
    # The directory is named after the set, so a changed set changes every
    # link's command line and relinks (the archives are not declared inputs).
    set_hash = hash(repr(sorted(archives.items())))
    directory = "static-%d" % (set_hash if set_hash >= 0 else -set_hash)
    for name, path in archives.items():
        ctx.symlink(path, "%s/lib%s.a" % (directory, name))
    return ctx.path(directory), None

def _system_libs_impl(ctx):
    if not ctx.which("pkg-config"):
        fail("pkg-config not found: run scripts/setup first.")
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    all_linkopts = {}
    for name, (modules, extra) in _LIBS.items():
        defines = []
        linkopts = []
        if modules:
            for flag in _pkg_config(ctx, ["--cflags"] + modules):
                if flag.startswith("-D"):
                    defines.append(flag[2:])
            linkopts = _dedupe_keep_last(_pkg_config(ctx, ["--libs"] + modules))
        linkopts = linkopts + extra
        all_linkopts[name] = linkopts
        build.append("cc_library(")
        build.append('    name = "%s",' % name)
        build.append("    defines = %s," % repr(_dedupe_keep_last(defines)))
        build.append("    linkopts = %s," % repr(linkopts))
        build.append(")")
        build.append("")
    static_dir, missing = _static_archives(ctx, all_linkopts)
    if missing:
        # tests/integration:static_link_test then fails, naming what is shared.
        print("%s is not installed: gradsyncd links gRPC, Abseil and Protobuf dynamically" % missing)
        build.append("# Not static: %s is not installed." % missing)
    build.append("cc_library(")
    build.append('    name = "static_grpc_absl_protobuf",')
    build.append("    linkopts = %s," % repr(["-L%s" % static_dir] if static_dir else []))
    build.append(")")
    build.append("")
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("BUILD", "\n".join(build))

system_libs = repository_rule(
    implementation = _system_libs_impl,
    environ = ["PKG_CONFIG_PATH", "CC"],
    local = True,
)
