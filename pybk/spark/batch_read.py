"""Batch reads of pybk logs: ``spark.read.format("pybk")...load()``.

Planning (:meth:`BatchReader.partitions`, on the driver) connects once, finds the logs
to read (:func:`find_logs`: those the option ``log`` lists, or with ``logPattern`` those
whose names match, listed then) and asks :func:`pybk.log.ranges.plan`, for each, for the
ranges from its ``startingPosition`` (inclusive, default ``earliest``) to its
``endingPosition`` (exclusive, default ``latest``; both given by log in a JSON object
when the read has several), or from and to the positions of its ``startingTimestamp``
and ``endingTimestamp`` (:func:`bound_of`: :func:`pybk.log.timeindex.position_at`, the
first record whose timestamp is at least the time; found once, while planning, so a
record with a smaller timestamp between the two is read and one with a larger timestamp
after the end is not, as Kafka's offsets by timestamp do): closed segments whole, the
first open segment up to its
last add confirmed (no fencing, no recovery: a live writer goes on undisturbed), nothing
after it.  Each range is one partition; with ``minPartitions`` the largest (of all the
logs) are halved by entries until there are that many.  Partitions come log by log (in
the list's order, or by name for a pattern), each log's in position order.  What a job
reads is fixed when it is planned: records appended later, and logs created later, are
not in it.  A pattern that matches no log reads no rows.

Each task (:meth:`BatchReader.read`) connects on its executor
(:func:`pybk.spark.connect.connect`), reads its range with read-ahead and closes its
client when the range is done (or the task stops early).  Rows come as Arrow record
batches built from whole entries (:mod:`pybk.spark.arrow`), several times faster than
one tuple per record.  Within a partition rows are in position order; a DataFrame's
order across partitions is Spark's to keep or not (``orderBy("position")`` is not a
text order: order by ``segment``, ``entry``, ``slot``).

A missing log (one the option ``log`` lists), a start in a segment the log has not
reached, or a cluster that cannot be reached fails the job on the driver, while it is
planned, before any task runs.  A range truncated away between planning and reading
fails its task with RecordsTruncated.

Filter pushdown (Spark calls :meth:`FilteringBatchReader.pushFilters` only with
``spark.sql.python.filterPushdown.enabled=true``): comparisons of ``segment`` and
``entry`` with whole numbers (``=``, ``<``, ``<=``, ``>``, ``>=``; ``IN`` as its least and
greatest values) narrow the ranges read, so rows outside them are never read; the
comparisons are exact and Spark does not evaluate them again (``IN`` it does).
Comparisons of ``timestamp`` with a time (``IN`` as its least and greatest) skip the
entries whose records all lie outside them, from each entry's header, and Spark
evaluates them again; a lower bound of the time also starts each log's plan at
:func:`~pybk.log.timeindex.position_at` that time, so that the segments and entries
before the first record at or after it are not read at all; ``key = b`` and
``key IN (...)`` keep only the rows with one of those keys, exactly, and skip the
entries without keys
(:class:`pybk.spark.arrow.RowFilter`).  PySpark refuses to read through a reader that
implements ``pushFilters`` while that setting is off, so the data source hands out the
filtering reader only to Spark's filter pushdown step (:func:`reader`); without it, the
range options do the same job.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from pyspark.sql.datasource import (
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from pybk.errors import InvalidConfiguration
from pybk.log import position_at
from pybk.log.metadata import list_logs
from pybk.log.position import Position
from pybk.log.ranges import EARLIEST, LATEST, Plan, ReadRange, plan, read_entries, split_ranges
from pybk.spark.arrow import RowFilter, record_batches
from pybk.spark.connect import connect
from pybk.spark.options import PybkOptions

if TYPE_CHECKING:
    from pybk.client import BookKeeper

#: The module of PySpark's planner step that calls ``pushFilters`` (see :func:`reader`).
_PUSHDOWN_WORKER = "pyspark.sql.worker.data_source_pushdown_filters"
_UNBOUNDED = 1 << 63


class RangePartition(InputPartition):
    """One task's range of a segment of a log (plain data: the log's name and a
    :class:`ReadRange`)."""

    def __init__(self, log: str, r: ReadRange) -> None:
        super().__init__((log, r))


@dataclass
class Bounds:
    """What pushed filters allow: segments and entries (in every segment) from ``low``
    (inclusive) to ``high`` (exclusive), and of the records' timestamps and keys
    ``rows``."""

    segment_low: int = 0
    segment_high: int = _UNBOUNDED
    entry_low: int = 0
    entry_high: int = _UNBOUNDED
    rows: RowFilter = field(default_factory=RowFilter)

    def clip(self, r: ReadRange) -> ReadRange | None:
        """``r`` within the bounds, or None if nothing of it is."""
        if not self.segment_low <= r.segment < self.segment_high:
            return None
        if r.first_entry < self.entry_low:
            r = r._replace(first_entry=self.entry_low, first_slot=0)
        if r.last_entry >= self.entry_high:
            r = r._replace(last_entry=self.entry_high - 1, end_slot=None)
        if r.last_entry < r.first_entry:
            return None
        if r.last_entry == r.first_entry and r.end_slot is not None \
                and r.end_slot <= r.first_slot:
            return None
        return r


class BatchReader(DataSourceReader):
    """Reads the log ``opts`` names; see the module docstring."""

    def __init__(self, opts: PybkOptions) -> None:
        self._opts = opts
        self._bounds = Bounds()

    @property
    def bounds(self) -> Bounds:
        """The segments and entries the pushed filters allow (all, without them)."""
        return self._bounds

    def partitions(self) -> Sequence[InputPartition]:
        opts = self._opts
        ranges: list[ReadRange] = []
        log_of: dict[int, str] = {}  # ledger ids are unique: a range's ledger names its log
        with connect(opts) as bk:
            names = find_logs(bk, opts)
            for name in names:
                found = plan_from_start(bk, opts.for_log(name), *self._bounds_of(bk, name))
                for r in filter(None, map(self._bounds.clip, found.ranges)):
                    ranges.append(r)
                    log_of[r.ledger_id] = name
        order = {name: i for i, name in enumerate(names)}
        split = split_ranges(ranges, opts.get("minPartitions") or 1)
        return [RangePartition(log_of[r.ledger_id], r)
                for r in sorted(split, key=lambda r: (order[log_of[r.ledger_id]], r.start))]

    def _bounds_of(self, bk: "BookKeeper", log: str) -> tuple["Position | str",
                                                              "Position | str"]:
        """Where the read of ``log`` starts and ends, by the options and the filters."""
        start = bound_of(bk, self._opts, "starting", log, EARLIEST)
        end = bound_of(bk, self._opts, "ending", log, LATEST)
        if end == EARLIEST:
            raise InvalidConfiguration(f"option endingPosition: earliest for log {log!r}: "
                                       "a batch read ends at latest or at a position "
                                       "(exclusive)")
        bounds = self._bounds
        if bounds.rows.time_low > 0 and (isinstance(start, Position) or start == EARLIEST):
            # No record before the first one at or after the filters' earliest time can
            # pass them (position_at's answer is exact): plan from there, so that the
            # segments and entries before it are never read.
            at = position_at(bk, log, bounds.rows.time_low, self._opts.password)
            start = at if start == EARLIEST else max(Position.parse(str(start)), at)
        if bounds.segment_high != _UNBOUNDED:  # plan no further than the filters allow
            ceiling = Position(bounds.segment_high, 0, 0)
            end = ceiling if end == LATEST else min(Position.parse(str(end)), ceiling)
        return start, end

    def read(self, partition: InputPartition) -> Iterator:
        return read_partition(self._opts, partition, self._bounds.rows)


class FilteringBatchReader(BatchReader):
    """A :class:`BatchReader` that takes Spark's pushed filters (module docstring)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            if not self._narrow(f):
                yield f

    def _narrow(self, f: Filter) -> bool:
        """Narrow the bounds by ``f``; whether ``f`` then holds for every row read."""
        # Not (and any filter Spark adds later without a column) names no attribute.
        attribute: tuple[str, ...] = getattr(f, "attribute", ())
        column = attribute[0] if len(attribute) == 1 else None
        if column == "timestamp":
            self._narrow_time(f)
            return False  # bounds rounded to milliseconds: Spark filters exactly
        if column == "key":
            return self._narrow_keys(f)
        if column not in ("segment", "entry"):
            return False
        if isinstance(f, In):
            values = [v for v in f.value if _whole(v)]
            if values and len(values) == len(f.value):
                self._limit(column, min(values), max(values) + 1)
            return False  # the values between are read too: Spark filters them
        if not isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan,
                              LessThanOrEqual)) or not _whole(f.value):
            return False
        v = f.value
        low, high = {EqualTo: (v, v + 1), GreaterThan: (v + 1, _UNBOUNDED),
                     GreaterThanOrEqual: (v, _UNBOUNDED), LessThan: (0, v),
                     LessThanOrEqual: (0, v + 1)}[type(f)]
        self._limit(column, low, high)
        return True

    def _narrow_time(self, f: Filter) -> None:
        """Narrow the timestamps by ``f``, to whole milliseconds around its bounds."""
        values = getattr(f, "value", ())
        found = [_millis(v) for v in (values if isinstance(f, In) else (values,))]
        millis = [m for m in found if m is not None]
        if not millis or len(millis) != len(found):
            return
        low, high = min(millis), max(millis)  # the floors of the bounds
        if isinstance(f, (EqualTo, In)):
            bounds = (low, high + 1)
        elif isinstance(f, (GreaterThan, GreaterThanOrEqual)):
            bounds = (low, _UNBOUNDED)
        elif isinstance(f, (LessThan, LessThanOrEqual)):
            bounds = (0, high + 1)
        else:
            return
        rows = self._bounds.rows
        self._bounds.rows = dataclasses.replace(
            rows, time_low=max(rows.time_low, bounds[0]),
            time_high=min(rows.time_high, bounds[1]))

    def _narrow_keys(self, f: Filter) -> bool:
        """Keep the rows with the keys ``f`` allows; whether it then holds for every row
        read."""
        if not isinstance(f, (EqualTo, In)):
            return False
        values = f.value if isinstance(f, In) else (f.value,)
        if not values or not all(isinstance(v, (bytes, bytearray)) for v in values):
            return False
        rows = self._bounds.rows
        keys = frozenset(map(bytes, values))
        self._bounds.rows = dataclasses.replace(
            rows, keys=keys if rows.keys is None else rows.keys & keys)
        return True

    def _limit(self, column: str, low: int, high: int) -> None:
        b = self._bounds
        if column == "segment":
            b.segment_low, b.segment_high = max(b.segment_low, low), min(b.segment_high, high)
        else:
            b.entry_low, b.entry_high = max(b.entry_low, low), min(b.entry_high, high)
        if b.segment_high < b.segment_low:
            b.segment_high = b.segment_low
        if b.entry_high < b.entry_low:
            b.entry_high = b.entry_low


def bound_of(bk: "BookKeeper", opts: PybkOptions, bound: str, log: str,
             default: str) -> "Position | str":
    """Where the read of ``log`` starts (``bound`` ``starting``) or ends (``ending``) by
    the options: ``position_at`` the option ``<bound>Timestamp``'s time for that log,
    else the option ``<bound>Position``'s word or position (parse checked that no log
    has both), else ``default``.  NoSuchLog if there is no log ``log``."""
    timestamp = opts.position(f"{bound}Timestamp", log)
    if isinstance(timestamp, int):
        return position_at(bk, log, timestamp, opts.password)
    return str(opts.position(f"{bound}Position", log) or default)


def plan_from_start(bk: "BookKeeper", opts: PybkOptions, start: "Position | str",
                    end: "Position | str") -> Plan:
    """:func:`pybk.log.ranges.plan` from the option ``startingPosition``'s ``start``; a
    start the log cannot have (past its end) raises InvalidConfiguration naming it."""
    try:
        return plan(bk, opts.log, start, end, password=opts.password)
    except ValueError as e:
        raise InvalidConfiguration(f"{opts.describe()}: option startingPosition={start}: "
                                   f"{e}") from None


def find_logs(bk: "BookKeeper", opts: PybkOptions) -> list[str]:
    """The logs a read reads: those its option ``log`` names, or, with ``logPattern``,
    those of the metadata store whose names match it, sorted."""
    if opts.log_pattern is None:
        return list(opts.logs)
    return [name for name in list_logs(bk.metadata) if opts.reads_log(name)]


def read_partition(opts: PybkOptions, partition: InputPartition,
                   rows: RowFilter | None = None) -> Iterator:
    """The rows of a planned range as Arrow record batches (those ``rows`` allows),
    through a client of the task's own, closed when the range is done (or the task stops
    reading)."""
    if partition.value is None:  # PySpark's one partition of a read that planned none
        return
    log, r = partition.value
    with connect(opts) as bk:
        yield from record_batches(log, r, read_entries(bk, r, opts.password),
                                  opts.get("includeHeaders"), rows)


def reader(opts: PybkOptions) -> BatchReader:
    """The reader for ``spark.read``: the filtering one when PySpark's filter pushdown
    step asks (its planner worker is on the stack), else the plain one, which PySpark
    accepts while ``spark.sql.python.filterPushdown.enabled`` is off."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        spec = frame.f_globals.get("__spec__")  # the module's name, also when run as -m
        if _PUSHDOWN_WORKER in (frame.f_globals.get("__name__"), getattr(spec, "name", None)):
            return FilteringBatchReader(opts)
        frame = frame.f_back
    return BatchReader(opts)


def _millis(value: object) -> int | None:
    """A filter's time as milliseconds since the epoch, rounded down (None: not a time
    this source can compare); a time without zone is taken as UTC."""
    if not isinstance(value, datetime.datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    delta = value - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return max(0, math.floor(delta / datetime.timedelta(milliseconds=1)))


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
