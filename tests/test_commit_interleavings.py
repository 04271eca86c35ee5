"""Randomized interleavings of the commit protocol (pybk.log.commit, pybk.log.jobs), with
lost answers and an unreachable store at every metadata call of the log.

Each seed draws a handful of parties (``random.Random(seed)``), each a thread with a
BookKeeper client of its own over one in-process bookie and one embedded metadata store:

- committers: begin a job, write its tasks' ledgers (registered in the job), commit them
  (sometimes with ``overwrite``, a streaming sink's batch id, possibly one another
  committer uses too: a replayed micro-batch, or an orphan timeout of 0, which gives up
  every other pending job); a commit that fails is followed by an abort, as Spark does,
  and a job that was reported failed (its commit failed, or its outcome was unknown and
  the abort answered "aborted") is written again once, under a new job id (the user's
  rerun);
- aborters of another committer's job, orphan cleaners (``clean_orphans``, with a timeout
  of 0 or an hour), writers (open the log, append, close) and truncators (open the log,
  truncate before a position read from it, close).

Every metadata call a party's thread makes is a step of the schedule: the calls run one
at a time, the seed picking whose comes next, so the parties interleave at every call.
At a call on the log's records, the seed may make the answer be lost the way the
ZooKeeper store loses it to a connection loss (the write lands, other parties go on,
then the retry answers: BadVersion if the record moved on meanwhile, NodeExists if a
create's record is not ours any more, success otherwise), or the store unreachable
(MetadataUnavailable; a write then lands or not).  The rules, checked after every run:

1. Every job whose commit landed (a head written during the run listed it in
   ``committing``) is visible wholly, at the positions its commit gave it, unless
   truncated (records before the final head's ``truncated_before`` are gone, none
   after); no other job's record is visible; no record is visible twice (a rerun after
   a reported failure never duplicates).  Every record a writer was told is durable is
   visible at its position unless truncated (:func:`check_visible`).
2. What the committers were told matches: "committed" only for a landed job,
   "finished" (JobFinished) or "skipped" (the sink had the batch) only for one that did
   not land; after a commit of unknown outcome (MetadataUnavailable), its abort answers
   "committed" (False) exactly for a landed one.  An aborter's True ("aborted") only for
   a job that did not land, unless it is a sink's job whose committer was told
   "committed" (that committer deletes the job's marker then, the batch id telling a
   replay: an abort racing with it may answer either way, see
   :func:`pybk.log.commit.abort_job`); its False only for one that landed
   (:func:`check_told`).
3. A sink's landed batch ids increase in the order they landed (:func:`check_sinks`).
4. Every operation finishes within WALK_CALLS_MAX metadata calls (a walk that steps
   through numbers without records is stopped there and reported), and no party fails
   with anything but pybk's errors (:func:`check_parties`).

CI runs :data:`CI_SEEDS` seeds (5-20 s; 4 of them, 16 for one, broke rules 1
and 2 before commits told a landed commit from its marker; 2 to 9 of the first 150
broke rule 1 before LogWriter.open told a landed CAS from a lost race); by hand
``PYBK_COMMIT_INTERLEAVING_SEEDS=N`` runs N seeds from
``PYBK_COMMIT_INTERLEAVING_FIRST_SEED`` (default 0).  A failure names its seed, the rules
broken, each party's story and the schedule's last ``PYBK_COMMIT_INTERLEAVING_TRACE``
steps (default 40).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
from clientutil import FAST

from pybk.client import BookKeeper
from pybk.client.transport import InProcessBookieClient
from pybk.errors import (
    BadVersion,
    BookKeeperError,
    JobFinished,
    MetadataUnavailable,
    NodeExists,
    NoNode,
)
from pybk.log import LogReader, LogWriter, Position, jobs
from pybk.log.batch import encode_batch
from pybk.log.commit import Sink, abort_job, clean_orphans, commit_job
from pybk.log.metadata import LogMetadata, Segment, log_path, read_log
from pybk.meta.embedded import EmbeddedMetadataStore
from pybk.settings import LogSettings

CI_SEEDS = 40
SEED_TIMEOUT_S = 120
LOG = "events"
SETTINGS = LogSettings(ensembleSize=1, writeQuorumSize=1, ackQuorumSize=1,
                       segmentMaxBytes=200)
#: The most metadata calls one operation of a party may make (a commit of 3 ledgers
#: takes about 60; a walk bounded by the records that exist stays far below).
WALK_CALLS_MAX = 3000
#: The chance of a fault at a call on the log's records; at a write of its head (the
#: CASes of commits, aborts, cleaners and writers), where a lost answer matters most.
FAULT_CHANCE = 0.03
HEAD_FAULT_CHANCE = 0.3
FAULTS_MAX = 8
LOST_TURNS_MAX = 60
PER_ENTRY = 2        # records a task writes in one entry
STALL_S = 30.0       # the longest the schedule waits for a party to reach its next call
SETTLE_S = 0.05      # how long it waits for every party before picking among those ready
JOIN_S = 30.0
TRACE_STEPS = int(os.environ.get("PYBK_COMMIT_INTERLEAVING_TRACE", 40))


def _seeds() -> list[int]:
    count = int(os.environ.get("PYBK_COMMIT_INTERLEAVING_SEEDS", CI_SEEDS))
    first = int(os.environ.get("PYBK_COMMIT_INTERLEAVING_FIRST_SEED", 0))
    return list(range(first, first + count))


class WalkTooLong(Exception):
    """An operation made more than WALK_CALLS_MAX metadata calls."""


# -- the schedule: one metadata call at a time ----------------------------------------------


class Schedule:
    """Lets the parties' metadata calls run one at a time, in an order the seed picks, and
    decides each call's fault."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._changed = threading.Condition()
        self._live: set[str] = set()
        self._ready: set[str] = set()
        self._turn: str | None = None
        self._faults = 0
        self.trace: list[str] = []

    def start(self, party: str) -> None:
        with self._changed:
            self._live.add(party)

    def finish(self, party: str) -> None:
        with self._changed:
            self._live.discard(party)
            self._ready.discard(party)
            self._changed.notify_all()

    def take_turn(self, party: str, what: str, chance: float) -> str | None:
        """Wait for ``party``'s turn; return its fault (None, "lost" or "unreachable"),
        one with probability ``chance``."""
        with self._changed:
            self._ready.add(party)
            self._changed.notify_all()
            self._changed.wait_for(lambda: self._turn == party)
            fault = None
            if self._faults < FAULTS_MAX and self._rng.random() < chance:
                fault = self._rng.choice(("lost", "lost", "unreachable"))
                self._faults += 1
            self.trace.append(f"{party}: {what}" + (f" [{fault}]" if fault else ""))
            return fault

    def wait_steps(self, party: str, count: int) -> None:
        """Let ``count`` turns of ``party`` go by without a call (a party that starts
        later)."""
        for _ in range(count):
            self.take_turn(party, "waits", 0.0)
            self.end_turn(party)

    def coin(self) -> bool:
        with self._changed:
            return self._rng.random() < 0.5

    def lost_turns(self) -> int:
        """How many turns a party whose answer was lost waits before its retry."""
        with self._changed:
            return self._rng.randint(0, LOST_TURNS_MAX)

    def end_turn(self, party: str) -> None:
        with self._changed:
            if self._turn == party:
                self._turn = None
                self._changed.notify_all()

    def run(self) -> None:
        """Give turns until every party finished (TimeoutError if one stalls)."""
        with self._changed:
            while self._live:
                self._changed.wait_for(lambda: self._live <= self._ready, SETTLE_S)
                if not self._ready and not self._changed.wait_for(
                        lambda: bool(self._ready) or not self._live, STALL_S):
                    raise TimeoutError(f"no party made a metadata call for {STALL_S} s: "
                                       f"{sorted(self._live)} stuck")
                if not self._live:
                    return
                party = self._rng.choice(sorted(self._ready))
                self._ready.discard(party)
                self._turn = party
                self._changed.notify_all()
                if not self._changed.wait_for(lambda: self._turn is None, STALL_S):
                    raise TimeoutError(f"{party}'s metadata call did not end in {STALL_S} s")


class PartyStore:
    """A party's view of the store: the calls its own thread makes take turns in the
    :class:`Schedule` and may lose their answer (see the module docstring); other
    threads' calls (its client's callbacks) pass straight through."""

    def __init__(self, store: Any, schedule: Schedule, party: str) -> None:
        self._store, self._schedule, self._party = store, schedule, party
        self._faulty_prefix = log_path(LOG)
        self.thread: int | None = None
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def get(self, path: str) -> tuple[bytes, int]:
        return self._call("get", path, lambda: self._store.get(path))

    def children(self, path: str) -> list[str]:
        return self._call("children", path, lambda: self._store.children(path))

    def exists(self, path: str) -> bool:
        return self._call("exists", path, lambda: self._store.exists(path))

    def set(self, path: str, data: bytes, expected_version: int) -> int:
        def retried(version: int) -> int:  # the ZooKeeper store's retry of a lost set
            found, now = self._store.get(path)
            if now != version or found != data:
                raise BadVersion(f"{path} moved on after a lost set (a test's fault)")
            return version
        return self._call("set", path, lambda: self._store.set(path, data, expected_version),
                          retried)

    def create(self, path: str, data: bytes, ephemeral: bool = False) -> int:
        return self._call("create", path,
                          lambda: self._store.create(path, data, ephemeral),
                          lambda version: self._ours(path, data, version))

    def create_many(self, records) -> None:
        records = list(records)

        def retried(_result: None) -> None:
            for path, data in records:
                self._ours(path, data, 0)
        return self._call("create_many", records[0][0] if records else "",
                          lambda: self._store.create_many(records), retried)

    def delete(self, path: str, expected_version: int) -> None:
        return self._call("delete", path, lambda: self._store.delete(path, expected_version),
                          lambda result: result)

    def _ours(self, path: str, data: bytes, version: int) -> int:
        try:
            found, now = self._store.get(path)
        except NoNode:
            found, now = None, -1
        if found != data or now != 0:
            raise NodeExists(f"{path} is not the record a lost create made (a test's fault)")
        return version

    def _call(self, what: str, path: str, call: Callable[[], Any],
              retried: Callable[[Any], Any] | None = None) -> Any:
        if threading.get_ident() != self.thread:
            return call()
        self.calls += 1
        if self.calls > WALK_CALLS_MAX:
            raise WalkTooLong(f"{self._party}: more than {WALK_CALLS_MAX} metadata calls in "
                              f"one operation (at {what} {path})")
        chance = 0.0
        if path.startswith(self._faulty_prefix):
            head_cas = path == self._faulty_prefix and what == "set"
            chance = HEAD_FAULT_CHANCE if head_cas else FAULT_CHANCE
        fault = self._schedule.take_turn(self._party, f"{what} {path}", chance)
        try:
            if fault == "unreachable":
                if retried is not None and self._schedule.coin():
                    with contextlib.suppress(BookKeeperError):
                        call()  # the write landed; its answer did not come
                raise MetadataUnavailable(f"{what} {path}: unreachable (a test's fault)")
            result = call()
            if fault != "lost" or retried is None:
                return result
        finally:
            self._schedule.end_turn(self._party)
        # The answer was lost: others go on until this party's retry answers (after a
        # reconnection taking up to LOST_TURNS_MAX of the party's turns).
        self._schedule.wait_steps(self._party, self._schedule.lost_turns())
        self._schedule.take_turn(self._party, f"retry {what} {path}", 0.0)
        try:
            return retried(result)
        finally:
            self._schedule.end_turn(self._party)



class Recording:
    """The real store, recording every head of LOG written (in the order they landed)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._head = log_path(LOG)
        self.heads: list[LogMetadata] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def set(self, path: str, data: bytes, expected_version: int) -> int:
        with self._lock:
            version = self._store.set(path, data, expected_version)
            if path == self._head:
                self.heads.append(LogMetadata.from_bytes(data))
            return version

    def create(self, path: str, data: bytes, ephemeral: bool = False) -> int:
        with self._lock:
            version = self._store.create(path, data, ephemeral)
            if path == self._head:
                self.heads.append(LogMetadata.from_bytes(data))
            return version


# -- what a run observes --------------------------------------------------------------------


@dataclass
class Attempt:
    """One job a committer wrote: its records, ledgers, and what it was told."""

    logical: str
    job_id: str | None = None
    records: list[list[bytes]] = field(default_factory=list)  # per ledger, in order
    ledgers: list[int] = field(default_factory=list)
    sink: Sink | None = None
    told: str | None = None            # committed, skipped, finished, unknown, failed
    aborted: bool | str | None = None  # the abort's answer after a failed commit


@dataclass
class Observed:
    attempts: list[Attempt] = field(default_factory=list)
    aborts: list[tuple[str, bool]] = field(default_factory=list)  # job, answer
    acked: list[tuple[Position, bytes]] = field(default_factory=list)
    unacked: list[bytes] = field(default_factory=list)
    stories: dict[str, list[str]] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)


# -- the parties -----------------------------------------------------------------------------


def write_job(bk: BookKeeper, attempt: Attempt) -> None:
    """Begin the attempt's job and write its tasks' ledgers (as Spark's tasks do)."""
    attempt.job_id = jobs.begin_job(bk.metadata, LOG)
    for partition, records in enumerate(attempt.records):
        ledger = bk.create_ledger(1, 1, 1)
        jobs.register_ledger(bk, LOG, attempt.job_id, ledger.id, partition, 0)
        for i in range(0, len(records), PER_ENTRY):
            ledger.add_entry(encode_batch(records[i:i + PER_ENTRY]))
        ledger.close()
        attempt.ledgers.append(ledger.id)


def committer(rng: random.Random, logical: str, sink: Sink | None) -> Callable:
    overwrite = rng.random() < 0.15
    orphan_timeout_s = rng.choice((None, None, 3600.0, 0.0))
    parts = rng.randint(1, 3)

    def run(bk: BookKeeper, seen: Observed, story: list[str], store: PartyStore) -> None:
        for rerun in range(2):
            attempt = Attempt(logical, sink=sink, records=[
                [f"{logical}:{p}:{i}".encode() for i in range(rng.randint(1, 4))]
                for p in range(parts)])
            seen.attempts.append(attempt)
            store.calls = 0
            try:
                write_job(bk, attempt)
            except BookKeeperError as e:
                story.append(f"writing {attempt.job_id} failed: {e!r}")
                attempt.told = "failed"
            if attempt.told is None:
                story.append(f"commit {attempt.job_id} {attempt.ledgers} overwrite="
                             f"{overwrite} sink={sink} orphans={orphan_timeout_s}")
                store.calls = 0
                try:
                    result = commit_job(bk, LOG, attempt.job_id, attempt.ledgers,
                                        overwrite=overwrite, sink=sink,
                                        orphan_timeout_s=orphan_timeout_s)
                    attempt.told = "committed" if result.committed else "skipped"
                except JobFinished as e:
                    attempt.told = "finished"
                    story.append(f"finished: {e}")
                except MetadataUnavailable as e:
                    attempt.told = "unknown"
                    story.append(f"unknown: {e}")
                except BookKeeperError as e:
                    attempt.told = "failed"
                    story.append(f"failed: {e!r}")
                story.append(f"told {attempt.told}")
            if attempt.told in ("committed", "skipped"):
                return
            if attempt.job_id is not None:
                store.calls = 0
                try:  # Spark aborts a job whose commit failed
                    attempt.aborted = abort_job(bk, LOG, attempt.job_id)
                except BookKeeperError as e:
                    attempt.aborted = repr(e)
                story.append(f"abort answered {attempt.aborted}")
            if attempt.aborted is False or (attempt.told == "unknown"
                                            and attempt.aborted is not True):
                return  # committed after all, or not known: no rerun
            story.append("rerun" if rerun == 0 else "no more reruns")
    return run


def aborter(rng: random.Random, target: str) -> Callable:
    def run(bk: BookKeeper, seen: Observed, story: list[str], store: PartyStore) -> None:
        found = [a.job_id for a in seen.attempts if a.logical == target and a.job_id]
        if not found:
            story.append(f"no job of {target} begun yet")
            return
        job_id = rng.choice(found)
        answer = abort_job(bk, LOG, job_id)
        seen.aborts.append((job_id, answer))
        story.append(f"abort {job_id}: {answer}")
    return run


def cleaner(rng: random.Random) -> Callable:
    older_than_s = rng.choice((0.0, 3600.0))

    def run(bk: BookKeeper, seen: Observed, story: list[str], store: PartyStore) -> None:
        story.append(f"cleaned {clean_orphans(bk, LOG, older_than_s)} (older than "
                     f"{older_than_s} s)")
    return run


def writer(rng: random.Random, name: str) -> Callable:
    count = rng.randint(1, 3)

    def run(bk: BookKeeper, seen: Observed, story: list[str], store: PartyStore) -> None:
        with LogWriter.open(bk, LOG, SETTINGS) as log_writer:
            for i in range(count):
                value = f"{name}:{i}".encode()
                try:
                    seen.acked.append((log_writer.append(value), value))
                except BookKeeperError:
                    seen.unacked.append(value)
                    raise
        story.append(f"appended {count}")
    return run


def truncator(rng: random.Random) -> Callable:
    pick = rng.random()

    def run(bk: BookKeeper, seen: Observed, story: list[str], store: PartyStore) -> None:
        with LogWriter.open(bk, LOG, SETTINGS) as log_writer:
            # (Not past the writer's own segments: a commit may have added more since.)
            positions = [p for p, _ in LogReader(bk, LOG, writer=log_writer).read()
                         if p.segment < log_writer.metadata.next_segment]
            if positions:
                bound = positions[int(pick * len(positions))]
                story.append(f"truncate before {bound}: "
                             f"{log_writer.truncate(bound)} ledgers deleted")
    return run


def make_parties(rng: random.Random) -> dict[str, tuple[int, Callable]]:
    """The parties of a run by name: how many turns each waits before it starts, and
    what it does."""
    parties: dict[str, tuple[int, Callable]] = {}
    committers = [f"J{i}" for i in range(rng.randint(2, 4))]
    sinks = [Sink("s", rng.randint(0, 2)) if rng.random() < 0.4 else None
             for _ in committers]
    for name, sink in zip(committers, sinks):
        parties[name] = (rng.choice((0, 0, 20)), committer(rng, name, sink))
    for i in range(rng.randint(1, 4)):
        kind = rng.choice(("abort", "clean", "writer", "truncate"))
        name = f"{kind}{i}"
        if kind == "abort":
            party = aborter(rng, rng.choice(committers))
        elif kind == "clean":
            party = cleaner(rng)
        elif kind == "writer":
            party = writer(rng, f"W{i}")
        else:
            party = truncator(rng)
        parties[name] = (rng.randint(0, 60), party)
    return parties


def run_parties(store: Any, bookie: Any, rng: random.Random, schedule: Schedule,
                parties: dict[str, tuple[int, Callable]], seen: Observed) -> None:
    """Run every party in a thread of its own, its calls taking turns; join them."""
    threads = []
    with contextlib.ExitStack() as stack:
        for name, (later, party) in parties.items():
            party_store = PartyStore(store, schedule, name)
            bk = stack.enter_context(BookKeeper(
                party_store, {"B1": InProcessBookieClient("B1", bookie)}, FAST))
            story = seen.stories.setdefault(name, [])

            def run(party=party, bk=bk, story=story, party_store=party_store, name=name,
                    later=later):
                party_store.thread = threading.get_ident()
                try:
                    schedule.wait_steps(name, later)
                    party(bk, seen, story, party_store)
                except WalkTooLong as e:
                    seen.unexpected.append(str(e))
                except BookKeeperError as e:
                    story.append(f"failed: {e!r}")
                except BaseException as e:  # handed to the checkers
                    seen.unexpected.append(f"{name}: {e!r}")
                finally:
                    party_store.thread = None
                    schedule.finish(name)

            schedule.start(name)
            threads.append(threading.Thread(target=run, name=name, daemon=True))
        for thread in threads:
            thread.start()
        try:
            schedule.run()
        finally:
            for thread in threads:
                thread.join(JOIN_S)
            stuck = [t.name for t in threads if t.is_alive()]
            if stuck:
                seen.unexpected.append(f"parties {stuck} did not finish in {JOIN_S} s")


# -- the checkers: each returns what it found wrong (nothing: the rule holds) ---------------


def landed_jobs(heads: list[LogMetadata]) -> dict[str, LogMetadata]:
    """Each job a head listed in ``committing``, with the first such head (its commit's)."""
    landed: dict[str, LogMetadata] = {}
    for head in heads:
        for job_id in head.committing:
            landed.setdefault(job_id, head)
    return landed


def job_positions(attempt: Attempt, head: LogMetadata) -> list[tuple[Position, bytes]]:
    """Where the records of ``attempt`` are in the log, as its commit's ``head`` says."""
    first = head.next_segment - len(attempt.ledgers)
    return [(Position(first + k, i // PER_ENTRY, i % PER_ENTRY), value)
            for k, records in enumerate(attempt.records) for i, value in enumerate(records)]


def check_visible(seen: Observed, heads: list[LogMetadata], final: LogMetadata,
                  visible: list[tuple[Position, bytes]]) -> list[str]:
    """Rule 1."""
    problems = []
    landed = landed_jobs(heads)
    bound = final.truncated_before
    required = {}
    for attempt in seen.attempts:
        if attempt.job_id in landed:
            head = landed[attempt.job_id]
            tail = [s.ledger_id for s in head.tail[len(head.tail) - len(attempt.ledgers):]]
            if attempt.ledgers and tail != attempt.ledgers:
                problems.append(f"job {attempt.job_id}'s commit head ends with ledgers "
                                f"{tail}, not its {attempt.ledgers}")
            required.update((p, v) for p, v in job_positions(attempt, head) if p >= bound)
    required.update((p, v) for p, v in seen.acked if p >= bound)
    values = [v for _, v in visible]
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        problems.append(f"records visible twice: {twice}")
    shown = dict(visible)
    missing = sorted((p, v) for p, v in required.items() if shown.get(p) != v)
    if missing:
        problems.append(f"records that must be visible are not (truncated before {bound}):"
                        f" {missing}")
    extra = sorted((p, v) for p, v in visible
                   if required.get(p) != v and v not in seen.unacked)
    if extra:
        problems.append(f"records visible that no landed job or acknowledged append "
                        f"explains: {extra}")
    return problems


def check_told(seen: Observed, heads: list[LogMetadata]) -> list[str]:
    """Rule 2."""
    problems = []
    landed = landed_jobs(heads)
    for a in seen.attempts:
        if a.job_id is None:
            continue
        is_landed = a.job_id in landed
        if a.told == "committed" and not is_landed:
            problems.append(f"job {a.job_id} was told committed and did not land")
        if a.told in ("finished", "skipped", "failed") and is_landed:
            problems.append(f"job {a.job_id} was told {a.told} and landed")
        if a.aborted is True and is_landed:
            problems.append(f"job {a.job_id}: its abort answered aborted, and it landed")
        if a.aborted is False and not is_landed:
            problems.append(f"job {a.job_id}: its abort answered committed, and it did not "
                            "land")
    # Only a sink's committer forgets its marker when told "committed" (the batch id
    # tells a replay then): an abort after it may answer aborted.
    told_committed = {a.job_id for a in seen.attempts
                      if a.told == "committed" and a.sink is not None}
    for job_id, answer in seen.aborts:
        if answer and job_id in landed and job_id not in told_committed:
            problems.append(f"an abort of job {job_id} answered aborted, and it landed")
        if not answer and job_id not in landed:
            problems.append(f"an abort of job {job_id} answered committed, and it did not "
                            "land")
    return problems


def check_sinks(seen: Observed, heads: list[LogMetadata]) -> list[str]:
    """Rule 3."""
    landed = landed_jobs(heads)
    order = sorted((heads.index(landed[a.job_id]), a.sink.batch_id)
                   for a in seen.attempts if a.sink is not None and a.job_id in landed)
    batches = [batch for _, batch in order]
    if batches != sorted(set(batches)):
        return [f"sink s landed batches {batches}, in that order"]
    return []


def check_parties(seen: Observed) -> list[str]:
    """Rule 4."""
    return list(seen.unexpected)


# -- the test --------------------------------------------------------------------------------


def run_seed(seed: int, workdir, bookie) -> list[str]:
    """Run one seed's schedule; return the rules it broke, with its story."""
    rng = random.Random(seed)
    schedule = Schedule(random.Random(rng.random()))
    seen = Observed()
    with EmbeddedMetadataStore(str(workdir / "meta")) as real:
        recording = Recording(real)
        parties = make_parties(rng)
        run_parties(recording, bookie, rng, schedule, parties, seen)
        with BookKeeper(real, {"B1": InProcessBookieClient("B1", bookie)}, FAST) as bk:
            try:
                final = read_log(real, LOG).metadata
            except NoNode:
                final = LogMetadata(LOG)
            unreadable = []
            try:
                visible = list(LogReader(bk, LOG).read()) if recording.heads else []
            except BookKeeperError as e:
                visible, unreadable = [], [f"reading the log failed: {e!r}"]
    problems = unreadable + (check_visible(seen, recording.heads, final, visible)
                + check_told(seen, recording.heads) + check_sinks(seen, recording.heads)
                + check_parties(seen))
    if not problems:
        return []
    stories = [f"  {name}: " + "; ".join(story) for name, story in seen.stories.items()]
    return [f"seed {seed} (PYBK_COMMIT_INTERLEAVING_SEEDS=1 "
            f"PYBK_COMMIT_INTERLEAVING_FIRST_SEED={seed}):", *problems, "parties:", *stories,
            "last steps:", *schedule.trace[-TRACE_STEPS:]]


@pytest.mark.timeout(SEED_TIMEOUT_S)
@pytest.mark.parametrize("seed", _seeds())
def test_random_interleaving_keeps_the_commit_rules(tmp_path, bookie, seed):
    problems = run_seed(seed, tmp_path, bookie)
    assert not problems, "\n".join(problems)


def test_checkers_catch_broken_histories():
    """Each checker flags the history it is about."""
    job = Attempt("J0", job_id="j", ledgers=[7], records=[[b"J0:0:0"]], told="committed")
    head = LogMetadata(LOG, tail=(Segment(3, 7),), next_segment=4, committing=("j",))
    seen = Observed(attempts=[job])
    assert check_told(seen, []) == ["job j was told committed and did not land"]
    assert check_visible(seen, [head], head, []) != []  # landed, not visible
    twice = [(Position(3, 0, 0), b"J0:0:0"), (Position(3, 0, 1), b"J0:0:0")]
    assert any("twice" in p for p in check_visible(seen, [head], head, twice))
    seen.attempts = [dataclasses.replace(job, sink=Sink("s", 1)),
                     dataclasses.replace(job, job_id="k", sink=Sink("s", 0))]
    later = dataclasses.replace(head, committing=("k",))
    assert check_sinks(seen, [head, later]) == ["sink s landed batches [1, 0], in that "
                                                "order"]
