"""Tensor names are user input: in gradsyncd's key=value log they stay inside
their quoted field, escaped, and one event stays one line. A real daemon and
a real trainer that leaves a tensor unmarked, so the daemon reports a stall
naming it.
"""
from __future__ import annotations


import pytest

import gradsync
from conftest import wait_until
from gradsync import DType, TensorSpec

EVIL = 'w "x" event=forged\nsecond line'


def test_stall_report_escapes_the_tensor_name(gradsyncd) -> None:
    cluster = gradsyncd(1, "--stall-threshold-s=0.2", "--bucket-cap-mb=1000",
                        "--first-bucket-cap-mb=1000")
    with gradsync.Client(cluster.socket, 0, connect_timeout_s=10) as client:
        client.register([TensorSpec("ready", DType.FLOAT32, 4), TensorSpec(EVIL, DType.FLOAT32, 4)])
        client.mark_ready(0)  # the other tensor stays unmarked: the iteration stalls
        if not wait_until(lambda: "event=stall " in cluster.daemon.log(), 30):
            pytest.fail("no event=stall in the daemon's log\n" + cluster.logs())
    lines = cluster.daemon.log().splitlines()
    stall = [line for line in lines if "event=stall " in line]
    assert len(stall) == 1, stall
    assert 'w \\"x\\" event=forged\\nsecond line' in stall[0]
    assert not any(line.startswith("second line") for line in lines), lines
    assert sum("event=forged" in line for line in lines) == 1
