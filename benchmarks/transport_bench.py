#!/usr/bin/env python3
"""Benchmark of pybk's ZeroMQ transport: one client process, one bookie server process.

Usage::

    python benchmarks/transport_bench.py [--quick] [--dir DIR]

The bookie server runs in a child process (this script with ``--serve``), as bookies do,
so that client and server do not share one interpreter lock.  Measured, in order:

* ``sequential_rtt_per_s``: LAC reads, one in flight (a round trip through both Python
  event loops, no disk);
* ``pipelined_reads_per_s``: reads of a 1 KiB entry with ``WINDOW`` in flight;
* ``pipelined_adds_per_s``: durable 1 KiB adds with ``WINDOW`` in flight (journal
  fdatasync included; compare with ``storage_bench.py``'s in-process figure).

Progress goes to stderr; stdout gets one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from pybk.cluster import BookieServer, ZmqBookieClient  # noqa: E402
from pybk.settings import ServerSettings  # noqa: E402
from pybk.storage import Bookie, format_bookie, make_entry  # noqa: E402

KEY = b"transport-bench"
ENTRY_BYTES = 1024
WINDOW = 1000
LEDGER_READS, LEDGER_ADDS = 1, 2


def serve(directory: str) -> None:
    """Child process: serve a bookie until stdin closes; print the address first."""
    settings = ServerSettings(journalDirectory=os.path.join(directory, "journal"),
                              ledgerDirectories=(os.path.join(directory, "ledgers"),))
    format_bookie(settings)
    with Bookie(settings) as bookie, BookieServer(bookie, "tcp://127.0.0.1:*") as server:
        bookie.add_entry(LEDGER_READS, 0, make_entry(LEDGER_READS, 0, -1,
                                                     b"r" * (ENTRY_BYTES - 24)), KEY)
        print(server.address, flush=True)
        sys.stdin.read()


def pipelined(count: int, submit) -> float:
    """Operations per second with up to WINDOW futures outstanding."""
    window: deque = deque()
    started = time.perf_counter()
    for i in range(count):
        if len(window) >= WINDOW:
            window.popleft().result(timeout=60)
        window.append(submit(i))
    for future in window:
        future.result(timeout=60)
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer operations")
    parser.add_argument("--dir", default=".", help="where the bookie's files go")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    scale = 1 if args.quick else 5
    directory = tempfile.mkdtemp(prefix="pybk-transport-bench-", dir=args.dir)
    child = subprocess.Popen([sys.executable, __file__, "--serve", directory],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        address = child.stdout.readline().strip()
        print(f"bookie server at {address}", file=sys.stderr)
        results = {}
        with ZmqBookieClient("bench", address) as client:
            client.read_lac(LEDGER_READS).result(timeout=10)  # connected
            count = 4000 * scale
            started = time.perf_counter()
            for _ in range(count):
                client.read_lac(LEDGER_READS).result(timeout=10)
            results["sequential_rtt_per_s"] = round(count / (time.perf_counter() - started))
            print(f"sequential: {results['sequential_rtt_per_s']} round trips/s",
                  file=sys.stderr)
            results["pipelined_reads_per_s"] = round(pipelined(
                20_000 * scale, lambda i: client.read(LEDGER_READS, 0)))
            print(f"pipelined reads: {results['pipelined_reads_per_s']}/s", file=sys.stderr)
            body = b"a" * (ENTRY_BYTES - 24)
            results["pipelined_adds_per_s"] = round(pipelined(
                20_000 * scale, lambda i: client.add(
                    LEDGER_ADDS, i, make_entry(LEDGER_ADDS, i, i - 1, body), KEY)))
            print(f"pipelined adds: {results['pipelined_adds_per_s']}/s", file=sys.stderr)
        print(json.dumps(results))
    finally:
        child.stdin.close()
        child.wait(timeout=60)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
