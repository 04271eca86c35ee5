"""Streaming reads of a pybk log: ``spark.readStream.format("pybk")...load()``.

**Offsets** are log positions as JSON, ``{"position": "segment:entry:slot"}``: the
position of the next record to read (a micro-batch reads from its start offset,
inclusive, to its end offset, exclusive).  A new query starts at ``startingPosition``
(default ``latest``: only records appended from now on; ``earliest``: everything the log
holds); a restarted query goes on from its checkpoint, and since a micro-batch's records
are fixed by its two positions (:func:`pybk.log.ranges.plan`), a batch Spark replays
after a restart reads the same records: none lost, none repeated.

**What a micro-batch reads**: up to what is readable when its end is chosen: closed
segments whole, the first open segment up to its last add confirmed as the bookies
know it (the writer's LAC reaches them with its next entry, or its explicit LAC within
``explicitLacInterval``), so a query tails a live writer about one trigger interval
behind.  Nothing is fenced or recovered.  One partition per segment read.

**Admission control**: ``maxRecordsPerTrigger`` (:class:`ReadMaxRows`) and
``maxBytesPerTrigger`` (:class:`ReadMaxBytes`, bytes of values) bound a micro-batch;
with both, the default limit Spark is given is the record count and the byte bound
applies too, whichever is reached first.  A micro-batch always takes at least one record
when one is there.  When Spark passes :class:`ReadAllAvailable` (``Trigger.Once``, or
its own reasons) the options are ignored.  *Cost*: a position ``n`` records ahead cannot
be known without the entries' batch headers, and bookies serve whole entries: with a
limit, the offsets process reads the micro-batch's entries (read-ahead, stopping at the
limit) to count them, so those bytes cross the network twice, once for counting and
once in the tasks.  Without a limit nothing is read to plan a micro-batch (metadata and
a LAC request only).

``Trigger.AvailableNow`` reads up to the end of what was readable when the query
started (:meth:`StreamReader.prepareForTriggerAvailableNow`), in micro-batches bounded
as above, then stops.

**Data loss**: if truncation removed records the query has not read yet (its start
offset is before the log's ``truncated_before``, or a task's range is gone when read),
the query fails with RecordsTruncated; with ``failOnDataLoss=false`` it logs a warning
and goes on at the truncation point.  (A query whose start offset is the end of a
segment that was still open when it read it cannot tell whether that segment got more
records before it was truncated: it reports a possible loss.  A ``consumerId`` holds
back truncation, so a truncation point past the query's position then means that only
numbers of dropped empty segments were skipped: no loss is reported.)

**Consumers**: with ``consumerId``, a new query registers that consumer at its start,
and every :meth:`StreamReader.commit` stores the committed end as its position
(:mod:`pybk.log.consumers`): truncation stops there until the query has read past it.
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
from typing import TYPE_CHECKING, Iterator, Sequence

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pybk.errors import MalformedMetadata, RecordsTruncated
from pybk.log import consumers
from pybk.log.batch import batch_lengths
from pybk.log.position import Position
from pybk.log.ranges import EARLIEST, LATEST, Plan, plan, read_entries, slots
from pybk.spark.batch_read import RangePartition, plan_from_start, read_partition
from pybk.spark.connect import connect
from pybk.spark.options import PybkOptions

if TYPE_CHECKING:
    from pybk.client import BookKeeper

log = logging.getLogger(__name__)

_KEY = "position"


def to_offset(position: Position) -> dict:
    """A position as a streaming offset."""
    return {_KEY: str(position)}


def from_offset(offset: dict) -> Position:
    """The position of a streaming offset; MalformedMetadata for anything else (a
    checkpoint written by another source)."""
    try:
        return Position.parse(offset[_KEY])
    except (KeyError, TypeError, ValueError):
        raise MalformedMetadata(f"streaming offset {offset!r} is not a pybk offset "
                                '({"position": "segment:entry:slot"}): the checkpoint '
                                "belongs to a query of another source") from None


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads the log ``opts`` names as a stream; see the module docstring."""

    def __init__(self, opts: PybkOptions) -> None:
        self._opts = opts
        self._target: Position | None = None  # Trigger.AvailableNow's end

    # -- offsets (the driver's offsets process) -------------------------------------

    def initialOffset(self) -> dict:
        opts = self._opts
        start = opts.get("startingPosition") or LATEST
        with connect(opts) as bk:
            found = plan_from_start(bk, opts, start, start)
            if start not in (EARLIEST, LATEST) and found.start > Position.parse(start):
                self._lost(f"{opts.describe()} was truncated before {found.start}: the "
                           f"records from startingPosition={start} up to there are gone")
            if opts.get("consumerId"):
                consumers.set_position(bk.metadata, opts.log, opts.get("consumerId"),
                                       found.start)
        return to_offset(found.start)

    def getDefaultReadLimit(self) -> ReadLimit:
        rows, size = self._opts.get("maxRecordsPerTrigger"), self._opts.get("maxBytesPerTrigger")
        if rows:
            return ReadMaxRows(rows)
        if size:
            return ReadMaxBytes(size)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        opts = self._opts
        with connect(opts) as bk:
            self._target = plan(bk, opts.log, LATEST, password=opts.password).end

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        opts = self._opts
        begin = from_offset(start)
        rows, size = self._limits(limit)
        with connect(opts) as bk:
            found = self._plan(bk, begin, self._target or LATEST)
            if rows is None and size is None:
                return to_offset(found.end)
            try:
                return to_offset(_admitted(bk, opts, found, rows, size))
            except RecordsTruncated as e:  # truncated while counted: the next call sees it
                self._lost(str(e))
                return start

    def _limits(self, limit: ReadLimit) -> tuple[int | None, int | None]:
        """The record and byte bounds of a micro-batch under ``limit``."""
        if isinstance(limit, ReadMaxRows):
            return limit.max_rows, self._opts.get("maxBytesPerTrigger")
        if isinstance(limit, ReadMaxBytes):
            return self._opts.get("maxRecordsPerTrigger"), limit.max_bytes
        return None, None  # ReadAllAvailable: the options do not apply

    # -- micro-batches --------------------------------------------------------------

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, finish = from_offset(start), from_offset(end)
        if finish <= begin:
            return []
        with connect(self._opts) as bk:
            return [RangePartition(r) for r in self._plan(bk, begin, finish).ranges]

    def read(self, partition: InputPartition) -> Iterator:
        try:
            yield from read_partition(self._opts, partition)
        except RecordsTruncated as e:
            self._lost(f"{e}; its records the query had not read are gone")

    def commit(self, end: dict) -> None:
        consumer = self._opts.get("consumerId")
        if consumer:
            with connect(self._opts) as bk:
                consumers.set_position(bk.metadata, self._opts.log, consumer,
                                       from_offset(end))

    def stop(self) -> None:
        """Nothing to release: every call connects and disconnects."""

    # -- helpers --------------------------------------------------------------------

    def _plan(self, bk: BookKeeper, begin: Position, end: "Position | str") -> Plan:
        """The plan from ``begin``, checked for records truncated before it was read."""
        opts = self._opts
        found = plan(bk, opts.log, begin, end, password=opts.password)
        if found.start > begin and not self._held_at(bk, begin):
            self._lost(f"{opts.describe()} was truncated before {found.start}: the records "
                       f"from {begin}, where the query is, up to there are gone")
        return found

    def _held_at(self, bk: BookKeeper, begin: Position) -> bool:
        """Whether the query's consumer holds truncation at or before ``begin``: then a
        truncation past ``begin`` only skipped numbers of dropped empty segments (a
        writer moves the truncation point to the next segment that exists), no record."""
        consumer = self._opts.get("consumerId")
        found = consumers.get(bk.metadata, self._opts.log, consumer) if consumer else None
        return found is not None and found.position <= begin

    def _lost(self, what: str) -> None:
        if self._opts.get("failOnDataLoss"):
            raise RecordsTruncated(f"{what}.  Set failOnDataLoss=false to skip ahead "
                                   "instead, or register the query as a consumer "
                                   "(consumerId) so that truncation waits for it")
        log.warning("%s; failOnDataLoss=false: skipping ahead", what)


def _admitted(bk: BookKeeper, opts: PybkOptions, found: Plan, rows: int | None,
              size: int | None) -> Position:
    """The end of the plan's first records within ``rows`` records and ``size`` bytes of
    values (at least one record), counted from the entries' batch headers."""
    taken = taken_bytes = 0
    for r in found.ranges:
        for entry_id, data in read_entries(bk, r, opts.password):
            lengths, _ = batch_lengths(data)
            first, end = slots(r, entry_id, len(lengths))
            for slot in range(first, end):
                taken_bytes += lengths[slot]
                if taken and ((rows is not None and taken >= rows)
                              or (size is not None and taken_bytes > size)):
                    return Position(r.segment, entry_id, slot)
                taken += 1
    return found.end
