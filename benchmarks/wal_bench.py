#!/usr/bin/env python3
"""Benchmark of pybk's embedded WAL against the raw disk, SQLite and LMDB, in one run.

Usage::

    python benchmarks/wal_bench.py [--quick] [--dir DIR] [--plot FILE.png] [--sweep-only]

Every figure is for durable 1 KiB appends (acknowledged only once fdatasync'd):

* the WAL with ``append_async`` pipelined (many records in flight from one thread);
* the WAL, SQLite and LMDB with 1, 8 and 64 threads each calling a blocking append;
* the WAL through its asyncio face (:mod:`pybk.aio`): one task keeping as many records in
  flight with ``submit``, and 64 tasks each awaiting ``append``, with their ratios to
  the thread rows above;
* the raw write(4 KiB)+fdatasync loops and durable sequential bandwidth of
  :mod:`rawdisk`, on the same disk; the pipelined row notes the bytes the process wrote
  to disk per append (journal, its zero fill, entry logs, index: /proc/self/io) and the
  rate the raw bandwidth allows at that;
* the floor of blocking appends from many threads in Python: the same thread counts
  around a bare group commit (no storage: one committer thread sleeps the same run's raw
  fdatasync p50 per group, GIL released, and wakes the group's threads), so the WAL's
  thread rows have a same-run bound to be read against;
* the floor of a pipelined durable append in Python (:mod:`append_floor`: a checksum and
  a Future per record, a group commit into a zero-filled journal file, a second write to
  an entry-log file, no engine), driven by the same loop as the WAL's pipelined row;
* latency against offered load: ``append_async`` open loop at a sweep of fixed rates up
  to the pipelined rate, p50 and p99 at each (``--sweep-only`` runs just this, after the
  pipelined rate it is scaled to); ``--plot FILE.png`` draws it (:mod:`plot`);
* the cost of metrics: the WAL pipelined and with one thread, with and without a
  Prometheus registry (``pybk.open(..., metrics_registry=)``), alternating, three times each
  (``--metrics-only`` runs just this);
* deferred sync against durable appends, measured the same way (``--deferred-only`` runs
  just this): the WAL opened with ``deferredSync=True`` acknowledges an append once it
  is written, before fdatasync, so these rows are *not* durable appends; a pipelined run
  ends with one ``wal.sync()``, counted in its time.

SQLite runs in WAL journal mode with ``synchronous=FULL``, one record per transaction,
one connection per thread; LMDB commits one synced write transaction per record.
Progress goes to stderr; stdout gets one line, a JSON object with every figure.  Targets
are reported with pass/fail booleans, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import lmdb
from prometheus_client import CollectorRegistry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from append_floor import AppendFloor  # noqa: E402
from plot import PlottingUnavailable, check_plotting, plot_latency  # noqa: E402
from rawdisk import MIB, latency_summary, measure_raw, ratio, run_and_report  # noqa: E402

import pybk  # noqa: E402
import pybk.aio  # noqa: E402

RECORD = 1024
THREAD_COUNTS = (1, 8, 64)
ASYNCIO_TASKS = 64
TARGET_PIPELINED_PER_S = 200_000
TARGET_64_THREADS_PER_S = 40_000
TARGET_SINGLE_P50_RATIO = 1.5
TARGET_SINGLE_OVER_SQLITE = 1.0     # one thread's appends/s over SQLite's, same run
#: Offered loads of the open-loop sweep (appends/s): those under the pipelined rate
#: measured in the same run, then SWEEP_TOP_FRACTION of that rate.
SWEEP_RATES = (500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000)
SWEEP_TOP_FRACTION = 0.9
#: The open-loop producer sleeps at least this long between rounds, then appends every
#: record that fell due (each charged from its scheduled time), as an application's
#: records come in bursts too.
OPEN_LOOP_TICK_S = 0.001
SWEEP_IN_FLIGHT_MAX = 200_000      # a safety limit: past it the producer waits
SWEEP_DRAIN_TIMEOUT_S = 60.0       # the last appends of a rate are acknowledged
FLOOR_WAIT_S = 1.0                 # the thread floor's waits (bounded: its stop is a flag)


@dataclass(frozen=True)
class Profile:
    name: str
    raw_seconds: float     # each raw fdatasync loop
    raw_max_ops: int
    pipelined: int         # records appended with append_async
    window: int            # records in flight at most
    seconds: float         # each threaded measurement
    bandwidth_mb: int      # the raw durable bandwidth test writes this many MiB
    sweep_warmup: float    # start of each open-loop rate, not counted
    sweep_seconds: float   # counted part of each open-loop rate


QUICK = Profile("quick", raw_seconds=1.5, raw_max_ops=16_384, pipelined=200_000,
                window=20_000, seconds=2.0, bandwidth_mb=256, sweep_warmup=0.5, sweep_seconds=1.5)
FULL = Profile("full", raw_seconds=5.0, raw_max_ops=65_536, pipelined=1_000_000,
               window=20_000, seconds=6.0, bandwidth_mb=1024, sweep_warmup=1.0, sweep_seconds=5.0)


def say(message: str) -> None:
    print(f"[wal_bench] {message}", file=sys.stderr, flush=True)


# -- the systems under test ------------------------------------------------------------

class WalSystem:
    name = "pybk WAL"

    def __init__(self, workdir: str, metrics: bool = False, deferred: bool = False) -> None:
        self.wal = pybk.open(os.path.join(workdir, "wal"),
                             metrics_registry=CollectorRegistry() if metrics else None,
                             deferredSync=deferred)

    def append(self) -> Callable[[bytes], object]:
        return self.wal.append

    def close(self) -> None:
        self.wal.close()


class SqliteSystem:
    name = "SQLite"

    def __init__(self, workdir: str) -> None:
        self.path = os.path.join(workdir, "bench.sqlite")
        with sqlite3.connect(self.path) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE log (id INTEGER PRIMARY KEY, data BLOB)")
        self.local = threading.local()
        self.connections: list[sqlite3.Connection] = []
        self.lock = threading.Lock()

    def append(self) -> Callable[[bytes], object]:
        db = sqlite3.connect(self.path, timeout=60, isolation_level=None,
                             check_same_thread=False)
        db.execute("PRAGMA synchronous=FULL")
        with self.lock:
            self.connections.append(db)

        def insert(data: bytes) -> None:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO log (data) VALUES (?)", (data,))
            db.execute("COMMIT")
        return insert

    def close(self) -> None:
        for db in self.connections:
            db.close()


class LmdbSystem:
    name = "LMDB"

    def __init__(self, workdir: str) -> None:
        self.env = lmdb.open(os.path.join(workdir, "lmdb"), map_size=4 << 30, sync=True,
                             metasync=True, max_spare_txns=128)
        self.counter = iter(range(1 << 62))
        self.lock = threading.Lock()

    def append(self) -> Callable[[bytes], object]:
        def put(data: bytes) -> None:
            with self.lock:
                key = next(self.counter).to_bytes(8, "big")
            with self.env.begin(write=True) as txn:  # commit syncs (sync=True)
                txn.put(key, data, append=False)
        return put

    def close(self) -> None:
        self.env.close()


# -- measurements ------------------------------------------------------------------------

def threaded(system, threads: int, seconds: float) -> dict:
    """``threads`` threads appending 1 KiB records for ``seconds``: rate and latency."""
    payload = os.urandom(RECORD)
    appends = [system.append() for _ in range(threads)]
    samples: list[list[int]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads + 1)
    stop_at = [0.0]

    def work(number: int) -> None:
        append, mine, clock = appends[number], samples[number], time.perf_counter_ns
        start.wait()
        while time.monotonic() < stop_at[0]:
            begin = clock()
            append(payload)
            mine.append(clock() - begin)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    stop_at[0] = time.monotonic() + seconds
    started = time.perf_counter()
    start.wait()
    for worker in workers:
        worker.join()
    return latency_summary([s for mine in samples for s in mine],
                           time.perf_counter() - started)


def thread_floor(threads: int, sync_s: float, seconds: float) -> dict:
    """What ``threads`` Python threads that each wait for a group commit reach with no
    storage at all: each puts a token in the current group and waits for its event; one
    committer takes the group, sleeps ``sync_s`` (an fdatasync, GIL released) and sets
    the event.  Appends/s and CPU µs per append (the whole process's)."""
    lock = threading.Lock()
    arrived = threading.Condition(lock)
    state: dict = {"group": 0, "event": threading.Event(), "stop": False}
    counts = [0] * threads

    def work(number: int) -> None:
        done = 0
        while not state["stop"]:
            with lock:
                state["group"] += 1
                event = state["event"]
                arrived.notify()
            event.wait(FLOOR_WAIT_S)
            done += 1
        counts[number] = done

    def commit() -> None:
        while not state["stop"]:
            with lock:
                while not state["group"] and not state["stop"]:
                    arrived.wait(FLOOR_WAIT_S)
                event = state["event"]
                state["group"], state["event"] = 0, threading.Event()
            time.sleep(sync_s)
            event.set()
        state["event"].set()

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    workers.append(threading.Thread(target=commit))
    cpu_before, started = time.process_time(), time.perf_counter()
    for worker in workers:
        worker.start()
    time.sleep(seconds)
    state["stop"] = True
    for worker in workers:
        worker.join(FLOOR_WAIT_S * 10)
    elapsed = time.perf_counter() - started
    total = sum(counts)
    return {"threads": threads, "sync_us": round(sync_s * 1e6, 1),
            "per_s": round(total / elapsed, 1),
            "cpu_us_per_append": round((time.process_time() - cpu_before) / total * 1e6, 1)}


def written_bytes() -> int:
    """Bytes this process sent to storage so far (journal, zero fill ahead of it, entry
    logs, index), from /proc; 0 where there is no such count."""
    try:
        with open("/proc/self/io", encoding="ascii") as io:
            return next(int(line.split()[1]) for line in io
                        if line.startswith("write_bytes:"))
    except (OSError, StopIteration, ValueError):
        return 0


def pipelined(wal, count: int, window: int) -> dict:
    """One thread keeps up to ``window`` ``append_async`` calls in flight; with the bytes
    the process wrote to disk per append meanwhile, and the CPU it used per append (all
    its threads; ``kernel_us_per_append`` of it in the kernel: above all the copies into
    the page cache, see benchmarks/README.md)."""
    payload = os.urandom(RECORD)
    in_flight: deque = deque()
    written_before = written_bytes()
    kernel_before = os.times().system
    cpu_before, started = time.process_time(), time.perf_counter()
    for _ in range(count):
        in_flight.append(wal.append_async(payload))
        if len(in_flight) >= window:
            in_flight.popleft().result()
    last = None
    for future in in_flight:
        last = future.result()
    wal.sync()  # a no-op for durable appends; what makes deferred ones durable
    elapsed = time.perf_counter() - started
    cpu_us = (time.process_time() - cpu_before) / count * 1e6
    kernel_us = (os.times().system - kernel_before) / count * 1e6
    return {"records": count, "per_s": round(count / elapsed, 1),
            "cpu_us_per_append": round(cpu_us, 2),
            "kernel_us_per_append": round(kernel_us, 2),
            "mb_per_s": round(count * RECORD / MIB / elapsed, 1), "last_position": str(last),
            "disk_bytes_per_append": round((written_bytes() - written_before) / count)}


def floor_pipelined(workdir: str, profile: Profile) -> dict:
    """:func:`pipelined` against :class:`append_floor.AppendFloor`: the least a pipelined
    durable append costs here in Python."""
    directory = os.path.join(workdir, "floor")
    os.makedirs(directory)
    floor = AppendFloor(directory)
    try:
        return pipelined(floor, profile.pipelined, profile.window)
    finally:
        floor.close()
        shutil.rmtree(directory, ignore_errors=True)


def asyncio_rows(directory: str, profile: Profile) -> dict:
    """The WAL's asyncio face, in a WAL of its own: one task keeping ``window`` records in
    flight with ``submit``, then ASYNCIO_TASKS tasks each awaiting ``append`` for
    ``seconds``."""
    payload = os.urandom(RECORD)

    async def measure() -> dict:
        async with await pybk.aio.open(directory, max_pending=profile.window) as wal:
            in_flight: deque = deque()
            started = time.perf_counter()
            for _ in range(profile.pipelined):
                in_flight.append(await wal.submit(payload))
                if len(in_flight) >= profile.window:
                    await in_flight.popleft()
            last = None
            for future in in_flight:
                last = await future
            elapsed = time.perf_counter() - started
            pipelined = {"records": profile.pipelined,
                         "per_s": round(profile.pipelined / elapsed, 1),
                         "last_position": str(last)}
            counts = [0] * ASYNCIO_TASKS
            stop_at = time.monotonic() + profile.seconds

            async def task(number: int) -> None:
                while time.monotonic() < stop_at:
                    await wal.append(payload)
                    counts[number] += 1

            started = time.perf_counter()
            await asyncio.gather(*(task(n) for n in range(ASYNCIO_TASKS)))
            elapsed = time.perf_counter() - started
            return {"pipelined": pipelined,
                    f"tasks_{ASYNCIO_TASKS}": {"records": sum(counts),
                                               "per_s": round(sum(counts) / elapsed, 1)}}

    return asyncio.run(measure())


class _Completions:
    """Timestamps the acknowledgement of each open-loop append, on a thread of its own
    that waits for the futures in order (as an application waiting for its records
    would; a batch's records complete together, so it wakes once per batch)."""

    def __init__(self) -> None:
        self.futures: deque = deque()
        self.done_ns: list[int] = []
        self.errors: list[BaseException] = []
        self._more = threading.Semaphore(0)
        self._thread = threading.Thread(target=self._run, name="sweep-completions")
        self._thread.start()

    def add(self, future) -> None:
        self.futures.append(future)
        self._more.release()

    def finish(self, timeout: float) -> None:
        """Wait for every future added (TimeoutError after ``timeout`` seconds)."""
        self.futures.append(None)  # the end
        self._more.release()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"open-loop appends unacknowledged after {timeout} s")
        if self.errors:
            raise RuntimeError(f"{len(self.errors)} open-loop appends failed; first: "
                               f"{self.errors[0]!r}")

    def _run(self) -> None:
        clock, done = time.perf_counter_ns, self.done_ns
        while True:
            self._more.acquire()
            future = self.futures.popleft()
            if future is None:
                return
            try:
                future.result(SWEEP_DRAIN_TIMEOUT_S)
            except Exception as e:  # reported by finish()
                self.errors.append(e)
            done.append(clock())


def open_loop(wal, rate_per_s: float, profile: Profile) -> dict:
    """``rate_per_s`` ``append_async`` calls per second on a fixed schedule, whatever the
    acknowledgements do: the rate and latency of the appends acknowledged in the counted
    part.  Latency counts from each record's scheduled time, so an append that fell
    behind is charged its delay (no coordinated omission)."""
    payload = os.urandom(RECORD)
    clock = time.perf_counter_ns
    interval_ns = 1e9 / rate_per_s
    completions = _Completions()
    scheduled: list[int] = []
    begin = clock()
    measure_from = begin + int(profile.sweep_warmup * 1e9)
    measure_to = measure_from + int(profile.sweep_seconds * 1e9)
    try:
        while (now := clock()) < measure_to:
            due = int((now - begin) / interval_ns) + 1
            while len(scheduled) < due:
                if len(scheduled) - len(completions.done_ns) >= SWEEP_IN_FLIGHT_MAX:
                    time.sleep(OPEN_LOOP_TICK_S)
                    break
                scheduled.append(begin + int(len(scheduled) * interval_ns))
                completions.add(wal.append_async(payload))
            pause_ns = begin + int(len(scheduled) * interval_ns) - clock()
            if pause_ns > 0:
                time.sleep(max(pause_ns / 1e9, OPEN_LOOP_TICK_S))
    finally:
        completions.finish(SWEEP_DRAIN_TIMEOUT_S)
    latencies = [done - start for start, done in zip(scheduled, completions.done_ns)
                 if measure_from <= done < measure_to]
    figures = latency_summary(latencies, profile.sweep_seconds)
    figures["offered_per_s"] = round(rate_per_s, 1)
    return figures


def sweep_rates(pipelined_per_s: float) -> list[float]:
    """The offered loads for a WAL whose pipelined rate is ``pipelined_per_s``."""
    top = SWEEP_TOP_FRACTION * pipelined_per_s
    return [rate for rate in SWEEP_RATES if rate < top] + [
        round(top, -2) if top >= 1000 else max(1.0, round(top))]


def sweep(workdir: str, profile: Profile, pipelined_per_s: float) -> list[dict]:
    """The WAL's latency at each offered load of :func:`sweep_rates`, each rate in a
    fresh WAL (so no rate inherits another's backlog or journal files)."""
    rows = []
    for number, rate in enumerate(sweep_rates(pipelined_per_s)):
        directory = os.path.join(workdir, f"sweep-{number}")
        os.makedirs(directory)
        system = WalSystem(directory)
        try:
            rows.append(figures := open_loop(system.wal, rate, profile))
        finally:
            system.close()
        shutil.rmtree(directory, ignore_errors=True)
        say(f"WAL open loop at {rate:,.0f}/s offered: {figures['per_s']:,.0f}/s, "
            f"p50 {figures['p50_us']} µs, p99 {figures['p99_us']} µs")
    return rows


def sweep_only(workdir: str, profile: Profile) -> dict:
    """The pipelined rate (in a WAL of its own), then the sweep scaled to it."""
    directory = os.path.join(workdir, "pipelined")
    os.makedirs(directory)
    system = WalSystem(directory)
    try:
        figures = pipelined(system.wal, profile.pipelined, profile.window)
    finally:
        system.close()
    shutil.rmtree(directory, ignore_errors=True)
    say(f"WAL append_async pipelined: {figures['per_s']:,.0f}/s")
    return {"profile": profile.name, "record_bytes": RECORD, "wal_pipelined": figures,
            "wal_sweep": sweep(workdir, profile, figures["per_s"])}


def compare(workdir: str, profile: Profile, topic: str,
            variants: dict[str, dict]) -> dict[str, dict[str, float]]:
    """The WAL opened with each of ``variants`` (name -> WalSystem options), alternating
    (each in turn, three times) so that drift of the disk or the machine weighs on all;
    the best figures of each."""
    best: dict[str, dict[str, float]] = {name: {} for name in variants}
    for round_number in range(3):
        for variant, options in variants.items():
            directory = os.path.join(workdir, f"{topic}-{variant}-{round_number}")
            os.makedirs(directory)
            system = WalSystem(directory, **options)
            try:
                figures = {"pipelined_per_s": pipelined(system.wal, profile.pipelined // 2,
                                                        profile.window)["per_s"],
                           "threads_1_per_s": threaded(system, 1, profile.seconds)["per_s"]}
            finally:
                system.close()
            shutil.rmtree(directory, ignore_errors=True)
            say(f"WAL {topic} {variant}: {figures['pipelined_per_s']:,.0f}/s pipelined, "
                f"{figures['threads_1_per_s']:,.0f}/s with one thread")
            for key, value in figures.items():
                best[variant][key] = max(best[variant].get(key, 0.0), value)
    return best


def metrics_cost(workdir: str, profile: Profile) -> dict:
    """The WAL without and with metrics: the best of each, and their ratios."""
    best = compare(workdir, profile, "metrics", {"off": {}, "on": {"metrics": True}})
    return {**best, "on_to_off": {key: ratio(best["on"][key], best["off"][key])
                                  for key in best["off"]}}


def deferred_gain(workdir: str, profile: Profile) -> dict:
    """The WAL with durable appends and with deferred sync: the best of each, and their
    ratios."""
    best = compare(workdir, profile, "sync", {"durable": {}, "deferred": {"deferred": True}})
    return {**best, "deferred_to_durable": {
        key: ratio(best["deferred"][key], best["durable"][key]) for key in best["durable"]}}


def run(workdir: str, profile: Profile, metrics_only: bool = False,
        deferred_only: bool = False) -> dict:
    say(f"{profile.name} run in {workdir}")
    results: dict = {"profile": profile.name, "record_bytes": RECORD}
    if not metrics_only:
        results["deferred_sync"] = deferred = deferred_gain(workdir, profile)
        say(f"ratio deferred/durable: {deferred['deferred_to_durable']}")
    if deferred_only:
        return results
    results["metrics"] = metrics = metrics_cost(workdir, profile)
    say(f"ratio metrics on/off: {metrics['on_to_off']}")
    if metrics_only:
        return results
    raw = measure_raw(workdir, profile.raw_seconds, profile.raw_max_ops,
                      profile.bandwidth_mb, say)
    results["raw"] = raw
    sync_s = raw["fdatasync_overwrite"]["p50_us"] / 1e6  # what a journal group pays
    for threads in THREAD_COUNTS:
        results[f"floor_threads_{threads}"] = figures = thread_floor(threads, sync_s,
                                                                     profile.seconds)
        say(f"floor, {threads} threads around a bare group commit: "
            f"{figures['per_s']:,.0f}/s, {figures['cpu_us_per_append']} µs CPU per append")
    results["floor_pipelined"] = figures = floor_pipelined(workdir, profile)
    say(f"floor, append_async pipelined with no engine: {figures['per_s']:,.0f}/s "
        f"({figures['disk_bytes_per_append']} bytes to disk per append)")
    systems = {"wal": WalSystem, "sqlite": SqliteSystem, "lmdb": LmdbSystem}
    for key, make in systems.items():
        directory = os.path.join(workdir, key)
        os.makedirs(directory)
        system = make(directory)
        try:
            if key == "wal":
                results["wal_pipelined"] = figures = pipelined(system.wal, profile.pipelined,
                                                               profile.window)
                bytes_per_append = figures["disk_bytes_per_append"]
                if bytes_per_append:  # what the disk's durable bandwidth allows
                    figures["disk_bound_per_s"] = round(
                        raw["durable_write_mb_s"] * MIB / bytes_per_append, 1)
                say(f"{system.name} append_async pipelined: {figures['per_s']:,.0f}/s "
                    f"({figures['mb_per_s']} MiB/s; {bytes_per_append} bytes to disk per "
                    f"append, {figures.get('disk_bound_per_s', 0):,.0f}/s at the raw "
                    "durable bandwidth)")
            for threads in THREAD_COUNTS:
                results[f"{key}_threads_{threads}"] = figures = threaded(system, threads,
                                                                         profile.seconds)
                say(f"{system.name}, {threads} threads: {figures['per_s']:,.0f}/s, "
                    f"p50 {figures['p50_us']} µs, p99 {figures['p99_us']} µs")
        finally:
            system.close()
        shutil.rmtree(directory, ignore_errors=True)
        if key == "wal":  # right after the thread rows, on the same disk
            results["wal_asyncio"] = aio = asyncio_rows(directory, profile)
            shutil.rmtree(directory, ignore_errors=True)
            say(f"WAL asyncio: {aio['pipelined']['per_s']:,.0f}/s pipelined (submit), "
                f"{aio[f'tasks_{ASYNCIO_TASKS}']['per_s']:,.0f}/s with {ASYNCIO_TASKS} "
                "tasks")
            results["wal_sweep"] = sweep(workdir, profile, results["wal_pipelined"]["per_s"])
    results["ratios"] = ratios = {}
    aio = results["wal_asyncio"]
    ratios["asyncio_to_threads"] = {
        "pipelined": ratio(aio["pipelined"]["per_s"], results["wal_pipelined"]["per_s"]),
        f"tasks_{ASYNCIO_TASKS}_to_threads_64": ratio(
            aio[f"tasks_{ASYNCIO_TASKS}"]["per_s"], results["wal_threads_64"]["per_s"])}
    for threads in THREAD_COUNTS:
        wal = results[f"wal_threads_{threads}"]["per_s"]
        ratios[f"wal_to_sqlite_threads_{threads}"] = ratio(
            wal, results[f"sqlite_threads_{threads}"]["per_s"])
        ratios[f"wal_to_lmdb_threads_{threads}"] = ratio(
            wal, results[f"lmdb_threads_{threads}"]["per_s"])
        ratios[f"wal_to_floor_threads_{threads}"] = ratio(
            wal, results[f"floor_threads_{threads}"]["per_s"])
    ratios["wal_pipelined_to_floor_pipelined"] = ratio(
        results["wal_pipelined"]["per_s"], results["floor_pipelined"]["per_s"])
    ratios["wal_pipelined_to_sqlite_threads_1"] = ratio(
        results["wal_pipelined"]["per_s"], results["sqlite_threads_1"]["per_s"])
    single_p50 = results["wal_threads_1"]["p50_us"]
    ratios["single_p50_to_raw_fdatasync_p50"] = {
        variant: ratio(single_p50, raw[f"fdatasync_{variant}"]["p50_us"])
        for variant in ("append", "fallocated", "overwrite")}
    reference = ratios["single_p50_to_raw_fdatasync_p50"]["append"]
    results["targets"] = {
        "pipelined_per_s": {"target": TARGET_PIPELINED_PER_S,
                            "measured": results["wal_pipelined"]["per_s"],
                            "met": results["wal_pipelined"]["per_s"] >= TARGET_PIPELINED_PER_S},
        "threads_64_per_s": {"target": TARGET_64_THREADS_PER_S,
                             "measured": results["wal_threads_64"]["per_s"],
                             "met": results["wal_threads_64"]["per_s"]
                             >= TARGET_64_THREADS_PER_S},
        "single_p50_ratio": {"target": TARGET_SINGLE_P50_RATIO, "measured": reference,
                             "met": reference <= TARGET_SINGLE_P50_RATIO},
        "threads_1_over_sqlite": {
            "target": TARGET_SINGLE_OVER_SQLITE,
            "measured": ratios["wal_to_sqlite_threads_1"],
            "met": ratios["wal_to_sqlite_threads_1"] >= TARGET_SINGLE_OVER_SQLITE},
    }
    for name, target in results["targets"].items():
        say(f"target {name}: {target['measured']} vs {target['target']}: "
            f"{'met' if target['met'] else 'MISSED'}")
    for name, value in ratios.items():
        say(f"ratio {name}: {value}")
    return results


def draw(results: dict, path: str) -> None:
    """The open-loop sweep of ``results`` as a PNG at ``path`` (noted in ``results``)."""
    rate = results["wal_pipelined"]["per_s"]
    raw = results.get("raw")  # not measured by --sweep-only
    references = {} if raw is None else {
        "raw write+fdatasync p50 (overwrite)": raw["fdatasync_overwrite"]["p50_us"]}
    results["plot"] = plot_latency(
        path, {"pybk WAL append_async": results["wal_sweep"]},
        f"Embedded WAL, durable 1 KiB appends, open loop (pipelined: {rate:,.0f}/s)",
        load_label="offered load (appends/s)", references_us=references)
    say(f"latency against offered load drawn in {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (under a minute)")
    parser.add_argument("--metrics-only", action="store_true",
                        help="only the WAL with and without metrics")
    parser.add_argument("--deferred-only", action="store_true",
                        help="only the WAL with durable appends and with deferred sync")
    parser.add_argument("--sweep-only", action="store_true",
                        help="only the pipelined rate and the open-loop sweep")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="draw latency against offered load into FILE.png (needs "
                             "matplotlib: pip install -e '.[bench]')")
    parser.add_argument("--dir", default=os.getcwd(),
                        help="where to make the temporary work directory (the disk tested)")
    args = parser.parse_args(argv)
    profile = QUICK if args.quick else FULL
    if args.plot is not None:
        if args.metrics_only or args.deferred_only:
            parser.error("--plot draws the sweep, which --metrics-only and "
                         "--deferred-only leave out")
        try:
            check_plotting()
        except PlottingUnavailable as e:
            parser.error(str(e))

    def measure(workdir: str) -> dict:
        if args.sweep_only:
            results = sweep_only(workdir, profile)
        else:
            results = run(workdir, profile, args.metrics_only, args.deferred_only)
        if args.plot is not None:
            draw(results, args.plot)
        return results

    return run_and_report("pybk-wal-bench-", args.dir, measure)


if __name__ == "__main__":
    sys.exit(main())
