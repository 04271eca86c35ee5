#!/usr/bin/env python3
"""CPU of a bookie's ADD path per entry, and the share of each per-entry step its formats
impose, in one process with no network and no disk writes.

Usage::

    python benchmarks/add_steps_bench.py [--run N] [--dir DIR]

An ADD message of one run of ``N`` 1 KiB entries (48 by default: about what a bookie of
``cluster_bench.py --quick`` gets per message at full load) is decoded as a bookie server
decodes it (:func:`pybk.net.wire.decode_adds`: the entries are views of the body), added
(``add_entries_async``, then ``commit_queued`` on this thread, as the server does) and
checkpointed every 500 messages.  The bookie's file writes are counted, not made, and
fdatasync is skipped (:class:`CountingIO`): what is timed is the CPU of this thread
(``time.thread_time``), the interpreter's part, without the kernel's copies or the disk.

Then each step the formats make per entry is timed alone over the same runs:

* the entry header (ledger id, entry id, LAC: :mod:`pybk.storage.entries`), read to check
  that each entry names its ledger and id, and to find the run's highest LAC;
* the journal record header of each ADD record (length, CRC-32C, type:
  :mod:`pybk.storage.journal_codec`), which entry logs keep as their record header;
* the journal's write of a header and an entry buffer per record (``writev`` to
  ``/dev/null``: the iovecs, not the copy);
* the index's key and location per entry (:mod:`pybk.storage.index`), encoded and put
  into LMDB (without sync);

and, for comparison, the write cache's per-entry slots (in memory; no format).  Each
figure is the best of ``ROUNDS`` rounds (a shared machine only ever adds time).  Progress
goes to stderr; stdout gets one line of JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from typing import Callable, Sequence

import lmdb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from pybk.checksum import crc32c  # noqa: E402
from pybk.fileio import Buffer, FileIO  # noqa: E402
from pybk.net import wire  # noqa: E402
from pybk.settings import ServerSettings  # noqa: E402
from pybk.storage import Bookie, format_bookie  # noqa: E402
from pybk.storage import journal_codec as codec  # noqa: E402
from pybk.storage.entries import ENTRY_HEADER, make_entry  # noqa: E402
from pybk.storage.index import Index  # noqa: E402
from pybk.storage.writecache import WriteCache  # noqa: E402

ENTRY_BYTES = 1024
MESSAGES = 2000
CHECKPOINT_EVERY = 500      # messages; the write cache stays well under its half
ROUNDS = 5
LEDGER = 7
KEY = b"k" * 20             # a SHA-1-sized master key, as BookKeeper's
MAX_ENTRY = 1 << 20
LOG_ID = 3


def say(message: str) -> None:
    print(f"[add_steps_bench] {message}", file=sys.stderr, flush=True)


class CountingIO(FileIO):
    """Counts the bytes of the bookie's writes instead of making them (file headers and
    marks of at most 64 bytes are written, so that files open and roll as usual); no
    sync.  The files are wrong afterwards: the bookie is not reopened."""

    def write_all(self, fd: int, buffers: Sequence[Buffer]) -> int:
        if len(buffers) == 1 and len(buffers[0]) <= 64:
            return super().write_all(fd, buffers)
        return sum(map(len, buffers))

    def pwrite_all(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        pass

    def fdatasync(self, fd: int) -> None:
        pass

    def fsync(self, fd: int) -> None:
        pass

    def write_out(self, fd: int, offset: int, nbytes: int) -> None:
        pass


def bodies(run: int, first_ledger: int) -> list[bytes]:
    """``MESSAGES`` ADD bodies of one run each, with consecutive entry ids."""
    payload = os.urandom(ENTRY_BYTES - 24)
    out = []
    for m in range(MESSAGES):
        ids = list(range(m * run, (m + 1) * run))
        entries = [make_entry(first_ledger, e, e - 1, payload) for e in ids]
        out.append(wire.encode_adds([wire.AddRun(first_ledger, ids, entries, KEY)],
                                    MAX_ENTRY))
    return out


def best_ns_per_entry(step: Callable[[], object], entries: int) -> float:
    times = []
    for _ in range(ROUNDS):
        started = time.thread_time()
        step()
        times.append(time.thread_time() - started)
    return round(min(times) / entries * 1e9, 1)


def measure_path(workdir: str, run: int) -> dict:
    """CPU per entry of decode, add, commit and checkpoint, best of ``ROUNDS`` rounds
    (each on a ledger of its own)."""
    settings = ServerSettings(journalDirectory=os.path.join(workdir, "journal"),
                              ledgerDirectories=(os.path.join(workdir, "ledgers"),))
    format_bookie(settings)
    errors: list[list[BaseException | None]] = []
    totals, checkpoints = [], []
    with Bookie(settings, io=CountingIO(), start_background_threads=False) as bookie:
        for round_number in range(ROUNDS):
            messages = bodies(run, LEDGER + round_number)
            checkpoint_s = 0.0
            started = time.thread_time()
            for number, body in enumerate(messages, 1):
                bookie.add_entries_async(wire.decode_adds(body, MAX_ENTRY), errors.append,
                                         wake=False)
                bookie.commit_queued()
                if number % CHECKPOINT_EVERY == 0:
                    checkpoint_from = time.thread_time()
                    bookie.checkpoint()
                    checkpoint_s += time.thread_time() - checkpoint_from
            totals.append(time.thread_time() - started)
            checkpoints.append(checkpoint_s)
    if len(errors) != ROUNDS * MESSAGES or any(any(batch) for batch in errors):
        raise RuntimeError("an add failed or never completed")
    entries = MESSAGES * run
    best = min(range(ROUNDS), key=totals.__getitem__)
    return {"us_per_entry": round(totals[best] / entries * 1e6, 2),
            "checkpoint_us_per_entry": round(checkpoints[best] / entries * 1e6, 2),
            "rounds_us_per_entry": [round(t / entries * 1e6, 2) for t in totals]}


def measure_steps(workdir: str, run: int) -> dict:
    """Each per-entry step alone over the same runs, in ns per entry."""
    runs = [wire.decode_adds(body, MAX_ENTRY)[0] for body in bodies(run, LEDGER)]
    entries = MESSAGES * run
    seed = codec.ENTRY_CRC_SEED

    def entry_headers() -> None:
        for r in runs:
            ledgers, ids, lacs = zip(*map(ENTRY_HEADER.unpack_from, r.entries))
            assert ledgers.count(LEDGER) == len(ledgers) and list(ids) == r.entry_ids
            max(lacs)

    def record_headers() -> None:
        for r in runs:
            list(map(codec.RECORD.pack, map(len, r.entries),
                     map(crc32c, r.entries, itertools.repeat(seed)),
                     itertools.repeat(codec.ADD)))

    def checksums() -> None:
        for r in runs:
            list(map(crc32c, r.entries, itertools.repeat(seed)))

    headers = [[codec.RECORD.pack(len(e), crc32c(e, seed), codec.ADD) for e in r.entries]
               for r in runs]
    null = os.open(os.devnull, os.O_WRONLY)

    def journal_iovecs() -> None:
        for r, h in zip(runs, headers):
            os.writev(null, list(itertools.chain.from_iterable(zip(h, r.entries))))

    def write_cache() -> None:
        cache = WriteCache()
        for r, h in zip(runs, headers):
            cache.put_run(LEDGER, r.entry_ids, h, r.entries, ENTRY_BYTES * run)

    def location_items(r: wire.AddRun) -> list[tuple[bytes, bytes]]:
        offsets = itertools.accumulate(itertools.repeat(codec.RECORD.size + ENTRY_BYTES,
                                                        run), initial=64)
        return list(Index.record_items(itertools.repeat(LEDGER), r.entry_ids, LOG_ID,
                                       offsets, itertools.repeat(ENTRY_BYTES)))

    def index_items() -> None:
        for r in runs:
            location_items(r)

    items = list(itertools.chain.from_iterable(map(location_items, runs)))
    env = lmdb.open(os.path.join(workdir, "lmdb"), map_size=1 << 30, max_dbs=1,
                    sync=False, metasync=False)
    table = env.open_db(b"entries")

    def index_puts() -> None:
        with env.begin(write=True) as txn:
            txn.cursor(db=table).putmulti(items)

    try:
        steps = {"entry_header_check": entry_headers,
                 "journal_record_header": record_headers,
                 "journal_record_header_crc32c_only": checksums,
                 "journal_writev_iovecs": journal_iovecs,
                 "index_items_encoded": index_items,
                 "index_lmdb_puts": index_puts,
                 "write_cache_put_run": write_cache}
        return {name: best_ns_per_entry(step, entries) for name, step in steps.items()}
    finally:
        os.close(null)
        env.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=int, default=48, help="entries per ADD message")
    parser.add_argument("--dir", default=None, help="where the temporary bookie goes")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pybk-add-steps-", dir=args.dir) as workdir:
        path = measure_path(workdir, args.run)
        say(f"whole path: {path['us_per_entry']} µs/entry (checkpoint "
            f"{path['checkpoint_us_per_entry']})")
        steps = measure_steps(workdir, args.run)
    format_steps = ("entry_header_check", "journal_record_header", "journal_writev_iovecs",
                    "index_items_encoded", "index_lmdb_puts")
    imposed = sum(steps[name] for name in format_steps)
    for name, ns in steps.items():
        say(f"{name}: {ns} ns/entry")
    result = {"run": args.run, "entry_bytes": ENTRY_BYTES, "messages": MESSAGES,
              "path": path, "steps_ns_per_entry": steps,
              "format_steps_ns_per_entry": round(imposed, 1),
              "format_steps_share_of_path": round(imposed / 1000 / path["us_per_entry"], 3)}
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
