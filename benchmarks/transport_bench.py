#!/usr/bin/env python3
"""Benchmark of pybk's ZeroMQ transport: one client process, one bookie server process.

Usage::

    python benchmarks/transport_bench.py [--quick] [--dir DIR] [--round-trips-only]

The bookie server runs in a child process (this script with ``--serve``), as bookies do,
so that client and server do not share one interpreter lock.

First, what one message round trip costs in CPU (``round_trip_cpu``), one in flight:

* ``raw_zmq``: a DEALER here, a ROUTER echo child (this script with ``--echo``) sending
  every 1 KiB message back: the floor of one message each way, wake-ups included;
* ``raw_zmq_durable``: the same echo child writing each message to a file and
  fdatasyncing it before sending it back (``--echo --sync-dir``): the floor of a durable
  add's round trip, with no protocol, one thread per side;
* ``fdatasync``: write(4 KiB) + fdatasync over zeros already synced (as the journal
  writes), here (``rawdisk.timed_sync_loop``): the CPU a durable add cannot avoid on the
  bookie;
* ``pybk_add``: ADD messages with one durable 1 KiB add each (``ZmqBookieClient.add``,
  then waiting for it);
* ``pybk_read_lac``: LAC reads (the protocol and both event loops, no disk).

Each has ``per_s`` and, per round trip, the CPU microseconds of the ``client`` (this
process: all its threads) and of the ``server`` (the child: its own
``time.process_time``, asked for over its stdin before and after), and ``server_threads``
(the child's threads' share, from ``/proc``, 10 ms ticks).  Ratios:
``add_round_trip_cpu_to_raw`` (client + server of ``pybk_add`` over those of
``raw_zmq``; target at most 2), ``add_round_trip_cpu_less_fdatasync_to_raw`` (the
same less the fdatasync's CPU), ``raw_durable_round_trip_cpu_to_raw`` (the floor's
own ratio) and ``add_round_trip_cpu_to_raw_durable`` (pybk over that floor).
``--round-trips-only`` stops there.  Then:

* ``sequential_rtt_per_s``: LAC reads, one in flight (a round trip through both Python
  event loops, no disk);
* ``pipelined_reads_per_s``: reads of a 1 KiB entry with ``WINDOW`` in flight;
* ``pipelined_adds_per_s``: durable 1 KiB adds with ``WINDOW`` in flight (journal
  fdatasync included; compare with ``storage_bench.py``'s in-process figure).

The same with ZeroMQ CURVE on (``curve_*``: a second bookie process serving CURVE, keys
made by :func:`pybk.net.curve.create_key_pair`), in the order plain, CURVE, CURVE,
plain, each figure the better of its two rounds; and ``curve_cost_*``, each CURVE figure
as a fraction of the plain one (0.9: CURVE costs 10%).

Progress goes to stderr; stdout gets one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from typing import Any, Callable

import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from rawdisk import BLOCK, prepare_zero_fill, ratio, timed_sync_loop  # noqa: E402

from pybk.net import BookieServer, ZmqBookieClient  # noqa: E402
from pybk.net.curve import create_key_pair, load_key_pair  # noqa: E402
from pybk.settings import ClientSettings, ServerSettings  # noqa: E402
from pybk.storage import Bookie, format_bookie, make_entry  # noqa: E402

KEY = b"transport-bench"
ENTRY_BYTES = 1024
WINDOW = 1000
LEDGER_READS, LEDGER_ADDS = 1, 2  # adds: one ledger per round, from 2
LEDGER_ROUND_TRIP_ADDS = 100  # ``round_trip_cpu``'s adds: one ledger per round, from 100
LOOPBACK_ANY_PORT = "tcp://127.0.0.1:*"
CHILD_TIMEOUT_S = 60.0  # a child prints its address, or answers a CPU request
WARM_UP_ROUND_TRIPS = 200  # before each counted round trip loop
TARGET_ADD_CPU_TO_RAW = 2.0  # add_round_trip_cpu_to_raw at most this
SYNC_FILE_BYTES = 16 * 1024 * 1024  # the durable echo's file, rewritten from its start
MAX_ECHO_BYTES = 64 * 1024  # messages sent to the durable echo are smaller


def serve(directory: str, keys: str | None) -> None:
    """Child process: serve a bookie until stdin closes; print the address first.  With
    ``keys`` (the directory of :func:`make_keys`), serve CURVE."""
    curve = {} if keys is None else dict(
        zmqCurveEnabled=True, zmqCurveSecretKeyFile=os.path.join(keys, "bookie.key_secret"),
        zmqCurveAllowedClientKeysDirectory=os.path.join(keys, "allowed"))
    settings = ServerSettings(journalDirectory=os.path.join(directory, "journal"),
                              ledgerDirectories=(os.path.join(directory, "ledgers"),),
                              **curve)
    format_bookie(settings)
    with Bookie(settings) as bookie, BookieServer(bookie, "tcp://127.0.0.1:*") as server:
        bookie.add_entry(LEDGER_READS, 0, make_entry(LEDGER_READS, 0, -1,
                                                     b"r" * (ENTRY_BYTES - 24)), KEY)
        print(server.address, flush=True)
        answer_cpu_requests()


def echo(sync_directory: str | None) -> None:
    """Child process: a ROUTER sending every message back (raw pyzmq, no protocol);
    prints its address, answers CPU requests on stdin, and exits when stdin ends.  With
    ``sync_directory``, each message is first written to a file there and fdatasync'd
    (over zeros synced before, wrapping at ``SYNC_FILE_BYTES``): the least a durable add
    costs on a bookie."""
    socket = zmq.Context().socket(zmq.ROUTER)
    socket.bind(LOOPBACK_ANY_PORT)
    fd = -1
    if sync_directory is not None:
        fd = os.open(os.path.join(sync_directory, "echo-sync.dat"),
                     os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        prepare_zero_fill(fd, SYNC_FILE_BYTES)
    print(socket.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)

    def control() -> None:
        answer_cpu_requests()
        os._exit(0)  # the main thread is blocked in recv
    threading.Thread(target=control, name="control", daemon=True).start()
    recv, send, offset = socket.recv_multipart, socket.send_multipart, 0
    while True:
        message = recv()
        if fd >= 0:
            if offset > SYNC_FILE_BYTES - MAX_ECHO_BYTES:
                offset = os.lseek(fd, 0, os.SEEK_SET)
            offset += os.writev(fd, message[1:])
            os.fdatasync(fd)
        send(message)


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds used so far by each of this process's threads, by name (the Python
    name, else the kernel's: ZeroMQ's I/O thread is ``ZMQbg/IO/0``), from ``/proc``."""
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="utf-8") as f:
                head, _, tail = f.read().rpartition(")")
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        fields = tail.split()  # from the 3rd field (state) on
        name = names.get(int(tid)) or head.partition("(")[2]
        used[name] = used.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return used


def answer_cpu_requests() -> None:
    """In a child: answer each ``cpu`` line on stdin with one JSON line on stdout, this
    process's CPU seconds so far (``cpu_s``, read first) and its threads'
    (``threads``), until stdin ends."""
    for line in sys.stdin:
        if line.strip() == "cpu":
            cpu_s = time.process_time()
            print(json.dumps({"cpu_s": cpu_s, "threads": thread_cpu_s()}), flush=True)


class Child:
    """A child process of this script (``--serve DIR`` or ``--echo``): its address, and
    its CPU use on request.  It exits when :meth:`stop` closes its stdin."""

    def __init__(self, *args: str) -> None:
        self.name = " ".join(args)
        self.process = subprocess.Popen([sys.executable, __file__, *args],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        self.address = self._line()

    def _line(self) -> str:
        stdout = self.process.stdout
        assert stdout is not None
        if not select.select([stdout], [], [], CHILD_TIMEOUT_S)[0]:
            raise RuntimeError(f"child {self.name} did not answer within "
                               f"{CHILD_TIMEOUT_S} s")
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"child {self.name} exited")
        return line.strip()

    def cpu(self) -> dict:
        """The child's answer to a CPU request (see :func:`answer_cpu_requests`)."""
        assert self.process.stdin is not None
        self.process.stdin.write("cpu\n")
        self.process.stdin.flush()
        return json.loads(self._line())

    def stop(self) -> None:
        """Close the child's stdin and reap it (killed if it does not exit in time)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


def cpu_per_round_trip(child: Child, seconds: float, round_trip: Callable[[], object]
                       ) -> dict:
    """Call ``round_trip`` (one request to ``child`` and its answer) for ``seconds``,
    after a warm-up: ``per_s`` and the CPU µs per round trip of this process
    (``client``) and of the child (``server``, and ``server_threads`` by thread)."""
    for _ in range(WARM_UP_ROUND_TRIPS):
        round_trip()
    before = child.cpu()
    count = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    deadline = started + seconds
    while True:
        for _ in range(100):  # look at the clock once per hundred
            round_trip()
        count += 100
        if time.perf_counter() >= deadline:
            break
    elapsed, client_s = time.perf_counter() - started, time.process_time() - cpu_started
    after = child.cpu()
    threads = {name: round((used - before["threads"].get(name, 0.0)) / count * 1e6, 1)
               for name, used in after["threads"].items()}
    return {"round_trips": count, "per_s": round(count / elapsed),
            "client": round(client_s / count * 1e6, 1),
            "server": round((after["cpu_s"] - before["cpu_s"]) / count * 1e6, 1),
            "server_threads": {name: us for name, us in sorted(threads.items()) if us}}


def raw_zmq_round_trips(echo_child: Child, seconds: float) -> dict:
    """One 1 KiB message at a time through a DEALER to the echo child and back."""
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    try:
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVTIMEO, int(CHILD_TIMEOUT_S * 1000))
        socket.connect(echo_child.address)
        send, recv, payload = socket.send, socket.recv, b"m" * ENTRY_BYTES

        def round_trip() -> None:
            send(payload)
            recv()
        return cpu_per_round_trip(echo_child, seconds, round_trip)
    finally:
        socket.close()
        context.term()


def fdatasync_cpu(directory: str, seconds: float, max_syncs: int) -> dict:
    """CPU µs per write + fdatasync of one block over zeros already synced."""
    path = os.path.join(directory, "fdatasync.dat")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        prepare_zero_fill(fd, max_syncs * BLOCK)
        cpu_started = time.process_time()
        samples, elapsed = timed_sync_loop(fd, seconds, max_syncs)
        cpu_s = time.process_time() - cpu_started
    finally:
        os.close(fd)
        os.unlink(path)
    return {"syncs": len(samples), "per_s": round(len(samples) / elapsed),
            "cpu_us_per_sync": round(cpu_s / len(samples) * 1e6, 1)}


def pybk_round_trips(bookie_child: Child, seconds: float, ledger_id: int) -> dict:
    """ADD messages of one durable add each, then LAC reads, one at a time."""
    body = b"a" * (ENTRY_BYTES - 24)
    with ZmqBookieClient("bench", bookie_child.address) as client:
        entry_ids = iter(range(10**9))

        def add() -> None:
            entry_id = next(entry_ids)
            client.add(ledger_id, entry_id, make_entry(ledger_id, entry_id, entry_id - 1,
                                                       body), KEY).result(timeout=10)
        figures = {"pybk_add": cpu_per_round_trip(bookie_child, seconds, add)}
        figures["pybk_read_lac"] = cpu_per_round_trip(
            bookie_child, seconds, lambda: client.read_lac(ledger_id).result(timeout=10))
    return figures


def cpu_us(figures: dict) -> float:
    """The CPU µs per operation of a ``round_trip_cpu`` figure (client and server)."""
    return figures.get("cpu_us_per_sync") or figures["client"] + figures["server"]


def measure_round_trip_cpu(directory: str, bookie_child: Child, seconds: float) -> dict:
    """``round_trip_cpu``: raw pyzmq, the durable echo, fdatasync, pybk adds and LAC
    reads, in that order and then the other way round, each figure from its round with
    less CPU per round trip (a load that comes and goes on the machine weighs on every
    figure alike)."""
    echo_child = Child("--echo")
    durable_child = Child("--echo", "--sync-dir", directory)
    best: dict[str, Any] = {}
    try:
        def keep(name: str, figures: dict) -> None:
            if name not in best or cpu_us(figures) < cpu_us(best[name]):
                best[name] = figures
            print(f"{name}: {figures}", file=sys.stderr)

        steps: list[tuple[str, Callable[[int], dict]]] = [
            ("raw_zmq", lambda _: raw_zmq_round_trips(echo_child, seconds)),
            ("raw_zmq_durable", lambda _: raw_zmq_round_trips(durable_child, seconds)),
            ("fdatasync", lambda _: fdatasync_cpu(directory, seconds, 100_000)),
            ("pybk", lambda n: pybk_round_trips(bookie_child, seconds,
                                                LEDGER_ROUND_TRIP_ADDS + n))]
        for round_number, order in enumerate((steps, steps[::-1])):
            for name, step in order:
                figures = step(round_number)
                for key, value in (figures.items() if name == "pybk" else ((name, figures),)):
                    keep(key, value)
    finally:
        echo_child.stop()
        durable_child.stop()
    raw, add = cpu_us(best["raw_zmq"]), cpu_us(best["pybk_add"])
    best["add_round_trip_cpu_to_raw"] = ratio(add, raw)
    best["add_round_trip_cpu_less_fdatasync_to_raw"] = ratio(
        add - cpu_us(best["fdatasync"]), raw)
    best["raw_durable_round_trip_cpu_to_raw"] = ratio(cpu_us(best["raw_zmq_durable"]), raw)
    best["add_round_trip_cpu_to_raw_durable"] = ratio(add, cpu_us(best["raw_zmq_durable"]))
    best["read_lac_round_trip_cpu_to_raw"] = ratio(cpu_us(best["pybk_read_lac"]), raw)
    value = best["add_round_trip_cpu_to_raw"]
    best["target"] = {"value": value, "target": f"<= {TARGET_ADD_CPU_TO_RAW}",
                      "pass": value <= TARGET_ADD_CPU_TO_RAW}
    return best


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


def make_keys(directory: str) -> tuple[ClientSettings, bytes]:
    """A bookie's and a client's key pairs under ``directory`` (the client's public key
    in ``allowed/``): the client's settings, and the bookie's public key to pin."""
    client_public, client_secret = create_key_pair(directory, "client")
    _public, bookie_secret = create_key_pair(directory, "bookie")
    os.mkdir(os.path.join(directory, "allowed"))
    shutil.copy(client_public, os.path.join(directory, "allowed"))
    settings = ClientSettings(zmqCurveEnabled=True, zmqCurveSecretKeyFile=client_secret)
    return settings, load_key_pair(bookie_secret).public


def measure(address: str, scale: int, settings: ClientSettings | None,
            server_key: bytes | None, prefix: str, adds_ledger: int) -> dict[str, int]:
    """The three figures against the bookie at ``address`` (adds to ``adds_ledger``)."""
    results = {}
    with ZmqBookieClient("bench", address, settings, server_key=server_key) as client:
        client.read_lac(LEDGER_READS).result(timeout=10)  # connected
        count = 4000 * scale
        started = time.perf_counter()
        for _ in range(count):
            client.read_lac(LEDGER_READS).result(timeout=10)
        results["sequential_rtt_per_s"] = round(count / (time.perf_counter() - started))
        results["pipelined_reads_per_s"] = round(pipelined(
            20_000 * scale, lambda i: client.read(LEDGER_READS, 0)))
        body = b"a" * (ENTRY_BYTES - 24)
        results["pipelined_adds_per_s"] = round(pipelined(
            20_000 * scale, lambda i: client.add(
                adds_ledger, i, make_entry(adds_ledger, i, i - 1, body), KEY)))
    for name, value in results.items():
        print(f"{prefix}{name}: {value}", file=sys.stderr)
    return {prefix + name: value for name, value in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer operations")
    parser.add_argument("--dir", default=".", help="where the bookie's files go")
    parser.add_argument("--round-trips-only", action="store_true",
                        help="measure round_trip_cpu only")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--keys", help=argparse.SUPPRESS)
    parser.add_argument("--echo", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sync-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.keys)
        return
    if args.echo:
        echo(args.sync_dir)
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    scale = 1 if args.quick else 5
    directory = tempfile.mkdtemp(prefix="pybk-transport-bench-", dir=args.dir)
    keys = os.path.join(directory, "keys")
    client_settings, server_key = make_keys(keys)
    children: list[Child] = []
    try:
        modes = {}
        for name, server_keys, settings, pinned in (
                ("", None, None, None), ("curve_", keys, client_settings, server_key)):
            if name and args.round_trips_only:
                continue
            command = ["--serve", os.path.join(directory, name + "bookie")]
            children.append(Child(*command, *(["--keys", server_keys] if server_keys
                                              else [])))
            print(f"bookie server at {children[-1].address}"
                  f"{' (CURVE)' if server_keys else ''}", file=sys.stderr)
            modes[name] = (children[-1].address, settings, pinned)
        results: dict = {"load_average_1m_at_start": os.getloadavg()[0]}
        results["round_trip_cpu"] = round_trips = measure_round_trip_cpu(
            directory, children[0], 1.0 * scale)
        results["add_round_trip_cpu_to_raw"] = round_trips["add_round_trip_cpu_to_raw"]
        if not args.round_trips_only:
            # Plain, CURVE, CURVE, plain, keeping each figure's best: a load that comes
            # and goes on the machine weighs on both alike.
            for round_number, name in enumerate(("", "curve_", "curve_", "")):
                address, settings, pinned = modes[name]
                for key, value in measure(address, scale, settings, pinned, name,
                                          LEDGER_ADDS + round_number).items():
                    results[key] = max(value, results.get(key, 0))
            for name in ("sequential_rtt_per_s", "pipelined_reads_per_s",
                         "pipelined_adds_per_s"):
                results[f"curve_cost_{name}"] = round(
                    results[f"curve_{name}"] / results[name], 3)
        print(json.dumps(results))
    finally:
        for child in children:
            child.stop()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
