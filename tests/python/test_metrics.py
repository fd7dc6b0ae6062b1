"""gradsyncd's Prometheus endpoint (--metrics-listen): a real daemon, a real
trainer running iterations, scraped over HTTP and read with
prometheus_client's own parser (what a Prometheus server accepts).
"""
from __future__ import annotations

import re
import urllib.error
import urllib.request

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import gradsync
from conftest import wait_until
from gradsync import DType, TensorSpec

ITERATIONS = 5


def metrics_port(cluster, timeout_s: float = 20) -> int:
    """The port gradsyncd logged for --metrics-listen HOST:0."""
    def port():
        return re.search(r"event=metrics_listening .* port=(\d+)", cluster.daemon.log())
    if wait_until(port, timeout_s):
        return int(port().group(1))
    pytest.fail("no event=metrics_listening in the daemon's log\n" + cluster.logs())


def scrape(port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return response.read().decode()


def test_metrics_endpoint_serves_histograms(gradsyncd) -> None:
    cluster = gradsyncd(1, "--metrics-listen=127.0.0.1:0")
    port = metrics_port(cluster)

    with gradsync.Client(cluster.socket, 0, connect_timeout_s=10) as client:
        client.register([TensorSpec("layer 1.weight \"q\"", DType.FLOAT32, 1000)])
        view = torch.frombuffer(client.buffer(0), dtype=torch.float32)
        for it in range(ITERATIONS):
            view.fill_(float(it))
            client.mark_ready(0)
            client.wait(timeout_s=10)

    families = {f.name: f for f in text_string_to_metric_families(scrape(port))}
    iterations = families["gradsync_iterations"]
    assert iterations.type == "counter"
    assert [s.value for s in iterations.samples] == [ITERATIONS]

    latency = families["gradsync_bucket_latency_seconds"]
    assert latency.type == "histogram"
    assert not any("quantile" in s.labels for s in latency.samples)
    for phase in ("total", "wait_for_ready", "local_reduce"):
        series = [s for s in latency.samples
                  if s.labels.get("bucket") == "0" and s.labels.get("phase") == phase]
        buckets = [s for s in series if s.name.endswith("_bucket")]
        bounds = [float(s.labels["le"]) for s in buckets]
        counts = [s.value for s in buckets]
        assert bounds == sorted(bounds) and bounds[-1] == float("inf"), phase
        assert counts == sorted(counts), f"{phase}: buckets are not cumulative: {counts}"
        count = [s.value for s in series if s.name.endswith("_count")]
        total = [s.value for s in series if s.name.endswith("_sum")]
        assert count == [ITERATIONS] and counts[-1] == ITERATIONS, phase
        assert len(total) == 1 and total[0] >= 0, phase


def test_metrics_endpoint_serves_only_metrics(gradsyncd) -> None:
    cluster = gradsyncd(1, "--metrics-listen=127.0.0.1:0")
    port = metrics_port(cluster)
    with pytest.raises(urllib.error.HTTPError) as error:
        scrape(port, "/")
    assert error.value.code == 404
    assert "gradsync_uptime_seconds" in scrape(port)


def iteration_histogram(port: int):
    """gradsync_iteration_duration_seconds as (its +Inf-ended cumulative bucket
    counts, its count); fails the test when the family is missing."""
    families = {f.name: f for f in text_string_to_metric_families(scrape(port))}
    family = families.get("gradsync_iteration_duration_seconds")
    assert family is not None, sorted(families)
    assert family.type == "histogram"
    buckets = [s for s in family.samples if s.name.endswith("_bucket")]
    bounds = [float(s.labels["le"]) for s in buckets]
    assert bounds == sorted(bounds) and bounds[-1] == float("inf"), bounds
    counts = [s.value for s in buckets]
    assert counts == sorted(counts), f"buckets are not cumulative: {counts}"
    [count] = [s.value for s in family.samples if s.name.endswith("_count")]
    assert counts[-1] == count
    return counts, count


def run_job(cluster, iterations: int) -> None:
    with gradsync.Client(cluster.socket, 0, connect_timeout_s=10) as client:
        client.register([TensorSpec("w", DType.FLOAT32, 100)])
        for _ in range(iterations):
            client.mark_ready(0)
            client.wait(timeout_s=10)


def test_iteration_histogram_is_there_from_the_start_and_counts_every_job(gradsyncd) -> None:
    cluster = gradsyncd(1, "--metrics-listen=127.0.0.1:0")
    port = metrics_port(cluster)
    counts, count = iteration_histogram(port)
    assert count == 0 and set(counts) == {0}, counts

    # A trainer sees its iteration done just before the daemon counts it.
    run_job(cluster, ITERATIONS)
    assert wait_until(lambda: iteration_histogram(port)[1] >= ITERATIONS, 20)
    assert iteration_histogram(port)[1] == ITERATIONS

    run_job(cluster, 3)  # a second job adds to the same histogram
    assert wait_until(lambda: iteration_histogram(port)[1] >= ITERATIONS + 3, 20)
    assert iteration_histogram(port)[1] == ITERATIONS + 3
