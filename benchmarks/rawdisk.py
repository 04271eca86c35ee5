"""The raw limits of a disk, the statistics every pybk benchmark reports them with, and
the run every benchmark shares (:func:`run_and_report`).

Each benchmark measures these in the same run as its own figures and reports ratios to
them, because the machines are shared and their disks noisy.

The raw fdatasync loops write 4 KiB and call fdatasync, on a file prepared three ways:
``append`` (each write grows the file, so each sync also writes the size change),
``fallocated`` (space reserved with posix_fallocate) and ``overwrite`` (the range was
written and synced before, as a recycled journal would be).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Callable

MIB = 1024 * 1024
BLOCK = 4096                 # bytes per write of the raw fdatasync loops
BANDWIDTH_CHUNK = MIB        # bytes per write of the raw bandwidth test
BANDWIDTH_SYNC_EVERY = 8     # chunks between fdatasyncs of the raw bandwidth test


# -- statistics -------------------------------------------------------------------------

def percentile_us(sorted_ns: list[int], fraction: float) -> float:
    """The nearest-rank percentile of sorted nanosecond samples, in microseconds."""
    index = min(len(sorted_ns) - 1, max(0, round(fraction * len(sorted_ns)) - 1))
    return round(sorted_ns[index] / 1000.0, 1)


def latency_summary(samples_ns: list[int], elapsed_s: float) -> dict:
    """Operation count, operations per second, p50 and p99 latency (µs)."""
    ordered = sorted(samples_ns)
    return {"ops": len(ordered), "per_s": round(len(ordered) / elapsed_s, 1),
            "p50_us": percentile_us(ordered, 0.50), "p99_us": percentile_us(ordered, 0.99)}


def mb_per_s(nbytes: int, seconds: float) -> float:
    """MiB per second."""
    return round(nbytes / MIB / seconds, 1)


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, rounded (infinite for a zero denominator)."""
    return round(numerator / denominator, 3) if denominator else float("inf")


# -- raw disk limits --------------------------------------------------------------------

def write_fully(fd: int, data: bytes) -> None:
    """Write all of ``data`` at the file position."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def prepare_append(fd: int, nbytes: int) -> None:
    """Nothing: every write appends to an empty file (size changes on each sync)."""


def prepare_fallocate(fd: int, nbytes: int) -> None:
    """Reserve the space with posix_fallocate (unwritten extents on ext4/xfs)."""
    os.posix_fallocate(fd, 0, nbytes)


def prepare_zero_fill(fd: int, nbytes: int) -> None:
    """Write zeros over the whole range and sync them, so later writes overwrite."""
    zeros = bytes(MIB)
    for _ in range(0, nbytes, MIB):
        write_fully(fd, zeros)
    os.fsync(fd)
    os.lseek(fd, 0, os.SEEK_SET)


RAW_VARIANTS: dict[str, Callable[[int, int], None]] = {
    "append": prepare_append,
    "fallocated": prepare_fallocate,
    "overwrite": prepare_zero_fill,
}


def timed_sync_loop(fd: int, seconds: float, max_ops: int) -> tuple[list[int], float]:
    """write(4 KiB) + fdatasync until the time budget or ``max_ops``: latencies (ns), time."""
    block = b"\xa5" * BLOCK
    samples: list[int] = []
    clock = time.perf_counter_ns
    started = clock()
    deadline = started + int(seconds * 1e9)
    while len(samples) < max_ops:
        begin = clock()
        os.write(fd, block)
        os.fdatasync(fd)
        end = clock()
        samples.append(end - begin)
        if end >= deadline:
            break
    return samples, (clock() - started) / 1e9


def raw_fdatasync(workdir: str, variant: str, seconds: float, max_ops: int) -> dict:
    """The write+fdatasync loop on a new file prepared as ``variant`` says."""
    path = os.path.join(workdir, f"raw-{variant}.dat")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        RAW_VARIANTS[variant](fd, max_ops * BLOCK)
        samples, elapsed = timed_sync_loop(fd, seconds, max_ops)
    finally:
        os.close(fd)
        os.unlink(path)
    return latency_summary(samples, elapsed)


def raw_durable_bandwidth(workdir: str, megabytes: int) -> float:
    """MiB/s appending 1 MiB chunks with an fdatasync every 8 MiB (and one at the end)."""
    path = os.path.join(workdir, "raw-bandwidth.dat")
    chunk = os.urandom(BANDWIDTH_CHUNK)
    chunks = megabytes * MIB // BANDWIDTH_CHUNK
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        started = time.perf_counter()
        for number in range(1, chunks + 1):
            write_fully(fd, chunk)
            if number % BANDWIDTH_SYNC_EVERY == 0 or number == chunks:
                os.fdatasync(fd)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        os.unlink(path)
    return mb_per_s(chunks * BANDWIDTH_CHUNK, elapsed)


def measure_raw(workdir: str, seconds: float, max_ops: int, bandwidth_mb: int,
                say: Callable[[str], None]) -> dict:
    """Every raw figure of the disk under test: each fdatasync loop runs ``seconds`` or
    ``max_ops`` writes; the bandwidth test writes ``bandwidth_mb`` MiB (0: skipped)."""
    raw: dict = {}
    for variant in RAW_VARIANTS:
        raw[f"fdatasync_{variant}"] = figures = raw_fdatasync(workdir, variant, seconds,
                                                              max_ops)
        say(f"raw fdatasync ({variant}): {figures['per_s']:.0f}/s, p50 {figures['p50_us']} µs, "
            f"p99 {figures['p99_us']} µs")
    if bandwidth_mb:
        raw["durable_write_mb_s"] = raw_durable_bandwidth(workdir, bandwidth_mb)
        say(f"raw durable sequential write: {raw['durable_write_mb_s']} MiB/s")
    return raw


def run_and_report(prefix: str, parent: str, measure: Callable[[str], dict]) -> int:
    """Run ``measure(workdir)`` in a new temporary directory under ``parent`` (the disk
    under test), delete the directory (also on failure), and print the figures as one
    JSON line on stdout.  Returns the exit code, 0."""
    workdir = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        result = measure(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0
