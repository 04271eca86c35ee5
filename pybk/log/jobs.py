"""Jobs that write ledgers to commit to a log: their records, and deleting what they leave.

A job (a Spark write job, a streaming micro-batch) writes its records into ledgers of
its own, which a commit (:mod:`pybk.log.commit`) appends to the log in one
compare-and-set of its head.  Until then the job and each of its ledgers have a record
under the log, sealed records (:mod:`pybk.meta.sealed`)::

    /logs/<name>/jobs/<job id>                  the job (magic b"PBKJ", version 2)
    /logs/<name>/jobs/<job id>/<ledger id, 20 digits>
                                                one ledger a task attempt created (magic
                                                b"PBKT", version 1)

The job's body::

    "job"        its id (a valid record name: :func:`new_job_id` makes 32 hex digits)
    "created"    when it began, Unix time in seconds
    "plan"       null until its commit; then [ledger id, ...]: the ledgers the commit
                 appends, in order (written before the commit's CAS, so that whoever
                 finishes a commit whose committer died knows which ledgers to keep)
    "committed"  null while the job is pending; once its commit's CAS landed and the job
                 was settled, [its first segment's number, Unix time in seconds of the
                 settling]: the record is then the job's *committed marker*
                 (version 1 had no such key: read as null)

A ledger's body::

    "ledger_id"  the ledger (the one in its name)
    "partition"  the partition of the task attempt that writes it
    "attempt"    that attempt's number (a retried or speculative task has several)
    "refreshed"  Unix time in seconds: the attempt rewrites it while it writes

**Registration** (:func:`register_ledger`): a task attempt creates a ledger's record
before it creates the ledger (under an id reserved with ``next_ledger_id``: an attempt
killed in between leaves a record whose ledger does not exist, which settling skips),
then checks that the job is still pending: its record is there (a store's create makes
missing parents, so a registration that comes after the job's records were deleted
brings back an empty job record, which it removes again) and the log's head does not
list it.  Otherwise the attempt deletes its ledger and fails with JobFinished: nothing
that registers late survives.  Once it has created the ledger it checks that the record
is still there (:func:`refresh_ledger`): a settler that came in between found no ledger
to delete.

**Settling** a job (:func:`settle`) deletes its ledgers except those kept (the plan of a
committed job; none for an aborted one), then its ledgers' records, then its own record,
once no new registration came meanwhile; a committed job's record is not deleted but
turned into its committed marker (:func:`settle_listed`).  Each step can be repeated: a
settler that dies is followed by the next one.

**Committed markers** tell a committer whose commit's answer was lost (and an abort that
follows it) that the commit landed, after others finished the job: whoever settles a job
the head lists in ``committing`` writes the marker *before* the CAS that takes the job
off the list, so from the commit's CAS on, the head lists the job or its marker exists,
or both.  A marker stays until its committer's outcome cannot matter any more: the
cleaners that give up orphans delete the markers older than COMMITTED_MARKER_KEEP_S (a
day) or their orphan timeout if longer (:func:`find_leftovers`), and a streaming sink's
committer deletes its own when it returns "committed" (:func:`forget`: the sink's batch
id tells a replay from then on).  So a log holds a marker per batch job committed within
a day, and those of the commits still running, each a few hundred bytes.

**Orphans**: a job that no head lists, whose record and ledgers' records were all last
written more than ``older_than`` seconds ago (:func:`find_leftovers`), is taken as
abandoned (its driver died between its tasks and its commit); a job without any ledger
yet, only once it is EMPTY_JOB_TIMEOUT_S (a day) old.  The times are the writing hosts'
clocks: ``older_than`` must exceed both their skew and the longest time a job goes
without any task writing once its first ledger is registered (its tasks refresh their
ledgers' records while they write).
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Iterable, NamedTuple

from pybk.errors import JobFinished, MalformedMetadata, MetadataError, NoNode, NoSuchLedger
from pybk.log.metadata import LogMetadata, Segment, jobs_path, read_log
from pybk.meta import paths
from pybk.meta.interface import ANY_VERSION, MetadataStore
from pybk.meta.sealed import seal, typed, unseal, unseal_versions

if TYPE_CHECKING:
    from pybk.client import BookKeeper

JOB_MAGIC = b"PBKJ"
LEDGER_MAGIC = b"PBKT"
RECORD_VERSION = 2
#: How many times a settler goes over a job whose ledgers keep being registered.
SETTLE_ATTEMPTS_MAX = 10
#: How long a job none of whose tasks registered a ledger yet is waited for before it is
#: taken for an orphan (if the orphan timeout is shorter).  A Spark job is begun when
#: its write is planned, before the stages that compute its rows run, however long they
#: take: its tasks register their ledgers only then.
EMPTY_JOB_TIMEOUT_S = 24 * 3600.0
#: How long a committed marker is kept (or the orphan
#: timeout, if that is longer): far longer than a committer whose answer was lost takes
#: to look (its store's retries, then Spark's abort), whatever orphan timeout a cleaner
#: is given.
COMMITTED_MARKER_KEEP_S = 24 * 3600.0
_LEDGER_DIGITS = 20
_JOB_KEYS_1 = frozenset(("job", "created", "plan"))
_JOB_KEYS = _JOB_KEYS_1 | {"committed"}
_LEDGER_KEYS = frozenset(("ledger_id", "partition", "attempt", "refreshed"))


class Committed(NamedTuple):
    """What a committed job's marker says: where its segments start, and when it was
    settled."""

    first_segment: int
    settled: float


class Job(NamedTuple):
    """A job's record: pending, or a committed job's marker (``committed`` set)."""

    job_id: str
    created: float
    plan: tuple[int, ...] | None = None
    committed: Committed | None = None

    @property
    def segments(self) -> tuple[Segment, ...]:
        """A committed job's segments (its plan's ledgers, numbered from its first)."""
        assert self.committed is not None and self.plan is not None  # a marker has both
        first = self.committed.first_segment
        return tuple(Segment(first + i, ledger_id) for i, ledger_id in enumerate(self.plan))

    def to_bytes(self) -> bytes:
        return seal(JOB_MAGIC, RECORD_VERSION, {
            "job": self.job_id, "created": self.created,
            "plan": None if self.plan is None else list(self.plan),
            "committed": None if self.committed is None else list(self.committed)})

    @classmethod
    def from_bytes(cls, data: bytes) -> "Job":
        version, obj = unseal_versions(data, JOB_MAGIC, {1: _JOB_KEYS_1,
                                                         RECORD_VERSION: _JOB_KEYS},
                                       "job record")
        try:
            plan = typed("plan", obj["plan"], list, nullable=True)
            committed = None if version == 1 else typed("committed", obj["committed"],
                                                        list, nullable=True)
            if committed is not None and (plan is None or len(committed) != 2):
                raise ValueError(f"committed is {committed!r}, not [first segment, time] "
                                 "beside a plan")
            return cls(typed("job", obj["job"], str), _seconds("created", obj["created"]),
                       None if plan is None else tuple(typed("a ledger id", i, int)
                                                       for i in plan),
                       None if committed is None else Committed(
                           typed("a first segment", committed[0], int),
                           _seconds("a settling time", committed[1])))
        except ValueError as e:
            raise MalformedMetadata(f"job record body is malformed: {e}") from e


class JobLedger(NamedTuple):
    """A ledger's record: which task attempt writes it, and when it last said so."""

    ledger_id: int
    partition: int
    attempt: int
    refreshed: float

    def to_bytes(self) -> bytes:
        return seal(LEDGER_MAGIC, RECORD_VERSION, self._asdict())

    @classmethod
    def from_bytes(cls, data: bytes) -> "JobLedger":
        obj = unseal(data, LEDGER_MAGIC, RECORD_VERSION, _LEDGER_KEYS, "job ledger record")
        try:
            return cls(typed("ledger_id", obj["ledger_id"], int),
                       typed("partition", obj["partition"], int),
                       typed("attempt", obj["attempt"], int),
                       _seconds("refreshed", obj["refreshed"]))
        except ValueError as e:
            raise MalformedMetadata(f"job ledger record body is malformed: {e}") from e


def _seconds(name: str, value: object) -> float:
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return typed(name, value, float)


# -- paths ----------------------------------------------------------------------------


def new_job_id() -> str:
    """A job id no other job has (a random UUID's 32 hex digits)."""
    return uuid.uuid4().hex


def job_path(name: str, job_id: str) -> str:
    return paths.join(jobs_path(name), paths.check_name(job_id))


def ledger_path(name: str, job_id: str, ledger_id: int) -> str:
    return paths.join(job_path(name, job_id), f"{ledger_id:0{_LEDGER_DIGITS}d}")


# -- the driver's side ----------------------------------------------------------------


def begin_job(store: MetadataStore, name: str, job_id: str | None = None) -> str:
    """Record a new job on log ``name`` (created if new); return its id."""
    job_id = job_id or new_job_id()
    read_log(store, name, create=True)  # the head first: a job's create makes parents
    store.create(job_path(name, job_id), Job(job_id, time.time()).to_bytes())
    return job_id


def read_job(store: MetadataStore, name: str, job_id: str) -> tuple[Job, int] | None:
    """The job's record (pending, or its committed marker) and its version; None if it
    has none (settled), or only the empty one a late registration made (see the module
    docstring)."""
    try:
        data, version = store.get(job_path(name, job_id))
    except NoNode:
        return None
    return (Job.from_bytes(data), version) if data else None


def is_pending(found: tuple[Job, int] | None) -> bool:
    """Whether a record :func:`read_job` found is a pending job's (not settled, not a
    committed marker)."""
    return found is not None and found[0].committed is None


def write_plan(store: MetadataStore, name: str, job_id: str,
               ledger_ids: Iterable[int]) -> None:
    """Record the ledgers the job's commit appends, before its CAS; JobFinished if the
    job is not pending any more."""
    found = read_job(store, name, job_id)
    if found is None or not is_pending(found):
        raise _finished(name, job_id)
    job, version = found
    store.set(job_path(name, job_id), job._replace(plan=tuple(ledger_ids)).to_bytes(),
              version)


def job_ledgers(store: MetadataStore, name: str, job_id: str) -> list[JobLedger]:
    """The records of the job's ledgers, by ledger id (none once it is settled)."""
    found = []
    for child in _children(store, job_path(name, job_id)):
        try:
            data, _version = store.get(paths.join(job_path(name, job_id), child))
        except NoNode:
            continue  # settled meanwhile
        found.append(JobLedger.from_bytes(data))
    return found


def _children(store: MetadataStore, path: str) -> list[str]:
    try:
        return store.children(path)
    except NoNode:
        return []


# -- the tasks' side --------------------------------------------------------------------


def register_ledger(bk: "BookKeeper", name: str, job_id: str, ledger_id: int,
                    partition: int, attempt: int) -> JobLedger:
    """Record that a task attempt writes ``ledger_id`` for the job, before it creates
    it.

    JobFinished (with the ledger deleted) if the job was committed, aborted or settled."""
    store = bk.metadata
    registration = JobLedger(ledger_id, partition, attempt, time.time())
    path = ledger_path(name, job_id, ledger_id)
    if not is_pending(read_job(store, name, job_id)):  # most late attempts stop here
        _undo_registration(bk, name, job_id, ledger_id, created=False)
    store.create(path, registration.to_bytes())
    head = read_log(store, name).metadata
    if job_id in head.committing or job_id in head.aborted \
            or not is_pending(read_job(store, name, job_id)):
        _undo_registration(bk, name, job_id, ledger_id, created=True)
    return registration


def refresh_ledger(store: MetadataStore, name: str, job_id: str,
                   registration: JobLedger) -> JobLedger:
    """Say that the attempt still writes its ledger; JobFinished if the job was
    settled (its ledger is deleted: the attempt should stop)."""
    refreshed = registration._replace(refreshed=time.time())
    try:
        store.set(ledger_path(name, job_id, registration.ledger_id), refreshed.to_bytes(),
                  ANY_VERSION)
    except NoNode:
        raise _finished(name, job_id) from None
    return refreshed


def _undo_registration(bk: "BookKeeper", name: str, job_id: str, ledger_id: int,
                       created: bool) -> None:
    """Take back a registration that came too late, and raise JobFinished."""
    if created:
        _delete(bk.metadata, ledger_path(name, job_id, ledger_id))
        if read_job(bk.metadata, name, job_id) is None:
            try:  # the empty parent the create brought back, unless others share it
                bk.metadata.delete(job_path(name, job_id), ANY_VERSION)
            except (NoNode, MetadataError):
                pass
    delete_ledger(bk, ledger_id)
    raise _finished(name, job_id)


def _finished(name: str, job_id: str) -> JobFinished:
    return JobFinished(f"log {name}: job {job_id} was committed, aborted or given up as an "
                       "orphan already: it takes no more ledgers")


# -- settling ---------------------------------------------------------------------------


def settle(bk: "BookKeeper", name: str, job_id: str, keep: Iterable[int] = ()) -> int:
    """Delete the job's ledgers but those in ``keep``, then its records (a committed
    marker too); return how many ledgers were deleted.  Harmless if it was settled
    already."""
    store = bk.metadata
    keep = set(keep)
    deleted = 0
    for _ in range(SETTLE_ATTEMPTS_MAX):
        deleted += _delete_ledgers(bk, name, job_id, keep)
        try:
            store.delete(job_path(name, job_id), ANY_VERSION)
            return deleted
        except NoNode:
            return deleted
        except MetadataError:
            if not _children(store, job_path(name, job_id)):
                raise
            # an attempt registered a ledger meanwhile: it finds the job settled
    raise MetadataError(f"log {name}: job {job_id} kept getting new ledgers while it was "
                        f"settled ({SETTLE_ATTEMPTS_MAX} rounds)")


def _delete_ledgers(bk: "BookKeeper", name: str, job_id: str, keep: set[int]) -> int:
    """Delete the job's registered ledgers but those in ``keep``, and their records;
    return how many ledgers were deleted."""
    deleted = 0
    for ledger in job_ledgers(bk.metadata, name, job_id):
        if ledger.ledger_id not in keep:
            deleted += delete_ledger(bk, ledger.ledger_id)
        _delete(bk.metadata, ledger_path(name, job_id, ledger.ledger_id))
    return deleted


def settle_listed(bk: "BookKeeper", metadata: LogMetadata) -> None:
    """Settle the jobs the head lists: committed ones keep their plan and their record
    becomes their committed marker; aborted ones keep nothing."""
    for job_id in metadata.committing:
        found = read_job(bk.metadata, metadata.name, job_id)
        if not is_pending(found):
            continue  # settled already (or its marker forgotten by its committer)
        assert found is not None
        job = found[0]
        plan = job.plan or ()
        _delete_ledgers(bk, metadata.name, job_id, set(plan))
        # The head that lists the job is its commit's: its segments end the tail.
        marker = job._replace(committed=Committed(metadata.next_segment - len(plan),
                                                  time.time()))
        try:
            bk.metadata.set(job_path(metadata.name, job_id), marker.to_bytes(), ANY_VERSION)
        except NoNode:
            pass  # its committer was told and deleted the marker already
    for job_id in metadata.aborted:
        settle(bk, metadata.name, job_id)


def forget(bk: "BookKeeper", name: str, job_id: str) -> None:
    """Delete a committed job's marker (and any ledger a task registered late under it,
    but its plan's); nothing if it has none."""
    found = read_job(bk.metadata, name, job_id)
    if found is not None and found[0].committed is not None:
        settle(bk, name, job_id, keep=found[0].plan or ())


class Leftovers(NamedTuple):
    """What :func:`find_leftovers` found."""

    #: Jobs no head lists that nothing wrote for the time asked: to give up.
    orphans: list[str]
    #: Committed jobs whose markers are old enough: to :func:`forget`.
    committed: list[str]


def find_leftovers(store: MetadataStore, metadata: LogMetadata, older_than_s: float,
                   exclude: Iterable[str] = (), limit: int | None = None) -> Leftovers:
    """The jobs of the log that the head ``metadata`` does not list and that nothing
    wrote for ``older_than_s`` seconds (at most ``limit``), oldest first, a job without
    any ledger yet once it is EMPTY_JOB_TIMEOUT_S old, if that is longer; and the
    committed markers settled ``older_than_s`` ago, or COMMITTED_MARKER_KEEP_S if that
    is longer (at most ``limit``)."""
    listed = set(metadata.committing) | set(metadata.aborted) | set(exclude)
    now = time.time()
    found, committed = [], []
    for job_id in _children(store, jobs_path(metadata.name)):
        if job_id in listed:
            continue
        record = read_job(store, metadata.name, job_id)
        if record is not None and record[0].committed is not None:
            keep_s = max(older_than_s, COMMITTED_MARKER_KEEP_S)
            if record[0].committed.settled <= now - keep_s:
                committed.append(job_id)
            continue  # a marker is never an orphan: its plan is in the log
        # None: settled meanwhile, or the empty record a late registration left (it has
        # no time of its own: only its ledgers' count).
        created = 0.0 if record is None else record[0].created
        ledgers = job_ledgers(store, metadata.name, job_id)
        wait_s = older_than_s if ledgers else max(older_than_s, EMPTY_JOB_TIMEOUT_S)
        if created <= now - wait_s and all(
                ledger.refreshed <= now - older_than_s for ledger in ledgers):
            found.append((created, job_id))
    return Leftovers([job_id for _created, job_id in sorted(found)[:limit]],
                     committed[:limit])


def delete_ledger(bk: "BookKeeper", ledger_id: int) -> bool:
    """Delete a ledger; False if it was gone already (deleted before a crash)."""
    try:
        bk.delete_ledger(ledger_id)
    except NoSuchLedger:
        return False
    return True


def _delete(store: MetadataStore, path: str) -> None:
    try:
        store.delete(path, ANY_VERSION)
    except NoNode:
        pass
