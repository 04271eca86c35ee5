"""The storage demo: durable adds, a kill -9, a restart, and every entry verified.

A child process adds entries to several ledgers (many in flight) and reports how many
were acknowledged; the parent kills it with SIGKILL (no clean shutdown, so the journal
must be replayed), starts a bookie on the same directories and reads every acknowledged
entry back, comparing bytes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from pybk.settings import ServerSettings
from pybk.storage import Bookie, format_bookie, make_entry

KEY = b"demo-master-key"
LEDGERS = 4
ENTRY_BYTES = 1024


def _settings(directory: str) -> ServerSettings:
    # A long flush interval leaves the acknowledged entries in the journal only, so the
    # restart really replays them.
    return ServerSettings(journalDirectory=os.path.join(directory, "journal"),
                          ledgerDirectories=(os.path.join(directory, "ledgers"),),
                          flushInterval=3_600_000, journalPreAllocSizeMB=4)


def _entry(ledger_id: int, entry_id: int) -> bytes:
    seed = hashlib.sha256(f"{ledger_id}/{entry_id}".encode()).digest()
    body = (seed * (ENTRY_BYTES // len(seed) + 1))[:ENTRY_BYTES - 24]
    return make_entry(ledger_id, entry_id, entry_id - 1, body)


def write_child(directory: str, count: int) -> None:
    """Add ``count`` entries per ledger, print the result, then wait to be killed."""
    bookie = Bookie(_settings(directory))
    entries = [[_entry(ledger, e) for e in range(count)] for ledger in range(LEDGERS)]
    remaining = [LEDGERS * count]
    all_done = threading.Event()
    window = threading.BoundedSemaphore(2000)

    def acknowledged(error: BaseException | None) -> None:
        if error is not None:
            print(f"add failed: {error}", flush=True)
        window.release()
        remaining[0] -= 1
        if remaining[0] == 0:
            all_done.set()

    started = time.perf_counter()
    for e in range(count):
        for ledger in range(LEDGERS):
            window.acquire()
            bookie.add_entry_async(ledger, e, entries[ledger][e], KEY, callback=acknowledged)
    all_done.wait()
    elapsed = time.perf_counter() - started
    print(f"acknowledged {LEDGERS * count} {elapsed:.6f}", flush=True)
    time.sleep(3600)  # the parent kills us: no clean close, no final checkpoint


def run_demo(directory: str | None, count: int) -> int:
    """Run the whole demo; returns the process exit code (0 when all entries verified)."""
    own_dir = directory is None
    directory = directory or tempfile.mkdtemp(prefix="pybk-demo-", dir=os.getcwd())
    try:
        settings = _settings(directory)
        format_bookie(settings, force=True)
        print(f"pybk storage demo in {directory}")
        child = subprocess.Popen([sys.executable, "-m", "pybk", "demo", "--child",
                                  "--dir", directory, "--count", str(count)],
                                 stdout=subprocess.PIPE, text=True)
        try:
            line = child.stdout.readline().split()
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(30)
        if not line or line[0] != "acknowledged":
            print("the writer failed before acknowledging its entries")
            return 1
        total, seconds = int(line[1]), float(line[2])
        print(f"writer: {total} entries of {ENTRY_BYTES} B acknowledged durably in "
              f"{seconds:.2f} s ({total / seconds:,.0f} entries/s), then killed with SIGKILL")
        started = time.perf_counter()
        with Bookie(settings) as bookie:
            restart = time.perf_counter() - started
            replay = bookie.replay_stats
            print(f"restart: {restart:.2f} s, replayed {replay['records']} journal records "
                  f"({replay['bytes'] / 1e6:.1f} MB)")
            started = time.perf_counter()
            bad = sum(bookie.read_entry(ledger, e) != _entry(ledger, e)
                      for ledger in range(LEDGERS) for e in range(count))
            read_seconds = time.perf_counter() - started
        if bad:
            print(f"FAILED: {bad} of {total} entries differ after the restart")
            return 1
        print(f"verified: all {total} acknowledged entries read back byte-identical "
              f"({total / read_seconds:,.0f} reads/s)")
        return 0
    finally:
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)
