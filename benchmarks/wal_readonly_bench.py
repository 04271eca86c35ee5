#!/usr/bin/env python3
"""How far behind its owner a read-only WAL reader in another process runs.

Usage::

    python benchmarks/wal_readonly_bench.py [--dir DIR] [--poll-ms N]

An owner process appends records holding the wall-clock time their append started, at a
steady gap (5 ms: a later entry's LAC makes each record visible; 200 ms: the owner's
explicit LAC does); this process tails the WAL with ``pybk.open_readonly`` and
``reader.tail(poll_interval=...)`` and measures, for each record, the time from the
start of its append to the moment the reader returned it.  Progress goes to stderr;
stdout gets one line, a JSON object with the median, 90th percentile and maximum lag per
gap, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import pybk  # noqa: E402

_STAMP = struct.Struct(">d")
#: (gap between appends in seconds, records) of each run.
RUNS = ((0.005, 400), (0.2, 25))
#: Records at the start of a run left out (the reader catching up with the owner's start).
WARM_UP = 5


def owner(directory: str, gap_s: float, count: int) -> None:
    """Append ``count`` stamped records ``gap_s`` apart, then stay open a moment."""
    with pybk.open(directory) as wal:
        for _ in range(count):
            wal.append(_STAMP.pack(time.time()))
            time.sleep(gap_s)
        time.sleep(1.0)


def measure(directory: str, gap_s: float, count: int, poll_s: float) -> dict:
    shutil.rmtree(directory, ignore_errors=True)
    with pybk.open(directory):
        pass  # the log exists before the reader opens it
    child = subprocess.Popen((sys.executable, __file__, "--owner", directory, str(gap_s),
                              str(count)))
    lags = []
    try:
        with pybk.open_readonly(directory) as wal:
            for _position, data in wal.reader().tail(10.0, poll_interval=poll_s):
                lags.append(time.time() - _STAMP.unpack(data)[0])
                if len(lags) == count:
                    break
    finally:
        child.wait(timeout=60)
    lags = sorted(lags[WARM_UP:])
    figures = {"records": len(lags), "median_ms": statistics.median(lags) * 1000,
               "p90_ms": lags[int(len(lags) * 0.9)] * 1000, "max_ms": lags[-1] * 1000}
    print(f"appends {gap_s * 1000:.0f} ms apart: {figures}", file=sys.stderr)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="where the WAL goes (default: a temporary directory)")
    parser.add_argument("--poll-ms", type=float, default=5.0,
                        help="the reader's poll interval (default 5)")
    parser.add_argument("--owner", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.owner:
        owner(args.owner[0], float(args.owner[1]), int(args.owner[2]))
        return
    base = args.dir or tempfile.mkdtemp(prefix="pybk-readonly-bench-")
    try:
        results = {f"gap_{gap_s * 1000:.0f}ms": measure(os.path.join(base, "wal"), gap_s,
                                                         count, args.poll_ms / 1000.0)
                   for gap_s, count in RUNS}
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(results, sort_keys=True))


if __name__ == "__main__":
    main()
