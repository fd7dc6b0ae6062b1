#!/usr/bin/python3
"""bench_report: what every benchmark driver of tests/bench shares.

- ``quick()``: whether this is a ``scripts/bench.sh --quick`` run
  (``--quick`` on the command line or ``GRADSYNC_BENCH_QUICK=1``);
- ``Report``: the tables and plots of one driver, printed as markdown and
  written to ``bench-results/<name>.json`` with the machine's facts and the
  exact command, so a result can be read (and compared) without the log;
- ``Progress``: one stderr line per step (which benchmark, how far, the time
  left), or one updated line on a terminal;
- ``figure`` / ``save_figure``: matplotlib (Agg, no display) with a title,
  axis units and a legend on every plot.

Run as a program it wraps a C++ benchmark: ``bench_report.py --wrap NAME
CMD...`` runs CMD, passes its output through, and stores its whitespace
tables in bench-results/NAME.json.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from typing import Iterable, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS_DIR = os.path.join(ROOT, "bench-results")


def quick() -> bool:
    return "--quick" in sys.argv[1:] or os.environ.get("GRADSYNC_BENCH_QUICK") == "1"


# --------------------------------------------------------------------------
# The machine.


def _mem_total_bytes() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _copy_bandwidth_gbps() -> Optional[float]:
    """Single-thread memcpy of 64 MB with numpy, best of 5: the memory
    bandwidth reference measured in this run (the machine is shared)."""
    try:
        import numpy as np
    except ImportError:
        return None
    src = np.ones(64 << 20, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return src.nbytes / best / 1e9


def _command_output(cmd: Sequence[str]) -> Optional[str]:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _torch_version() -> Optional[str]:
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def machine_facts() -> dict:
    return {
        "cores": os.cpu_count(),
        "mem_total_bytes": _mem_total_bytes(),
        "memcpy_1thread_gbps": _copy_bandwidth_gbps(),
        "loadavg_1min": os.getloadavg()[0],
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": _torch_version(),
        "gloo": _command_output(["dpkg-query", "-W", "-f=${Version}", "libgloo-dev"]),
        "gradsync": _command_output(["git", "-C", ROOT, "describe", "--always", "--dirty"]),
        "hostname": platform.node(),
    }


def command_line() -> str:
    """The exact command, with the environment that changes what runs."""
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(os.environ.items())
           if k.startswith("GRADSYNC_BENCH_")]
    return " ".join(env + [shlex.join([sys.executable] + sys.argv)])


# --------------------------------------------------------------------------
# Reports.


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return "n/a" if v is None else str(v)


class Report:
    """One driver's tables and plots; ``write()`` makes bench-results/<name>.json."""

    def __init__(self, name: str):
        self.name = name
        self.command = command_line()
        self.started = time.time()
        self.machine = machine_facts()
        self.tables: List[dict] = []
        self.plots: List[str] = []
        self.notes: List[str] = []

    def table(self, title: str, columns: Sequence[str], rows: Iterable[Sequence],
              note: str = "") -> dict:
        """Records a table and prints it as markdown (rows keep raw numbers)."""
        t = {"title": title, "columns": list(columns), "rows": [list(r) for r in rows]}
        if note:
            t["note"] = note
        self.tables.append(t)
        print(f"\n## {title}\n")
        print("| " + " | ".join(t["columns"]) + " |")
        print("|" + "---|" * len(t["columns"]))
        for r in t["rows"]:
            print("| " + " | ".join(_cell(v) for v in r) + " |")
        if note:
            print(f"\n{note}")
        sys.stdout.flush()
        return t

    def plot(self, fig, stem: str) -> str:
        path = save_figure(fig, stem)
        self.plots.append(os.path.relpath(path, ROOT))
        print(f"\nplot: {os.path.relpath(path, ROOT)}", flush=True)
        return path

    def write(self) -> str:
        os.makedirs(RESULTS_DIR, exist_ok=True)
        path = os.path.join(RESULTS_DIR, f"{self.name}.json")
        doc = {"name": self.name, "command": self.command, "quick": quick(),
               "started_unix": self.started, "duration_s": time.time() - self.started,
               "machine": self.machine, "tables": self.tables, "plots": self.plots}
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"report: {os.path.relpath(path, ROOT)}", flush=True)
        return path


# --------------------------------------------------------------------------
# Progress on stderr.


class Progress:
    """``step(label)`` before each of ``total`` steps: prints the benchmark,
    step i/N, elapsed time and an estimate of the time left (from the mean
    step so far). One line per step unless stderr is a terminal."""

    def __init__(self, name: str, total: int):
        self.name, self.total, self.done = name, max(total, 1), 0
        self.start = time.monotonic()
        self.tty = sys.stderr.isatty()

    def step(self, label: str) -> None:
        elapsed = time.monotonic() - self.start
        eta = "?" if self.done == 0 else f"{elapsed / self.done * (self.total - self.done):.0f}s"
        line = (f"[{self.name}] {self.done + 1}/{self.total} {label} "
                f"elapsed={elapsed:.0f}s eta={eta}")
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        self.done += 1

    def finish(self) -> None:
        elapsed = time.monotonic() - self.start
        end = "\r\033[K" if self.tty else ""
        sys.stderr.write(f"{end}[{self.name}] done in {elapsed:.0f}s\n")
        sys.stderr.flush()


# --------------------------------------------------------------------------
# Plots.


def figure(title: str, xlabel: str, ylabel: str, size=(8, 5)):
    """A figure and its axes, titled and labelled (units in the labels)."""
    import matplotlib
    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=size)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)
    return fig, ax


def save_figure(fig, stem: str, dpi: int = 80) -> str:
    import matplotlib.pyplot as plt
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{stem}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def size_label(nbytes: float) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            v = nbytes / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2g} {unit}"
    return f"{nbytes:.0f} B"


# --------------------------------------------------------------------------
# Wrapping a C++ benchmark.


def _numeric(field: str):
    try:
        return float(field)
    except ValueError:
        return field


def parse_tables(lines: Sequence[str]) -> List[dict]:
    """The C++ benches' tables: markdown ones (titled by the last "## "
    heading before them) and aligned ones (runs of lines with the same number
    of fields after a header line without numbers)."""
    tables: List[dict] = []
    header: Optional[List[str]] = None
    heading = ""
    for line in lines:
        if line.startswith("## "):
            heading = line[3:].strip()
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if all(set(c) <= set("-: ") for c in cells):
                continue  # the separator under the header
            if header is None or len(cells) != len(header):
                header = cells
                tables.append({"title": heading or " ".join(cells), "columns": cells, "rows": []})
            else:
                tables[-1]["rows"].append([_numeric(c) for c in cells])
            continue
        fields = line.split()
        if not fields or line.startswith("#"):
            header = None
            continue
        numbers = sum(isinstance(_numeric(f), float) for f in fields)
        if numbers == 0 and len(fields) > 1:
            header = fields
            tables.append({"title": " ".join(fields), "columns": fields, "rows": []})
        elif header is not None and len(fields) == len(header):
            tables[-1]["rows"].append([_numeric(f) for f in fields])
        else:
            header = None
    return [t for t in tables if t["rows"]]


def wrap(name: str, cmd: List[str]) -> int:
    report = Report(name)
    report.command = command_line() + "  # runs: " + shlex.join(cmd)
    progress = Progress(name, 1)
    progress.step(shlex.join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line.rstrip("\n"))
    rc = proc.wait()
    progress.finish()
    report.tables = parse_tables(lines)
    report.tables.append({"title": "output", "columns": ["line"], "rows": [[l] for l in lines]})
    report.write()
    return rc


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--wrap":
        sys.exit(wrap(sys.argv[2], sys.argv[3:]))
    print(__doc__)
    sys.exit(2)
