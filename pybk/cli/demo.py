"""The demo (``pybk demo``): an embedded WAL is written, killed with SIGKILL, reopened,
and every acknowledged record is verified.

A child process opens a WAL and appends 1 KiB records from four threads, one of them
pipelining ``append_async``; after each acknowledgement it reports the record's position
on stdout.  The parent kills it with SIGKILL mid-stream (no clean shutdown: the bookie
must replay its journal and the log must recover its last segment), reopens the WAL in
this process, reads everything back and checks that every acknowledged record is there,
at its position, byte for byte, in order.  Then it appends a little more, to show the
WAL goes on where it stopped.  Exit status 0 when every record is verified, else 1
(with ``FAILED: ...`` on standard output, where the rest of the demo's story is).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from typing import Any

import pybk
from pybk.cli import options
from pybk.cluster import child
from pybk.log import Position

RECORD_BYTES = 1024
THREADS = 4
PIPELINE = 256


def add_commands(commands: Any) -> None:
    """Add ``demo`` to the ``pybk`` parser's ``commands``."""
    demo = commands.add_parser(
        "demo", help="an embedded WAL: appends, kill -9, restart, verify every record")
    demo.add_argument("--dir", help="data directory (default: a temporary one)")
    demo.add_argument("--seconds", type=options.positive(float), default=3.0,
                      help="how long the writer appends before it is killed")
    demo.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    demo.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    if args.child:  # the writer, started by run_demo
        write_child(args.dir, args.seconds)
        return 0
    return run_demo(args.dir, args.seconds)


def record(thread: int, index: int) -> bytes:
    """The one content of record ``index`` of ``thread``: 1 KiB derived from the two."""
    seed = hashlib.sha256(b"%d/%d" % (thread, index)).digest()
    return (seed * (RECORD_BYTES // len(seed)))[:RECORD_BYTES]


def write_child(directory: str, seconds: float) -> None:
    """Append for ``seconds``, printing ``<position> <thread> <index>`` per ack, then
    ``done`` and wait to be killed."""
    wal = pybk.open(directory, flushInterval=3_600_000)  # leave the data to the journal
    out_lock = threading.Lock()
    stop = time.monotonic() + seconds

    def report(lines: list[str]) -> None:
        with out_lock:
            sys.stdout.write("".join(lines))
            sys.stdout.flush()

    def blocking(thread: int) -> None:
        index = 0
        while time.monotonic() < stop:
            position = wal.append(record(thread, index))
            report([f"{position} {thread} {index}\n"])
            index += 1

    def pipelined(thread: int) -> None:
        in_flight: deque = deque()
        index = 0
        while time.monotonic() < stop:
            in_flight.append((index, wal.append_async(record(thread, index))))
            index += 1
            if len(in_flight) >= PIPELINE:
                report([f"{f.result()} {thread} {i}\n"
                        for i, f in (in_flight.popleft() for _ in range(PIPELINE // 2))])
        report([f"{f.result()} {thread} {i}\n" for i, f in in_flight])

    workers = [threading.Thread(target=pipelined, args=(0,))] + [
        threading.Thread(target=blocking, args=(t,)) for t in range(1, THREADS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    report(["done\n"])
    time.sleep(3600)  # the parent kills us: no clean close


def run_demo(directory: str | None, seconds: float) -> int:
    """Run the whole demo; returns the process exit code (0 when all records verified)."""
    own_dir = directory is None
    directory = directory or tempfile.mkdtemp(prefix="pybk-demo-", dir=os.getcwd())
    wal_dir = os.path.join(directory, "wal")
    try:
        print(f"pybk demo: an embedded WAL in {wal_dir}")
        acked, elapsed = _run_and_kill(wal_dir, seconds)
        if not acked:
            print("FAILED: the writer acknowledged nothing before it was killed")
            return 1
        print(f"writer: {len(acked):,} records of {RECORD_BYTES} B appended durably by "
              f"{THREADS} threads in {elapsed:.2f} s ({len(acked) / elapsed:,.0f} "
              "appends/s), then killed with SIGKILL")
        return _verify(wal_dir, acked)
    finally:
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)


def _run_and_kill(wal_dir: str, seconds: float) -> tuple[dict[Position, bytes], float]:
    writer = subprocess.Popen(child.command("demo", "--child", "--dir", wal_dir,
                                            "--seconds", str(seconds)),
                              stdout=subprocess.PIPE, text=True, env=child.environment())
    acked: dict[Position, bytes] = {}
    started = None
    assert writer.stdout is not None  # stdout=PIPE
    try:
        for line in writer.stdout:
            if line == "done\n":
                break
            if started is None:
                started = time.perf_counter()
            position, thread, index = line.split()
            acked[Position.parse(position)] = record(int(thread), int(index))
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(30)
    return acked, time.perf_counter() - (started or time.perf_counter())


def _verify(wal_dir: str, acked: dict[Position, bytes]) -> int:
    started = time.perf_counter()
    with pybk.open(wal_dir) as wal:
        reopened = time.perf_counter() - started
        replayed = wal.bookie.replay_stats
        print(f"restart: WAL reopened in {reopened:.2f} s (replayed "
              f"{replayed['records']:,} journal records, {replayed['bytes'] / 1e6:.1f} MB; "
              "the last segment recovered and closed)")
        started = time.perf_counter()
        records = list(wal.read())
        read_seconds = time.perf_counter() - started
        found = dict(records)
        in_order = all(a[0] < b[0] for a, b in zip(records, records[1:]))
        missing = sum(found.get(position) != data for position, data in acked.items())
        after = wal.append(b"one more record after the restart")
    if missing or not in_order:
        print(f"FAILED: {missing} of {len(acked)} acknowledged records missing or "
              f"different; positions in order: {in_order}")
        return 1
    print(f"verified: all {len(acked):,} acknowledged records read back at their positions, "
          f"byte-identical and in order ({len(records):,} records in the WAL, read at "
          f"{len(records) / read_seconds:,.0f} records/s)")
    print(f"the WAL goes on: the next record went to position {after}")
    return 0
