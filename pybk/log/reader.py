"""Reading a log from a position, to its end or tailing it.

A reader walks the log's segments in order.  A closed segment is read to its last
entry; the open one (the writer's) up to its last add confirmed, which the reader learns
from the bookies (or, in the writer's own process, from the writer).  Bookies learn the
LAC from the next entry or, once the writer is idle, from its explicit LAC
(``explicitLacInterval``): in another process the newest record shows up that late.  A reader never
disturbs the writer: it opens ledgers without recovery.  It moves to the next segment
only once the current one is closed (or, for a reader told that no writer can add any
more, ``writerless``, once it read an open segment to its LAC and a later one exists),
so it sees records in position order, each once.

What it gives: :meth:`LogReader.read`, :meth:`~LogReader.read_next` and
:meth:`~LogReader.tail` give ``(position, value)`` pairs; :meth:`~LogReader.records`,
:meth:`~LogReader.next_record` and :meth:`~LogReader.tail_records` give the same records
as :class:`~pybk.log.record.Record` values, with their keys, timestamps and headers.
Both kinds may be mixed on one reader: they go on from the same position.

If truncation removes the segment a reader is in, it goes on at the truncation point.
The next segment is found in the log's head or, below the head's tail, in one segment
record (:func:`pybk.log.metadata.find_segment`): entering a segment costs the same
however many segments the log has.

The start may be a :class:`Position`, its text or three integers.  A start past the end
of the log raises ValueError at the first read: in a segment the log has not reached yet,
or (read in the writer's process, which knows the last acknowledged entry) beyond the
entry after the last acknowledged one.  Reading from where the next record will go is not
past the end (in a log with no segment yet, the start of its next segment): it gives
nothing until a record is appended.  Once the client the reader
reads through is closed (or the WAL it came from), every read raises LogClosed.

Entries are read ahead: a reader asks for every entry from its position to the last
readable one at once (:meth:`LedgerHandle.read_entries`: many entries per request,
several requests in flight) and takes them one by one while it goes on from where it
left off, so catching up costs a round trip per batch of entries, not per entry.
:meth:`LogReader.read` starts a new read ahead (it reads the log as it is now, so it
sees a truncation at once); ``read_next`` and ``tail`` go on with the current one, so
records already read ahead (at most a read-ahead window of entries) may still come after
a truncation passed them.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Iterator

from pybk.errors import LogClosed, NoNode, NoSuchEntry, NoSuchLedger, NoSuchLog
from pybk.log.metadata import LogMetadata, Segment, find_segment, log_path
from pybk.log.position import START, Position
from pybk.log.record import PositionedValue, Record, batch_records, position_and_value
from pybk.meta.ledger_metadata import LedgerState

if TYPE_CHECKING:
    from pybk.client import BookKeeper
    from pybk.client.ledger import LedgerEntry, LedgerHandle
    from pybk.log.writer import LogWriter

_POLL_MIN_S = 0.0005
_POLL_MAX_S = 0.01


class LogReader:
    """Records of log ``name`` from ``start`` (the beginning when None), in order."""

    def __init__(self, bk: "BookKeeper", name: str, start: Position | str | None = None,
                 password: bytes = b"", writer: "LogWriter | None" = None,
                 writerless: "Callable[[], bool] | None" = None) -> None:
        """``writerless``, if given, says whether no writer can add to the log any more
        (a read-only WAL's owner is not running): an open segment that a later one
        follows (its writer died while rolling) is then read to its LAC and left, as
        the next writer's recovery will close it."""
        self._bk = bk
        self.name = name
        self._password = password
        self._writer = writer
        self._writerless = writerless
        self._next = Position.of(start, "start") if start is not None else START
        self._start_checked = False
        self._segment: Segment | None = None
        self._handle: LedgerHandle | None = None
        self._pending: list[Record] = []
        # The read ahead in the current segment: its handle, the next entry id it gives,
        # the last one it reads, and its entries.
        self._ahead: tuple[LedgerHandle, int, int, Iterator[LedgerEntry]] | None = None
        self._head: tuple[bytes, LogMetadata] | None = None  # the last head read, parsed

    @property
    def position(self) -> Position:
        """Where the next record will be read from (at or before the next record's own
        position: positions have gaps)."""
        return self._pending[0][0] if self._pending else self._next

    def read(self) -> Iterator[PositionedValue]:
        """``(position, value)`` of every record from the current position to the end
        of the log as it is now.

        A start past the end raises ValueError here, not at the first record."""
        return map(position_and_value, self.records())

    def records(self) -> Iterator[Record]:
        """What :meth:`read` gives, as :class:`~pybk.log.record.Record` values."""
        self._check_start()
        self._ahead = None  # read the log as it is now (see the module docstring)
        return self._records()

    def _records(self) -> Iterator[Record]:
        while True:
            batch = self._fetch()
            if not batch:
                return
            yield from batch

    def read_next(self, timeout: float, poll_interval: float = _POLL_MAX_S
                  ) -> PositionedValue | None:
        """``(position, value)`` of the next record (see :meth:`next_record`)."""
        record = self.next_record(timeout, poll_interval)
        return None if record is None else position_and_value(record)

    def next_record(self, timeout: float, poll_interval: float = _POLL_MAX_S
                    ) -> Record | None:
        """The next record, waiting up to ``timeout`` seconds for one to be appended
        (None if none was).  While it waits it looks again after 0.5 ms, then at
        doubling intervals up to ``poll_interval`` seconds (each look from another
        process, :mod:`pybk.log.readonly`, reads the owner's newest files)."""
        self._check_start()
        deadline = time.monotonic() + timeout
        pause = min(_POLL_MIN_S, poll_interval)
        while True:
            if not self._pending:
                self._pending = self._fetch()
            if self._pending:
                return self._pending.pop(0)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, poll_interval)

    def tail(self, idle_timeout: float, poll_interval: float = _POLL_MAX_S
             ) -> Iterator[PositionedValue]:
        """``(position, value)`` of records as they are appended (see
        :meth:`tail_records`)."""
        return map(position_and_value, self.tail_records(idle_timeout, poll_interval))

    def tail_records(self, idle_timeout: float, poll_interval: float = _POLL_MAX_S
                     ) -> Iterator[Record]:
        """Records as they are appended, until none came for ``idle_timeout`` seconds
        (``math.inf``: for ever), looking for new ones as :meth:`next_record` does."""
        while True:
            record = self.next_record(idle_timeout, poll_interval)
            if record is None:
                return
            yield record

    # -- checks -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._bk.closed:
            raise LogClosed(f"log {self.name!r} cannot be read: the client this reader "
                            "reads through (or the WAL it came from) is closed")

    def _check_start(self) -> None:
        """Refuse a start past the end of the log (see the module docstring), once."""
        self._check_open()
        if self._start_checked:
            return
        start, metadata = self._next, self._log_metadata()
        # In a log with no segment (made by a job that wrote nothing, say), the first
        # record will go at the start of the next segment: not past the end.
        first_to_come = not metadata.tail and start == Position(metadata.next_segment, 0, 0)
        if start.segment >= metadata.next_segment and not first_to_come:
            raise ValueError(f"start {start} is past the end of the log {self.name!r}: it "
                             f"has no segment {start.segment} yet (its newest is "
                             f"{metadata.next_segment - 1})")
        current = metadata.tail[-1] if metadata.tail else None
        if current is not None and self._writer is not None:
            own = self._writer.ledger_for(current.ledger_id)
            if own is not None and start.segment == current.number \
                    and start.entry > own.last_add_confirmed + 1:
                raise ValueError(f"start {start} is past the end of the log {self.name!r}: "
                                 f"the next record goes at {current.number}:"
                                 f"{own.last_add_confirmed + 1}:0 or later")
        self._start_checked = True

    # -- walking the segments ---------------------------------------------------------

    def _fetch(self) -> list[Record]:
        """The records of the next entry at or after the position, or [] at the end."""
        self._check_open()
        if self._pending:
            pending, self._pending = self._pending, []
            return pending
        while True:
            if self._handle is None and not self._enter_segment():
                return []
            handle, segment = self._handle, self._segment
            assert handle is not None and segment is not None  # _enter_segment() set them
            entry_id = self._next.entry
            limit = self._readable_limit(handle)
            if entry_id <= limit:
                try:
                    entry = self._read_ahead(handle, entry_id, limit)
                except (NoSuchLedger, NoSuchEntry):
                    if self._segment_still_listed():
                        raise
                    self._handle = None  # truncated away while reading: go on after it
                    continue
                first_slot = self._next.slot
                self._next = Position(segment.number, entry_id + 1, 0)
                found = batch_records(segment.number, entry_id, entry.data, first_slot)
                if found:
                    return found
                continue
            refreshed = self._refreshed(handle)
            if refreshed is None:
                self._handle = None  # truncated away: go on after it
            elif refreshed.metadata.state is not LedgerState.CLOSED:
                if self._writer is not None and self._writer.is_closing(handle.id):
                    time.sleep(_POLL_MIN_S)  # rolled away from: closed once drained
                    continue
                if self._writerless is not None and self._writerless():
                    # No writer can add to it: its LAC, asked now, is where recovery will
                    # close it (asked again after the LAC: an owner that came back will
                    # close it itself, and the reader goes on then).
                    end = handle.read_last_add_confirmed()
                    if not self._writerless():
                        return []
                    if entry_id <= end:
                        continue
                    if find_segment(self._bk.metadata, self._log_metadata(),
                                    segment.number + 1) is not None:
                        self._handle = None  # left open by a roll its writer died in
                        self._next = Position(segment.number + 1, 0, 0)
                        continue
                return []  # the end of the log, for now
            elif entry_id <= refreshed.metadata.closed_last_entry_id():
                self._handle = refreshed  # closed since opened, with entries still to read
            else:
                self._handle = None
                self._next = Position(segment.number + 1, 0, 0)

    def _read_ahead(self, handle: "LedgerHandle", entry_id: int,
                    limit: int) -> "LedgerEntry":
        """Entry ``entry_id`` (at most ``limit``, the last readable one) of ``handle``,
        from the read ahead if it goes on there, else from a new one to ``limit``."""
        ahead = self._ahead
        if ahead is None or ahead[0] is not handle or ahead[1] != entry_id:
            ahead = (handle, entry_id, limit, handle.read_entries(entry_id, limit))
        self._ahead = None  # until the entry was read: a read that raised is not resumed
        entry = next(ahead[3])
        if entry_id < ahead[2]:
            self._ahead = (handle, entry_id + 1, ahead[2], ahead[3])
        return entry

    def _enter_segment(self) -> bool:
        """Open the first segment at or after the position; False if there is none."""
        while True:
            metadata = self._log_metadata()
            if self._next < metadata.truncated_before:
                self._next = metadata.truncated_before
            segment = find_segment(self._bk.metadata, metadata, self._next.segment)
            if segment is None:
                return False
            if segment.number > self._next.segment:
                self._next = Position(segment.number, 0, 0)
            self._segment = segment
            try:
                self._handle = self._open_ledger(segment.ledger_id)
            except NoSuchLedger:
                if self._segment_still_listed():
                    raise
                continue  # truncated or dropped since the head was read: the next one
            return True

    def _open_ledger(self, ledger_id: int) -> "LedgerHandle":
        own = self._writer.ledger_for(ledger_id) if self._writer is not None else None
        if own is not None:
            return own
        return self._bk.open_ledger(ledger_id, self._password, recovery=False)

    def _readable_limit(self, handle: "LedgerHandle") -> int:
        if handle.metadata.state is LedgerState.CLOSED:
            return handle.metadata.closed_last_entry_id()
        if self._writer is not None and handle is self._writer.ledger_for(handle.id):
            return handle.last_add_confirmed
        if handle.last_add_confirmed >= self._next.entry:
            return handle.last_add_confirmed
        return handle.read_last_add_confirmed()

    def _refreshed(self, handle: "LedgerHandle") -> "LedgerHandle | None":
        """The segment's handle as the metadata store knows it now: reopened if the
        ledger was closed since it was opened; None if truncation removed it."""
        if handle.metadata.state is LedgerState.CLOSED:
            return handle
        try:
            current = self._bk.ledger_manager.read(handle.id).metadata
        except NoSuchLedger:
            if self._segment_still_listed():
                raise
            return None
        if current.state is not LedgerState.CLOSED:
            return handle
        return self._bk.open_ledger(handle.id, self._password, recovery=False)

    def _segment_still_listed(self) -> bool:
        segment = self._segment
        assert segment is not None, "not in a segment"
        return find_segment(self._bk.metadata, self._log_metadata(), segment.number) == segment

    def _log_metadata(self) -> LogMetadata:
        """The log's head as it is now.  Read at every segment entered, so that a
        truncation is seen at once; parsed again only when its bytes changed (parsing it
        took a fifth of the time of a read across a long run of empty segments)."""
        try:
            data, _version = self._bk.metadata.get(log_path(self.name))
        except NoNode:
            raise NoSuchLog(f"there is no log named {self.name!r}") from None
        if self._head is None or data != self._head[0]:
            self._head = (data, LogMetadata.from_bytes(data))
        return self._head[1]
