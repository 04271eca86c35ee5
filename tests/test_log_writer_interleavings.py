"""Randomized interleavings of a log writer's appends, rolls, syncs and truncations with
bookie and metadata faults, with ``deferredSync`` on and off.

Each seed draws a bounded schedule (``random.Random(seed)``) over four in-process bookies
(tests/clientutil.py: real bookies, a real embedded metadata store, fault hooks between)
and runs it against a real :class:`~pybk.log.LogWriter` whose segments are small, so
that it rolls every few appends.  Even seeds write with ``deferredSync``, odd ones
without.  The steps:

- appends (``append_async``, a few at a time), and ``sync()`` (bounded by a timeout);
- ``truncate()`` before a position an append returned, in its own thread (it waits for
  held metadata writes);
- bookie faults: adds or forces failing, dropped (no answer), replies held and released
  later (as given, or failed), a bookie slowed down, faults lifted;
- metadata writes held (landing later, in an order the schedule picks) or slowed;
- a new writer taking the log over (another client's ``LogWriter.open``, the way a
  restarted application does) once the writer stopped, or at random.

Then every fault is lifted, every thread joined and the last writer closed, each wait
bounded, and a fresh client opens the log (a writer's open: it recovers whatever the
writers left open) and reads it all.  The rules, each by one function below:

1. Durable: every record appended to a writer before a ``sync()`` of it that returned
   and, without deferred sync, every record whose append returned, is read back, unless
   a truncation was asked for past it (:func:`check_durable`).
2. Nothing else, in order, once: every record read is one the run appended, each once,
   in the order the appends were made, at the position its append returned if it
   returned one (:func:`check_read_back`).
3. Every append completes: once its writer is closed, every append's future is done
   (:func:`check_completed`).

CI runs :data:`CI_SEEDS` seeds.  By hand, ``PYBK_LOG_SEEDS=N`` runs N seeds from
``PYBK_LOG_FIRST_SEED`` (default 0).  A failure names its seed, the command that replays
it, the schedule and what happened at each step.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time
import traceback
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

import pytest
from clientutil import FAST, Cluster

from pybk.errors import BookKeeperError
from pybk.log import LogReader, LogWriter, Position
from pybk.settings import LogSettings

CI_SEEDS = 10
SEED_TIMEOUT_S = 90
BOOKIES = 4
LOG = "log"
QUORUMS = ((3, 2, 2), (3, 3, 2), (2, 2, 2), (2, 2, 1))
SETTINGS = dataclasses.replace(FAST, addEntryTimeout=0.5, readTimeout=0.5)
SYNC_TIMEOUT_S = 2.0  # a sync waiting for a held roll gives up (Timeout) after this
JOIN_S = 30.0         # the longest a thread of a run may take once faults are lifted


def _seeds() -> list[int]:
    count = int(os.environ.get("PYBK_LOG_SEEDS", CI_SEEDS))
    first = int(os.environ.get("PYBK_LOG_FIRST_SEED", 0))
    return list(range(first, first + count))


def payload(seed: int, index: int) -> bytes:
    """Record ``index`` of a run (sizes vary, so that batches and segments do)."""
    return f"seed {seed} record {index};".encode() * (1 + (seed * 7 + index) % 17)


def index_of(seed: int, data: bytes) -> int | None:
    """The index of a record this run appended, or None if these bytes are no record of
    it."""
    head = data.split(b";", 1)[0].decode("ascii", "replace").split()
    if len(head) != 4 or head[:3] != ["seed", str(seed), "record"] \
            or not head[3].isdigit():
        return None
    index = int(head[3])
    return index if payload(seed, index) == data else None


# -- the schedule ------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    kind: str
    args: tuple = ()

    def __str__(self) -> str:
        return " ".join([self.kind, *map(str, self.args)])


_WEIGHTS = {
    "append": 30, "sync": 8, "truncate": 3, "pause": 5, "fail": 3, "drop": 2, "hold": 3,
    "release": 5, "delay": 1, "heal": 6, "meta_hold": 2, "meta_release_one": 3,
    "meta_release_all": 2, "meta_delay": 1, "take_over": 1,
}


def make_schedule(rng: random.Random, deferred: bool) -> list[Step]:
    """30-60 steps.  Only a deferred writer forces, and one add fault stops it (a
    deferred segment does not change its ensemble): its faults are mostly forces'."""
    operations = ("add", "force_ledger", "force_ledger") if deferred else ("add",)
    return [_random_step(rng, operations) for _ in range(rng.randint(30, 60))]


def _random_step(rng: random.Random, operations: tuple[str, ...]) -> Step:
    kind = rng.choices(list(_WEIGHTS), weights=list(_WEIGHTS.values()))[0]
    bookie = f"B{rng.randint(1, BOOKIES)}"
    if kind == "append":
        return Step(kind, (rng.randint(1, 6),))
    if kind == "pause":
        return Step(kind, (rng.choice((0.005, 0.02, 0.05)),))
    if kind == "truncate":  # before the n-th of the positions returned so far (a fraction)
        return Step(kind, (rng.random(),))
    if kind in ("fail", "drop", "hold"):
        return Step(kind, (bookie, rng.choice(operations)))
    if kind == "release":
        return Step(kind, (bookie, rng.choice(("as-given", "as-given", "failed"))))
    if kind == "delay":
        return Step(kind, (bookie, rng.choice((0.005, 0.02))))
    if kind == "heal":
        return Step(kind, (bookie,))
    if kind == "meta_release_one":
        return Step(kind, (rng.randrange(3),))
    if kind == "meta_delay":
        return Step(kind, (rng.choice((0.0, 0.005, 0.02)),))
    return Step(kind)


# -- what a run observes -----------------------------------------------------------------

@dataclass
class Append:
    """One append: its record's index, the writer it went to, its future."""

    index: int
    writer: int
    future: Future


@dataclass
class Observed:
    deferred: bool
    appends: list[Append] = field(default_factory=list)
    #: Per writer, how many appends of the run had been made when its last successful
    #: sync() was called: every append to it before that one must be durable.
    synced_before: dict[int, int] = field(default_factory=dict)
    truncated_below: Position | None = None  # the highest bound any truncate() was given
    read: list[tuple[Position, bytes]] | str = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


def returned(append: Append) -> Position | None:
    """The position an append returned, or None (failed, or not done)."""
    future = append.future
    if not future.done() or future.exception() is not None:
        return None
    return future.result()


def required(seen: Observed) -> list[Append]:
    """The appends whose records must be read back (rule 1)."""
    must = []
    for append in seen.appends:
        position = returned(append)
        synced = append.index < seen.synced_before.get(append.writer, 0)
        if not (synced or (not seen.deferred and position is not None)):
            continue
        if seen.truncated_below is not None and (
                position is None or position < seen.truncated_below):
            continue  # a truncation may have taken it
        must.append(append)
    return must


# -- the checkers: each returns what it found wrong (nothing: the rule holds) ------------

def check_durable(seen: Observed, seed: int) -> list[str]:
    """Rule 1: every record that must be durable is read back."""
    if isinstance(seen.read, str):
        return [f"a fresh client could not read the log: {seen.read}"]
    found = {index_of(seed, data) for _, data in seen.read}
    problems = []
    for append in required(seen):
        if append.future.done() and append.future.exception() is not None:
            problems.append(f"record {append.index} failed ({append.future.exception()!r})"
                            f" although a sync() of writer {append.writer} after it "
                            "returned")
        elif append.index not in found:
            problems.append(f"record {append.index} (writer {append.writer}, position "
                            f"{returned(append)}) must be durable but is not read back")
    return problems


def check_read_back(seen: Observed, seed: int) -> list[str]:
    """Rule 2: only appended records, once each, in append order, at their positions."""
    if isinstance(seen.read, str):
        return []  # check_durable reports it
    problems = []
    indexes = []
    by_index = {append.index: append for append in seen.appends}
    for position, data in seen.read:
        index = index_of(seed, data)
        if index is None or index not in by_index:
            problems.append(f"at {position}: {data[:40]!r}..., never appended")
            continue
        indexes.append(index)
        given = returned(by_index[index])
        if given is not None and given != position:
            problems.append(f"record {index} is read at {position}, its append returned "
                            f"{given}")
    if indexes != sorted(set(indexes)):
        problems.append(f"records read out of append order or twice: {indexes}")
    positions = [position for position, _ in seen.read]
    if positions != sorted(set(positions)):
        problems.append("positions read do not increase")
    return problems


def check_completed(seen: Observed) -> list[str]:
    """Rule 3: every append completed once its writer was closed."""
    pending = [append.index for append in seen.appends if not append.future.done()]
    return [f"appends {pending} never completed"] if pending else []


# -- running a schedule ------------------------------------------------------------------

class Run:
    """One seed: the cluster, the writers, the threads, and what they observed."""

    def __init__(self, cluster: Cluster, seed: int) -> None:
        self.cluster = cluster
        self.seed = seed
        self.rng = random.Random(seed)
        e, qw, qa = self.quorums = self.rng.choice(QUORUMS)
        self.settings = LogSettings(
            ensembleSize=e, writeQuorumSize=qw, ackQuorumSize=qa,
            segmentMaxBytes=self.rng.choice((600, 1500, 4000)),
            batchMaxBytes=self.rng.choice((400, 2000)),
            maxOutstandingBatches=self.rng.choice((1, 2, 4)),
            deferredSync=seed % 2 == 0)
        self.schedule = make_schedule(self.rng, self.settings.deferredSync)
        self.seen = Observed(self.settings.deferredSync)
        self.notes: list[str] = []
        self.started = time.monotonic()
        self.threads: list[threading.Thread] = []
        self.writers: list[LogWriter] = []
        self.writer: LogWriter | None = None
        self.open_writer()

    def note(self, text: str) -> None:
        self.notes.append(f"{time.monotonic() - self.started:6.3f} {text}")

    # writers
    def open_writer(self) -> str:
        """A new writer on a new client (it fences the one before, if any)."""
        try:
            writer = LogWriter.open(self.cluster.client(SETTINGS), LOG, self.settings)
        except BookKeeperError as e:
            self.writer = None
            return f"open failed: {e!r}"
        self.writers.append(writer)
        self.writer = writer
        return f"writer {len(self.writers) - 1} opened"

    def close_writer(self, number: int) -> str:
        """Close writer ``number`` (a close that returns promises nothing about a writer
        that stopped earlier: only sync() counts)."""
        try:
            self.writers[number].close()
        except BookKeeperError as e:
            return f"writer {number} closed: {e!r}"
        return f"writer {number} closed"

    def take_over(self) -> str:
        """Close the writer (bounded: its own timeouts) and open a new one, with the
        metadata writes let go first (an opening writer waits for them)."""
        self.cluster.metadata_faults.release_all()
        if self.writer is None:
            return f"no writer; {self.open_writer()}"
        return f"{self.sync()}; {self.close_writer(len(self.writers) - 1)}; " \
            f"{self.open_writer()}"

    # appends, syncs, truncations
    def append(self, count: int) -> str:
        if self.writer is None:
            return "no writer"
        number = len(self.writers) - 1
        made = []
        for _ in range(count):
            index = len(self.seen.appends)
            try:
                future = self.writer.append_async(payload(self.seed, index))
            except BookKeeperError as e:
                made.append(f"refused ({type(e).__name__})")
                break
            self.seen.appends.append(Append(index, number, future))
            made.append(f"#{index}")
        return ", ".join(made)

    def sync(self) -> str:
        if self.writer is None:
            return "no writer"
        number, made = len(self.writers) - 1, len(self.seen.appends)
        try:
            self.writer.sync(timeout=SYNC_TIMEOUT_S)
        except BookKeeperError as e:
            return f"raised {e!r}"
        self.seen.synced_before[number] = made
        return f"returned: appends before #{made} durable"

    def truncate(self, fraction: float) -> str:
        positions = [p for p in map(returned, self.seen.appends) if p is not None]
        if self.writer is None or not positions:
            return "nothing to truncate"
        before = positions[int(fraction * len(positions))]
        if self.seen.truncated_below is None or before > self.seen.truncated_below:
            self.seen.truncated_below = before
        writer = self.writer

        def truncate() -> None:
            try:
                self.note(f"truncate({before}): {writer.truncate(before)} ledgers deleted")
            except BookKeeperError as e:
                self.note(f"truncate({before}): {e!r}")
        self.start(f"truncate-{before}", truncate)
        return f"truncate({before}) started"

    def start(self, name: str, body: Callable[[], None]) -> None:
        def guarded() -> None:
            try:
                body()
            except Exception:  # noqa: BLE001 - reported as a failure of the seed
                self.seen.unexpected.append(f"{name}: {traceback.format_exc()}")
        thread = threading.Thread(target=guarded, name=f"log-interleavings-{name}",
                                  daemon=True)
        self.threads.append(thread)
        thread.start()

    # the steps
    def do(self, step: Step) -> str:
        """Run one step; returns what happened (for the failure message)."""
        kind, args = step.kind, step.args
        metadata = self.cluster.metadata_faults
        if kind == "append":
            result = self.append(args[0])
            if self.writer is not None and "refused" in result:  # it stopped: the
                result += "; " + self.take_over()              # application reopens
            return result
        if kind == "sync":
            return self.sync()
        if kind == "truncate":
            return self.truncate(args[0])
        if kind == "take_over":
            return self.take_over()
        if kind == "pause":
            time.sleep(args[0])
            return ""
        if kind == "meta_hold":
            metadata.hold_writes = True
            return "holding metadata writes"
        if kind == "meta_release_one":
            held = metadata.held()
            if not held:
                return "none held"
            write = held[args[0] % len(held)]
            metadata.release(write)
            return f"released {write.operation} {write.path}"
        if kind == "meta_release_all":
            count = len(metadata.held())
            metadata.release_all()
            return f"released {count}, no longer holding"
        if kind == "meta_delay":
            metadata.delay_s = args[0]
            return ""
        faults = self.cluster.faults[args[0]]
        if kind in ("fail", "drop", "hold"):
            getattr(faults, kind).add(args[1])
            return ""
        if kind == "release":
            error = BookKeeperError("injected late failure") if args[1] == "failed" else None
            return f"{faults.release(error)} replies {args[1]}"
        if kind == "delay":
            faults.delay_s = args[1]
            return ""
        if kind == "heal":
            return f"{self.heal(args[0])} held replies released"
        raise AssertionError(f"unknown step {step}")

    def heal(self, bookie_id: str) -> int:
        faults = self.cluster.faults[bookie_id]
        faults.fail.clear()
        faults.drop.clear()
        faults.hold.clear()
        faults.delay_s = 0.0
        return faults.release()

    def lift_everything(self) -> None:
        metadata = self.cluster.metadata_faults
        metadata.delay_s = 0.0
        metadata.release_all()
        for bookie_id in self.cluster.bookie_ids:
            self.heal(bookie_id)

    def run(self) -> None:
        for number, step in enumerate(self.schedule, 1):
            try:
                result = self.do(step)
            except Exception:  # noqa: BLE001 - reported as a failure of the seed
                result = "raised"
                self.seen.unexpected.append(f"step {number} {step}: {traceback.format_exc()}")
            self.note(f"step {number:2d} {step}: {result}")
            time.sleep(self.rng.choice((0, 0, 0.002, 0.01)))
        self.settle()

    def settle(self) -> None:
        """Lift the faults, join the threads, close the writers, read from a fresh
        client."""
        self.lift_everything()
        deadline = time.monotonic() + JOIN_S
        for thread in self.threads:
            while thread.is_alive() and time.monotonic() < deadline:
                self.lift_everything()  # a write may have been held as faults lifted
                thread.join(0.05)
            if thread.is_alive():
                self.seen.unexpected.append(f"{thread.name} still running {JOIN_S} s after "
                                            "every fault was lifted")
        self.note(f"settle: sync {self.sync()}")
        for number in range(len(self.writers)):
            self.note(f"settle: {self.close_writer(number)}")
        self.read_fresh()

    def close_writers(self) -> None:
        """Close every writer (again: closing twice does nothing), whatever happened."""
        for writer in self.writers:
            try:
                writer.close()
            except BookKeeperError:
                pass  # a run that got here failed already, or reported it at settle

    def read_fresh(self) -> None:
        """A fresh client takes the log over (recovering what was left open) and reads
        every record."""
        try:
            with LogWriter.open(self.cluster.client(SETTINGS), LOG, self.settings):
                self.seen.read = list(LogReader(self.cluster.client(SETTINGS), LOG).read())
        except BookKeeperError as e:
            self.seen.read = repr(e)
        read = self.seen.read
        self.note(f"fresh reader: {read if isinstance(read, str) else len(read)} records")

    def problems(self) -> list[str]:
        found = [f"unexpected error: {u}" for u in self.seen.unexpected]
        for rule, problems in (
                ("1 durable", check_durable(self.seen, self.seed)),
                ("2 read back", check_read_back(self.seen, self.seed)),
                ("3 completed", check_completed(self.seen))):
            found += [f"rule {rule}: {p}" for p in problems]
        return found

    def report(self, problems: list[str]) -> str:
        e, qw, qa = self.quorums
        s = self.settings
        return "\n".join([
            f"seed {self.seed} (E={e} Qw={qw} Qa={qa}, deferredSync={s.deferredSync}, "
            f"segmentMaxBytes={s.segmentMaxBytes}, batchMaxBytes={s.batchMaxBytes}, "
            f"maxOutstandingBatches={s.maxOutstandingBatches}) broke the rules; replay with "
            f"PYBK_LOG_SEEDS=1 PYBK_LOG_FIRST_SEED={self.seed} "
            "python -m pytest tests/test_log_writer_interleavings.py",
            *[f"  {p}" for p in problems],
            f"appends: {len(self.seen.appends)}; synced before: {self.seen.synced_before}; "
            f"truncated below: {self.seen.truncated_below}",
            "schedule: " + "; ".join(map(str, self.schedule)),
            "what happened:", *[f"  {n}" for n in self.notes]])


@pytest.fixture
def cluster(tmp_path):
    made = Cluster(str(tmp_path / "cluster"), BOOKIES)
    yield made
    made.close()


@pytest.mark.timeout(SEED_TIMEOUT_S)
@pytest.mark.parametrize("seed", _seeds())
def test_random_interleaving_keeps_the_log_rules(cluster, seed):
    run = Run(cluster, seed)
    try:
        run.run()
    finally:
        run.lift_everything()  # also on failure: no client thread stays blocked
        run.close_writers()
    problems = run.problems()
    assert not problems, run.report(problems)
