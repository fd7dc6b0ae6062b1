"""gradsync_proto_library: a .proto -> C++ (+ gRPC) library with the system protoc.

Bazel 4.2.3 offline cannot fetch rules_proto or the gRPC rules, so a genrule
runs Debian's protoc with grpc_cpp_plugin. Sources are given relative to this
package (proto/), and generated headers are included as
"gradsync/v1/<name>.pb.h" / ".grpc.pb.h".
"""

def gradsync_proto_library(name, src, deps = [], proto_deps = [], grpc = True):
    """Generates and compiles one .proto file.

    Args:
      name: the cc_library's name.
      src: the .proto path relative to proto/, e.g. "gradsync/v1/local.proto".
      deps: gradsync_proto_library targets this one's proto imports.
      proto_deps: the .proto files those imports name (inputs to protoc).
      grpc: also generate the gRPC service stubs.
    """
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    grpc_flags = ""
    if grpc:
        grpc_flags = "--grpc_out=$(RULEDIR) --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin "
    native.genrule(
        name = name + "_gen",
        srcs = [src] + proto_deps,
        outs = outs,
        cmd = ("/usr/bin/protoc -I" + native.package_name() + " " +
               "--cpp_out=$(RULEDIR) " + grpc_flags + "$(location " + src + ")"),
        message = "protoc " + src,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        includes = ["."],
        copts = ["-Wno-unused-parameter"],
        deps = deps + ["@system//:grpc" if grpc else "@system//:protobuf"],
    )
