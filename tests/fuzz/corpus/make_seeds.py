#!/usr/bin/env python3
"""Writes the committed seed corpus of the fuzz targets (tests/fuzz): a few
valid inputs per target, encoded by hand (protobuf wire format, the ring's
32-byte entries) so no generated code is needed. Run from this directory;
the files are named after their content's purpose and are rewritten as is."""
import os
import struct


def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num, value):
    return varint(num << 3) + varint(value)


def field_bytes(num, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(num << 3 | 2) + varint(len(data)) + data


def field_double(num, value):
    return varint(num << 3 | 1) + struct.pack("<d", value)


def field_fixed64(num, value):
    return varint(num << 3 | 1) + struct.pack("<Q", value)


def tensor_spec(name, dtype, numel, device=-1):
    return (field_bytes(1, name) + field_varint(2, dtype) + field_varint(3, numel) +
            field_varint(4, device))


def register_request(specs):
    return field_varint(1, 7) + b"".join(field_bytes(2, s) for s in specs)


def write(target, name, data):
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, name), "wb") as f:
        f.write(data)


# layout_fuzz: RegisterRequest.
write("layout_fuzz", "one_float32", register_request([tensor_spec("w", 0, 4)]))
write("layout_fuzz", "mixed_dtypes", register_request([
    tensor_spec("fc1.weight", 0, 1024), tensor_spec("fc1.bias", 2, 32),
    tensor_spec("emb", 3, 4096), tensor_spec("head", 1, 10)]))
write("layout_fuzz", "duplicate_names",
      register_request([tensor_spec("a", 0, 1), tensor_spec("a", 0, 1)]))
write("layout_fuzz", "cuda_tensor", register_request([tensor_spec("g", 0, 8, device=0)]))

# rendezvous_records_fuzz: record values.
write("rendezvous_records_fuzz", "layout", register_request([tensor_spec("w", 0, 4)]))
write("rendezvous_records_fuzz", "caps", field_double(1, 25.0) + field_double(2, 1.0))
write("rendezvous_records_fuzz", "config", field_varint(1, 3) + field_varint(2, 100) +
      field_bytes(3, field_double(1, 4.0) + field_double(2, 0.5)))
write("rendezvous_records_fuzz", "order",
      field_bytes(1, b"".join(varint(i) for i in (3, 1, 0, 2))))
write("rendezvous_records_fuzz", "plan_stamp", field_varint(1, 1) +
      field_fixed64(2, 0x0123456789ABCDEF) + field_varint(3, 42) + field_varint(4, 2))

# rendezvous_service_fuzz: byte 0 picks num_nodes (0: 1 node, 1: 2 nodes),
# then calls: rpc byte, 16-bit little-endian length, serialized request.
JOIN, SET, GET, WAIT, HEARTBEAT, LEAVE = range(6)


def call(rpc, request):
    return bytes([rpc]) + struct.pack("<H", len(request)) + request


job = field_bytes(1, field_bytes(1, "fuzz-job"))


def join(rank, num_nodes):
    return call(JOIN, job + field_varint(2, rank) + field_varint(3, num_nodes) +
                field_varint(4, 2) + field_bytes(5, "127.0.0.1"))


write("rendezvous_service_fuzz", "join_one_node", b"\x00" + join(0, 1))
write("rendezvous_service_fuzz", "join_set_get_wait", b"\x00" + join(0, 1) +
      call(SET, job + field_bytes(2, "g1/layout/0") + field_bytes(3, b"\x01\x02")) +
      call(GET, job + field_bytes(2, "g1/layout/0")) +
      call(WAIT, job + field_bytes(2, "g1/layout/0") + field_bytes(2, "g1/caps")))
write("rendezvous_service_fuzz", "join_heartbeat_leave", b"\x00" + join(0, 1) +
      call(HEARTBEAT, job + field_varint(2, 0) + field_varint(3, 1) + field_varint(4, 5)) +
      call(LEAVE, job + field_varint(2, 0) + field_varint(3, 1) + field_bytes(4, "done")))
write("rendezvous_service_fuzz", "two_nodes_one_joins", b"\x01" + join(1, 2) +
      call(SET, job + field_bytes(2, "config/1") + field_bytes(3, b"x" * 2000)))

# ring_entry_fuzz: byte 0 picks num_tensors - 1, then ReadyEvents
# (tensor u32, kind u32, iteration u64, sequence u64, reserved u64).
READY, UNUSED = 1, 2


def entry(tensor, kind, iteration, sequence):
    return struct.pack("<IIQQQ", tensor, kind, iteration, sequence, 0)


write("ring_entry_fuzz", "two_iterations_of_three", bytes([2]) + b"".join(
    entry(t, READY if t != 1 else UNUSED, it, it * 3 + t) for it in range(2) for t in (2, 0, 1)))
write("ring_entry_fuzz", "tensor_out_of_range", bytes([0]) + entry(5, READY, 0, 0))
write("ring_entry_fuzz", "sequence_gap", bytes([1]) + entry(0, READY, 0, 0) + entry(1, READY, 0, 2))

# segment_header_fuzz: XORed onto intact headers (zeros: intact).
write("segment_header_fuzz", "intact", bytes(16))
write("segment_header_fuzz", "magic_flipped", b"\x01")
write("segment_header_fuzz", "version_bumped", bytes(8) + b"\x02")
