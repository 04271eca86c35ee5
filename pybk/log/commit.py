"""Committing a job's closed ledgers to a log in one compare-and-set, and giving jobs up.

A job (:mod:`pybk.log.jobs`: a Spark write job, or one micro-batch of a streaming query)
writes its records into ledgers of its own, in the log's batch format
(:mod:`pybk.log.batch`), and closes them.  :func:`commit_job` then appends them all to
the log as new segments, in the order given, in one CAS of the log's head: readers see
all of the job or none of it.  The protocol, and how it fits the head's format, is in
:mod:`pybk.log.metadata` ("Commits", "Job bookkeeping"); in short:

* A commit takes the log over as an opening writer does: a live
  :class:`~pybk.log.LogWriter` of the log gets LogFenced at its next append or head
  change, exactly as when another writer opens the log.  The log is single-writer: a job
  and an application writer take turns, and the application reopens its writer to go on.
* ``overwrite``: the same CAS truncates everything before the job's first record.
* ``sink`` (sink id, batch id): the same CAS records the batch id; a commit whose sink
  recorded that batch id already changes nothing, deletes the job's ledgers and reports
  that (``committed`` False): a replayed micro-batch commits once.  A batch id below the
  recorded one (a query whose checkpoint was deleted or reset, under the same sink id)
  is refused with InvalidConfiguration, which says to start over under a new sink id:
  its batches would otherwise be skipped silently.
* The ledgers of the job that the commit does not name (failed and speculative task
  attempts) are deleted after the CAS, then the job's records.

:func:`abort_job` deletes a job's ledgers and records.  Orphans (jobs whose driver died
between their tasks and their commit) are given up by every commit and abort on the log
that is told ``orphan_timeout_s``, and by :func:`clean_orphans` (``pybk clean-orphans``):
each names the jobs nothing wrote for that long in a CAS of the head (``aborted``), then
deletes their ledgers and records.  Giving up jobs changes nothing else in the head, so
it never disturbs a live writer.  A committer whose job was given up, or whose records
are gone, fails with JobFinished and commits nothing.

**Lost answers.**  The CAS of a commit can land and its answer be lost: a connection
loss whose retry finds the head moved on (the ZooKeeper store then reports BadVersion:
another client wrote after ours), or MetadataUnavailable after ``zkOperationTimeoutMs``.
Meanwhile another client may have finished the job (a writer opening the log, another
commit, an orphan cleaner: each settles the jobs the head lists and takes them off the
list).  The committer tells "my commit landed" from "it did not, or someone else gave my
job up" by the job's *committed marker* (:mod:`pybk.log.jobs`): whoever settles a
committed job turns its record into a marker naming its first segment *before* the CAS
that takes it off the head's list.  So after any lost answer the committer re-reads the
head and then the job's record: the head lists the job, or the marker is there, exactly
when the commit landed (and a CAS that did not land never will: the head moved past the
version it expected, or the committer sends it again at that version, and at most one
of the two lands).  Then it reports the commit, with its segments; else it goes on as
after any lost race.  Chosen over looking for the plan's ledgers among the log's
segments: a truncation or an overwrite may delete them right after the commit, which
would make a landed commit look failed, and a marker costs one record write per commit,
written by whoever settles the job (crash-safe: the head lists the job until it is
written).  The marker outlives the commit's return: the caller's answer can be
lost too (Spark aborts a write whose commit returned when the worker that ran it dies
before answering), and :func:`abort_job` reads the same two places, so it never answers
"aborted" for a job whose commit landed while its marker lasts.  Markers are deleted by
the orphan cleaning a day later (COMMITTED_MARKER_KEEP_S, whatever the orphan timeout),
so they stay as few as the batch commits of a day; a streaming sink's commit, which a
replay tells by its batch id, deletes its own marker when it returns "committed", so
that a query's micro-batches leave none.  What they cost: a commit or abort that gives
up orphans (an orphan timeout given, as Spark's writes give it) reads every job record
of the log, the day's markers among them, so its metadata calls grow with the batch
jobs committed in the last day (one read each); keeping markers apart from pending jobs
would bound that, and is left for a format change.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, NamedTuple, Sequence

from pybk.errors import (
    BadVersion,
    BookKeeperError,
    InvalidConfiguration,
    JobFinished,
    MetadataError,
    MetadataUnavailable,
    NoNode,
    NoSuchLog,
    TooManyLedgers,
)
from pybk.log import jobs
from pybk.log.metadata import (
    COMMIT_LEDGERS_MAX,
    FORMAT_VERSION,
    NO_TIMESTAMP,
    ORPHANS_PER_CAS_MAX,
    SINK_ID_MAX_CHARS,
    SINKS_MAX,
    TAIL_SEGMENTS,
    LogMetadata,
    Segment,
    ensure_records,
    next_max_before,
    read_log,
    update_log,
)
from pybk.log.position import Position
from pybk.log.timeindex import max_before_next, segment_max
from pybk.log.writer import OPEN_ATTEMPTS_MAX, delete_segments, finish_take_over, take_over
from pybk.meta.ledger_metadata import LedgerState

if TYPE_CHECKING:
    from pybk.client import BookKeeper
    from pybk.meta.interface import MetadataStore

log = logging.getLogger(__name__)


class Sink(NamedTuple):
    """A streaming sink's id and the batch id a commit records for it."""

    sink_id: str
    batch_id: int


class CommitResult(NamedTuple):
    """What :func:`commit_job` did."""

    #: False if the sink had recorded the batch already: nothing was added.
    committed: bool
    #: The job's segments, in the order of the ledgers given (none if not committed),
    #: each its number and ledger (max_before None: the log's records say it).
    segments: tuple[Segment, ...]


def commit_job(bk: "BookKeeper", name: str, job_id: str, ledger_ids: Sequence[int],
               password: bytes = b"", overwrite: bool = False, sink: Sink | None = None,
               orphan_timeout_s: float | None = None) -> CommitResult:
    """Append the job's closed ledgers ``ledger_ids`` to log ``name`` in one CAS, in that
    order; delete the job's other ledgers and its records (see the module docstring).

    Raises TooManyLedgers over COMMIT_LEDGERS_MAX ledgers, InvalidConfiguration for a
    ledger that is not a closed ledger of the job or a bad sink, JobFinished if the job
    was given up or settled already; nothing is committed then.  MetadataUnavailable if
    the store stayed unreachable after the CAS was sent: the outcome is unknown then, and
    :func:`abort_job` tells it (False: committed) once the store is back.  A commit that
    landed is reported committed whatever answer its CAS got."""
    ledger_ids = list(ledger_ids)
    store = bk.metadata
    done = _committed_already(store, name, job_id, ledger_ids)
    if done is not None:
        return _forget(bk, name, job_id, sink, done)
    _check_commit(bk, name, job_id, ledger_ids, password, sink)
    # The ledgers' largest timestamps, for the max_before of the segments after them
    # (pybk.log.timeindex): closed ledgers, read once whatever the rounds below (a tagged
    # one's last entry; all of an untagged one's, which an older executor wrote: no
    # segment yet, so no max_before makes it trusted).
    maxima = [segment_max(bk, ledger_id, password) for ledger_id in ledger_ids[:-1]]
    known: dict[int, int | None] = {}  # the tail's last ledger's, read once for all rounds
    jobs.write_plan(store, name, job_id, ledger_ids)
    sent = False  # whether a CAS of ours was sent whose answer may be lost
    found = jobs.Leftovers([], [])
    try:
        for _ in range(OPEN_ATTEMPTS_MAX):
            metadata, version = read_log(store, name, create=True)
            if job_id in metadata.committing:
                # Our CAS landed, but its answer was lost: finish the commit.
                committed = metadata
                break
            done = _committed_already(store, name, job_id, ledger_ids)
            if done is not None:  # our CAS landed and another client finished the job
                log.info("log %s: job %s's commit landed (its answer was lost); another "
                         "client finished it", name, job_id)
                return _forget(bk, name, job_id, sink, done)
            if job_id in metadata.aborted \
                    or not jobs.is_pending(jobs.read_job(store, name, job_id)):
                raise JobFinished(f"log {name}: job {job_id} was aborted, or given up as "
                                  "an orphan, before its commit: this commit adds nothing")
            if sink is not None and metadata.sinks.get(sink.sink_id, -1) >= sink.batch_id:
                return _replayed(bk, metadata, job_id, sink)
            taken = take_over(bk, metadata, password)
            found = _leftovers(store, taken, orphan_timeout_s, job_id)
            before = NO_TIMESTAMP if overwrite \
                else max_before_next(bk, taken, password, known)
            committed = _appended(taken, job_id, ledger_ids, overwrite, sink, found.orphans,
                                  before, maxima)
            try:
                sent = True
                version = update_log(store, committed, version)
                break
            except (BadVersion, MetadataUnavailable) as e:
                # Another write came first, or ours landed and its answer was lost (a
                # retry after a lost connection finds the head moved on: BadVersion):
                # the next round tells which from the head and the job's records.
                log.info("log %s: job %s's commit CAS did not answer that it landed (%s); "
                         "looking again", name, job_id, e)
        else:
            raise MetadataError(f"log {name}: job {job_id} lost the race to commit "
                                f"{OPEN_ATTEMPTS_MAX} times in a row to other writers")
    except MetadataUnavailable as e:
        if not sent:
            raise
        raise MetadataUnavailable(
            f"log {name}: the outcome of job {job_id}'s commit is unknown (its CAS was "
            f"sent, then the metadata store became unreachable: {e}); abort_job tells "
            "once the store is back (False: it was committed): do not write the job "
            "again before") from e
    first = committed.next_segment - len(ledger_ids)
    segments = tuple(Segment(first + i, ledger_id) for i, ledger_id in enumerate(ledger_ids))
    log.info("log %s: job %s committed %d ledgers as segments %d to %d%s", name, job_id,
             len(ledger_ids), first, committed.next_segment - 1,
             " (overwrite)" if overwrite else "")
    try:
        finish_take_over(bk, committed)
        jobs.settle_listed(bk, committed)
        if overwrite:
            delete_segments(bk, committed)
        # The tail cut back to TAIL_SEGMENTS, truncation's progress, the settled jobs.
        _tidy(bk, committed, dataclasses.replace(
            committed, tail=committed.tail[-TAIL_SEGMENTS:],
            oldest_segment=committed.truncated_before.segment, dropping=(), committing=(),
            aborted=()), version)
        for old in found.committed:
            jobs.forget(bk, name, old)
    except BookKeeperError as e:
        # The job is committed: reporting a failure would invite the caller to write it
        # again.  What is left (records, deletions, the tail) is the next owner's to do.
        log.warning("log %s: job %s is committed, but tidying up after it failed (the next "
                    "writer or commit of the log finishes it): %s", name, job_id, e)
    return _forget(bk, name, job_id, sink, CommitResult(True, segments))


def _replayed(bk: "BookKeeper", metadata: LogMetadata, job_id: str,
              sink: Sink) -> CommitResult:
    """A sink's batch that the log recorded already: replayed (the batch id recorded),
    it commits nothing and its job is settled; an older one is refused."""
    recorded = metadata.sinks[sink.sink_id]
    if sink.batch_id < recorded:
        raise InvalidConfiguration(
            f"log {metadata.name}: sink {sink.sink_id!r} committed batch {recorded} "
            f"already, and this commit is of batch {sink.batch_id}: the query's checkpoint "
            "was deleted or reset (Spark replays at most the batch recorded).  Its batches "
            "would be skipped: to write them, start over under a new sinkId")
    log.info("log %s: sink %s committed batch %d already; job %s commits nothing",
             metadata.name, sink.sink_id, sink.batch_id, job_id)
    jobs.settle(bk, metadata.name, job_id)
    return CommitResult(False, ())


def _committed_already(store: "MetadataStore", name: str, job_id: str,
                       ledger_ids: list[int]) -> CommitResult | None:
    """What the job's committed marker says (None without one); JobFinished if it
    committed other ledgers than ``ledger_ids``."""
    found = jobs.read_job(store, name, job_id)
    if found is None or found[0].committed is None:
        return None
    job = found[0]
    if list(job.plan or ()) != ledger_ids:
        raise JobFinished(f"log {name}: job {job_id} was committed already, with ledgers "
                          f"{list(job.plan or ())}, not {ledger_ids}")
    return CommitResult(True, job.segments)


def _forget(bk: "BookKeeper", name: str, job_id: str, sink: Sink | None,
            result: CommitResult) -> CommitResult:
    """``result``, once a sink's job's committed marker is deleted: the sink's batch id
    tells a replay from now on.  A job without a sink keeps its marker for the orphan
    cleaning to forget (see the module docstring).  (A marker left by a failure here is
    forgotten by the next orphan cleaning too.)"""
    if sink is None:
        return result
    try:
        jobs.forget(bk, name, job_id)
    except BookKeeperError as e:
        log.warning("log %s: job %s is committed; its marker stays until orphans are "
                    "next cleaned: %s", name, job_id, e)
    return result


def _check_commit(bk: "BookKeeper", name: str, job_id: str, ledger_ids: list[int],
                  password: bytes, sink: Sink | None) -> None:
    if len(ledger_ids) > COMMIT_LEDGERS_MAX:
        raise TooManyLedgers(
            f"log {name}: job {job_id} would commit {len(ledger_ids)} ledgers, over "
            f"COMMIT_LEDGERS_MAX={COMMIT_LEDGERS_MAX} for one commit: write with fewer "
            "partitions (coalesce) or larger segments (segmentMaxBytes)")
    if len(set(ledger_ids)) != len(ledger_ids):
        raise InvalidConfiguration(f"log {name}: job {job_id} names a ledger twice in its "
                                   f"commit: {ledger_ids}")
    if sink is not None and not (isinstance(sink.sink_id, str)
                                 and 0 < len(sink.sink_id) <= SINK_ID_MAX_CHARS
                                 and isinstance(sink.batch_id, int) and sink.batch_id >= 0):
        raise InvalidConfiguration(
            f"sink {sink.sink_id!r} with batch {sink.batch_id!r}: a sink id has 1 to "
            f"{SINK_ID_MAX_CHARS} characters, a batch id is 0 or more")
    registered = {r.ledger_id for r in jobs.job_ledgers(bk.metadata, name, job_id)}
    for ledger_id in ledger_ids:
        if ledger_id not in registered:
            raise InvalidConfiguration(f"log {name}: ledger {ledger_id} is not a ledger of "
                                       f"job {job_id} (or the job was settled already)")
        metadata = bk.ledger_manager.read(ledger_id).metadata
        if metadata.state is not LedgerState.CLOSED:
            raise InvalidConfiguration(f"log {name}: ledger {ledger_id} of job {job_id} is "
                                       f"{metadata.state.name}, not closed: only a task that "
                                       "finished hands its ledgers to the commit")
        if not metadata.check_password(password):
            raise InvalidConfiguration(f"log {name}: ledger {ledger_id} of job {job_id} has "
                                       "another password than the log's")


def _appended(taken: LogMetadata, job_id: str, ledger_ids: list[int], overwrite: bool,
              sink: Sink | None, orphans: list[str], max_before: int,
              maxima: list[int | None]) -> LogMetadata:
    """The head with the job's ledgers appended to ``taken`` (a takeover's head), the
    first with ``max_before``, each next one's made from it and the ledger before's
    largest timestamp (``maxima``)."""
    first = taken.next_segment
    new: list[Segment] = []
    for i, ledger_id in enumerate(ledger_ids):
        if new:
            max_before = next_max_before(new[-1], maxima[i - 1])
        new.append(Segment(first + i, ledger_id, max_before))
    sinks = dict(taken.sinks)
    if sink is not None:
        if sink.sink_id not in sinks and len(sinks) >= SINKS_MAX:
            raise InvalidConfiguration(f"log {taken.name} records SINKS_MAX={SINKS_MAX} "
                                       f"sinks already: sink {sink.sink_id!r} cannot be "
                                       "added")
        sinks[sink.sink_id] = sink.batch_id
    if overwrite:
        # Readers start at truncated_before's segment: the job's first, or the number
        # the next segment gets if the job brings none.
        tail, truncated_before = tuple(new), Position(first, 0, 0)
    else:
        # The older tail segments have their records (the takeover wrote them).
        tail = (taken.tail + tuple(new))[-max(TAIL_SEGMENTS, len(new)):]
        truncated_before = taken.truncated_before
    return dataclasses.replace(taken, next_segment=first + len(new), sinks=sinks,
                               committing=(job_id,), aborted=tuple(orphans), tail=tail,
                               truncated_before=truncated_before)


def _tidy(bk: "BookKeeper", head: LogMetadata, tidy: LogMetadata, version: int) -> None:
    """CAS ``tidy`` over ``head`` (at ``version``), which this caller wrote and whose
    listed jobs it settled; if a cleaner listed jobs meanwhile, settle them and try again
    with them off the list too.  Left to the next writer or committer if one took the log
    over meanwhile (it does the same)."""
    store = bk.metadata
    for _ in range(OPEN_ATTEMPTS_MAX):
        try:
            update_log(store, tidy, version)
            return
        except BadVersion:
            current, version = read_log(store, head.name)
        if not head.same_owner(current):
            return
        jobs.settle_listed(bk, current)
    log.warning("log %s: could not tidy its head (lost the race %d times); the next "
                "writer or commit does it", head.name, OPEN_ATTEMPTS_MAX)


def _leftovers(store: "MetadataStore", metadata: LogMetadata,
               orphan_timeout_s: float | None, job_id: str | None) -> jobs.Leftovers:
    if orphan_timeout_s is None:
        return jobs.Leftovers([], [])
    return jobs.find_leftovers(store, metadata, orphan_timeout_s,
                               exclude=() if job_id is None else (job_id,),
                               limit=ORPHANS_PER_CAS_MAX)


# -- giving jobs up ---------------------------------------------------------------------


def abort_job(bk: "BookKeeper", name: str, job_id: str,
              orphan_timeout_s: float | None = None) -> bool:
    """Give the job up: delete its ledgers and records; with ``orphan_timeout_s``, give
    up the log's orphans too.  Returns False if the job's commit landed (its CAS, whatever
    its committer was told: the head lists the job, or its committed marker is there):
    then its committed ledgers stay, and only its others are deleted.  True: the job is
    given up (by this call or an earlier one), and no commit of it can land any more.

    A committed job is told apart by its committed marker for as long as the marker
    lasts (:mod:`pybk.log.jobs`): a day (COMMITTED_MARKER_KEEP_S), or, for a streaming
    sink's job, until its committer returned "committed" (the sink's batch id tells a
    replay then); aborting such a job after that answers True and deletes nothing."""
    committed, _given_up, _forgotten = _give_up(bk, name, job_id, orphan_timeout_s)
    return not committed


def clean_orphans(bk: "BookKeeper", name: str, older_than_s: float) -> list[str]:
    """Give up the jobs of log ``name`` that nothing wrote for ``older_than_s`` seconds
    (see :mod:`pybk.log.jobs`): delete their ledgers and records.  Returns their ids."""
    if older_than_s < 0:
        raise InvalidConfiguration(f"older_than_s={older_than_s}: must be 0 or more")
    given_up: list[str] = []
    while True:  # one CAS gives up at most ORPHANS_PER_CAS_MAX, and forgets as many markers
        _committed, found, forgotten = _give_up(bk, name, None, older_than_s)
        given_up += found
        if len(found) < ORPHANS_PER_CAS_MAX and forgotten < ORPHANS_PER_CAS_MAX:
            return given_up


def _give_up(bk: "BookKeeper", name: str, job_id: str | None,
             orphan_timeout_s: float | None) -> tuple[bool, list[str], int]:
    """List ``job_id`` (if given and pending) and the orphans in ``aborted`` in one CAS
    that changes nothing else, then settle them and CAS them off the list again; forget
    the committed markers older than ``orphan_timeout_s``.

    Returns whether ``job_id`` was committed already (then it is settled as committed,
    not given up), the jobs given up, and how many markers were forgotten."""
    store = bk.metadata
    for _ in range(OPEN_ATTEMPTS_MAX):
        try:
            metadata, version = read_log(store, name)
        except NoNode:
            raise NoSuchLog(f"no log is named {name!r}") from None
        jobs.settle_listed(bk, metadata)
        found = None if job_id is None else jobs.read_job(store, name, job_id)
        if job_id is not None and (job_id in metadata.committing or (
                found is not None and found[0].committed is not None)):
            log.warning("log %s: job %s was committed already; it is not aborted", name,
                        job_id)
            return True, [], 0
        leftovers = _leftovers(store, metadata, orphan_timeout_s, job_id)
        targets = leftovers.orphans
        if job_id is not None and jobs.is_pending(found):
            targets.insert(0, job_id)
        if not targets and not (metadata.committing or metadata.aborted):
            break
        listed = dataclasses.replace(metadata, committing=(), aborted=tuple(targets),
                                     format_version=FORMAT_VERSION)
        if metadata.format_version == 1:  # no writer opened it since: convert it
            ensure_records(store, metadata)
            listed = dataclasses.replace(listed, tail=metadata.tail[-TAIL_SEGMENTS:])
        try:
            version = update_log(store, listed, version)
        except BadVersion:
            continue  # (if ours landed, its answer lost, the next round finds it done)
        for target in targets:
            log.info("log %s: job %s given up: %d ledgers deleted", name, target,
                     jobs.settle(bk, name, target))
        _tidy(bk, listed, dataclasses.replace(listed, aborted=()), version)
        break
    else:
        raise MetadataError(f"log {name}: lost the race to give up jobs "
                            f"{OPEN_ATTEMPTS_MAX} times in a row")
    for old in leftovers.committed:
        jobs.forget(bk, name, old)
    return False, targets, len(leftovers.committed)
