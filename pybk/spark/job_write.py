"""What a write to a pybk log does in Spark, for the batch and the streaming writer alike.

One Spark write job (a ``df.write`` or one micro-batch of a ``df.writeStream``) is one
pybk job (:mod:`pybk.log.jobs`), committed exactly once (:mod:`pybk.log.commit`):

* **Driver, before any task** (:func:`begin`, from the writer's constructor, which
  Spark runs where it plans the write): connect (a wrong ``metadataServiceUri`` or an
  unusable log name fails here, with the reason) and record the job under the log.
* **Tasks** (:func:`write_partition`, on the executors): each task attempt builds its own
  client, writes its rows into ledgers of its own (created with the options'
  LogSettings quorums, tagged with the log's name, the job's id (``JOB_KEY``: a job's
  ledger is trusted to keep running maxima only by its tag, which older executors did
  not set) and as keeping running maxima: :func:`pybk.log.writer.batch_ledger_metadata`;
  a new one past ``segmentMaxBytes``),
  each registered in the job under an id reserved before the ledger is created (an
  attempt killed in between leaves nothing that the job's commit or abort does not
  delete; one gap is left: an attempt that creates its ledger just after the job's
  commit or abort settled it, and is killed before it sees its registration gone,
  leaves that ledger, empty of visible rows, to no cleaner) and refreshed while it is
  written,
  closes them, and returns a :class:`PybkCommitMessage` naming them.  Records are packed
  into entries in the log's batch format (:mod:`pybk.log.batch`), up to
  ``batchMaxBytes`` each, with up to ENTRIES_IN_FLIGHT_MAX entries in flight, their max
  timestamps running maxima (which commits and searches by time rely on, for a ledger
  so tagged).  Rows of a
  ``value`` column alone are cut straight from the Arrow column's buffers, all of an
  entry with the time it is made; with ``key``, ``timestamp`` or ``headers`` columns
  (:func:`pybk.spark.source.check_write_schema`) each record takes its own (a null
  timestamp: the time its entry is made), through Python lists.  A failed attempt
  deletes its ledgers.
* **Driver, after the tasks** (:func:`commit`): the successful attempts' ledgers, in
  partition order, are appended to the log in one compare-and-set; the job's other
  ledgers (failed and speculative attempts) and its records are deleted; a commit whose
  answer was lost is reported committed once it knows (:mod:`pybk.log.commit`).
  :func:`abort` deletes everything of the job, unless its commit landed.  Both give up
  the log's orphans on the way: jobs nothing wrote for ``orphanTimeoutSeconds`` (their
  driver died before committing).

Spark's save modes: ``append`` adds the job's records after the log's; ``overwrite``
truncates everything before the job's first record in the same commit.  Spark itself
refuses ``errorifexists`` and ``ignore`` for Python data sources, before the source is
asked ([UNSUPPORTED_DATA_SOURCE_SAVE_MODE]): a pybk log cannot be written in those modes.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import logging
import operator
import threading
import time
from itertools import accumulate, repeat
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Literal, Sequence, cast

from pyspark.sql.datasource import WriterCommitMessage

from pybk.errors import (
    BookKeeperError,
    EntryTooLarge,
    InvalidConfiguration,
    JobFinished,
    MetadataError,
)
from pybk.log import jobs
from pybk.log.batch import (
    BATCH_HEADER_BYTES,
    FIELDS_OVERHEAD_BYTES,
    JOB_KEY,
    RECORD_OVERHEAD_BYTES,
    batch_max,
    check_fields,
    encode_batch,
    encode_batch_parts,
    now_ms,
)
from pybk.log.commit import CommitResult, Sink, abort_job, commit_job
from pybk.log.metadata import log_path
from pybk.log.writer import batch_ledger_metadata
from pybk.spark.connect import connect
from pybk.spark.options import PybkOptions

if TYPE_CHECKING:
    import pyarrow as pa

    from pybk.client import BookKeeper
    from pybk.client.ledger_adv import LedgerHandleAdv

log = logging.getLogger(__name__)

#: How many entries a task has in flight at once (256 KiB each with the default
#: batchMaxBytes): enough to keep every bookie's pipeline busy.
ENTRIES_IN_FLIGHT_MAX = 32
#: A task refreshes its ledger's record every orphanTimeoutSeconds x this.
REFRESH_FRACTION = 0.25


@dataclasses.dataclass(frozen=True)
class PybkCommitMessage(WriterCommitMessage):
    """What a task attempt hands to the commit: its ledgers, in order."""

    job_id: str
    partition: int
    ledger_ids: tuple[int, ...]
    records: int


def task_messages(messages: Sequence[WriterCommitMessage | None]
                  ) -> Sequence[PybkCommitMessage | None]:
    """The messages Spark hands a writer's commit or abort, as what they are: each one
    what a task's :func:`write_partition` returned (None for a task that failed)."""
    return cast(Sequence[PybkCommitMessage | None], messages)


# -- the driver -----------------------------------------------------------------------


def begin(opts: PybkOptions) -> str:
    """Record a new job on the options' log; return its id.  Raises on the driver what
    would make every task fail: an unreachable cluster, an unusable log name."""
    try:
        log_path(opts.log)
    except MetadataError as e:
        raise InvalidConfiguration(f"option log={opts.log!r} cannot name a log: {e}") from None
    with connect(opts) as bk:
        return jobs.begin_job(bk.metadata, opts.log)


def commit(opts: PybkOptions, job_id: str,
           messages: Iterable[PybkCommitMessage | None], overwrite: bool,
           sink: Sink | None = None) -> CommitResult:
    """Append the ledgers of ``messages`` (the successful task attempts'), in partition
    order, to the log in one CAS; delete the job's others and its records."""
    found = [m for m in messages if m is not None]
    partitions = [m.partition for m in found]
    if len(set(partitions)) != len(partitions):
        raise MetadataError(f"{opts.describe()}: job {job_id} got two commit messages for "
                            f"one partition: {sorted(partitions)}")
    ledger_ids = [i for m in sorted(found, key=lambda m: m.partition) for i in m.ledger_ids]
    with connect(opts) as bk:
        if not ledger_ids and not overwrite:  # nothing to add: no need to take the log over
            jobs.settle(bk, opts.log, job_id)
            return CommitResult(True, ())
        result = commit_job(bk, opts.log, job_id, ledger_ids, opts.password, overwrite, sink,
                            orphan_timeout_s=opts.get("orphanTimeoutSeconds"))
    log.info("%s: job %s %s %d records in %d ledgers", opts.describe(), job_id,
             "committed" if result.committed else "had been committed already: skipped",
             sum(m.records for m in found), len(ledger_ids))
    return result


def abort(opts: PybkOptions, job_id: str) -> None:
    """Delete every ledger and record of the job (and the log's orphans).  JobFinished
    if the job's commit landed after all (its commit failed not knowing): its records
    are in the log, once."""
    with connect(opts) as bk:
        if not abort_job(bk, opts.log, job_id,
                         orphan_timeout_s=opts.get("orphanTimeoutSeconds")):
            raise JobFinished(f"{opts.describe()}: job {job_id} was committed (its commit "
                              "failed not knowing that it had landed): its records are in "
                              "the log, once; do not write them again")


def settle(opts: PybkOptions, job_id: str) -> None:
    """Delete a job's ledgers and records at once (a job known to be unused)."""
    with connect(opts) as bk:
        jobs.settle(bk, opts.log, job_id)


# -- the tasks ------------------------------------------------------------------------


def write_partition(opts: PybkOptions, job_id: str,
                    batches: Iterator["pa.RecordBatch"]) -> PybkCommitMessage:
    """Write a task's rows (Arrow batches of the columns check_write_schema allows) into
    ledgers of the job; return the message naming them."""
    from pyspark import TaskContext
    context = TaskContext.get()
    assert context is not None  # a task's function runs in its task
    partition, attempt = context.partitionId(), context.attemptNumber()
    with connect(opts) as bk:
        ledgers = _TaskLedgers(bk, opts, job_id, partition, attempt)
        try:
            records = 0
            floor: int | None = None  # the max timestamp of the entry sent before
            for batch in batches:
                for entry in _entries(batch, ledgers.settings.batchMaxBytes,
                                      ledgers.settings.recordMaxBytes, floor):
                    ledgers.add(entry)
                    floor = batch_max(entry)
                records += batch.num_rows
            ledger_ids = ledgers.finish()
        except BaseException:
            ledgers.discard()
            raise
    return PybkCommitMessage(job_id, partition, tuple(ledger_ids), records)


def _entries(batch: "pa.RecordBatch", batch_max_bytes: int, record_max_bytes: int,
             max_floor: int | None = None) -> Iterator[bytes]:
    """The entries (log batches of up to ``batch_max_bytes``, a larger record alone)
    holding the rows of ``batch``, in order: cut straight from the value column's
    buffers if it is the only column, else with each row's key, timestamp and headers.
    Their max timestamps are running maxima from ``max_floor`` (the max timestamp of the
    entry sent before: :mod:`pybk.log.batch`, "Maxima"), whatever the wall clock does,
    since a commit and a search by time rely on them (:mod:`pybk.log.timeindex`).  The
    floor is carried over when a task starts a new ledger: a header max above its
    ledger's records is still an upper bound."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = batch.column("value")
    count = len(column)
    if count == 0:
        return
    if column.null_count:
        raise InvalidConfiguration(f"column value holds {column.null_count} nulls: a log "
                                   "record is bytes (write b'' for an empty one, or filter "
                                   "the nulls out)")
    kind = column.type
    width: Literal["q", "i"]
    if pa.types.is_large_binary(kind) or pa.types.is_large_string(kind):
        width = "q"
    elif pa.types.is_binary(kind) or pa.types.is_string(kind):
        width = "i"
    else:
        raise InvalidConfiguration(f"column value is {kind}: binary or string only")
    if batch.num_columns > 1:
        yield from _record_entries(batch, batch_max_bytes, record_max_bytes, max_floor)
        return
    longest = pc.max(pc.binary_length(column)).as_py()
    if longest > record_max_bytes:
        raise _too_large(longest, record_max_bytes)
    _validity, offsets_buffer, data_buffer = column.buffers()
    offsets = memoryview(offsets_buffer).cast("B").cast(width)[
        column.offset:column.offset + count + 1]
    data = memoryview(data_buffer) if data_buffer is not None else memoryview(b"")

    def end_of(k: int) -> int:  # bytes records [0, k) take in an entry, but the header
        return offsets[k] + RECORD_OVERHEAD_BYTES * k

    for first, last in _cuts(end_of, count, batch_max_bytes):
        lengths = list(map(operator.sub, offsets[first + 1:last + 1], offsets[first:last]))
        entry = encode_batch_parts(lengths, data[offsets[first]:offsets[last]],
                                   max_floor=max_floor)
        max_floor = batch_max(entry)
        yield entry


def _record_entries(batch: "pa.RecordBatch", batch_max_bytes: int, record_max_bytes: int,
                    max_floor: int | None) -> Iterator[bytes]:
    """:func:`_entries` of a batch with ``key``, ``timestamp`` or ``headers`` columns."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = batch.schema.names
    count = batch.num_rows
    values = batch.column("value").cast(pa.binary()).to_pylist()
    keys = batch.column("key").cast(pa.binary()).to_pylist() if "key" in names else None
    headers = None
    if "headers" in names:  # a list of {"key": name, "value": value} structs, or null
        headers = [_header_pairs(found) for found in batch.column("headers").to_pylist()]
    timestamps = None
    if "timestamp" in names:
        stamps = batch.column("timestamp")
        if pa.types.is_timestamp(stamps.type):
            stamps = stamps.cast(pa.timestamp("ms", stamps.type.tz), safe=False)
        timestamps = stamps.cast(pa.int64())
    sizes = list(map(len, values))
    overhead = RECORD_OVERHEAD_BYTES
    if keys is not None or headers is not None:
        overhead += FIELDS_OVERHEAD_BYTES
        checked = list(map(check_fields, repeat(None) if keys is None else keys,
                           repeat(None) if headers is None else headers))
        keys = [k for k, _, _ in checked]
        headers = [h for _, h, _ in checked] if headers is not None else None
        sizes = [size + extra for size, (_, _, extra) in zip(sizes, checked)]
    if max(sizes) > record_max_bytes:
        raise _too_large(max(sizes), record_max_bytes)
    ends = list(accumulate((size + overhead for size in sizes), initial=0))
    for first, last in _cuts(ends.__getitem__, count, batch_max_bytes):
        entry_keys = keys[first:last] if keys is not None else None
        if entry_keys is not None and entry_keys.count(None) == len(entry_keys):
            entry_keys = None  # no record of the entry has a key: no key fields
        entry_stamps = None
        if timestamps is not None:  # a null timestamp: now, as the entry is made
            entry_stamps = pc.fill_null(timestamps[first:last], now_ms()).to_pylist()
        entry = encode_batch(values[first:last], entry_stamps, entry_keys,
                             headers[first:last] if headers is not None else None,
                             max_floor=max_floor)
        max_floor = batch_max(entry)
        yield entry


def _header_pairs(found: list[dict] | None) -> tuple:
    """A row's ``headers`` (a list of {"key", "value"} structs, or null) as the pairs
    :func:`pybk.log.batch.check_fields` takes."""
    if not found:
        return ()
    if None in found:
        raise InvalidConfiguration("column headers holds a null header (a null struct in "
                                   "a row's array): drop it, e.g. with filter(headers, h "
                                   "-> h is not null)")
    return tuple((h["key"], h["value"]) for h in found)


def _cuts(end_of: Callable[[int], int], count: int,
          batch_max_bytes: int) -> Iterator[tuple[int, int]]:
    """How records ``0..count-1`` go into entries of up to ``batch_max_bytes``, given
    ``end_of(k)``, the bytes records ``[0, k)`` take in an entry but its header: each
    entry's first record and the one after its last (a record over the budget goes
    alone)."""
    budget = batch_max_bytes - BATCH_HEADER_BYTES
    first = 0
    while first < count:
        last = bisect.bisect_right(range(count + 1), end_of(first) + budget, lo=first + 1,
                                   key=end_of) - 1
        last = max(last, first + 1)  # a record over the budget goes alone
        yield first, last
        first = last


def _too_large(size: int, record_max_bytes: int) -> EntryTooLarge:
    return EntryTooLarge(f"a record of {size} bytes (value, key and headers) is over "
                         f"recordMaxBytes={record_max_bytes}: raise it (and the bookies' "
                         "maxEntrySizeBytes) or split the value")


class _TaskLedgers:
    """The ledgers one task attempt writes: created and registered on demand, rolled at
    segmentMaxBytes, refreshed in the job while written, closed at the end."""

    def __init__(self, bk: "BookKeeper", opts: PybkOptions, job_id: str, partition: int,
                 attempt: int) -> None:
        self._bk, self._opts, self._job_id = bk, opts, job_id
        self._partition, self._attempt = partition, attempt
        self.settings = opts.log_settings_object()
        self._refresh_s = opts.get("orphanTimeoutSeconds") * REFRESH_FRACTION
        self._done: list[int] = []
        self._ledger: LedgerHandleAdv | None = None
        self._entries = 0  # the id the current ledger's next entry gets
        self._registration: jobs.JobLedger | None = None
        self._refreshed = 0.0
        self._ledger_bytes = 0
        self._in_flight = 0
        self._failure: BaseException | None = None
        self._changed = threading.Condition()

    def add(self, entry: bytes) -> None:
        """Send an entry to the current ledger (a new one if it is full), once fewer than
        ENTRIES_IN_FLIGHT_MAX are in flight."""
        if self._ledger is None or self._ledger_bytes >= self.settings.segmentMaxBytes:
            self._roll()
        elif time.monotonic() - self._refreshed >= self._refresh_s:
            assert self._registration is not None  # registered with the ledger
            self._registration = jobs.refresh_ledger(self._bk.metadata, self._opts.log,
                                                     self._job_id, self._registration)
            self._refreshed = time.monotonic()
        with self._changed:
            self._changed.wait_for(lambda: self._in_flight < ENTRIES_IN_FLIGHT_MAX
                                   or self._failure is not None)
            self._raise_failure()
            self._in_flight += 1
        self._ledger_bytes += len(entry)
        assert self._ledger is not None  # _roll() made one
        try:
            self._ledger.add_entry_then(self._entries, entry, self._on_added)
        except BaseException:
            with self._changed:
                self._in_flight -= 1
            raise
        self._entries += 1

    def _on_added(self, _entry_id: int | None, error: BaseException | None) -> None:
        with self._changed:
            self._in_flight -= 1
            if error is not None and self._failure is None:
                self._failure = error
            self._changed.notify_all()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise BookKeeperError(f"{self._opts.describe()}: job {self._job_id}, partition "
                                  f"{self._partition}: writing failed: "
                                  f"{self._failure}") from self._failure

    def _roll(self) -> None:
        """Start a new ledger: its id reserved and registered in the job before it is
        created, so that an attempt killed at any point leaves nothing the job's commit
        or abort does not find; then checked registered still (JobFinished if the job
        was settled meanwhile: :meth:`discard` deletes the ledger)."""
        self._close_current()
        s = self.settings
        ledger_id = self._bk.metadata.next_ledger_id()
        self._registration = jobs.register_ledger(self._bk, self._opts.log, self._job_id,
                                                  ledger_id, self._partition, self._attempt)
        self._ledger = self._bk.create_ledger_adv(
            s.ensembleSize, s.writeQuorumSize, s.ackQuorumSize, s.digestType,
            self._opts.password,
            batch_ledger_metadata(self._opts.log, {JOB_KEY: self._job_id.encode("ascii")}),
            ledger_id=ledger_id)
        self._ledger_bytes = self._entries = 0
        self._registration = jobs.refresh_ledger(self._bk.metadata, self._opts.log,
                                                 self._job_id, self._registration)
        self._refreshed = time.monotonic()

    def _close_current(self) -> None:
        """Close the current ledger once its entries are acknowledged (close waits)."""
        if self._ledger is None:
            return
        ledger, self._ledger = self._ledger, None
        ledger.close()
        self._raise_failure()
        self._done.append(ledger.id)

    def finish(self) -> list[int]:
        """Close the last ledger; the ids of every ledger written, in order."""
        self._close_current()
        return list(self._done)

    def discard(self) -> None:
        """A failed attempt: close and delete what it wrote (its records go with the
        job's), quietly: the failure that brought it here is what the task reports."""
        ledger_ids = list(self._done)
        if self._ledger is not None:
            ledger_ids.append(self._ledger.id)
            with contextlib.suppress(BookKeeperError):
                self._ledger.close()
            self._ledger = None
        for ledger_id in ledger_ids:
            try:
                jobs.delete_ledger(self._bk, ledger_id)
            except BookKeeperError as e:
                log.warning("ledger %d of a failed task attempt was not deleted now (the "
                            "job's commit or abort deletes it): %s", ledger_id, e)
