"""Planning reads of a log: the entry ranges that hold the records between two positions,
split for parallel readers, and reading one range.

This is what a job that reads a log with many tasks needs (:mod:`pybk.spark` plans on
the driver and reads each range in a task): :func:`plan` looks at the log once and
returns a :class:`Plan`, whose :class:`ReadRange` values are plain data (picklable, a few
integers each); :func:`read_records` (or :func:`read_entries`) reads one of them
anywhere, with a client of its own.

What a plan covers, from ``start`` (inclusive) to ``end`` (exclusive), each ``earliest``,
``latest`` or a :class:`~pybk.log.position.Position`:

* ``earliest`` is the log's first record that truncation left (its ``truncated_before``);
  a start before it is moved up to it (:attr:`Plan.start` says where the plan starts, so
  a caller can tell that records it wanted are gone).
* ``latest`` is the end of what can be read now: a closed segment is read to its last
  entry; the first segment that is not closed (the writer's, or one it is still closing
  after a roll) up to its last add confirmed, which the bookies tell (no fencing, no
  recovery: a live writer is never disturbed); nothing after it.  Entries written past
  that LAC, and segments after an open one, belong to a later plan: this is what keeps
  records in position order, each once, across consecutive plans whose start is the
  previous one's end (a streaming query's micro-batches).
* :attr:`Plan.end` is the position after the last record covered (or ``end`` itself, if
  it is before that): the next plan starts there.

A range is a part of one segment: entries ``first_entry..last_entry`` of its ledger, from
slot ``first_slot`` of the first entry and up to (not including) slot ``end_slot`` of the
last (None: all of it).  With ``min_ranges``, the largest ranges are halved (by entries)
until there are at least that many, or every range is one entry.

Costs: the log's head and one segment record per segment below the head's tail (as a
reader entering a segment), one ledger metadata read per segment, and one LAC read (a
request to each bookie of the last fragment) for an open segment.  No entry is read.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Iterator, NamedTuple

from pybk.errors import NoNode, NoSuchEntry, NoSuchLedger, NoSuchLog, RecordsTruncated
from pybk.log.batch import decode_batch
from pybk.log.metadata import LogMetadata, Segment, find_segment, read_log
from pybk.log.position import Position
from pybk.meta.ledger_metadata import LedgerState

if TYPE_CHECKING:
    from pybk.client import BookKeeper
    from pybk.client.ledger import LedgerHandle

#: The words a plan's start and end take besides a position.
EARLIEST, LATEST = "earliest", "latest"

class ReadRange(NamedTuple):
    """Records of one segment: entries ``first_entry..last_entry`` (inclusive), from slot
    ``first_slot`` of the first one, before slot ``end_slot`` of the last (None: all)."""

    segment: int
    ledger_id: int
    first_entry: int
    last_entry: int
    first_slot: int = 0
    end_slot: int | None = None

    @property
    def entries(self) -> int:
        return self.last_entry - self.first_entry + 1

    @property
    def start(self) -> Position:
        """The position of the range's first record (or where it would be)."""
        return Position(self.segment, self.first_entry, self.first_slot)

    def split(self) -> tuple["ReadRange", "ReadRange"]:
        """The range in two halves by entries (it must have two entries or more)."""
        middle = self.first_entry + self.entries // 2
        return (self._replace(last_entry=middle - 1, end_slot=None),
                self._replace(first_entry=middle, first_slot=0))


class Plan(NamedTuple):
    """The ranges holding the records from ``start`` (inclusive) to ``end``
    (exclusive), in position order (see the module docstring)."""

    start: Position
    end: Position
    ranges: list[ReadRange]


def parse_bound(value: "Position | str", what: str) -> "Position | str":
    """``earliest``, ``latest`` (any case), or a position (its text or a Position);
    ValueError naming ``what`` otherwise."""
    if isinstance(value, str) and value.strip().lower() in (EARLIEST, LATEST):
        return value.strip().lower()
    return Position.of(value, what)


def plan(bk: "BookKeeper", name: str, start: "Position | str" = EARLIEST,
         end: "Position | str" = LATEST, min_ranges: int = 1,
         password: bytes = b"") -> Plan:
    """The ranges of log ``name`` from ``start`` to ``end`` (module docstring).

    Raises NoSuchLog if there is no such log, ValueError for a bound that is none of the
    three forms or a start in a segment the log has not reached yet."""
    start, end = parse_bound(start, "start"), parse_bound(end, "end")
    metadata = _head(bk, name)
    first = metadata.truncated_before
    if isinstance(start, Position):
        if start.segment > metadata.next_segment:
            raise ValueError(f"start {start} is past the end of the log {name!r}: it has no "
                             f"segment {start.segment} (its newest is "
                             f"{metadata.next_segment - 1})")
        first = max(first, start)
    if end == EARLIEST and start != LATEST:
        return Plan(first, first, [])
    if start == LATEST and metadata.tail:
        first = max(first, Position(metadata.tail[0].number, 0, 0))  # the end is there
    ranges: list[ReadRange] = []
    readable_end = first  # the position after the last readable record seen
    number = first.segment
    while (segment := find_segment(bk.metadata, metadata, number)) is not None:
        number = segment.number + 1
        if isinstance(end, Position) and segment.number > end.segment:
            break
        state = _readable(bk, segment, password)
        if state is None:  # truncated or dropped since the head was read
            continue
        last_entry, closed = state
        lower = max(first, Position(segment.number, 0, 0))
        upper = Position(segment.number, last_entry + 1, 0)
        readable_end = Position(segment.number + 1, 0, 0) if closed else max(lower, upper)
        if isinstance(end, Position):
            upper = min(upper, end)
        found = _range(segment, lower, upper)
        if found is not None:
            ranges.append(found)
        if not closed:
            break  # an open segment ends what can be read now (module docstring)
    if start == LATEST:
        return Plan(readable_end, readable_end, [])
    plan_end = max(first, min(end, readable_end) if isinstance(end, Position)
                   else readable_end)
    return Plan(first, plan_end, split_ranges(ranges, min_ranges))


def _range(segment: Segment, lower: Position, upper: Position) -> ReadRange | None:
    """The range of ``segment`` holding the positions from ``lower`` to ``upper``
    (exclusive), both in that segment; None if it holds none."""
    if upper <= lower:
        return None
    if upper.slot == 0:
        return ReadRange(segment.number, segment.ledger_id, lower.entry, upper.entry - 1,
                         lower.slot)
    return ReadRange(segment.number, segment.ledger_id, lower.entry, upper.entry,
                     lower.slot, upper.slot)


def split_ranges(ranges: list[ReadRange], min_ranges: int) -> list[ReadRange]:
    """``ranges`` with the largest halved until there are ``min_ranges`` (or none has
    two entries), still in position order."""
    heap = [(-r.entries, r.start, r) for r in ranges]
    heapq.heapify(heap)
    while len(heap) < min_ranges and heap and -heap[0][0] > 1:
        _, _, largest = heapq.heappop(heap)
        for half in largest.split():
            heapq.heappush(heap, (-half.entries, half.start, half))
    return sorted((r for _, _, r in heap), key=lambda r: r.start)


def read_entries(bk: "BookKeeper", r: ReadRange,
                 password: bytes = b"") -> Iterator[tuple[int, bytes]]:
    """The entries of range ``r`` as ``(entry id, the entry's bytes: a record batch,
    :mod:`pybk.log.batch`)``, in order, read ahead (:meth:`LedgerHandle.read_entries`).
    The caller takes the range's slots of the first and last entries.  Raises
    RecordsTruncated if the segment's ledger (or an entry of it) is gone: truncation
    removed it."""
    try:
        handle = bk.open_ledger(r.ledger_id, password, recovery=False)
        for entry in handle.read_entries(r.first_entry, r.last_entry):
            yield entry.entry_id, entry.data
    except (NoSuchLedger, NoSuchEntry) as e:
        raise RecordsTruncated(f"segment {r.segment} (ledger {r.ledger_id}) is gone from "
                               f"the log: truncated while it was read ({e})") from e


def slots(r: ReadRange, entry_id: int, count: int) -> tuple[int, int]:
    """The slots of entry ``entry_id`` (which holds ``count`` records) that range ``r``
    covers: first, and end (exclusive)."""
    first = r.first_slot if entry_id == r.first_entry else 0
    end = r.end_slot if entry_id == r.last_entry and r.end_slot is not None else count
    return first, min(end, count)


def read_records(bk: "BookKeeper", r: ReadRange,
                 password: bytes = b"") -> Iterator[tuple[Position, bytes]]:
    """The records of range ``r`` with their positions, in order (:func:`read_entries`)."""
    for entry_id, data in read_entries(bk, r, password):
        records = decode_batch(data)
        first, end = slots(r, entry_id, len(records))
        for slot in range(first, end):
            yield Position(r.segment, entry_id, slot), records[slot]


def _head(bk: "BookKeeper", name: str) -> LogMetadata:
    try:
        return read_log(bk.metadata, name).metadata
    except NoNode:
        raise NoSuchLog(f"there is no log named {name!r}") from None


def _readable(bk: "BookKeeper", segment: Segment,
              password: bytes) -> tuple[int, bool] | None:
    """The segment's last readable entry and whether it is closed; None if its ledger is
    gone."""
    try:
        handle: LedgerHandle = bk.open_ledger(segment.ledger_id, password, recovery=False)
    except NoSuchLedger:
        return None
    closed = handle.metadata.state is LedgerState.CLOSED
    return (handle.metadata.closed_last_entry_id() if closed else handle.last_add_confirmed), closed
