"""A bookie under load, there to be killed (run by the crash tests, not by pytest).

    python tests/crash_child.py --acks FILE [--seed N] [options] key=value ...

The ``key=value`` arguments are ServerSettings.  The child formats the directories if
they hold no cookie, opens a Bookie and has ``--threads`` threads add entries to the
ledgers of ``crashutil.LEDGERS`` (each thread owns every ``threads``-th ledger and adds its
entry ids in order, continuing after the highest id the bookie already holds), mixing
blocking and asynchronous adds of ``crashutil.expected_entry`` bytes, now and then with an
explicit LAC.  Each acknowledged add or LAC is appended to the ``--acks`` file.  It runs
until killed (or ``--max-seconds``).  Any error exits with status 2 and a traceback.

``--deferred`` makes every add a deferred one (of a DEFERRED_SYNC ledger: acknowledged once
written), each thread forcing a ledger after every ``FORCE_EVERY`` of its adds: an add goes
to the ``--acks`` file only once a force after it completed, and to the ``--written`` file
once it was acknowledged as written.

``--new-ledgers`` makes every add the first of a new ledger (its entry 0, ledgers from
``crashutil.NEW_LEDGERS_FROM`` on, each thread every ``threads``-th id), blocking and
asynchronous as above: the adds that journal a ledger's master key with its first entry.

``--faulty-log`` puts a :class:`pybk.testing.faultyio.FaultyFileIO` under the bookie that logs its
unsynced writes there; with ``--kill-before-sync N`` the child SIGKILLs itself just before
its N-th sync (of a file whose name ends with ``--kill-sync-of``), with
``--kill-before-log-header`` just before it writes the header of a new entry log.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import sys
import threading
import traceback

from crashutil import KEY, LEDGERS, NEW_LEDGERS_FROM, AckLog, expected_entry

from pybk.errors import NoSuchLedger
from pybk.fileio import DEFAULT_IO
from pybk.settings import ServerSettings
from pybk.storage import Bookie, format_bookie
from pybk.storage.cookie import is_formatted
from pybk.testing.faultyio import FaultyFileIO

ASYNC_WINDOW = 16     # asynchronous adds in flight per thread
LAC_EVERY = 41        # a thread sets an explicit LAC after every 41st add
FORCE_EVERY = 8       # --deferred: a thread forces a ledger after every 8th add of it


def fail() -> None:
    traceback.print_exc()
    sys.stderr.flush()
    os._exit(2)


def deferred_writer(bookie: Bookie, ledgers: list[int], rng: random.Random, acks: AckLog,
                    written: AckLog) -> None:
    """Deferred adds, one at a time; a ledger is forced after every FORCE_EVERY of them,
    and only then are they acknowledged in ``acks``."""
    try:
        unforced: dict[int, list[int]] = {ledger_id: [] for ledger_id in ledgers}
        next_ids = {ledger_id: next_entry_id(bookie, ledger_id) for ledger_id in ledgers}
        while True:
            ledger_id = rng.choice(ledgers)
            entry_id = next_ids[ledger_id]
            next_ids[ledger_id] += 1
            bookie.add_entry_async(ledger_id, entry_id, expected_entry(ledger_id, entry_id),
                                   KEY, deferred=True).result(timeout=30)
            written.entry(ledger_id, entry_id)
            unforced[ledger_id].append(entry_id)
            if len(unforced[ledger_id]) >= FORCE_EVERY:
                bookie.force(ledger_id).result(timeout=30)
                for forced_id in unforced[ledger_id]:
                    acks.entry(ledger_id, forced_id)
                unforced[ledger_id].clear()
    except BaseException:
        fail()


def next_entry_id(bookie: Bookie, ledger_id: int) -> int:
    """The id after the highest one the bookie holds for the ledger."""
    try:
        last = bookie.last_entry_id(ledger_id)
    except NoSuchLedger:
        last = None
    return 0 if last is None else last + 1


class Adder:
    """One thread's adds, blocking or asynchronous at random (ASYNC_WINDOW in flight),
    each written to the ack log once acknowledged."""

    def __init__(self, bookie: Bookie, rng: random.Random, acks: AckLog) -> None:
        self._bookie = bookie
        self._rng = rng
        self._acks = acks
        self._window = threading.BoundedSemaphore(ASYNC_WINDOW)

    def add(self, ledger_id: int, entry_id: int) -> None:
        data = expected_entry(ledger_id, entry_id)
        if self._rng.random() < 0.5:
            self._bookie.add_entry(ledger_id, entry_id, data, KEY)
            self._acks.entry(ledger_id, entry_id)
            return
        if not self._window.acquire(timeout=30):
            raise TimeoutError("asynchronous adds not acknowledged within 30 s")

        def done(error: BaseException | None) -> None:
            if error is not None:
                print(f"add {ledger_id}/{entry_id} failed: {error!r}", file=sys.stderr)
                os._exit(2)
            self._acks.entry(ledger_id, entry_id)
            self._window.release()

        self._bookie.add_entry_async(ledger_id, entry_id, data, KEY, callback=done)


def new_ledger_writer(bookie: Bookie, first_ledger: int, step: int, rng: random.Random,
                      acks: AckLog) -> None:
    """Entry 0 of ledgers ``first_ledger``, ``first_ledger + step``, ...: each add is its
    ledger's first."""
    try:
        adder = Adder(bookie, rng, acks)
        for ledger_id in itertools.count(first_ledger, step):
            adder.add(ledger_id, 0)
    except BaseException:
        fail()


def writer(bookie: Bookie, ledgers: list[int], rng: random.Random, acks: AckLog) -> None:
    try:
        next_ids = {ledger_id: next_entry_id(bookie, ledger_id) for ledger_id in ledgers}
        adder = Adder(bookie, rng, acks)
        for count in range(1, 1 << 62):
            ledger_id = rng.choice(ledgers)
            entry_id = next_ids[ledger_id]
            next_ids[ledger_id] += 1
            adder.add(ledger_id, entry_id)
            if count % LAC_EVERY == 0:
                bookie.set_explicit_lac(ledger_id, entry_id, KEY).result(timeout=30)
                acks.lac(ledger_id, entry_id)
    except BaseException:
        fail()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--acks", required=True, help="file of acknowledged operations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--faulty-log", help="log unsynced writes here (FaultyFileIO)")
    parser.add_argument("--kill-before-sync", type=int, default=0)
    parser.add_argument("--kill-sync-of", default="", help="count only syncs of files "
                        "whose name ends so (e.g. .log)")
    parser.add_argument("--kill-before-log-header", action="store_true")
    parser.add_argument("--deferred", action="store_true", help="deferred adds and forces")
    parser.add_argument("--written", help="--deferred: file of adds acknowledged as written")
    parser.add_argument("--new-ledgers", action="store_true",
                        help="every add is the first of a new ledger")
    parser.add_argument("settings", nargs="+", help="ServerSettings as key=value")
    args = parser.parse_args()
    settings = ServerSettings.from_mapping(dict(kv.split("=", 1) for kv in args.settings))
    if not is_formatted(settings):
        format_bookie(settings)

    io = DEFAULT_IO
    if args.faulty_log:
        syncs = [0]

        def kill_when(op: str, path: str, offset: int) -> bool:
            if op == "sync" and path.endswith(args.kill_sync_of):
                syncs[0] += 1
                return syncs[0] == args.kill_before_sync
            return args.kill_before_log_header and path.endswith(".log.new") and offset == 0 \
                and os.path.getsize(path) == 0

        io = FaultyFileIO(args.faulty_log, kill_when)

    bookie = Bookie(settings, io=io)  # never closed: the child ends by SIGKILL
    acks = AckLog(args.acks)
    written = AckLog(args.written) if args.written else None
    for t in range(args.threads):
        rng = random.Random(args.seed * 1000 + t)
        ledgers = list(LEDGERS[t::args.threads])
        if args.new_ledgers:
            threading.Thread(target=new_ledger_writer, args=(
                bookie, NEW_LEDGERS_FROM + t, args.threads, rng, acks), daemon=True).start()
        elif args.deferred:
            assert written is not None, "--deferred needs --written"
            threading.Thread(target=deferred_writer, args=(bookie, ledgers, rng, acks, written),
                             daemon=True).start()
        else:
            threading.Thread(target=writer, args=(bookie, ledgers, rng, acks),
                             daemon=True).start()
    threading.Event().wait(args.max_seconds)
    os._exit(0)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        fail()
