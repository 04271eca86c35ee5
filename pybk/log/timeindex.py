"""Positions by time: the first record of a log at or after a timestamp.

:func:`position_at` answers as Kafka's ``offsetsForTimes`` does: the position of the
first record (in position order) whose timestamp is at least the target, or, if there
is none, the log's end (where the next record will be: a reader started there reads
only records appended later).  Timestamps are the callers' (event times): they need not
grow with positions, and the answer is exact whatever their order.  A version 1 record
(written by a pybk before records had timestamps, :mod:`pybk.log.batch`) has none: it
is never at or after a time, and the search passes it.

**What makes the search short.**  Two running maxima, each kept where it is known
when written, so that nothing is ever rewritten:

* *In a ledger* that keeps running maxima (:mod:`pybk.log.batch`, "Maxima"; which
  ledgers do: "Untagged ledgers" below): each entry's header holds the largest
  timestamp of its batch and of every entry before it in the ledger (its writer raises
  it to the previous entry's: ``max_floor``, and says so in the ledger's custom
  metadata).  So the headers never
  decrease with the entry id, and the first entry whose header max is at least the
  target holds the first record at or after it in that ledger: every record before
  that entry is smaller (the header before it says so), and since the entry's own
  max raised the running max to the target, one of its records is at least the
  target.  A bisection over the entry ids finds it: at most ``log2(entries) + 1``
  entry reads, then the entry's records are decoded to find the slot.
* *Across segments* (:mod:`pybk.log.metadata`, "Maxima before"): each segment's
  ``max_before`` (in its record and in the head's tail) is at least the largest
  timestamp of the records of every segment before it, from the first segment that
  has one on.  It never decreases with the segment number, since each is made from the
  one before: a writer that rolls takes its segment's max_before and the largest
  timestamp it sent to the segment; an opening writer or a commit the last tail
  segment's max_before and that segment's largest timestamp (recovery just closed it),
  then for a commit each of its ledgers' in turn (:func:`segment_max`: the last header
  of a ledger that keeps running maxima, one read; else its largest header, below).
  A bisection over the segment numbers (:func:`~pybk.log.metadata.find_segment` for
  each) finds the last segment whose max_before is below the target: every record
  before it is below the target, so the answer is in that segment or after it.

**The search**, from the head as read once: (1) the segments whose max_before is
unknown (None: their records were written by a pybk before this index, always a run
of the oldest live segments) are searched first, entry by entry, as their headers hold
each batch's own max only; (2) among the others, the bisection over numbers gives the
segment ``k`` to start from (the first of them if none is below the target); (3) ``k``'s
entries are bisected (if its ledger keeps running maxima; else read one by one) from
the first one a reader may read (truncated_before's, in its segment) to its last
readable one (a closed segment's last entry; the writer's LAC for an open one); if none
is at or after the target, the next segment is searched the same way, and so on to the
end of the log.
An open segment that a later one follows (a roll is closing it, or its writer died while
rolling) ends the search: entries past its last add confirmed may still be acknowledged,
or kept by the recovery that closes it, and a reader goes past it only once it is closed
(:mod:`pybk.log.reader`), so the answer is the end of its readable entries (a reader from
there gets its later entries first).

**Why it is exact.**  Every value the search trusts is an upper bound of what it
stands for: a header max is at least its batch's timestamps and the ledger's earlier
ones; a max_before is at least the timestamps of the segments before it, since a
writer counts each batch when it sends it (a batch whose add then failed only makes
the bound larger) and an opener or committer reads the header of the last entry the
ledger closed with.  Upper bounds never make the search skip a record at or after the
target: they can only make it start early, and step (3) goes on forward until it finds
one.  A bound is also *tight* (the maximum itself) for every segment whose writer did
not die with adds in flight and for every entry, so step (3) reads one segment, two at
most, in a log where no writer died while rolling.

**What it costs**, in a log of ``S`` segment numbers from truncated_before's and ``E``
entries per segment: ``log2(S) + 1`` segment lookups (each one record read, and the
head's tail is read from the head; a lookup that lands on a dead record follows it to
its skip_to; one that lands inside a run of dead numbers, which has a record at its
first number only (a hollow run: demotion's jump of 2**32, a format-1 conversion's gaps),
finds that first number by a bisection between the segment before and it, ``log2`` of
the run's length, after which the bisection over numbers has left the run behind, so a
run is paid for once; find_segment itself would walk every record from
truncated_before's segment there) and ``log2(E) + 2`` entry reads (and one ledger
open) for the segment found, plus one more ledger's worth per segment step (3) goes on
to.  Not bounded, and documented as such: the segments of step (1), read entry by entry
(a log upgraded from an older pybk until truncation removes them); and records that
truncation removed still count in the maxima of the entries and segments after them,
so after a truncation that removed records at or after the target, step (3) may step
through the live records before the answer (at worst the whole log); and the untagged
ledgers below.

**Untagged ledgers.**  A ledger's header maxima are trusted to be running maxima only
where :func:`~pybk.log.batch.keeps_running_maxima` says so, the one rule every step
above and :func:`segment_max` follow: a ledger tagged so by its creator (every pybk
writer of batches tags its ledgers, :func:`~pybk.log.writer.batch_ledger_metadata`, a log
writer's segments and a Spark task's ledgers alike); and a log writer's segment whose
max_before is known, which a pybk before the tag wrote untagged: its LogWriter kept
running maxima already, since they came in with max_before, which an older writer's
segments never have (a log upgraded from it costs what a tagged one does).  Not
trusted: a Spark task's ledger from an executor of a pybk before the tag (its headers
held each batch's own max; the job id in its custom metadata tells it from a log
writer's segment), and a ledger without the log's name in its custom metadata (another
writer's, appended by a caller of :func:`~pybk.log.commit.commit_job`).  (A log writer's
segment whose max_before is unknown is not trusted either, but costs nothing more: step
(1) reads it entry by entry anyway, and a takeover after it gives the next segment
NO_TIMESTAMP without reading it.)  A ledger not trusted costs, where its largest
timestamp is needed (the commit that appends it, if another of its ledgers follows it;
each opener or commit while it ends the tail, which the first segment written after it
ends; once for all the rounds of one that loses races): one read of all its entries
instead of its last one (:func:`segment_max`); and each search that reaches its segment
in step (3) reads its entries one by one, up to the answer, instead of ``log2(E) + 2``.
Its segment's max_before, and those after it, are as tight as a trusted one's.  Why not
leave its largest timestamp unknown, which costs nothing at the commit: max_before
cannot be unknown past the oldest segments (:mod:`pybk.log.metadata`, "Maxima before"),
since a max_before after the unknown one would bound only the segments from there, and
the bisection over numbers, which takes max_before to grow with the number, could land
past the ledger and skip its records; making every later max_before unknown instead
would make every search read the log from there, entry by entry, until truncation
removed the ledger.  The reads are bounded by the ledger's size (``segmentMaxBytes``
and one batch, for the writers that roll by it), and only a log that a job of executors
of a pybk before the tag wrote to (or a caller's own ledgers) has such ledgers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, Protocol

from pybk.errors import NoNode, NoSuchEntry, NoSuchLedger, NoSuchLog
from pybk.log.batch import batch_time_range, decode_fields, keeps_running_maxima
from pybk.log.metadata import (
    NO_TIMESTAMP,
    LogMetadata,
    Segment,
    find_segment,
    next_max_before,
    read_log,
    read_segment,
)
from pybk.log.position import Position
from pybk.meta.ledger_metadata import LedgerState

if TYPE_CHECKING:
    from pybk.client import BookKeeper
    from pybk.client.ledger import LedgerEntry, LedgerHandle


class Writer(Protocol):
    """What a search asks the log's writer in its own process (a
    :class:`~pybk.log.writer.LogWriter`, which imports this module)."""

    def ledger_for(self, ledger_id: int) -> "LedgerHandle | None": ...


def position_at(bk: "BookKeeper", name: str, timestamp: int, password: bytes = b"",
                writer: "Writer | None" = None) -> Position:
    """The position of the first record of log ``name`` whose timestamp is at least
    ``timestamp`` (milliseconds since the epoch), or the log's end if none is (see the
    module docstring); ``writer``: the log's writer, in its own process (its open
    segment is read up to its last acknowledged entry).  NoSuchLog if there is no such
    log; TypeError if ``timestamp`` is not an int."""
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise TypeError(f"a time to look for is an int of milliseconds since the epoch, "
                        f"not {type(timestamp).__name__} ({timestamp!r})")
    try:
        head = read_log(bk.metadata, name).metadata
    except NoNode:
        raise NoSuchLog(f"there is no log named {name!r}") from None
    search = _Search(bk, head, timestamp, password, writer)
    # (1): the unindexed segments, entry by entry; then (2) the bisection over numbers
    # and (3) the indexed segments from there, by bisection over entries.
    reached = search.scan(search.segment(head.truncated_before.segment), bisect=False)
    if isinstance(reached, Segment):
        reached = search.scan(search.start_segment(reached), bisect=True)
    return reached if isinstance(reached, Position) else search.end


class _Search:
    """One search by time over the log as of ``head`` (see the module docstring)."""

    def __init__(self, bk: "BookKeeper", head: LogMetadata, target: int, password: bytes,
                 writer: "Writer | None") -> None:
        self._bk, self._head, self._target = bk, head, target
        self._password, self._writer = password, writer
        #: Where the next record will be, as far as the segments searched tell: after
        #: the last readable entry of the last segment searched.
        tail = head.tail[-1].number if head.tail else head.next_segment
        self.end = max(Position(tail, 0, 0), head.truncated_before)
        #: The end of the readable entries of the segment just searched if it is open.
        self._open_end: Position | None = None
        #: Where the search stopped at an open segment that a later one follows.
        self.stopped: Position | None = None

    def segment(self, number: int) -> Segment | None:
        return find_segment(self._bk.metadata, self._head, number)

    def scan(self, segment: Segment | None, bisect: bool) -> "Segment | Position | None":
        """Search ``segment`` and those after it in turn (by bisection over entries if
        ``bisect``), up to the first segment with a known max_before when not
        ``bisect``: the position found (or where the search stopped), else that segment,
        or None at the log's end."""
        while segment is not None and (bisect or segment.max_before is None):
            found = self.in_segment(segment, bisect=bisect)
            if found is not None:
                return found
            segment = self.after(segment)
            if self.stopped is not None:
                return self.stopped
        return segment

    def after(self, segment: Segment) -> Segment | None:
        """The segment after ``segment``, which the search just left without finding
        the target.  If ``segment`` was open (not closed) and a later one follows it (a
        roll is closing it, or its writer died while rolling), the search stops instead
        (``self.stopped``: where its readable entries end): entries past its last add
        confirmed may still be acknowledged or recovered, and a reader waits for its
        close before it goes on (:mod:`pybk.log.reader`), so no answer past it would be
        the first record at or after the target."""
        following = self.segment(segment.number + 1)
        if following is not None and self._open_end is not None:
            self.stopped = self._open_end
        return following

    def start_segment(self, first: Segment) -> Segment:
        """The last segment from ``first`` on whose max_before is below the target, or
        ``first`` if none is: a bisection over the numbers, keeping every segment
        numbered from ``high`` on at or after the target."""
        assert first.max_before is not None  # the caller passed the unindexed ones
        if first.max_before >= self._target:
            return first
        best, low, high = first, first.number + 1, self._head.next_segment
        while low < high:
            middle = (low + high) // 2
            found, gap = self._probe(best, middle)
            if found is None or found.number >= high:
                high = gap
            elif found.max_before is not None and found.max_before < self._target:
                best, low = found, found.number + 1
            else:
                high = gap  # none from gap to found.number, found is at or after
        return best

    def _probe(self, best: Segment, middle: int) -> tuple[Segment | None, int]:
        """A segment of the bisection's range, from ``best`` (exclusive) on: the first
        one numbered ``gap`` or more, and ``gap`` (from ``best.number + 1`` to
        ``middle``).  A number with no record lies inside a run of dead numbers, and
        find_segment would walk the records from truncated_before's segment to it (one
        read per segment before it); instead the run's first number, whose dead record
        says where the run ends, is found by a bisection between ``best`` and
        ``middle`` (a number with a record whose next one has none): a run costs
        ``log2`` of its length, and the bisection over numbers leaves it behind."""
        store, name = self._bk.metadata, self._head.name
        end = self._head.tail[0].number if self._head.tail else self._head.next_segment
        if middle >= end or self._head.format_version == 1:
            return self.segment(middle), middle  # the head says
        record = read_segment(store, name, middle)
        if record is not None:
            if record.ledger_id is not None:
                return Segment(middle, record.ledger_id, record.max_before), middle
            return self.segment(middle), middle  # a dead record: at its skip_to
        low, high = best.number, middle  # low has a record, high has none
        while high - low > 1:
            number = (low + high) // 2
            if read_segment(store, name, number) is None:
                high = number
            else:
                low = number
        if low == best.number:  # none between (a record being written, a truncation)
            return self.segment(middle), middle
        return self.segment(low), low

    def in_segment(self, segment: Segment, bisect: bool) -> Position | None:
        """The first record at or after the target in ``segment``, from the first
        position a reader may read; None if it holds none (``self.end`` then moves past
        it).  ``bisect``: its entries are bisected if its ledger keeps running maxima
        (:func:`~pybk.log.batch.keeps_running_maxima`; read entry by entry otherwise)."""
        self._open_end = None
        try:
            return self._in_ledger(segment, bisect)
        except (NoSuchLedger, NoSuchEntry):
            if self._listed(segment):
                raise
            return None  # truncated away since the head was read: what is left is later

    def _in_ledger(self, segment: Segment, bisect: bool) -> Position | None:
        handle = self._open(segment)
        last = self._last_readable(handle)
        truncated = self._head.truncated_before
        start = truncated if truncated.segment == segment.number else \
            Position(segment.number, 0, 0)
        readable_end = Position(segment.number, max(last + 1, start.entry), 0)
        self.end = max(self.end, readable_end)
        if handle.metadata.state is not LedgerState.CLOSED:
            self._open_end = readable_end
        first = start.entry
        if first > last:
            return None

        def top(entry_id: int) -> int:
            found = batch_time_range(handle.read_entry(entry_id).data)
            return NO_TIMESTAMP if found is None else found[1]

        bisect = bisect and keeps_running_maxima(handle.metadata.custom_metadata,
                                                 segment.max_before)
        begin = _first_at_least(first, last, top, self._target) if bisect else first
        for entry in _entries(handle, begin, last):
            found = batch_time_range(entry.data)
            if found is None or found[1] < self._target:
                continue
            fields = decode_fields(entry.data)
            low_slot = start.slot if entry.entry_id == start.entry else 0
            for slot in range(low_slot, len(fields.timestamps)):
                stamp = fields.timestamps[slot]
                if stamp is not None and stamp >= self._target:
                    return Position(segment.number, entry.entry_id, slot)
        return None

    def _open(self, segment: Segment) -> "LedgerHandle":
        own = self._writer.ledger_for(segment.ledger_id) if self._writer is not None \
            else None
        if own is not None:
            return own
        return self._bk.open_ledger(segment.ledger_id, self._password, recovery=False)

    def _listed(self, segment: Segment) -> bool:
        """Whether ``segment`` is still in the log, as its head says now."""
        now = read_log(self._bk.metadata, self._head.name).metadata
        return find_segment(self._bk.metadata, now, segment.number) == segment

    def _last_readable(self, handle: "LedgerHandle") -> int:
        if handle.metadata.state is LedgerState.CLOSED:
            return handle.metadata.closed_last_entry_id()
        if self._writer is not None and handle is self._writer.ledger_for(handle.id):
            return handle.last_add_confirmed
        return handle.read_last_add_confirmed()


def _entries(handle: "LedgerHandle", first: int, last: int) -> Iterator["LedgerEntry"]:
    """Entries ``first..last``: the first alone (the entry a bisection found holds the
    record), then read ahead (a forward scan: unindexed, or a bound that was not tight)."""
    yield handle.read_entry(first)
    if first < last:
        yield from handle.read_entries(first + 1, last)


def _first_at_least(first: int, last: int, top: Callable[[int], int], target: int) -> int:
    """The first entry id from ``first`` to ``last`` whose ``top`` (never decreasing) is at
    least ``target``; ``last`` if none is (the caller decodes it and finds none)."""
    low, high = first, last
    while low < high:
        middle = (low + high) // 2
        if top(middle) >= target:
            high = middle
        else:
            low = middle + 1
    return low


# -- keeping max_before ------------------------------------------------------------------


def segment_max(bk: "BookKeeper", ledger_id: int, password: bytes = b"",
                max_before: int | None = None) -> int | None:
    """An upper bound of the timestamps of closed ledger ``ledger_id``'s records (the
    largest one, unless a batch's add failed after its header was counted): the header
    max of its last entry if its header maxima are running maxima
    (:func:`~pybk.log.batch.keeps_running_maxima`, given the max_before of the segment
    it is, ``max_before``, None if it is no segment: one entry read), else the largest
    header max of all its entries (one read of the whole ledger, whose last header may
    hold its own batch's max only: see the module docstring, "Untagged ledgers").  None
    if it has no entry, or no timestamp (version 1)."""
    return _segment_max(bk, ledger_id, password, max_before)[0]


def _segment_max(bk: "BookKeeper", ledger_id: int, password: bytes,
                 max_before: int | None) -> tuple[int | None, bool]:
    """:func:`segment_max`, and whether the ledger was closed (its value final)."""
    handle = bk.open_ledger(ledger_id, password, recovery=False)
    try:
        closed = handle.metadata.state is LedgerState.CLOSED
        last = handle.metadata.closed_last_entry_id() if closed \
            else handle.read_last_add_confirmed()
        if last < 0:
            return None, closed
        running = keeps_running_maxima(handle.metadata.custom_metadata, max_before)
        first = last if running else 0
        ranges = map(batch_time_range, (e.data for e in handle.read_entries(first, last)))
        return max((found[1] for found in ranges if found is not None), default=None), closed
    finally:
        handle.close()


def max_before_next(bk: "BookKeeper", taken: LogMetadata, password: bytes,
                    known: dict[int, int | None] | None = None) -> int:
    """The max_before of the segment that comes after ``taken``'s tail (a takeover's
    head: its last tail segment was recovered, so it is closed).  One ledger open and
    :func:`segment_max`'s reads (one entry if the ledger keeps running maxima, all of
    them if not);
    none if the tail is empty (the log has no live record) or its last segment's
    max_before is unknown (the index starts with the next segment).  ``known``: the
    values of closed ledgers read before by the caller, by ledger id, filled in here, so
    that a caller that takes the log over again after a lost race (an opening writer, a
    commit: up to OPEN_ATTEMPTS_MAX rounds) reads a ledger not trusted once."""
    last = taken.tail[-1] if taken.tail else None
    if last is None or last.max_before is None:
        return NO_TIMESTAMP
    if known is not None and last.ledger_id in known:
        return next_max_before(last, known[last.ledger_id])
    found, closed = _segment_max(bk, last.ledger_id, password, last.max_before)
    if known is not None and closed:
        known[last.ledger_id] = found
    return next_max_before(last, found)
