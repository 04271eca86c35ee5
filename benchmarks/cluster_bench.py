#!/usr/bin/env python3
"""Benchmark of replicated writes: three bookie processes on loopback, beside the raw
disk, raw pyzmq and a three-server ZooKeeper, all measured in one run.

Usage::

    python benchmarks/cluster_bench.py [--quick] [--dir DIR] [--plot FILE.png]

Measured, in order (each on an otherwise idle machine: every child process of one
measurement is stopped before the next starts):

1. the raw disk: :func:`rawdisk.measure_raw`'s write(4 KiB)+fdatasync loops;
2. raw pyzmq between two processes (a DEALER here, a ROUTER echo child): round trips with
   one message in flight, and 1 KiB messages with ``ZMQ_PIPELINE`` in flight;
3. the replication floor (:mod:`replication_floor`): E=3/Qw=3/Qa=2 with no protocol, three
   group-committing echo servers that fdatasync and one Python client thread, in the
   same phases as pybk's, so that pybk's figures can be read against the least this
   machine needs for the same work; then the formats' floor, the same with BookKeeper's
   per-entry formats and a store's files (journal, entry log, index) added;
4. pybk: three bookie child processes (this script with ``--serve``), one client here
   (an :class:`EmbeddedMetadataStore`, three :class:`ZmqBookieClient` on one
   :class:`ClientLoop`), 1 KiB entries, for E=3/Qw=3/Qa=2 and E=3/Qw=2/Qa=2: full load
   (a window of adds in flight), then open-loop loads at half the full-load rate and at
   a fixed 5,000 entries/s (and, with ``--plot``, at a few more fixed rates: latency
   against offered load, drawn as a PNG); then, on the same bookies and client, a
   :class:`LogWriter` of E=3/Qw=3/Qa=2 appending 1 KiB records with ``append_async``
   pipelined (``wal_bench.py``'s loop and record size);
5. the embedded WAL (:func:`pybk.open` in the temporary directory, so on the disk under
   test), the same pipelined loop, right after the LogWriter's (the bookies up and
   idle): the rate the replicated log is read against;
6. ZooKeeper: a three-server ensemble on loopback (fsync on, as bookies do), kazoo's
   ``create_async`` of 1 KiB znodes with a window in flight.

Progress goes to stderr; stdout gets one line, a JSON object with every figure (see
``benchmarks/README.md``).  Targets are reported with pass/fail booleans, never asserted:
the exit code is non-zero only if the benchmark itself fails (an add refused, an entry
read back wrong, a child process that did not start).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable, Iterator

import zmq
from kazoo.client import KazooClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from plot import PlottingUnavailable, check_plotting, plot_latency  # noqa: E402
from rawdisk import latency_summary, mb_per_s, measure_raw, ratio, run_and_report  # noqa: E402
from replication_floor import FloorClient, serve_durable_group_echo  # noqa: E402
from wal_bench import RECORD, pipelined  # noqa: E402

import pybk  # noqa: E402
from pybk.client.bookkeeper import BookKeeper  # noqa: E402
from pybk.client.ledger import LedgerHandle  # noqa: E402
from pybk.log import LogWriter  # noqa: E402
from pybk.meta.embedded import EmbeddedMetadataStore  # noqa: E402
from pybk.net import BookieServer, ClientLoop, ZmqBookieClient  # noqa: E402
from pybk.settings import ClientSettings, LogSettings, ServerSettings  # noqa: E402
from pybk.storage import Bookie, format_bookie  # noqa: E402
from pybk.testing.zookeeper_server import ZooKeeperEnsemble  # noqa: E402

ENTRY_BYTES = 1024                 # payload of each entry, znode and pyzmq message
PAYLOAD = bytes(range(256)) * (ENTRY_BYTES // 256)
BOOKIES = 3
#: (name in the JSON, ensemble size, write quorum, ack quorum)
CONFIGS = (("e3_qw3_qa2", 3, 3, 2), ("e3_qw2_qa2", 3, 2, 2))
REFERENCE_CONFIG = "e3_qw3_qa2"    # the configuration the targets and ratios use
HALF_LOAD_FRACTION = 0.5
#: The fixed offered rate measured beside half load: a light load whatever the machine.
FIXED_RATE_PER_S = 5000.0
#: With ``--plot``, the reference configuration is also measured at these offered rates
#: (besides the fixed rate, half load and full load), for the latency curve.
SWEEP_RATES_PER_S = (1000.0, 2000.0)
#: The open-loop producer sleeps at least this long between rounds, then submits every
#: add that fell due (charged from its scheduled time): an application's adds come in
#: bursts too, and one wake-up per add would cost the client more than the add.
OPEN_LOOP_TICK_S = 0.001
ZMQ_PIPELINE = 1000                # raw pyzmq messages in flight
ZMQ_HWM = 100_000                  # high-water marks well above ZMQ_PIPELINE
ZK_SERVERS = 3
ZK_FORCE_SYNC = True               # fsync'd transaction logs, as bookies fsync journals
LOOPBACK_ANY_PORT = "tcp://127.0.0.1:*"

# Bounds on every wait, so a hung child or a lost reply fails the run instead of
# stalling it.
READY_TIMEOUT_S = 60.0             # a child prints its endpoint
STOP_GRACE_S = 15.0                # a child exits after SIGTERM (a bookie checkpoints)
DRAIN_TIMEOUT_S = 60.0             # outstanding adds / creates are acknowledged
RECV_TIMEOUT_MS = 10_000           # one raw pyzmq reply
ZK_CONNECT_TIMEOUT_S = 30.0

TARGET_ENTRIES_PER_S = 60_000
TARGET_ZOOKEEPER_RATIO = 10.0
TARGET_LIGHT_LOAD_P99_US = 10_000     # at half load and at the fixed rate
TARGET_LIGHT_LOAD_P50_US = 2_000
#: CPU per entry (client + bookies) at the fixed rate, at most this times full load's.
TARGET_CPU_PER_ENTRY_FIXED_TO_FULL = 1.5
#: Entries per ``add_entries`` call in the full-load phase that adds in runs.
RUN_ENTRIES = 100
#: Replicated LogWriter records/s, at least this times the embedded WAL's (both
#: pipelined, same run; issue 34).
TARGET_LOG_WRITER_TO_WAL = 0.7
#: Issue 34's targets against the replication floor of the same run (E3/Qw3/Qa2): full
#: load at least this times the floor's entries/s...
TARGET_FULL_LOAD_TO_FLOOR = 0.4
#: ...at most this times its CPU per entry...
TARGET_CPU_PER_ENTRY_TO_FLOOR = 3.0
#: ...and at 5,000/s and at half load, p50 and p99 at most this times the floor's.
TARGET_LATENCY_TO_FLOOR = 1.5
LOG_NAME = "bench-log"


@dataclass(frozen=True)
class Profile:
    """How long each measurement runs."""

    name: str
    raw_seconds: float        # each raw fdatasync loop...
    raw_max_ops: int          # ...or this many writes
    zmq_seconds: float        # each raw pyzmq test
    warmup_seconds: float     # start of each pybk / ZooKeeper load, not counted
    load_seconds: float       # counted part of each pybk / ZooKeeper load
    window: int               # pybk adds in flight at full load
    zk_window: int            # ZooKeeper creates in flight
    log_records: int          # records each pipelined log phase (LogWriter, WAL) appends
    log_window: int           # ...with at most this many in flight (wal_bench's window)


QUICK = Profile("quick", raw_seconds=1.0, raw_max_ops=8192, zmq_seconds=2.0,
                warmup_seconds=1.0, load_seconds=5.0, window=2000, zk_window=1000,
                log_records=200_000, log_window=20_000)
FULL = Profile("full", raw_seconds=3.0, raw_max_ops=32_768, zmq_seconds=5.0,
               warmup_seconds=2.0, load_seconds=15.0, window=2000, zk_window=1000,
               log_records=1_000_000, log_window=20_000)


def say(message: str) -> None:
    """A progress line (stderr, so that stdout holds only the JSON result)."""
    print(f"[cluster_bench] {message}", file=sys.stderr, flush=True)


# -- child processes --------------------------------------------------------------------

class Children:
    """The child processes of this run (this script in a server mode).

    Each child gets a pipe on stdin, its lifeline: it exits when the pipe closes, so no
    child outlives this process even if it is killed.  :meth:`stop` ends one (SIGTERM,
    SIGKILL after ``STOP_GRACE_S``) and reaps it; leaving the context stops every child
    still running, also when the run failed.
    """

    def __init__(self) -> None:
        self._running: list[subprocess.Popen] = []

    def __enter__(self) -> "Children":
        return self

    def __exit__(self, *exc: object) -> None:
        for child in reversed(self._running[:]):
            self.stop(child)

    def start(self, *args: str) -> tuple[subprocess.Popen, str]:
        """Run this script with ``args``; return the process and the first line it prints
        (its endpoint), waiting at most ``READY_TIMEOUT_S``."""
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), *args],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._running.append(child)
        ready, _, _ = select.select([child.stdout], [], [], READY_TIMEOUT_S)
        line = child.stdout.readline().strip() if ready else ""
        if not line:
            raise RuntimeError(f"child {' '.join(args)} printed no endpoint within "
                               f"{READY_TIMEOUT_S:.0f} s (exit code {child.poll()})")
        return child, line

    def stop(self, child: subprocess.Popen) -> None:
        """End ``child`` and reap it."""
        self._running.remove(child)
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                say(f"child {child.pid} ignored SIGTERM for {STOP_GRACE_S:.0f} s; killing it")
                child.kill()
                child.wait()
        child.stdin.close()
        child.stdout.close()


def on_lifeline_lost(action: Callable[[], None]) -> None:
    """In a child: run ``action`` once stdin reaches its end (the parent closed it or
    died)."""
    def watch() -> None:
        sys.stdin.read()
        action()
    threading.Thread(target=watch, name="lifeline", daemon=True).start()


def serve_bookie(directory: str) -> None:
    """Child process: format a bookie in ``directory``, serve it on a loopback port,
    print the endpoint, and close both cleanly on SIGTERM (or when the lifeline goes)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    on_lifeline_lost(stop.set)
    settings = ServerSettings(journalDirectory=os.path.join(directory, "journal"),
                              ledgerDirectories=(os.path.join(directory, "ledgers"),))
    format_bookie(settings)
    with Bookie(settings) as bookie, BookieServer(bookie, LOOPBACK_ANY_PORT) as server:
        print(server.address, flush=True)
        while not stop.wait(0.5):
            pass


def serve_echo() -> None:
    """Child process: a ROUTER on a loopback port sending every message back; prints the
    endpoint; ends on SIGTERM (default action) or when the lifeline goes."""
    on_lifeline_lost(lambda: os._exit(0))
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.SNDHWM, ZMQ_HWM)
    socket.setsockopt(zmq.RCVHWM, ZMQ_HWM)
    socket.bind(LOOPBACK_ANY_PORT)
    print(socket.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    while True:
        socket.send_multipart(socket.recv_multipart())


# -- CPU accounting -------------------------------------------------------------------------

def process_cpu_times(pid: int) -> tuple[float, float]:
    """User + system, and system, CPU seconds used so far by process ``pid`` (one read of
    /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()  # fields from the 3rd (state) on
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, int(fields[12]) / tick


def process_cpu_s(pid: int, kernel_only: bool = False) -> float:
    """User + system (``kernel_only``: system) CPU seconds used so far by process ``pid``."""
    total, kernel = process_cpu_times(pid)
    return kernel if kernel_only else total


class CpuUse:
    """CPU used from creation on by this process (the client) and by the server processes
    ``server_pids``, per operation: where the machine's cores went."""

    def __init__(self, server_pids: list[int]) -> None:
        self.server_pids = server_pids
        self.started = self._now()

    def _now(self) -> tuple[float, float, float]:
        servers = [process_cpu_times(pid) for pid in self.server_pids]
        return (time.process_time(), sum(total for total, _ in servers),
                sum(kernel for _, kernel in servers))

    def per_op(self, ops: int) -> dict:
        """µs of CPU per operation: ``client``, ``servers`` (``servers_kernel`` of it in
        the kernel: sockets, the copies into the page cache, syncs), their ``total``, and
        ``cpu_limit_per_s``, the rate at which these processes alone would keep every
        core of the machine busy."""
        client, servers, servers_kernel = (round((now - then) / max(ops, 1) * 1e6, 1)
                                           for now, then in zip(self._now(), self.started))
        return {"client": client, "servers": servers, "servers_kernel": servers_kernel,
                "total": round(client + servers, 1),
                "cpu_limit_per_s": round(os.cpu_count() * 1e6 / (client + servers), 1)
                if client + servers else None}


# -- raw pyzmq ----------------------------------------------------------------------------

def measure_raw_zmq(children: Children, profile: Profile) -> dict:
    """Round trips with one message in flight, and 1 KiB messages/s with ``ZMQ_PIPELINE``
    in flight, between a DEALER here and the echo child: the transport's ceiling with no
    protocol at all."""
    child, endpoint = children.start("--echo")
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    try:
        for option, value in ((zmq.LINGER, 0), (zmq.RCVTIMEO, RECV_TIMEOUT_MS),
                              (zmq.SNDTIMEO, RECV_TIMEOUT_MS), (zmq.SNDHWM, ZMQ_HWM),
                              (zmq.RCVHWM, ZMQ_HWM)):
            socket.setsockopt(option, value)
        socket.connect(endpoint)
        send, recv, clock = socket.send, socket.recv, time.perf_counter_ns
        send(PAYLOAD)
        recv()  # connected
        samples: list[int] = []
        cpu = CpuUse([child.pid])
        started = clock()
        deadline = started + int(profile.zmq_seconds * 1e9)
        while True:
            begin = clock()
            send(PAYLOAD)
            recv()
            end = clock()
            samples.append(end - begin)
            if end >= deadline:
                break
        figures = {"message_bytes": ENTRY_BYTES,
                   "round_trip": latency_summary(samples, (clock() - started) / 1e9)}
        rtt = figures["round_trip"]
        # The CPU floor of one message each way, wake-ups included: what every ADD
        # message and its reply cost before pybk does any work.
        rtt["cpu_us_per_round_trip"] = use = cpu.per_op(len(samples))
        say(f"raw pyzmq, 1 in flight: {rtt['per_s']:,.0f} round trips/s, "
            f"p50 {rtt['p50_us']} µs, p99 {rtt['p99_us']} µs; CPU per round trip: "
            f"here {use['client']} µs, echo {use['servers']} µs")
        for _ in range(ZMQ_PIPELINE):
            send(PAYLOAD)
        received = 0
        started = clock()
        deadline = started + int(profile.zmq_seconds * 1e9)
        while True:
            for _ in range(256):  # look at the clock once per batch
                recv()
                send(PAYLOAD)
            received += 256
            now = clock()
            if now >= deadline:
                break
        for _ in range(ZMQ_PIPELINE):
            recv()
        figures["pipelined"] = {"in_flight": ZMQ_PIPELINE, "messages": received,
                                "per_s": round(received / ((now - started) / 1e9), 1)}
        say(f"raw pyzmq, {ZMQ_PIPELINE} in flight: "
            f"{figures['pipelined']['per_s']:,.0f} 1 KiB messages/s")
        return figures
    finally:
        socket.close()
        context.term()
        children.stop(child)


# -- the floor of a replicated add -----------------------------------------------------

def measure_floor(workdir: str, children: Children, profile: Profile,
                  formats: bool = False) -> dict:
    """:mod:`replication_floor` for the reference configuration (three servers, each
    entry to all three, acknowledged by two): full load, half of its rate and
    :data:`FIXED_RATE_PER_S`, with the CPU per entry of each (client + servers).  With
    ``formats``, the formats' floor: the same with BookKeeper's per-entry formats."""
    name = "formats' floor" if formats else "replication floor"
    servers = []
    try:
        for number in range(BOOKIES):
            directory = os.path.join(workdir, f"floor-{'formats-' * formats}{number}")
            os.makedirs(directory)
            servers.append(children.start("--floor-formats" if formats else "--floor-echo",
                                          directory))
        client = FloorClient([endpoint for _, endpoint in servers], ack_quorum=2,
                             payload=PAYLOAD, formats=formats)
        pids = [child.pid for child, _ in servers]
        try:
            def phase(label: str, run: Callable[[], dict]) -> dict:
                cpu = CpuUse(pids)
                figures = run()
                figures["cpu_us_per_add"] = cpu.per_op(figures["entries"])
                say_phase(name, label, figures)
                return figures

            full = phase("full load", lambda: client.closed_loop(
                profile.window, profile.warmup_seconds, profile.load_seconds))
            half_rate = full["per_s"] * HALF_LOAD_FRACTION
            half = phase(f"at {half_rate:,.0f}/s offered", lambda: client.open_loop(
                half_rate, profile.warmup_seconds, profile.load_seconds))
            fixed = phase(f"at {FIXED_RATE_PER_S:,.0f}/s offered", lambda: client.open_loop(
                FIXED_RATE_PER_S, profile.warmup_seconds, profile.load_seconds))
        finally:
            client.close()
        return {"full_load": full, "half_load": half, "fixed_rate": fixed,
                "cpu_per_entry_5k_to_full": ratio(fixed["cpu_us_per_add"]["total"],
                                                  full["cpu_us_per_add"]["total"]),
                "sweep": [{"offered_per_s": phase.get("offered_per_s", phase["per_s"]),
                           "closed_loop": phase is full, "per_s": phase["per_s"],
                           "p50_us": phase["p50_us"], "p99_us": phase["p99_us"],
                           "cpu_us_per_entry": phase["cpu_us_per_add"]["total"]}
                          for phase in (fixed, half, full)]}
    finally:
        for child, _ in servers:
            children.stop(child)


# -- pybk ---------------------------------------------------------------------------------

class Adds:
    """One load phase on a fresh ledger: when each add was submitted (or, open loop,
    scheduled) and when it was acknowledged.

    The ledger acknowledges in entry-id order from the client's I/O thread, so
    ``done_ns[i]`` belongs to entry ``i`` (checked).  The producer sleeps on an event that
    the acknowledgement bringing the in-flight count down to ``_wake_at`` sets.
    """

    def __init__(self, ledger: LedgerHandle) -> None:
        self.ledger = ledger
        self.start_ns: list[int] = []
        self.done_ns: list[int] = []
        self.errors: list[BaseException] = []
        self.in_flight_max = 0
        self._wakeup = threading.Event()
        self._wake_at = -1

    @property
    def in_flight(self) -> int:
        return len(self.start_ns) - len(self.done_ns)

    def submit(self, start_ns: int, run: int = 1) -> None:
        """Add one entry (``run`` > 1: that many in one ``add_entries_then`` call), timed
        from ``start_ns``."""
        if run == 1:
            self.start_ns.append(start_ns)
            self.ledger.add_entry_then(PAYLOAD, self._on_done)
            return
        self.start_ns.extend(itertools.repeat(start_ns, run))
        self.ledger.add_entries_then([PAYLOAD] * run, functools.partial(self._on_run_done,
                                                                        run))

    def _on_done(self, entry_id: int | None, error: BaseException | None) -> None:
        self._on_run_done(1, entry_id, error)

    def _on_run_done(self, run: int, last: int | None, error: BaseException | None) -> None:
        done = self.done_ns
        if error is not None:
            self.errors.append(error)
        elif last != len(done) + run - 1:
            self.errors.append(RuntimeError(f"entry {last} acknowledged as number "
                                            f"{len(done) + run - 1}"))
        done.extend(itertools.repeat(time.perf_counter_ns(), run))
        if len(self.start_ns) - len(done) <= self._wake_at:
            self._wake_at = -1
            self._wakeup.set()

    def wait_in_flight(self, most: int, deadline: float) -> None:
        """Block until at most ``most`` adds are in flight (TimeoutError at the
        ``time.monotonic()`` deadline)."""
        self.in_flight_max = max(self.in_flight_max, self.in_flight)
        while self.in_flight > most:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.in_flight} adds still unacknowledged")
            self._wakeup.clear()
            self._wake_at = most
            if self.in_flight > most:  # re-check: an ack may have come before _wake_at
                self._wakeup.wait(0.05)
        self._wake_at = -1

    def summary(self, measure_from_ns: int, measure_to_ns: int) -> dict:
        """Rate and latency of the adds acknowledged in [from, to)."""
        if self.errors:
            raise RuntimeError(f"{len(self.errors)} adds failed; first: {self.errors[0]!r}")
        latencies = [done - start for start, done in zip(self.start_ns, self.done_ns)
                     if measure_from_ns <= done < measure_to_ns]
        seconds = (measure_to_ns - measure_from_ns) / 1e9
        figures = latency_summary(latencies, seconds)
        figures["mb_per_s"] = mb_per_s(figures["ops"] * ENTRY_BYTES, seconds)
        figures["in_flight_max"] = self.in_flight_max
        return figures


def closed_loop(adds: Adds, profile: Profile, run: int = 1) -> dict:
    """Full load: keep up to ``window`` adds in flight; at a full window, wait until half
    of it was acknowledged.  Latency counts from the add_entry_then call (``run`` > 1:
    adds made ``run`` at a time by ``add_entries_then``, each timed from its call)."""
    clock = time.perf_counter_ns
    begin = clock()
    measure_from = begin + int(profile.warmup_seconds * 1e9)
    measure_to = measure_from + int(profile.load_seconds * 1e9)
    deadline = time.monotonic() + profile.warmup_seconds + profile.load_seconds \
        + DRAIN_TIMEOUT_S
    window, resume_at = profile.window, profile.window // 2
    while (now := clock()) < measure_to:
        if adds.in_flight >= window:
            adds.wait_in_flight(resume_at, deadline)
        else:
            adds.submit(now, run)
    adds.wait_in_flight(0, deadline)
    figures = adds.summary(measure_from, measure_to)
    figures["window"] = window
    return figures


def open_loop(adds: Adds, rate_per_s: float, profile: Profile) -> dict:
    """``rate_per_s`` adds per second on a fixed schedule, whatever the acknowledgements
    do (up to ``4 x window`` in flight, a safety limit).  Latency counts from the
    scheduled time, so a submission that fell behind is charged its delay (no
    coordinated omission)."""
    clock = time.perf_counter_ns
    interval_ns = 1e9 / rate_per_s
    begin = clock()
    measure_from = begin + int(profile.warmup_seconds * 1e9)
    measure_to = measure_from + int(profile.load_seconds * 1e9)
    deadline = time.monotonic() + profile.warmup_seconds + profile.load_seconds \
        + DRAIN_TIMEOUT_S
    limit = 4 * profile.window
    submitted = 0
    while (now := clock()) < measure_to:
        due = int((now - begin) / interval_ns) + 1
        while submitted < due:
            if adds.in_flight >= limit:
                adds.wait_in_flight(limit - 1, deadline)
            adds.submit(begin + int(submitted * interval_ns))
            submitted += 1
        adds.in_flight_max = max(adds.in_flight_max, adds.in_flight)
        pause_ns = begin + int(submitted * interval_ns) - clock()
        if pause_ns > 0:
            time.sleep(max(pause_ns / 1e9, OPEN_LOOP_TICK_S))
    adds.wait_in_flight(0, deadline)
    figures = adds.summary(measure_from, measure_to)
    figures["offered_per_s"] = round(rate_per_s, 1)
    return figures


def load_phase(bk: BookKeeper, quorums: tuple[int, int, int], bookie_pids: list[int],
               run: Callable[[Adds], dict]) -> dict:
    """``run`` on a fresh ledger; then check the last entry reads back and close it."""
    ledger = bk.create_ledger(*quorums)
    adds = Adds(ledger)
    cpu = CpuUse(bookie_pids)
    figures = run(adds)
    figures["cpu_us_per_add"] = cpu.per_op(len(adds.start_ns))
    last = ledger.last_add_confirmed
    if last != len(adds.start_ns) - 1 or ledger.read_entry(last).data != PAYLOAD:
        raise RuntimeError(f"ledger {ledger.id}: LAC {last} after {len(adds.start_ns)} "
                           "adds, or its last entry read back wrong")
    ledger.close()
    return figures


def say_phase(name: str, label: str, figures: dict) -> None:
    """The progress line of one load phase."""
    cpu = figures["cpu_us_per_add"]
    say(f"{name} {label}: {figures['per_s']:,.0f} entries/s, p50 "
        f"{figures['p50_us'] / 1000:.1f} ms, p99 {figures['p99_us'] / 1000:.1f} ms; CPU per "
        f"add: client {cpu['client']} µs, bookies {cpu['servers']} µs")


def measure_config(bk: BookKeeper, name: str, quorums: tuple[int, int, int],
                   bookie_pids: list[int], profile: Profile,
                   sweep_rates: tuple[float, ...] = ()) -> dict:
    """Full load, full load again in ``add_entries`` calls of :data:`RUN_ENTRIES`, then
    half of the first one's rate, then :data:`FIXED_RATE_PER_S`, for one (E, Qw, Qa);
    with ``sweep_rates``, also those offered rates, and ``sweep``: every phase as a
    point of latency against offered load (full load at the rate it reached)."""
    def open_phase(rate: float) -> dict:
        figures = load_phase(bk, quorums, bookie_pids,
                             lambda adds: open_loop(adds, rate, profile))
        say_phase(name, f"at {rate:,.0f}/s offered", figures)
        return figures

    full = load_phase(bk, quorums, bookie_pids, lambda adds: closed_loop(adds, profile))
    say_phase(name, "full load", full)
    runs = load_phase(bk, quorums, bookie_pids,
                      lambda adds: closed_loop(adds, profile, RUN_ENTRIES))
    say_phase(name, f"full load, add_entries of {RUN_ENTRIES}", runs)
    half = open_phase(full["per_s"] * HALF_LOAD_FRACTION)
    fixed = open_phase(FIXED_RATE_PER_S)
    ensemble, write_quorum, ack_quorum = quorums
    figures = {"ensemble": ensemble, "write_quorum": write_quorum, "ack_quorum": ack_quorum,
               "full_load": full, "full_load_runs": runs, "half_load": half,
               "fixed_rate": fixed,
               "bookie_adds_per_s": round(full["per_s"] * write_quorum, 1)}
    if sweep_rates:
        phases = [(rate, open_phase(rate)) for rate in sweep_rates]
        phases += [(half["offered_per_s"], half), (FIXED_RATE_PER_S, fixed),
                   (full["per_s"], full)]
        figures["sweep"] = [
            {"offered_per_s": round(rate, 1), "closed_loop": phase is full,
             "per_s": phase["per_s"], "p50_us": phase["p50_us"], "p99_us": phase["p99_us"],
             "cpu_us_per_entry": phase["cpu_us_per_add"]["total"]}
            for rate, phase in sorted(phases, key=lambda point: point[0])]
    return figures


@contextlib.contextmanager
def bookies_and_client(workdir: str,
                       children: Children) -> Iterator[tuple[BookKeeper, list[int]]]:
    """:data:`BOOKIES` bookie processes and a client of them over ZeroMQ (with the
    bookies' pids, for their CPU time); everything is stopped on the way out."""
    bookies: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        for number in range(BOOKIES):
            directory = os.path.join(workdir, f"bookie-{number}")
            os.makedirs(directory)
            bookies[f"bookie-{number}"] = children.start("--serve", directory)
        say("bookies at " + ", ".join(endpoint for _, endpoint in bookies.values()))
        settings = ClientSettings()
        with ExitStack() as stack:
            metadata = stack.enter_context(
                EmbeddedMetadataStore(os.path.join(workdir, "metadata")))
            loop = stack.enter_context(ClientLoop())  # its close also ends its clients
            clients = {bookie_id: ZmqBookieClient(bookie_id, endpoint, settings, loop=loop)
                       for bookie_id, (_, endpoint) in bookies.items()}
            bk = stack.enter_context(BookKeeper(metadata, clients, settings))
            # Clients close before the BookKeeper: adds still in flight on an abort then
            # fail through the ledger's own path (which needs the BookKeeper's worker).
            for client in clients.values():
                stack.callback(client.close)
            yield bk, [child.pid for child, _ in bookies.values()]
    finally:
        for child, _ in bookies.values():
            children.stop(child)


def measure_pybk(workdir: str, children: Children, profile: Profile,
                 measure: Callable[..., dict] | None = None) -> dict:
    """Three bookie processes, one client here; every configuration of ``CONFIGS``,
    each measured by ``measure(bk, name, quorums, bookie_pids, profile)`` (default:
    :func:`measure_config`, the write loads)."""
    measure = measure or measure_config
    results: dict = {"bookies": BOOKIES, "entry_bytes": ENTRY_BYTES}
    with bookies_and_client(workdir, children) as (bk, pids):
        for name, *quorums in CONFIGS:
            results[name] = measure(bk, name, tuple(quorums), pids, profile)
    return results


# -- the log: replicated and embedded ---------------------------------------------------

def measure_log_writer(bk: BookKeeper, quorums: tuple[int, int, int],
                       bookie_pids: list[int], profile: Profile) -> dict:
    """A :class:`LogWriter` of a new log whose segments have the (E, Qw, Qa) ``quorums``,
    on ``bk``'s bookies: ``wal_bench``'s :func:`pipelined` loop (``log_records`` records
    of :data:`RECORD` bytes, up to ``log_window`` in flight, rate from the first append
    to the last acknowledgement), with the CPU per record of this process and of the
    bookies (:class:`CpuUse`)."""
    ensemble, write_quorum, ack_quorum = quorums
    settings = LogSettings(ensembleSize=ensemble, writeQuorumSize=write_quorum,
                           ackQuorumSize=ack_quorum)
    with LogWriter.open(bk, LOG_NAME, settings) as writer:
        cpu = CpuUse(bookie_pids)
        row = pipelined(writer, profile.log_records, profile.log_window)
        use = cpu.per_op(row["records"])
        appended = writer.append_counts()[0]
    if appended != row["records"]:
        raise RuntimeError(f"log {LOG_NAME}: {appended} appends counted, "
                           f"{row['records']} made")
    # Not pipelined's cpu_us_per_append (this process only: cpu_us_per_record.client)
    # nor its disk_bytes_per_append (the bookies write, not this process).
    figures = {"record_bytes": RECORD, "window": profile.log_window,
               "records": row["records"], "per_s": row["per_s"], "mb_per_s": row["mb_per_s"],
               "last_position": row["last_position"], "cpu_us_per_record": use}
    say(f"LogWriter E{ensemble}/Qw{write_quorum}/Qa{ack_quorum}, append_async pipelined: "
        f"{figures['per_s']:,.0f} records/s; CPU per record: client {use['client']} µs, "
        f"bookies {use['servers']} µs")
    return figures


def measure_wal(workdir: str, profile: Profile) -> dict:
    """The embedded WAL (:func:`pybk.open` in ``workdir``, on the disk under test) with
    the same :func:`pipelined` loop as :func:`measure_log_writer`; its
    ``cpu_us_per_append`` is this whole process's, the WAL's bookie included, and
    ``kernel_us_per_append`` the part of it in the kernel."""
    wal = pybk.open(os.path.join(workdir, "wal"))
    try:
        figures = pipelined(wal, profile.log_records, profile.log_window)
    finally:
        wal.close()
    figures["window"] = profile.log_window
    say(f"embedded WAL, append_async pipelined: {figures['per_s']:,.0f} records/s; "
        f"CPU per record {figures['cpu_us_per_append']} µs "
        f"({figures['kernel_us_per_append']} µs in the kernel)")
    return figures


# -- ZooKeeper ------------------------------------------------------------------------------

def measure_zookeeper(workdir: str, profile: Profile) -> dict:
    """Creates/s of 1 KiB znodes with ``zk_window`` ``create_async`` calls in flight, on a
    fresh ensemble of ``ZK_SERVERS`` servers (each with its own data directory on the disk
    under test, fsync on)."""
    started = time.perf_counter()
    with ZooKeeperEnsemble(size=ZK_SERVERS, directory=os.path.join(workdir, "zookeeper"),
                           force_sync=ZK_FORCE_SYNC) as ensemble:
        say(f"ZooKeeper ensemble up at {ensemble.connect_string} "
            f"({time.perf_counter() - started:.1f} s)")
        client = KazooClient(hosts=ensemble.connect_string, timeout=10.0)
        client.start(timeout=ZK_CONNECT_TIMEOUT_S)
        try:
            client.create("/bench")
            cpu = CpuUse([server.pid for server in ensemble.servers])
            figures = zookeeper_creates(client, profile)
            figures["cpu_us_per_create"] = use = cpu.per_op(figures["created"])
            say(f"ZooKeeper CPU per create: client (kazoo) {use['client']} µs, servers "
                f"{use['servers']} µs")
            return figures
        finally:
            client.stop()
            client.close()


def zookeeper_creates(client: KazooClient, profile: Profile) -> dict:
    """The create loop: a window of ``create_async`` results, waited for oldest first
    (ZooKeeper answers one session's requests in order)."""
    clock = time.perf_counter_ns
    begin = clock()
    measure_from = begin + int(profile.warmup_seconds * 1e9)
    measure_to = measure_from + int(profile.load_seconds * 1e9)
    window: deque = deque()
    created = counted = 0
    while clock() < measure_to:
        if len(window) >= profile.zk_window:
            window.popleft().get(timeout=DRAIN_TIMEOUT_S)
            if clock() >= measure_from:
                counted += 1
            continue
        window.append(client.create_async(f"/bench/e{created:010d}", PAYLOAD))
        created += 1
    for result in window:
        result.get(timeout=DRAIN_TIMEOUT_S)
    seconds = (measure_to - measure_from) / 1e9
    figures = {"servers": ZK_SERVERS, "force_sync": ZK_FORCE_SYNC,
               "znode_bytes": ENTRY_BYTES, "window": profile.zk_window,
               "created": created, "creates": counted,
               "creates_per_s": round(counted / seconds, 1),
               "mb_per_s": mb_per_s(counted * ENTRY_BYTES, seconds)}
    say(f"ZooKeeper ({ZK_SERVERS} servers): {figures['creates_per_s']:,.0f} creates/s")
    return figures


# -- report ---------------------------------------------------------------------------------

def target(value: float, passed: bool, wanted: str) -> dict:
    """One target's entry in the report."""
    return {"value": value, "target": wanted, "pass": passed}


def evaluate(raw: dict, pybk: dict, wal: dict, zookeeper: dict) -> tuple[dict, dict]:
    """The ratios and the targets, from the reference configuration (and the replication
    floor, ``raw["replication_floor"]``, and the embedded WAL's pipelined row ``wal``)."""
    reference = pybk[REFERENCE_CONFIG]
    full = reference["full_load"]
    per_s = full["per_s"]
    cpu_full = full["cpu_us_per_add"]["total"]
    ratios = {"pybk_to_zookeeper": ratio(per_s, zookeeper["creates_per_s"]),
              "pybk_to_raw_zmq_pipelined": ratio(per_s, raw["zmq"]["pipelined"]["per_s"]),
              "pybk_half_load_p99_to_raw_fdatasync_p99": ratio(
                  reference["half_load"]["p99_us"], raw["fdatasync_append"]["p99_us"]),
              "cpu_per_entry_half_to_full": ratio(
                  reference["half_load"]["cpu_us_per_add"]["total"], cpu_full),
              "cpu_per_entry_5k_to_full": ratio(
                  reference["fixed_rate"]["cpu_us_per_add"]["total"], cpu_full)}
    floor = raw["replication_floor"]
    for phase in ("full_load", "half_load", "fixed_rate"):
        ratios[f"cpu_per_entry_{phase}_to_floor"] = ratio(
            reference[phase]["cpu_us_per_add"]["total"],
            floor[phase]["cpu_us_per_add"]["total"])
    ratios["full_load_to_floor"] = ratio(per_s, floor["full_load"]["per_s"])
    runs = reference["full_load_runs"]
    ratios["cpu_per_entry_full_load_runs_to_floor"] = ratio(
        runs["cpu_us_per_add"]["total"], floor["full_load"]["cpu_us_per_add"]["total"])
    ratios["full_load_runs_to_floor"] = ratio(runs["per_s"], floor["full_load"]["per_s"])
    ratios["floor_cpu_per_entry_5k_to_full"] = floor["cpu_per_entry_5k_to_full"]
    for phase in ("half_load", "fixed_rate"):
        for quantile in ("p50_us", "p99_us"):
            ratios[f"{phase}_{quantile[:3]}_to_floor"] = ratio(reference[phase][quantile],
                                                                floor[phase][quantile])
    # The formats' floor: how much of the gap to the floor BookKeeper's formats make.
    formats = raw["formats_floor"]["full_load"]
    cpu_formats = formats["cpu_us_per_add"]["total"]
    cpu_floor = floor["full_load"]["cpu_us_per_add"]["total"]
    ratios["formats_floor_cpu_per_entry_to_floor"] = ratio(cpu_formats, cpu_floor)
    ratios["formats_floor_to_floor"] = ratio(formats["per_s"], floor["full_load"]["per_s"])
    ratios["cpu_per_entry_full_load_to_formats_floor"] = ratio(cpu_full, cpu_formats)
    ratios["full_load_to_formats_floor"] = ratio(per_s, formats["per_s"])
    log = reference["log_writer_pipelined"]
    ratios["log_writer_to_wal_pipelined"] = ratio(log["per_s"], wal["per_s"])
    ratios["cpu_per_record_log_writer_to_wal"] = ratio(log["cpu_us_per_record"]["total"],
                                                       wal["cpu_us_per_append"])
    targets = {
        "replicated_1k_entries_per_s": target(per_s, per_s >= TARGET_ENTRIES_PER_S,
                                              f">= {TARGET_ENTRIES_PER_S} ({REFERENCE_CONFIG})"),
        "ratio_to_zookeeper": target(ratios["pybk_to_zookeeper"],
                                     ratios["pybk_to_zookeeper"] >= TARGET_ZOOKEEPER_RATIO,
                                     f">= {TARGET_ZOOKEEPER_RATIO:g} x ZooKeeper creates/s"),
    }
    for phase in ("half_load", "fixed_rate"):
        for quantile, most in (("p50_us", TARGET_LIGHT_LOAD_P50_US),
                               ("p99_us", TARGET_LIGHT_LOAD_P99_US)):
            value = reference[phase][quantile]
            targets[f"{phase}_{quantile}"] = target(value, value <= most,
                                                    f"<= {most} ({REFERENCE_CONFIG})")
    fixed_to_full = ratios["cpu_per_entry_5k_to_full"]
    targets["cpu_per_entry_5k_to_full"] = target(
        fixed_to_full, fixed_to_full <= TARGET_CPU_PER_ENTRY_FIXED_TO_FULL,
        f"<= {TARGET_CPU_PER_ENTRY_FIXED_TO_FULL:g} ({REFERENCE_CONFIG}, client + bookies)")
    log_to_wal = ratios["log_writer_to_wal_pipelined"]
    targets["log_writer_to_wal_pipelined"] = target(
        log_to_wal, log_to_wal >= TARGET_LOG_WRITER_TO_WAL,
        f">= {TARGET_LOG_WRITER_TO_WAL:g} x the embedded WAL's pipelined records/s "
        f"({REFERENCE_CONFIG})")
    to_floor = ratios["full_load_to_floor"]
    targets["full_load_to_floor"] = target(
        to_floor, to_floor >= TARGET_FULL_LOAD_TO_FLOOR,
        f">= {TARGET_FULL_LOAD_TO_FLOOR:g} x the replication floor's entries/s")
    cpu_to_floor = ratios["cpu_per_entry_full_load_to_floor"]
    targets["cpu_per_entry_full_load_to_floor"] = target(
        cpu_to_floor, cpu_to_floor <= TARGET_CPU_PER_ENTRY_TO_FLOOR,
        f"<= {TARGET_CPU_PER_ENTRY_TO_FLOOR:g} x the replication floor's CPU per entry")
    for phase in ("half_load", "fixed_rate"):
        for quantile in ("p50", "p99"):
            value = ratios[f"{phase}_{quantile}_to_floor"]
            targets[f"{phase}_{quantile}_to_floor"] = target(
                value, value <= TARGET_LATENCY_TO_FLOOR,
                f"<= {TARGET_LATENCY_TO_FLOOR:g} x the replication floor's")
    targets["all_pass"] = all(t["pass"] for t in targets.values())
    return ratios, targets


def run(profile: Profile, workdir: str, children: Children,
        plot_path: str | None = None) -> dict:
    """Every measurement, in order; returns the JSON-ready result (and, with
    ``plot_path``, draws the reference configuration's latency curve there)."""
    started = time.perf_counter()
    load_1m = os.getloadavg()[0]
    say(f"{profile.name} run in {workdir}; load average {load_1m:.2f} on {os.cpu_count()} "
        "CPUs (other work on the machine skews every figure)")
    raw = measure_raw(workdir, profile.raw_seconds, profile.raw_max_ops, 0, say)
    raw["zmq"] = measure_raw_zmq(children, profile)
    raw["replication_floor"] = measure_floor(workdir, children, profile)
    raw["formats_floor"] = measure_floor(workdir, children, profile, formats=True)

    wal: dict = {}

    def measure(bk: BookKeeper, name: str, quorums: tuple[int, int, int],
                bookie_pids: list[int], profile: Profile) -> dict:
        if name != REFERENCE_CONFIG:
            return measure_config(bk, name, quorums, bookie_pids, profile)
        sweep = SWEEP_RATES_PER_S if plot_path else ()
        figures = measure_config(bk, name, quorums, bookie_pids, profile, sweep)
        figures["log_writer_pipelined"] = measure_log_writer(bk, quorums, bookie_pids,
                                                             profile)
        if name == REFERENCE_CONFIG:
            # Right after the LogWriter it is read against, the bookies up and idle: a
            # write into new page-cache pages costs the kernel several times more once
            # the machine's recently freed memory is used up (benchmarks/README.md), so
            # the two loops run back to back.
            wal.update(measure_wal(workdir, profile))
        return figures

    pybk = measure_pybk(workdir, children, profile, measure)
    zookeeper = measure_zookeeper(workdir, profile)
    ratios, targets = evaluate(raw, pybk, wal, zookeeper)
    for name, value in ratios.items():
        say(f"ratio {name}: {value}")
    for name, entry in targets.items():
        if name != "all_pass":
            say(f"target {name}: {entry['value']} (want {entry['target']}): "
                f"{'pass' if entry['pass'] else 'MISSED'}")
    if plot_path:
        plot_latency(plot_path, {REFERENCE_CONFIG: pybk[REFERENCE_CONFIG]["sweep"],
                                 "floor (no protocol)": raw["replication_floor"]["sweep"]},
                     f"pybk replicated adds, 1 KiB entries, 3 bookies on loopback "
                     f"({profile.name} run)", "offered load (entries/s)")
        say(f"latency against offered load drawn in {plot_path}")
    return {"mode": profile.name, "dir": workdir, "python": sys.version.split()[0],
            "cpus": os.cpu_count(), "load_average_1m_at_start": round(load_1m, 2),
            "raw": raw, "pybk": pybk, "embedded_wal_pipelined": wal, "zookeeper": zookeeper,
            "ratios": ratios,
            "targets": targets, "elapsed_s": round(time.perf_counter() - started, 1)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (plus the hidden options of the child processes)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a shorter run (about two minutes)")
    parser.add_argument("--dir", default=os.getcwd(),
                        help="where the fresh temporary directory is made (default: the "
                             "current directory, i.e. its disk is the one under test)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="also measure a few more offered rates and draw p50 and p99 "
                             "latency against offered load in FILE.png (needs matplotlib)")
    # Internal: the child processes.
    parser.add_argument("--serve", metavar="BOOKIE_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--echo", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--floor-echo", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--floor-formats", metavar="DIR", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with a hidden option, one of its child processes)."""
    args = parse_args(argv)
    if args.serve:
        serve_bookie(args.serve)
        return 0
    if args.echo:
        serve_echo()
        return 0
    if args.floor_echo or args.floor_formats:
        on_lifeline_lost(lambda: os._exit(0))
        serve_durable_group_echo(args.floor_echo or args.floor_formats,
                                 formats=bool(args.floor_formats))
        return 0
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop the children.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    profile = QUICK if args.quick else FULL
    if args.plot:
        try:
            check_plotting()  # now, not after the run
        except PlottingUnavailable as e:
            print(f"cluster_bench: {e}", file=sys.stderr)
            return 2

    def measure(workdir: str) -> dict:
        with Children() as children:
            return run(profile, workdir, children, args.plot)

    return run_and_report("pybk-cluster-bench-", args.dir, measure)


if __name__ == "__main__":
    sys.exit(main())
