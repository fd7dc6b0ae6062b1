"""GetTrace stays within gRPC's 4 MiB message limit: a real daemon whose
flight recorder holds far more (thousands of one-tensor buckets), read with
the real `gradsyncctl trace`. The newest events come back, and the reply
says how many of the oldest were left out.
"""
from __future__ import annotations

import json
import re
import subprocess

import pytest

import gradsync
from conftest import REPO_ROOT, listen_port
from gradsync import DType, TensorSpec

GRADSYNCCTL = REPO_ROOT / "bazel-bin" / "tools" / "gradsyncctl" / "gradsyncctl"
TENSORS = 3000
ITERATIONS = 10


def test_trace_larger_than_a_grpc_message_keeps_the_newest_events(gradsyncd, workdir) -> None:
    # A 1-byte cap: every tensor is its own bucket, six events per iteration.
    cluster = gradsyncd(1, "--listen=127.0.0.1:0", "--bucket-cap-mb=0.000001",
                        "--first-bucket-cap-mb=0.000001")
    port = listen_port(cluster)
    with gradsync.Client(cluster.socket, 0, connect_timeout_s=10) as client:
        client.register([TensorSpec(f"layer{i}.weight", DType.FLOAT32, 1) for i in range(TENSORS)])
        for _ in range(ITERATIONS):
            for i in range(TENSORS):
                client.mark_ready(i)
            client.wait(timeout_s=60)

        out = workdir / "trace.json"
        # The reply is ~4 MiB of events: on a machine shared with other
        # builds its assembly can outlast gradsyncctl's default 5 s deadline.
        run = subprocess.run([str(GRADSYNCCTL), f"--addr=127.0.0.1:{port}", "--timeout-s=45",
                              "trace", "--out", str(out)],
                             capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    dropped = re.search(r"left out the oldest (\d+) events to fit a gRPC message", run.stderr)
    assert dropped, run.stderr
    size = out.stat().st_size
    assert size <= 4 << 20, size
    doc = json.loads(out.read_text())
    assert f"the oldest {dropped.group(1)} events left out" in doc["otherData"]["reason"]
    iterations = {e["args"]["iteration"] for e in doc["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") == "bucket"}
    assert max(iterations) == ITERATIONS - 1, "the newest iteration must be kept"
