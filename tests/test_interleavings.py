"""Randomized interleavings of one ledger's writer, its faults, its close and a recovery.

Each seed draws a bounded schedule (``random.Random(seed)``) over five in-process bookies
and one ledger (E/Qw/Qa drawn from valid combinations) and runs it against real clients:

- the writer's adds (``add_entry_then``), a few at a time;
- bookie faults: adds failing with an error, dropped (no answer: ``addEntryTimeout``
  decides), replies held and released late (as the bookie gave them, or failed), the
  bookie unreachable, slowed down, stopped (crashed) and restarted on its directories;
  fence and entry reads of a recovery dropped or held too;
- metadata writes held (landing later, in an order the schedule picks) or slowed;
- the writer's ``close()`` and recoveries by other clients (``open_ledger(recovery=True)``),
  each in its own thread, concurrently with everything above.

Then every fault is lifted, held replies and writes are let go, stopped bookies restart,
the writer is closed (if the schedule did not) and every thread is joined, each wait
bounded.  Two fresh clients open the ledger with recovery and read it all.  The rules
checked, each by one small function below:

1. Durable successes: every add whose callback reported success is at or below the
   closed last entry, and a fresh client reads it back with the bytes that were added
   (:func:`check_successes_are_durable`).
2. Completion order: callbacks come one at a time in entry-id order, once per accepted
   add; the successes are entries 0..k in order and no success follows a failure; the
   adds made before ``close()`` was called are all completed when it returns
   (:func:`check_completions`).
3. Readers agree: the two fresh readers see the same last entry and the same bytes, the
   bytes are those the writer added, and every recovery that succeeded during the run
   closed the ledger at that same last entry (:func:`check_readers_agree`).
4. Well-formed fragments in every metadata record observed: the first fragment starts at
   entry 0, first entry ids strictly increase, each ensemble has E distinct known
   bookies, and when CLOSED every fragment starts at or below last entry + 1
   (:func:`check_fragments`).
5. A CLOSED record is final: once a read of the record (a watch on it, and a read at
   every step) saw it CLOSED, every later read returns the same version and bytes
   (:func:`check_closed_record_is_final`).
6. The writer's close: it returns normally only if the ledger is closed at the highest
   entry the writer confirmed, and otherwise fails with LedgerClosed or LedgerFenced
   (:func:`check_writer_close`).

CI runs :data:`CI_SEEDS` seeds with the bookies in process, and the first
:data:`CURVE_SEEDS` of them again with each bookie behind a ZeroMQ server with CURVE on
both sides (clientutil's ``"zmq-curve"`` transport: the same schedules, the replies and
errors coming over encrypted connections, a crashed bookie's server closing with it and
its restart serving at the same address); not all of them, since each takes about as
long again (1-2 s) and the suite's run time is bounded.  By hand,
``PYBK_INTERLEAVING_SEEDS=N`` runs N seeds starting at ``PYBK_INTERLEAVING_FIRST_SEED``
(default 0), and ``PYBK_INTERLEAVING_CURVE_SEEDS=M`` the first M of them over CURVE.  A
failure names its seed and transport, the command that replays it, the schedule and what
happened at each step.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import pytest
from clientutil import CURVE, FAST, Cluster

from pybk.errors import BookKeeperError, LedgerClosed, LedgerFenced
from pybk.meta.ledger_metadata import (
    DigestType,
    Fragment,
    LedgerMetadata,
    LedgerState,
    hash_password,
)
from pybk.meta.ledgers import LedgerManager

CI_SEEDS = 12
CURVE_SEEDS = 4
SEED_TIMEOUT_S = 60
PASSWORD = b"interleavings"
BOOKIES = 5
QUORUMS = ((3, 3, 2), (3, 2, 2), (4, 3, 2), (4, 2, 2), (3, 3, 3), (2, 2, 2))
SETTINGS = dataclasses.replace(FAST, addEntryTimeout=0.5, readTimeout=0.5)
JOIN_S = 20.0      # the longest any thread of a run may take to finish once faults lift
CALLBACKS_S = 5.0  # how long after the writer's close every add must have completed


def _cases() -> list:
    """(transport, seed) of every run: each seed in process, the first ones over CURVE."""
    count = int(os.environ.get("PYBK_INTERLEAVING_SEEDS", CI_SEEDS))
    first = int(os.environ.get("PYBK_INTERLEAVING_FIRST_SEED", 0))
    over_curve = int(os.environ.get("PYBK_INTERLEAVING_CURVE_SEEDS", CURVE_SEEDS))
    seeds = list(range(first, first + count))
    return [pytest.param(transport, seed, id=f"{transport}-{seed}")
            for transport, chosen in (("inprocess", seeds), (CURVE, seeds[:over_curve]))
            for seed in chosen]


def payload(seed: int, entry_id: int) -> bytes:
    """What the writer adds as ``entry_id`` (sizes vary, so lengths are checked too)."""
    return f"seed {seed} entry {entry_id};".encode() * (1 + (seed * 31 + entry_id) % 13)


# -- the schedule ------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """One step of a schedule.  A bookie target is ``"slot<k>"`` (the k-th bookie of the
    ledger's last ensemble when the step runs) or a bookie id."""

    kind: str
    args: tuple = ()

    def __str__(self) -> str:
        return " ".join([self.kind, *map(str, self.args)])


_WEIGHTS = {
    "add": 30, "pause": 8, "fail": 4, "drop": 3, "hold": 4, "release": 6, "unreachable": 3,
    "heal": 7, "delay": 2, "crash": 2, "restart": 3, "meta_hold": 3, "meta_release_one": 4,
    "meta_release_all": 2, "meta_delay": 1,
}


def make_schedule(rng: random.Random) -> list[Step]:
    """30-60 steps; the writer's close at a random place in 4 of 5 schedules, zero to
    two recoveries (after the first quarter)."""
    steps = [_random_step(rng) for _ in range(rng.randint(30, 60))]
    if rng.random() < 0.8:
        steps.insert(rng.randint(len(steps) // 3, len(steps)), Step("close"))
    for _ in range(rng.choice((0, 1, 1, 2))):  # late enough for adds to be in flight
        steps.insert(rng.randint(len(steps) // 4, len(steps)), Step("recover"))
    return steps


def _random_step(rng: random.Random) -> Step:
    kind = rng.choices(list(_WEIGHTS), weights=list(_WEIGHTS.values()))[0]
    target = f"slot{rng.randrange(4)}" if rng.random() < 0.8 else f"B{rng.randint(1, BOOKIES)}"
    if kind == "add":
        return Step(kind, (rng.randint(1, 4),))
    if kind == "pause":
        return Step(kind, (rng.choice((0.005, 0.02, 0.05, 0.1)),))
    if kind == "fail":  # the next 1-3 entries only, or every add
        return Step(kind, (target, rng.choice((0, 1, 2, 3))))
    if kind in ("drop", "hold"):
        return Step(kind, (target, rng.choice(("add", "add", "read", "add+read"))))
    if kind == "release":  # "newest": only the highest entry's replies, out of order
        return Step(kind, (target, rng.choice(("as-given", "as-given", "newest", "failed"))))
    if kind == "delay":
        return Step(kind, (target, rng.choice((0.005, 0.02, 0.05))))
    if kind == "meta_release_one":
        return Step(kind, (rng.randrange(3),))
    if kind == "meta_delay":
        return Step(kind, (rng.choice((0.0, 0.01, 0.05)),))
    if kind in ("unreachable", "heal", "crash", "restart"):
        return Step(kind, (target,))
    return Step(kind)


# -- what a run observes -----------------------------------------------------------------

@dataclass
class Delivery:
    """One callback of ``add_entry_then``: the add's expected entry id, what it got."""

    expected_id: int
    entry_id: int | None
    error: BaseException | None


@dataclass
class Observed:
    """Everything the checkers look at."""

    ensemble_size: int
    bookie_ids: list[str]
    accepted: int = 0                       # adds that got an entry id: 0..accepted-1
    deliveries: list[Delivery] = field(default_factory=list)
    overlapping_callbacks: list[int] = field(default_factory=list)
    accepted_before_close: int | None = None  # when close() was called
    delivered_at_close_return: set[int] | None = None
    close_outcome: str | None = None        # "ok", or the error's repr
    close_error: BaseException | None = None
    recoveries: list[tuple[str, int | None]] = field(default_factory=list)  # (how, last)
    records: list[tuple[int, bytes]] = field(default_factory=list)  # (version, bytes) in order
    readers: list[tuple[int, list[bytes]] | str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


# -- the checkers: each returns what it found wrong (nothing: the rule holds) ------------

def check_completions(seen: Observed) -> list[str]:
    """Rule 2: one callback per accepted add, in entry-id order, successes a prefix."""
    problems = []
    order = [d.expected_id for d in seen.deliveries]
    if order != sorted(set(order)):
        problems.append(f"callbacks out of entry-id order or repeated: {order}")
    missing = sorted(set(range(seen.accepted)) - set(order))
    if missing:
        problems.append(f"adds {missing} never completed")
    if seen.overlapping_callbacks:
        problems.append(f"callbacks of entries {seen.overlapping_callbacks} ran while "
                        "another callback was running")
    failed_at = None
    for d in seen.deliveries:
        if d.error is None:
            if d.entry_id != d.expected_id:
                problems.append(f"add {d.expected_id} succeeded as entry {d.entry_id}")
            if failed_at is not None:
                problems.append(f"entry {d.expected_id} succeeded after entry {failed_at} "
                                "failed")
        elif failed_at is None:
            failed_at = d.expected_id
    if seen.accepted_before_close is not None and seen.delivered_at_close_return is not None:
        late = sorted(set(range(seen.accepted_before_close)) - seen.delivered_at_close_return)
        if late:
            problems.append(f"close() returned before the callbacks of adds {late}")
    return problems


def successes(seen: Observed) -> list[int]:
    return [d.expected_id for d in seen.deliveries if d.error is None]


def check_successes_are_durable(seen: Observed, seed: int) -> list[str]:
    """Rule 1: every success is at or below the closed last entry, with its bytes."""
    reader = seen.readers[0] if seen.readers else "no reader"
    if isinstance(reader, str):
        return [f"no fresh reader could read the ledger: {reader}"]
    last, entries = reader
    problems = []
    for entry_id in successes(seen):
        if entry_id > last:
            problems.append(f"entry {entry_id} succeeded but the ledger closed at {last}")
        elif entries[entry_id] != payload(seed, entry_id):
            problems.append(f"entry {entry_id} succeeded but reads back as "
                            f"{entries[entry_id][:40]!r}...")
    return problems


def check_readers_agree(seen: Observed, seed: int) -> list[str]:
    """Rule 3: fresh readers and successful recoveries agree on the last entry; the bytes
    read are the ones added."""
    problems = [f"a fresh reader failed: {r}" for r in seen.readers if isinstance(r, str)]
    views = [r for r in seen.readers if not isinstance(r, str)]
    if len({(last, tuple(entries)) for last, entries in views}) > 1:
        problems.append("fresh readers disagree: last entries "
                        f"{[last for last, _ in views]}, or their bytes differ")
    if views:
        last, entries = views[0]
        wrong = [i for i, data in enumerate(entries) if data != payload(seed, i)]
        if wrong:
            problems.append(f"entries {wrong} read back bytes the writer never added")
        for how, recovered_last in seen.recoveries:
            if how == "closed" and recovered_last != last:
                problems.append(f"a recovery closed the ledger at {recovered_last}, the "
                                f"readers see {last}")
    return problems


def check_fragments(metadata: LedgerMetadata, ensemble_size: int,
                    bookie_ids: list[str]) -> list[str]:
    """Rule 4: the fragments of one metadata record are well formed."""
    problems = []
    fragments = metadata.fragments
    firsts = [f.first_entry_id for f in fragments]
    if not fragments or firsts[0] != 0:
        problems.append(f"the first fragment does not start at entry 0: {firsts}")
    if any(b <= a for a, b in zip(firsts, firsts[1:])):
        problems.append(f"fragment first entries do not strictly increase: {firsts}")
    for f in fragments:
        if len(f.ensemble) != ensemble_size or len(set(f.ensemble)) != ensemble_size \
                or not set(f.ensemble) <= set(bookie_ids):
            problems.append(f"fragment at {f.first_entry_id} has ensemble {f.ensemble}, "
                            f"not {ensemble_size} distinct bookies of the cluster")
    if metadata.state is LedgerState.CLOSED:
        beyond = [a for a in firsts if a > metadata.last_entry_id + 1]
        if beyond:
            problems.append(f"closed at {metadata.last_entry_id} with fragments starting "
                            f"at {beyond}")
    return problems


def check_every_record(seen: Observed) -> list[str]:
    """Rule 4 for every record observed (each problem once)."""
    problems: list[str] = []
    for version, data in seen.records:
        try:
            metadata = LedgerMetadata.from_bytes(data)
        except BookKeeperError as e:  # its own checks refuse malformed fragments
            problems.append(f"version {version} of the record is malformed: {e}")
            continue
        for problem in check_fragments(metadata, seen.ensemble_size, seen.bookie_ids):
            text = f"{problem} (version {version}, {metadata.state.name})"
            if text not in problems:
                problems.append(text)
    return problems


def _decoded(data: bytes) -> LedgerMetadata | None:
    try:
        return LedgerMetadata.from_bytes(data)
    except BookKeeperError:  # check_every_record reports it
        return None


def check_closed_record_is_final(seen: Observed) -> list[str]:
    """Rule 5: after a read saw the record CLOSED, every later read saw the same one."""
    closed = None
    for version, data in seen.records:
        metadata = _decoded(data)
        if closed is None:
            if metadata is not None and metadata.state is LedgerState.CLOSED:
                closed = (version, data)
        elif (version, data) != closed:
            what = "undecodable" if metadata is None else (
                f"{metadata.state.name}, last entry {metadata.last_entry_id}, "
                f"{len(metadata.fragments)} fragments")
            return [f"the record was CLOSED at version {closed[0]}, then read as version "
                    f"{version} ({what})"]
    if closed is None:
        return ["the record was never seen CLOSED"]
    return []


def check_writer_close(seen: Observed) -> list[str]:
    """Rule 6: a close that returned closed the ledger at the writer's last success."""
    if seen.close_outcome is None:
        return ["the writer's close() never finished"]
    if seen.close_outcome != "ok":
        if isinstance(seen.close_error, (LedgerClosed, LedgerFenced)):
            return []
        return [f"the writer's close() failed with {seen.close_outcome}, not LedgerClosed "
                "or LedgerFenced"]
    final = _decoded(seen.records[-1][1])
    highest = max(successes(seen), default=-1)
    if final is None:
        return []  # check_every_record reports it
    if final.state is not LedgerState.CLOSED or final.last_entry_id != highest:
        return [f"the writer's close() returned, but the ledger is {final.state.name} at "
                f"{final.last_entry_id} while the writer's last success is {highest}"]
    return []


# -- running a schedule ------------------------------------------------------------------

class Run:
    """One seed: the cluster, the writer, the threads, and what they observed."""

    def __init__(self, cluster: Cluster, seed: int) -> None:
        self.cluster = cluster
        self.seed = seed
        self.rng = random.Random(seed)
        self.quorums = self.rng.choice(QUORUMS)
        self.schedule = make_schedule(self.rng)
        self.settle_rng = random.Random(seed + 1_000_003)  # settling draws apart
        self.notes: list[str] = []
        self.started = time.monotonic()
        self.writer_bk = cluster.client(SETTINGS)
        e, qw, qa = self.quorums
        self.handle = self.writer_bk.create_ledger(e, qw, qa, password=PASSWORD)
        self.seen = Observed(e, list(cluster.bookie_ids))
        self.threads: list[threading.Thread] = []
        self.stopped: set[str] = set()
        self._lock = threading.Lock()           # deliveries, records
        self._callback_lock = threading.Lock()  # the running-callbacks count
        self._running_callbacks = 0
        self._closing: threading.Thread | None = None
        ledgers = LedgerManager(cluster.store)
        self._record_path = ledgers.layout.ledger_path(self.handle.id)
        self._watch = ledgers.watch(self.handle.id, lambda _id: self.read_record())
        self.read_record()

    def note(self, text: str) -> None:
        self.notes.append(f"{time.monotonic() - self.started:6.3f} {text}")

    # the record, read in a total order (each read and its append under one lock)
    def read_record(self) -> None:
        with self._lock:
            data, version = self.cluster.store.get(self._record_path)
            self.seen.records.append((version, data))

    # adds
    def add(self) -> str:
        expected = self.seen.accepted
        try:
            self.handle.add_entry_then(payload(self.seed, expected),
                                       lambda entry_id, error: self._done(expected, entry_id,
                                                                          error))
        except BookKeeperError as e:
            return f"refused ({type(e).__name__})"
        self.seen.accepted += 1
        return f"#{expected}"

    def _done(self, expected: int, entry_id: int | None, error: BaseException | None) -> None:
        with self._callback_lock:
            self._running_callbacks += 1
            overlapping = self._running_callbacks > 1
        with self._lock:
            self.seen.deliveries.append(Delivery(expected, entry_id, error))
            if overlapping:
                self.seen.overlapping_callbacks.append(expected)
        with self._callback_lock:
            self._running_callbacks -= 1

    def delivered(self) -> set[int]:
        with self._lock:
            return {d.expected_id for d in self.seen.deliveries}

    # threads: the writer's close, recoveries
    def start(self, name: str, body: Callable[[], None]) -> threading.Thread:
        def guarded() -> None:
            try:
                body()
            except Exception:  # noqa: BLE001 - reported as a failure of the seed
                self.seen.unexpected.append(f"{name}: {traceback.format_exc()}")
        thread = threading.Thread(target=guarded, name=f"interleavings-{name}", daemon=True)
        self.threads.append(thread)
        thread.start()
        return thread

    def close_writer(self) -> str:
        if self._closing is not None:
            return "already closing"
        self.seen.accepted_before_close = self.seen.accepted

        def close() -> None:
            try:
                self.handle.close()
                outcome, error = "ok", None
            except BookKeeperError as e:
                outcome, error = repr(e), e
            self.seen.delivered_at_close_return = self.delivered()
            self.seen.close_outcome, self.seen.close_error = outcome, error
            self.note(f"writer's close: {outcome}")
        self._closing = self.start("close", close)
        return f"close() called after {self.seen.accepted} adds"

    def recover(self) -> str:
        number = len([t for t in self.threads if "recover" in t.name]) + 1
        bk = self.cluster.client(SETTINGS)  # made here: the cluster is not thread-safe

        def recover() -> None:
            try:
                opened = bk.open_ledger(self.handle.id, PASSWORD, recovery=True)
            except BookKeeperError as e:
                self.seen.recoveries.append((repr(e), None))
                self.note(f"recovery {number}: {e!r}")
                return
            last = opened.metadata.last_entry_id
            self.seen.recoveries.append(("closed", last))
            self.note(f"recovery {number}: closed at {last}")
        self.start(f"recover{number}", recover)
        return f"recovery {number} started"

    # faults
    def bookie(self, target: str) -> str:
        if target.startswith("slot"):
            ensemble = self.handle.metadata.fragments[-1].ensemble
            return ensemble[int(target[4:]) % len(ensemble)]
        return target

    def do(self, step: Step) -> str:
        """Run one step; returns what happened (for the failure message)."""
        kind, args = step.kind, step.args
        cluster = self.cluster
        if kind == "add":
            return ", ".join(self.add() for _ in range(args[0]))
        if kind == "pause":
            time.sleep(args[0])
            return ""
        if kind == "close":
            return self.close_writer()
        if kind == "recover":
            return self.recover()
        if kind == "meta_hold":
            cluster.metadata_faults.hold_writes = True
            return "holding metadata writes"
        if kind == "meta_release_one":
            held = cluster.metadata_faults.held()
            if not held:
                return "none held"
            write = held[args[0] % len(held)]
            cluster.metadata_faults.release(write)
            return f"released {write.operation} expecting version {write.expected_version}"
        if kind == "meta_release_all":
            count = len(cluster.metadata_faults.held())
            cluster.metadata_faults.release_all()
            return f"released {count}, no longer holding"
        if kind == "meta_delay":
            cluster.metadata_faults.delay_s = args[0]
            return ""
        bookie_id = self.bookie(args[0])
        faults = cluster.faults[bookie_id]
        if kind == "fail":
            faults.only_entries = None if args[1] == 0 else set(
                range(self.seen.accepted, self.seen.accepted + args[1]))
            faults.fail.add("add")
            return f"{bookie_id} fails adds {sorted(faults.only_entries or ()) or 'all'}"
        if kind in ("drop", "hold"):
            getattr(faults, kind).update(args[1].split("+"))
            return f"{bookie_id} {kind}s {args[1]}"
        if kind == "release":
            error = BookKeeperError("injected late failure") if args[1] == "failed" else None
            held = [entry_id for _, entry_id in faults.held() if entry_id is not None]
            entries = {max(held)} if args[1] == "newest" and held else None
            return f"{bookie_id}: {faults.release(error, entries)} replies {args[1]}"
        if kind == "unreachable":
            faults.unreachable = True
            return f"{bookie_id} unreachable"
        if kind == "delay":
            faults.delay_s = args[1]
            return f"{bookie_id} delayed {args[1]} s"
        if kind == "heal":
            self.heal(bookie_id, release_as_given=True)
            return f"{bookie_id} healed"
        if kind == "crash":
            if bookie_id in self.stopped:
                return f"{bookie_id} stopped already"
            cluster.stop_bookie(bookie_id)
            self.stopped.add(bookie_id)
            return f"{bookie_id} stopped"
        if kind == "restart":
            cluster.restart_bookie(bookie_id)
            self.stopped.discard(bookie_id)
            return f"{bookie_id} restarted"
        raise AssertionError(f"unknown step {step}")

    def heal(self, bookie_id: str, release_as_given: bool) -> int:
        faults = self.cluster.faults[bookie_id]
        faults.fail.clear()
        faults.drop.clear()
        faults.hold.clear()
        faults.unreachable = False
        faults.delay_s = 0.0
        faults.only_entries = None
        error = None if release_as_given else BookKeeperError("injected late failure")
        return faults.release(error=error)

    def lift_everything(self) -> None:
        """Stop every fault and let every held reply and write go (again and again while
        threads finish: one may have been held just as the faults were lifted)."""
        metadata = self.cluster.metadata_faults
        metadata.delay_s = 0.0
        metadata.release_all()
        for bookie_id in self.cluster.bookie_ids:
            self.heal(bookie_id, release_as_given=self.settle_rng.random() < 0.7)

    def run(self) -> None:
        for number, step in enumerate(self.schedule, 1):
            try:
                result = self.do(step)
            except Exception:  # noqa: BLE001 - reported as a failure of the seed
                result = "raised"
                self.seen.unexpected.append(f"step {number} {step}: {traceback.format_exc()}")
            self.note(f"step {number:2d} {step}: {result}")
            self.read_record()
            time.sleep(self.rng.choice((0, 0, 0.002, 0.01)))
        self.settle()

    def settle(self) -> None:
        self.lift_everything()
        for bookie_id in sorted(self.stopped):
            self.cluster.restart_bookie(bookie_id)
            self.note(f"settle: {bookie_id} restarted")
        self.stopped.clear()
        self.close_writer()
        deadline = time.monotonic() + JOIN_S
        for thread in self.threads:
            while thread.is_alive() and time.monotonic() < deadline:
                self.lift_everything()
                thread.join(0.05)
            if thread.is_alive():
                self.seen.unexpected.append(f"{thread.name} still running {JOIN_S} s after "
                                            "every fault was lifted")
        deadline = time.monotonic() + CALLBACKS_S
        while len(self.delivered()) < self.seen.accepted and time.monotonic() < deadline:
            time.sleep(0.01)
        self.read_fresh()
        self.read_record()
        self._watch.cancel()
        self.read_record()

    def read_fresh(self) -> None:
        """Two fresh clients open the ledger with recovery and read every entry."""
        for number in (1, 2):
            bk = self.cluster.client(SETTINGS)
            try:
                reader = bk.open_ledger(self.handle.id, PASSWORD, recovery=True)
                last = reader.metadata.last_entry_id
                entries = [e.data for e in reader.read_entries(0, last)] if last >= 0 else []
                self.seen.readers.append((last, entries))
                self.note(f"fresh reader {number}: last entry {last}")
            except BookKeeperError as e:
                self.seen.readers.append(repr(e))
                self.note(f"fresh reader {number}: {e!r}")

    def problems(self) -> list[str]:
        seen = self.seen
        found = [f"unexpected error: {u}" for u in seen.unexpected]
        for rule, problems in (
                ("1 durable successes", check_successes_are_durable(seen, self.seed)),
                ("2 completion order", check_completions(seen)),
                ("3 readers agree", check_readers_agree(seen, self.seed)),
                ("4 well-formed fragments", check_every_record(seen)),
                ("5 closed record is final", check_closed_record_is_final(seen)),
                ("6 writer's close", check_writer_close(seen))):
            found += [f"rule {rule}: {p}" for p in problems]
        return found

    def report(self, problems: list[str]) -> str:
        e, qw, qa = self.quorums
        succeeded = successes(self.seen)
        return "\n".join([
            f"seed {self.seed} over {self.cluster.transport} (E={e} Qw={qw} Qa={qa}) broke "
            "the rules; replay with "
            f"PYBK_INTERLEAVING_SEEDS=1 PYBK_INTERLEAVING_FIRST_SEED={self.seed} "
            "python -m pytest tests/test_interleavings.py",
            *[f"  {p}" for p in problems],
            f"accepted adds: {self.seen.accepted}; {len(succeeded)} succeeded, the highest "
            f"{max(succeeded, default=None)}; close: {self.seen.close_outcome}; "
            f"recoveries: {self.seen.recoveries}",
            "schedule: " + "; ".join(map(str, self.schedule)),
            "what happened:", *[f"  {n}" for n in self.notes]])


@pytest.fixture
def cluster(tmp_path, transport):
    made = Cluster(str(tmp_path / "cluster"), BOOKIES, transport)
    yield made
    made.close()


@pytest.mark.timeout(SEED_TIMEOUT_S)
@pytest.mark.parametrize("transport, seed", _cases())
def test_random_interleaving_keeps_the_ledger_rules(cluster, transport, seed):
    run = Run(cluster, seed)
    try:
        run.run()
    finally:
        run.lift_everything()  # also on failure: no client thread stays blocked
    problems = run.problems()
    assert not problems, run.report(problems)


def test_checkers_catch_broken_histories():
    """The checkers themselves: each rule flags a history that breaks it."""
    seen = Observed(3, ["B1", "B2", "B3", "B4"], accepted=3, deliveries=[
        Delivery(0, 0, None), Delivery(2, None, LedgerClosed("x")), Delivery(1, 1, None)])
    found = check_completions(seen)
    assert any("order" in p for p in found) and any("after entry 2" in p for p in found)
    seen.readers = [(0, [payload(0, 0)]), (1, [payload(0, 0), payload(0, 1)])]
    assert check_successes_are_durable(seen, 0) == [
        "entry 1 succeeded but the ledger closed at 0"]
    assert any("disagree" in p for p in check_readers_agree(seen, 0))
    opened = LedgerMetadata(ledger_id=7, ensemble_size=3, write_quorum_size=2,
                            ack_quorum_size=2, fragments=(Fragment(0, ("B1", "B2", "B3")),),
                            digest_type=DigestType.CRC32C, password_hash=hash_password(b"x"))
    closed = dataclasses.replace(opened, state=LedgerState.CLOSED, last_entry_id=0, length=1,
                                 fragments=(*opened.fragments,
                                            Fragment(5, ("B1", "B2", "B4"))))
    assert check_fragments(opened, 3, seen.bookie_ids) == []
    assert check_fragments(closed, 3, seen.bookie_ids) == [
        "closed at 0 with fragments starting at [5]"]
    seen.records = [(1, opened.to_bytes()), (2, closed.to_bytes())]
    assert check_closed_record_is_final(seen) == []
    seen.records.append((3, opened.to_bytes()))
    assert check_closed_record_is_final(seen)
