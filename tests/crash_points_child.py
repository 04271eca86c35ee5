"""A bookie that adds, deletes ledgers, checkpoints, collects garbage and compacts, there
to be killed just before one chosen durable step (run by ``tests/test_crash_points.py``).

    python tests/crash_points_child.py --acks FILE --faulty-log FILE
        (--count FILE | --kill-before KIND:K) key=value ...

The ``key=value`` arguments are ServerSettings.  The child formats the directories,
opens a Bookie on a :class:`pybk.testing.faultyio.FaultyFileIO` (logging its unsynced
writes to ``--faulty-log``) and runs :data:`STEPS` steps drawn with ``--seed``: adds of
``crashutil.expected_entry`` bytes to ledgers from ``FIRST_LEDGER`` on (new ones now and
then), one at a time or a few ledgers' in one journal group, each waited for; deletions;
checkpoints; garbage collections; compactions at ``majorCompactionThreshold``.  The
``--acks`` file (``crashutil.AckLog``) gets each acknowledged add and deletion, and each
deletion also just before it is asked for.

Every step that makes something durable is counted by kind (``crashutil.step_kind``):
the writes, syncs, renames and removals of journals, entry logs and LastLogMarks, which
go through FaultyFileIO, and the index's transactions, which this child announces to it
(LMDB writes its own files).  One thread, blocking calls and no background threads of the
bookie: the steps of each kind come in the same order in every run of a seed (the
journal's on its thread, the others on this one).  ``--count`` runs to the end and writes
how many steps of each kind were taken (JSON); ``--kill-before KIND:K`` SIGKILLs the child
just before its K-th step of that kind.  Any error exits with status 2 and a traceback.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sys
import threading
import traceback
from collections import Counter
from concurrent.futures import Future

from crashutil import INDEX_STEPS, KEY, AckLog, expected_entry, step_kind

from pybk.settings import ServerSettings
from pybk.storage import Bookie, format_bookie
from pybk.storage.index import Index
from pybk.testing.faultyio import FaultyFileIO

#: Steps of the workload (about 70% adds).
STEPS = 200
#: The first ledger id; each new ledger takes the next one.
FIRST_LEDGER = 1
#: Ledgers taking adds at once (a new one is made when fewer are left).
LIVE_LEDGERS = 6


class StepCounter:
    """``kill_when`` of the FaultyFileIO: counts each step by kind, and says when to kill."""

    def __init__(self, kill_kind: str | None, kill_at: int) -> None:
        self.counts: Counter[str] = Counter()
        self._kill_kind = kill_kind
        self._kill_at = kill_at
        self._lock = threading.Lock()  # the journal's thread and this one

    def __call__(self, op: str, path: str, offset: int) -> bool:
        kind = step_kind(op, path)
        if kind is None:
            return False
        with self._lock:
            self.counts[kind] += 1
            return kind == self._kill_kind and self.counts[kind] == self._kill_at


def announce_index_transactions(io: FaultyFileIO) -> None:
    """Make each index transaction of a checkpoint, a compaction and GC (the methods
    :data:`crashutil.INDEX_STEPS`) a step of ``io``, taken just before it commits
    anything: in this process only."""
    for name in INDEX_STEPS:
        method = getattr(Index, name)

        @functools.wraps(method)
        def announced(index: Index, *args: object, _method=method, _name=name) -> object:
            io.step(_name, "index")
            return _method(index, *args)

        setattr(Index, name, announced)


def workload(bookie: Bookie, rng: random.Random, acks: AckLog, threshold: float) -> None:
    """:data:`STEPS` steps: adds (alone or in groups), deletions, checkpoints, GC,
    compactions."""
    next_ids: dict[int, int] = {}  # live ledgers -> their next entry id
    new_ledger = FIRST_LEDGER
    for _ in range(STEPS):
        while len(next_ids) < LIVE_LEDGERS:
            next_ids[new_ledger] = 0
            new_ledger += 1
        roll = rng.random()
        if roll < 0.45:
            ledger_id = rng.choice(sorted(next_ids))
            entry_id = next_ids[ledger_id]
            next_ids[ledger_id] += 1
            bookie.add_entry(ledger_id, entry_id, expected_entry(ledger_id, entry_id), KEY)
            acks.entry(ledger_id, entry_id)
        elif roll < 0.7:
            add_batch(bookie, rng, acks, next_ids)
        elif roll < 0.8:
            ledger_id = rng.choice(sorted(next_ids))
            del next_ids[ledger_id]
            acks.deleting(ledger_id)
            bookie.delete_ledger(ledger_id)
            acks.deleted(ledger_id)
        elif roll < 0.88:
            bookie.checkpoint()
        elif roll < 0.94:
            bookie.collect_garbage()
        else:
            bookie.compact(threshold)


def add_batch(bookie: Bookie, rng: random.Random, acks: AckLog,
              next_ids: dict[int, int]) -> None:
    """Adds to two or three ledgers, one to four each, in one journal group; waits for
    them."""
    runs = []
    for ledger_id in rng.sample(sorted(next_ids), rng.randint(2, 3)):
        first = next_ids[ledger_id]
        next_ids[ledger_id] += rng.randint(1, 4)
        entry_ids = range(first, next_ids[ledger_id])
        runs.append((ledger_id, entry_ids, [expected_entry(ledger_id, entry_id)
                                            for entry_id in entry_ids], KEY, False))
    result: Future = Future()
    bookie.add_entries_async(runs, result.set_result)
    errors = result.result(timeout=30)
    assert not any(errors), errors
    for ledger_id, entry_ids, _entries, _key, _recovery in runs:
        for entry_id in entry_ids:
            acks.entry(ledger_id, entry_id)


def fail() -> None:
    traceback.print_exc()
    sys.stderr.flush()
    os._exit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--acks", required=True, help="file of acknowledged operations")
    parser.add_argument("--faulty-log", required=True, help="log unsynced writes here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", help="run to the end; write the steps of each kind here")
    parser.add_argument("--kill-before", help="KIND:K: SIGKILL just before the K-th step "
                        "of that kind")
    parser.add_argument("settings", nargs="+", help="ServerSettings as key=value")
    args = parser.parse_args()
    settings = ServerSettings.from_mapping(dict(kv.split("=", 1) for kv in args.settings))
    format_bookie(settings)
    kill_kind, kill_at = None, 0
    if args.kill_before:
        kill_kind, _, at = args.kill_before.rpartition(":")
        kill_at = int(at)
    counter = StepCounter(kill_kind, kill_at)
    io = FaultyFileIO(args.faulty_log, counter)
    announce_index_transactions(io)
    # Never closed: the child ends by SIGKILL, or by os._exit once counted.
    bookie = Bookie(settings, io=io, start_background_threads=False)
    workload(bookie, random.Random(args.seed), AckLog(args.acks),
             settings.majorCompactionThreshold)
    bookie.checkpoint()  # the last steps; the journal's thread is idle after it
    if args.count:
        with open(args.count, "w") as f:
            json.dump(dict(counter.counts), f)
    os._exit(0)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        fail()
