"""Streaming reads of pybk logs: ``spark.readStream.format("pybk")...load()``.

**Offsets** are log positions by log name as JSON, ``{"a": "segment:entry:slot", "b":
...}`` (as Spark's Kafka source keeps offsets by topic): for each log, the position of
the next record to read (a micro-batch reads from its start offset, inclusive, to its
end offset, exclusive).  A checkpoint written before offsets were kept by log holds
``{"position": "segment:entry:slot"}``: that is the position of the one log the option
``log`` names (:func:`from_offset`), and the query goes on from it (its next offsets are
of the new form, which an earlier pybk cannot read).  A new query starts each log at its
``startingPosition`` (default ``latest``: only records appended from now on;
``earliest``: everything the log holds) or at the position of its ``startingTimestamp``
(:func:`~pybk.spark.batch_read.bound_of`: the first record whose timestamp is at least
that time, or the log's end); a restarted query goes on from its checkpoint, whatever
its starting options say (as Kafka's source does), and since a micro-batch's records
are fixed by its two offsets (:func:`pybk.log.ranges.plan`), a batch Spark replays
after a restart reads the same records: none lost, none repeated.

**Logs**: those the option ``log`` lists (each must exist when a new query starts), or
with ``logPattern`` those whose names match (none at all is fine: the query waits for
them).  The logs are listed again each time a micro-batch's end is chosen
(:meth:`StreamReader.latestOffset`): a log that is not in the start offset (created
since, or added to the list before a restart) joins the end offset at its start, its
earliest record, whatever the starting options say (Kafka's source starts partitions it
discovers later at their earliest offset too; a time would silently skip the records of
a log written late with older event times), and is
read from the next micro-batch on; so the records of each micro-batch stay fixed by
its two offsets.  A log deleted while the query runs (or between runs) leaves the next
end offset: the query reads it no more and logs a warning.  Its records the query had
not read are not reported as lost (deleting a log is no truncation under a reader); a
micro-batch already planned over it skips it.  A log of the same name created later is
a new log, read from its start, once an end offset went without it; deleted and
created again between two micro-batches it is not told apart from the old one (offsets
hold names, not identities, as Kafka's did before topic ids): the query goes on at its
position, or fails if the new log has no such position yet.

**What a micro-batch reads**: up to what is readable when its end is chosen: closed
segments whole, the first open segment up to its last add confirmed as the bookies
know it (the writer's LAC reaches them with its next entry, or its explicit LAC within
``explicitLacInterval``), so a query tails a live writer about one trigger interval
behind.  Nothing is fenced or recovered.  One partition per segment read.

**Admission control**: ``maxRecordsPerTrigger`` (:class:`ReadMaxRows`) and
``maxBytesPerTrigger`` (:class:`ReadMaxBytes`, bytes of values) bound a micro-batch;
with both, the default limit Spark is given is the record count and the byte bound
applies too, whichever is reached first.  A micro-batch always takes at least one record
when one is there.  With several logs the bounds are shared out among the logs that
have records: each in turn (by name) takes at most what is left divided by the logs
still to come, and at least one record, so that no log waits on another (a bound of
fewer records than logs with records gives each one record).  When Spark passes
:class:`ReadAllAvailable` (``Trigger.Once``, or its own reasons) the options are
ignored.  *Cost*: a position ``n`` records ahead cannot be known without the entries'
batch headers, and bookies serve whole entries: with a limit, the offsets process reads
the micro-batch's entries (read-ahead, stopping at the limit) to count them, so those
bytes cross the network twice, once for counting and once in the tasks.  Without a
limit nothing is read to plan a micro-batch (metadata, a LAC request a log, and with
``logPattern`` a listing of the logs).

``Trigger.AvailableNow`` reads up to the end of what was readable when the query
started (:meth:`StreamReader.prepareForTriggerAvailableNow`: the logs there were then,
each up to its end then), in micro-batches bounded as above, then stops.

**Data loss**: if truncation removed records the query has not read yet (its start
offset is before the log's ``truncated_before``, or a task's range is gone when read),
the query fails with RecordsTruncated; with ``failOnDataLoss=false`` it logs a warning
and goes on at the truncation point.  (A query whose start offset is the end of a
segment that was still open when it read it cannot tell whether that segment got more
records before it was truncated: it reports a possible loss.  A ``consumerId`` holds
back truncation, so a truncation point past the query's position then means that only
numbers of dropped empty segments were skipped: no loss is reported.)

**Consumers**: with ``consumerId``, a new query registers that consumer at its start
in each log it reads (a log that joins later: when the first offset that holds it is
committed), and every :meth:`StreamReader.commit` stores each log's committed end as
the consumer's position in it (:mod:`pybk.log.consumers`): truncation stops there
until the query has read past it.
Spark commits a micro-batch's end to the source when it plans the next micro-batch
that has data, so the records of the last one stay held until the query moves on.
``pybk consumers remove`` unregisters a query that is gone for good.

**Resources**: Spark calls the planning methods in a long-lived driver-side process
that gets SIGTERM (its ``stop()`` may never be called): each call connects and
disconnects (:func:`pybk.spark.connect.connect`), so nothing stays open between calls.
Tasks connect on their executors, as batch reads do.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pybk.errors import MalformedMetadata, NoSuchLog, RecordsTruncated
from pybk.log import consumers
from pybk.log.batch import batch_lengths
from pybk.log.position import Position
from pybk.log.ranges import EARLIEST, LATEST, Plan, plan, read_entries, slots
from pybk.spark.batch_read import (
    RangePartition,
    bound_of,
    find_logs,
    plan_from_start,
    read_partition,
)
from pybk.spark.connect import connect
from pybk.spark.options import PybkOptions

if TYPE_CHECKING:
    from pybk.client import BookKeeper

log = logging.getLogger(__name__)

#: The one key of the offsets of a query of one log written before offsets were kept by
#: log (``{"position": "segment:entry:slot"}``), which a checkpoint may still hold.
_SINGLE_LOG_KEY = "position"


def to_offset(positions: Mapping[str, Position]) -> dict:
    """Positions by log name as a streaming offset, ``{"log": "segment:entry:slot",
    ...}`` (sorted by name)."""
    return {log: str(positions[log]) for log in sorted(positions)}


def from_offset(offset: dict, opts: PybkOptions) -> dict[str, Position]:
    """The positions by log of a streaming offset of a query with options ``opts``;
    MalformedMetadata for anything else (a checkpoint written by another source).  An
    offset of the single-log form (``{"position": ...}``, when ``position`` is no log
    the query reads) is the position of the one log ``opts`` names."""
    if isinstance(offset, dict) and set(offset) == {_SINGLE_LOG_KEY} \
            and not opts.reads_log(_SINGLE_LOG_KEY):
        if opts.log_pattern is not None or len(opts.logs) != 1:
            raise MalformedMetadata(
                f"streaming offset {offset!r} is the position of the one log of a query "
                f"written by an earlier pybk, and this query reads the {opts.describe()}: "
                "restart it with that log alone (option log), or with a new checkpoint")
        offset = {opts.logs[0]: offset[_SINGLE_LOG_KEY]}
    try:
        if not isinstance(offset, dict):
            raise TypeError(offset)
        return {log: Position.parse(text) for log, text in offset.items()}
    except (TypeError, ValueError):
        raise MalformedMetadata(f"streaming offset {offset!r} is not a pybk offset "
                                '({"log": "segment:entry:slot", ...}): the checkpoint '
                                "belongs to a query of another source") from None


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads the logs ``opts`` names as a stream; see the module docstring."""

    def __init__(self, opts: PybkOptions) -> None:
        self._opts = opts
        #: Trigger.AvailableNow's end: the logs there were when the run began, and their
        #: ends then.
        self._target: dict[str, Position] | None = None

    # -- offsets (the driver's offsets process) -------------------------------------

    def initialOffset(self) -> dict:
        opts = self._opts
        positions = {}
        with connect(opts) as bk:
            for name in find_logs(bk, opts):
                one = opts.for_log(name)
                try:
                    start = bound_of(bk, opts, "starting", name, LATEST)
                    found = plan_from_start(bk, one, start, start)
                except NoSuchLog:
                    if opts.log_pattern is None:
                        raise  # a log the option log names must be there
                    continue  # deleted since it was listed
                if start not in (EARLIEST, LATEST) and found.start > Position.parse(str(start)):
                    self._lost(f"{one.describe()} was truncated before {found.start}: the "
                               f"records from startingPosition={start} up to there are gone")
                positions[name] = found.start
                if opts.get("consumerId"):
                    consumers.set_position(bk.metadata, name, opts.get("consumerId"),
                                           found.start)
        return to_offset(positions)

    def getDefaultReadLimit(self) -> ReadLimit:
        rows, size = self._opts.get("maxRecordsPerTrigger"), self._opts.get("maxBytesPerTrigger")
        if rows:
            return ReadMaxRows(rows)
        if size:
            return ReadMaxBytes(size)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        opts = self._opts
        self._target = {}
        with connect(opts) as bk:
            for name in find_logs(bk, opts):
                try:
                    self._target[name] = plan(bk, name, LATEST, password=opts.password).end
                except NoSuchLog:
                    continue  # deleted: nothing to read (latestOffset drops it)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        opts = self._opts
        begins = from_offset(start, opts)
        rows, size = self._limits(limit)
        ends = dict(begins)
        plans: dict[str, Plan] = {}
        with connect(opts) as bk:
            targets: Mapping[str, Position | str] = (
                self._target if self._target is not None
                else dict.fromkeys(find_logs(bk, opts), LATEST))
            for name in sorted(begins.keys() | targets.keys()):
                try:
                    if name not in begins:  # new: it joins at its start, read from the next
                        ends[name] = plan(bk, name, EARLIEST, EARLIEST,
                                          password=opts.password).start
                    elif name not in targets:  # not listed: deleted
                        raise NoSuchLog(f"there is no log named {name!r}")
                    else:
                        plans[name] = self._plan(bk, name, begins[name], targets[name])
                except NoSuchLog:
                    if name in begins:  # (a new log may be gone already: never read)
                        self._deleted(name)
                        del ends[name]
            if rows is None and size is None:
                ends.update((name, found.end) for name, found in plans.items())
                return to_offset(ends)
            try:
                ends.update(_admitted(bk, opts, plans, rows, size))
            except RecordsTruncated as e:  # truncated while counted: the next call sees it
                self._lost(str(e))
                return start
        return to_offset(ends)

    def _limits(self, limit: ReadLimit) -> tuple[int | None, int | None]:
        """The record and byte bounds of a micro-batch under ``limit``."""
        if isinstance(limit, ReadMaxRows):
            return limit.max_rows, self._opts.get("maxBytesPerTrigger")
        if isinstance(limit, ReadMaxBytes):
            return self._opts.get("maxRecordsPerTrigger"), limit.max_bytes
        return None, None  # ReadAllAvailable: the options do not apply

    # -- micro-batches --------------------------------------------------------------

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begins, ends = from_offset(start, self._opts), from_offset(end, self._opts)
        found: list[InputPartition] = []
        with connect(self._opts) as bk:
            for name, finish in sorted(ends.items()):
                begin = begins.get(name, finish)  # a log that joins at ``end`` starts there
                if finish <= begin:
                    continue
                try:
                    ranges = self._plan(bk, name, begin, finish).ranges
                except NoSuchLog:
                    self._deleted(name)
                    continue
                found.extend(RangePartition(name, r) for r in ranges)
        return found

    def read(self, partition: InputPartition) -> Iterator:
        try:
            yield from read_partition(self._opts, partition)
        except RecordsTruncated as e:
            self._lost(f"{e}; its records the query had not read are gone")

    def commit(self, end: dict) -> None:
        consumer = self._opts.get("consumerId")
        if consumer:
            with connect(self._opts) as bk:
                for name, position in from_offset(end, self._opts).items():
                    try:
                        consumers.set_position(bk.metadata, name, consumer, position)
                    except NoSuchLog:
                        self._deleted(name)

    def stop(self) -> None:
        """Nothing to release: every call connects and disconnects."""

    # -- helpers --------------------------------------------------------------------

    def _plan(self, bk: BookKeeper, name: str, begin: Position,
              end: "Position | str") -> Plan:
        """The plan of log ``name`` from ``begin``, checked for records truncated before
        it was read."""
        found = plan(bk, name, begin, end, password=self._opts.password)
        if found.start > begin and not self._held_at(bk, name, begin):
            self._lost(f"{self._opts.for_log(name).describe()} was truncated before "
                       f"{found.start}: the records from {begin}, where the query is, up "
                       "to there are gone")
        return found

    def _held_at(self, bk: BookKeeper, name: str, begin: Position) -> bool:
        """Whether the query's consumer holds truncation of log ``name`` at or before
        ``begin``: then a truncation past ``begin`` only skipped numbers of dropped empty
        segments (a writer moves the truncation point to the next segment that exists),
        no record."""
        consumer = self._opts.get("consumerId")
        found = consumers.get(bk.metadata, name, consumer) if consumer else None
        return found is not None and found.position <= begin

    def _deleted(self, name: str) -> None:
        log.warning("%s was deleted: the query reads it no more",
                    self._opts.for_log(name).describe())

    def _lost(self, what: str) -> None:
        if self._opts.get("failOnDataLoss"):
            raise RecordsTruncated(f"{what}.  Set failOnDataLoss=false to skip ahead "
                                   "instead, or register the query as a consumer "
                                   "(consumerId) so that truncation waits for it")
        log.warning("%s; failOnDataLoss=false: skipping ahead", what)


def _admitted(bk: BookKeeper, opts: PybkOptions, plans: Mapping[str, Plan],
              rows: int | None, size: int | None) -> dict[str, Position]:
    """The ends, by log, of the plans' first records within ``rows`` records and ``size``
    bytes of values, shared out among the logs that have records: each in turn (by name)
    takes at most what is left divided by the logs still to come, and at least one
    record (so that no log waits on the others)."""
    ends = {name: found.end for name, found in plans.items()}
    waiting = sorted(name for name, found in plans.items() if found.ranges)
    for i, name in enumerate(waiting):
        share = len(waiting) - i
        ends[name], taken, taken_bytes = _admitted_of(
            bk, opts, plans[name], None if rows is None else rows // share,
            None if size is None else size // share)
        rows = None if rows is None else rows - taken
        size = None if size is None else size - taken_bytes
    return ends


def _admitted_of(bk: BookKeeper, opts: PybkOptions, found: Plan, rows: int | None,
                 size: int | None) -> tuple[Position, int, int]:
    """The end of one log's plan's first records within ``rows`` records and ``size``
    bytes of values (at least one record), counted from the entries' batch headers, and
    the records and bytes it takes."""
    taken = taken_bytes = 0
    for r in found.ranges:
        for entry_id, data in read_entries(bk, r, opts.password):
            lengths, _ = batch_lengths(data)
            first, end = slots(r, entry_id, len(lengths))
            for slot in range(first, end):
                if taken and ((rows is not None and taken >= rows)
                              or (size is not None and taken_bytes + lengths[slot] > size)):
                    return Position(r.segment, entry_id, slot), taken, taken_bytes
                taken += 1
                taken_bytes += lengths[slot]
    return found.end, taken, taken_bytes
