#!/usr/bin/env python3
"""Benchmark of catch-up reads: a ledger written over ZeroMQ to three bookie processes,
then read back from its first entry to its last, beside raw pyzmq in the same run.

Usage::

    python benchmarks/read_bench.py [--quick] [--dir DIR]

Measured, in order (the child processes are ``cluster_bench.py``'s: bookies with
``--serve``, the echo server with ``--echo``):

1. raw pyzmq between two processes: round trips with one message in flight (the limit
   of reading one entry per round trip), and 1 KiB messages with many in flight;
2. for E=3/Qw=2/Qa=2 (``pybk simpletest``'s default) and E=3/Qw=3/Qa=2: writing 1 KiB
   entries at full load (``cluster_bench.py``'s closed loop, on a fresh ledger), then,
   once the ledger is closed, reading every entry back in order through a new handle
   with ``LedgerHandle.read_entries`` (catch-up reads: many entries per READ_BATCH,
   several requests in flight), and a sample read one ``read_entry`` at a time (one
   round trip each, as ``read_entries`` did before).

Every entry read is checked (its id and bytes).  Progress goes to stderr; stdout gets
one JSON line with every figure.  Targets are reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass, replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from cluster_bench import (  # noqa: E402
    CONFIGS,
    ENTRY_BYTES,
    FULL,
    PAYLOAD,
    QUICK,
    Adds,
    Children,
    CpuUse,
    Profile,
    closed_loop,
    measure_pybk,
    measure_raw_zmq,
)
from rawdisk import mb_per_s, ratio, run_and_report  # noqa: E402

from pybk.client.bookkeeper import BookKeeper  # noqa: E402

#: Catch-up reads are at least as fast as the writes of the same entries (issue 14).
TARGET_READ_TO_WRITE = 1.0


@dataclass(frozen=True)
class ReadProfile:
    """How long the writes run (``cluster_bench.py``'s profile) and how many entries are
    read one at a time."""

    writes: Profile
    single_reads: int


READ_QUICK = ReadProfile(replace(QUICK, warmup_seconds=0.5, load_seconds=4.0), 2000)
READ_FULL = ReadProfile(replace(FULL, warmup_seconds=1.0, load_seconds=10.0), 5000)


def say(message: str) -> None:
    """A progress line (stderr, so that stdout holds only the JSON result)."""
    print(f"[read_bench] {message}", file=sys.stderr, flush=True)


def timed_reads(entries, first: int, count: int) -> float:
    """Seconds to take ``count`` entries from ``entries``, checking each one."""
    started = time.perf_counter()
    expected = first
    for entry in entries:
        if entry.entry_id != expected or entry.data != PAYLOAD:
            raise RuntimeError(f"entry {entry.entry_id} read back wrong (expected entry "
                               f"{expected}, {len(PAYLOAD)} bytes of the payload)")
        expected += 1
    if expected != first + count:
        raise RuntimeError(f"read {expected - first} entries, not {count}")
    return time.perf_counter() - started


def measure_config(bk: BookKeeper, name: str, quorums: tuple[int, int, int],
                   bookie_pids: list[int], profile: ReadProfile) -> dict:
    """Write a fresh ledger at full load, close it, read it all back, then a sample one
    entry at a time."""
    ledger = bk.create_ledger(*quorums)
    adds = Adds(ledger)
    write = closed_loop(adds, profile.writes)
    ledger.close()
    count = len(adds.start_ns)
    say(f"{name}: wrote {count:,} entries, {write['per_s']:,.0f} entries/s at full load")

    reader = bk.open_ledger(ledger.id, recovery=False)
    cpu = CpuUse(bookie_pids)
    seconds = timed_reads(reader.read_entries(0, count - 1), 0, count)
    read = {"entries": count, "seconds": round(seconds, 3),
            "per_s": round(count / seconds, 1),
            "mb_per_s": mb_per_s(count * ENTRY_BYTES, seconds),
            "cpu_us_per_entry": cpu.per_op(count)}
    say(f"{name}: read them back in {seconds:.2f} s, {read['per_s']:,.0f} entries/s; CPU "
        f"per entry: client {read['cpu_us_per_entry']['client']} µs, bookies "
        f"{read['cpu_us_per_entry']['servers']} µs")

    sample = min(profile.single_reads, count)
    seconds = timed_reads((reader.read_entry(i) for i in range(sample)), 0, sample)
    single = {"entries": sample, "per_s": round(sample / seconds, 1)}
    say(f"{name}: one read_entry at a time: {single['per_s']:,.0f} entries/s")
    bk.delete_ledger(ledger.id)
    ensemble, write_quorum, ack_quorum = quorums
    return {"ensemble": ensemble, "write_quorum": write_quorum, "ack_quorum": ack_quorum,
            "write": write, "catch_up_read": read, "single_reads": single,
            "read_to_write": ratio(read["per_s"], write["per_s"]),
            "read_to_single_reads": ratio(read["per_s"], single["per_s"])}


def run(profile: ReadProfile, workdir: str, children: Children) -> dict:
    """Every measurement, in order; returns the JSON-ready result."""
    started = time.perf_counter()
    load_1m = os.getloadavg()[0]
    say(f"run in {workdir}; load average {load_1m:.2f} on {os.cpu_count()} CPUs (other "
        "work on the machine skews every figure)")
    raw_zmq = measure_raw_zmq(children, profile.writes)
    pybk = measure_pybk(workdir, children, profile, measure_config)
    round_trips = raw_zmq["round_trip"]["per_s"]
    ratios = {name: {"read_to_write": pybk[name]["read_to_write"],
                     "read_to_single_reads": pybk[name]["read_to_single_reads"],
                     "read_to_raw_zmq_round_trips": ratio(
                         pybk[name]["catch_up_read"]["per_s"], round_trips)}
              for name, *_ in CONFIGS}
    targets = {f"{name}_read_to_write": {
        "value": ratios[name]["read_to_write"], "target": f">= {TARGET_READ_TO_WRITE:g}",
        "pass": ratios[name]["read_to_write"] >= TARGET_READ_TO_WRITE}
        for name, *_ in CONFIGS}
    targets["all_pass"] = all(t["pass"] for t in targets.values())
    for name, values in ratios.items():
        say(f"{name}: " + ", ".join(f"{key} {value}" for key, value in values.items()))
    return {"mode": "quick" if profile is READ_QUICK else "full", "dir": workdir,
            "python": sys.version.split()[0], "cpus": os.cpu_count(),
            "load_average_1m_at_start": round(load_1m, 2), "raw": {"zmq": raw_zmq},
            "pybk": pybk, "ratios": ratios, "targets": targets,
            "elapsed_s": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a shorter run (under a minute)")
    parser.add_argument("--dir", default=os.getcwd(),
                        help="where the fresh temporary directory is made (default: the "
                             "current directory)")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop the children.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    profile = READ_QUICK if args.quick else READ_FULL

    def measure(workdir: str) -> dict:
        with Children() as children:
            return run(profile, workdir, children)

    return run_and_report("pybk-read-bench-", args.dir, measure)


if __name__ == "__main__":
    sys.exit(main())
