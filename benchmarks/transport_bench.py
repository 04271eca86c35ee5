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

The same with ZeroMQ CURVE on (``curve_*``: a second bookie process serving CURVE, keys
made by :func:`pybk.cluster.curve.create_key_pair`), in the order plain, CURVE, CURVE,
plain, each figure the better of its two rounds; and ``curve_cost_*``, each CURVE figure
as a fraction of the plain one (0.9: CURVE costs 10%).

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
from pybk.cluster.curve import create_key_pair, load_key_pair  # noqa: E402
from pybk.settings import ClientSettings, ServerSettings  # noqa: E402
from pybk.storage import Bookie, format_bookie, make_entry  # noqa: E402

KEY = b"transport-bench"
ENTRY_BYTES = 1024
WINDOW = 1000
LEDGER_READS, LEDGER_ADDS = 1, 2  # adds: one ledger per round, from 2


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


def start_server(directory: str, keys: str | None) -> tuple[subprocess.Popen, str]:
    """A bookie server child process and its address."""
    command = [sys.executable, __file__, "--serve", directory]
    if keys is not None:
        command += ["--keys", keys]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    return child, child.stdout.readline().strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer operations")
    parser.add_argument("--dir", default=".", help="where the bookie's files go")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--keys", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.keys)
        return
    scale = 1 if args.quick else 5
    directory = tempfile.mkdtemp(prefix="pybk-transport-bench-", dir=args.dir)
    keys = os.path.join(directory, "keys")
    client_settings, server_key = make_keys(keys)
    children: list[subprocess.Popen] = []
    try:
        modes = {}
        for name, server_keys, settings, pinned in (
                ("", None, None, None), ("curve_", keys, client_settings, server_key)):
            child, address = start_server(os.path.join(directory, name + "bookie"),
                                          server_keys)
            children.append(child)
            print(f"bookie server at {address}{' (CURVE)' if server_keys else ''}",
                  file=sys.stderr)
            modes[name] = (address, settings, pinned)
        # Plain, CURVE, CURVE, plain, keeping each figure's best: a load that comes and
        # goes on the machine weighs on both alike.
        results: dict[str, float] = {}
        for round_number, name in enumerate(("", "curve_", "curve_", "")):
            address, settings, pinned = modes[name]
            for key, value in measure(address, scale, settings, pinned, name,
                                      LEDGER_ADDS + round_number).items():
                results[key] = max(value, results.get(key, 0))
        for name in ("sequential_rtt_per_s", "pipelined_reads_per_s",
                     "pipelined_adds_per_s"):
            results[f"curve_cost_{name}"] = round(results[f"curve_{name}"] / results[name],
                                                  3)
        print(json.dumps(results))
    finally:
        for child in children:
            child.stdin.close()
            child.wait(timeout=60)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
