"""The writer of a log: batching, rolling, truncation, and taking over from a writer.

Opening (docs/DESIGN.md, "Logs from ledgers"): read the log's head, finish what a writer
that died left undone (:mod:`pybk.log.metadata`: dropped segments, a truncation, segment
records), fence and recover its last two segments (the last one may still have a writer;
the one before may still be closing after a roll), create a new ledger, and
compare-and-set the head with it appended.  No append is served before that succeeds.
A writer that lost the race, or that another writer opened after, finds out at its next
add (its ledger is fenced: :class:`~pybk.errors.LogFenced`) or at its next change of the
head (the compare-and-set fails).  Segments that recovery found empty are dropped from
the log on the way (but never the tail's first: see :mod:`pybk.log.metadata`).  A job's
commit (:mod:`pybk.log.commit`) takes the log over the same way (:func:`take_over`), so
it fences a live writer as an opening writer does; an orphan cleaner's change of the
head's job lists does not.

Lost answers: a CAS of the head can land and its answer be lost (the ZooKeeper store's
retry after a connection loss finds the head moved on and answers BadVersion; or
MetadataUnavailable).  So after either answer the writer reads the head again and tells
from it whether its CAS landed, before it deletes or gives up anything:

* An opening writer's CAS landed, and the log is still its own, exactly when the head is
  the one it wrote, changed since in job bookkeeping and truncation's progress only
  (:meth:`~pybk.log.metadata.LogMetadata.same_owner`: its new ledger, which no other CAS
  names, is the tail's last, with the epoch its CAS gave): it goes on as the writer.
* Otherwise the head and the segment records tell who has the number its CAS gave its
  new ledger (``_added``).  Nobody (``next_segment`` is not past it) or another ledger:
  the CAS did not land, and the ledger is deleted.  That ledger: the CAS landed before
  another writer or a commit took the log over, and the ledger is a segment of the log,
  closed and left to whoever drops it or truncates it away.  Nothing says any more (the
  number was dropped or truncated away since): closed and left too (a ledger no head
  names wastes space; a deleted segment breaks the log for good), and so is one
  whose CAS answered MetadataUnavailable while the head is still at the version that
  CAS expects (it may still land).  Then the opener tries
  again, unless the answer was MetadataUnavailable and the CAS did not land: the open
  fails with it.
* A roll or a truncation whose CAS got either answer is done if the head says what its
  CAS said (``_holds``), and otherwise goes on as after that answer (BadVersion: made
  again on a head changed in job bookkeeping only, else LogFenced); a roll that fails
  gives its new ledger up as an opener does.
* If the head cannot be read either, MetadataUnavailable: an open says its outcome is
  unknown and leaves its ledger (the next opener recovers it if the log has it), a roll
  stops the writer, and after a truncation the writer's next change of the head tells
  first (``_refresh_head``).  A CAS answered MetadataUnavailable that the head does not
  show might still land, if the store had it in flight: a truncation's is told at the
  next change of the head the same way; an open's or a roll's ledger was left, closed
  and empty, so the tail's last segment is then that empty ledger, which readers pass
  and the next writer or commit to take the log over drops.

Batching: appends go into the current batch.  While fewer than ``maxOutstandingBatches``
batches are in flight a batch goes out at once (a lone append waits for one fsync, not
for company); otherwise records gather until a batch completes and then go out together
as one entry (under load, one entry carries many records).  A batch also goes out when
it reaches ``batchMaxBytes``.  Batches are sent in order by whichever thread holds the
"sender" role, so a completion callback on the bookie's journal thread never waits for a
lock held by a thread that waits for the journal.

Rolling: once the batches sent to a segment reach ``segmentMaxBytes``, or a send finds it
older than ``segmentMaxAgeSeconds``, the segment takes no more batches: later ones wait
while a background thread creates the next ledger, appends it to the head
(compare-and-set), writes its segment record and switches to it, then sends them there;
it closes the previous ledger once its batches completed.  So a segment ends at most one
batch past ``segmentMaxBytes``, however fast appends come and however long the roll
takes.  The new segment's max_before (:mod:`pybk.log.metadata`, "Maxima before") is the
old one's raised to the largest timestamp sent to the old segment, final once the roll
starts since no batch goes to a segment due to roll; an opening writer makes its
segment's from the last segment it recovered (:func:`~pybk.log.timeindex.max_before_next`).
Each batch's max timestamp is raised to the segment's running maximum, under the lock
that orders the sends, so a ledger's header maxima never decrease (:mod:`pybk.log.batch`),
and the writer tags its ledgers so (:func:`batch_ledger_metadata`).
A roll costs the same whatever the number of segments: one head of a few hundred bytes
and one segment record are written.

Deferred sync (``deferredSync``): an append returns once its record is written on Qa
bookies (it survives this process and the bookies' processes dying, not a power cut);
:meth:`LogWriter.sync` forces every segment that holds records appended before it, and
returns only once all of them are durable, or raises.  A ledger closes at its durable
LAC, so a segment is closed (by a roll, or by :meth:`LogWriter.close`) only once a force
covered every entry it acknowledged: the force is retried (``FORCE_ATTEMPTS_MAX``), and a
segment that still cannot be forced is left open and the writer stops with an error that
says so (later appends and ``sync()`` raise it).  The next writer to open the log
recovers that segment with every record its bookies hold, so no record whose append
returned is lost to a failed force.  (A bookie that fails an *add* of a deferred segment
closes it at its durable LAC, BookKeeper's rule, :mod:`pybk.client.deferred`: the records
appended since the last ``sync()`` that returned may then be lost, and the writer stops.)

Truncation deletes whole segments before a position, but never past the slowest
consumer's committed position (:mod:`pybk.log.consumers`): the head is updated first,
then the ledgers and segment records are deleted, then the head notes how far that got
(also as it deletes the record of a hollow run: :mod:`pybk.log.metadata`).  A writer
opening the log, or truncating again, finishes deletions a crash interrupted.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from time import time_ns
from typing import TYPE_CHECKING, Iterable, Mapping

from pybk.client.deferred import WriteFlag
from pybk.client.digest import MAX_OVERHEAD
from pybk.errors import (
    BadVersion,
    BookKeeperError,
    ClientClosed,
    EntryTooLarge,
    InvalidConfiguration,
    LedgerClosed,
    LedgerFenced,
    LogClosed,
    LogFenced,
    MetadataError,
    MetadataUnavailable,
    NoSuchLedger,
    NotEnoughBookies,
    Timeout,
)
from pybk.log import consumers
from pybk.log.batch import (
    BATCH_HEADER_BYTES,
    FIELDS_OVERHEAD_BYTES,
    LOG_NAME_KEY,
    MAXIMA_KEY,
    RECORD_OVERHEAD_BYTES,
    RUNNING_MAXIMA,
    Headers,
    check_fields,
    check_timestamp,
    encode_batch,
)
from pybk.log.futures import BatchFutures
from pybk.log.jobs import delete_ledger, settle_listed
from pybk.log.metadata import (
    FORMAT_VERSION,
    Dropped,
    LogMetadata,
    Segment,
    VersionedLog,
    delete_records,
    ensure_records,
    find_segment,
    mark_dropped,
    next_max_before,
    read_log,
    read_segment,
    store_records,
    update_log,
    write_segment,
)
from pybk.log.position import Position, positions
from pybk.log.timeindex import max_before_next
from pybk.meta.ledger_metadata import LedgerState
from pybk.settings import LogSettings

if TYPE_CHECKING:
    from pybk.client import BookKeeper
    from pybk.client.ledger import LedgerHandle
    from pybk.meta.interface import MetadataStore

log = logging.getLogger(__name__)

#: How many times an opening writer retries after losing a compare-and-set race.
OPEN_ATTEMPTS_MAX = 10
#: With deferredSync, how many times a segment is forced before the writer gives up on
#: closing it (and stops, leaving it to the next writer's recovery: see _close_segment).
FORCE_ATTEMPTS_MAX = 3
#: Seconds between those attempts (times the number of attempts made so far).
FORCE_RETRY_PAUSE_S = 0.1


class _Batch:
    """Records that go out together as one entry."""

    __slots__ = ("records", "timestamps", "fields", "overhead", "futures", "size",
                 "segment", "ledger", "max_floor")

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.timestamps: list[int] = []
        #: The key and headers of the records that have either, by slot (None: none has).
        self.fields: dict[int, tuple[bytes | None, Headers]] | None = None
        #: The bytes the batch's format adds to each record (see add_fields).
        self.overhead = RECORD_OVERHEAD_BYTES
        self.futures = BatchFutures()
        self.size = BATCH_HEADER_BYTES  # the batch's bytes at most, as the format counts
        self.segment: Segment | None = None      # set when the batch is sent
        self.ledger: LedgerHandle | None = None
        #: The max timestamp of the ledger's entry before this one (set when sent).
        self.max_floor: int | None = None

    def add_fields(self, key: bytes | None, headers: Headers) -> None:
        """Give the record about to be added ``key`` and ``headers``.  From then on
        every record of the batch has key and header fields (the caller counted them
        for the records before)."""
        if self.fields is None:
            self.fields = {}
            self.overhead = RECORD_OVERHEAD_BYTES + FIELDS_OVERHEAD_BYTES
        self.fields[len(self.records)] = (key, headers)

    def encode(self) -> bytes:
        """The batch's entry (:mod:`pybk.log.batch`)."""
        if self.fields is None:  # the common case: no Python loop per record
            return encode_batch(self.records, self.timestamps, max_floor=self.max_floor)
        count = len(self.records)
        keys: list[bytes | None] = [None] * count
        headers: list[Headers] = [()] * count
        for slot, (key, pairs) in self.fields.items():
            keys[slot], headers[slot] = key, pairs
        with_keys = any(key is not None for key, _ in self.fields.values())
        with_headers = any(pairs for _, pairs in self.fields.values())
        return encode_batch(self.records, self.timestamps, keys if with_keys else None,
                            headers if with_headers else None, self.max_floor)


class LogWriter:
    """The one writer of a log.  Make it with :meth:`open`; close it when done."""

    def __init__(self, bk: "BookKeeper", name: str, settings: LogSettings, password: bytes,
                 segment: Segment, ledger: "LedgerHandle", metadata: LogMetadata,
                 version: int) -> None:
        self._bk = bk
        self.name = name
        self.settings = settings
        self._password = password
        self._lock = threading.Lock()
        self._progress = threading.Condition(self._lock)  # a batch completed
        self._progress_waiters = 0  # so that completions notify only when one waits
        self._meta_lock = threading.Lock()   # one change of the ledger list at a time
        self._metadata, self._version = metadata, version
        #: A head this writer CASed whose answer was lost, not told yet (_refresh_head).
        self._unanswered: LogMetadata | None = None
        self._segment, self._ledger = segment, ledger
        self._segment_bytes = 0
        #: The largest timestamp of the batches sent to the segment (None: none sent):
        #: each batch's max timestamp is raised to it (:mod:`pybk.log.batch`, "Maxima").
        self._segment_max: int | None = None
        self._segment_started = time.monotonic()
        self._batch = _Batch()
        self._ready: collections.deque[_Batch] = collections.deque()
        self._in_flight: dict[int, int] = {ledger.id: 0}  # batches per ledger id
        self._closing: dict[int, LedgerHandle] = {}       # rolled away from, not closed
        self._outstanding: set[_Batch] = set()             # sealed, not completed
        self._sending = False
        self._rolling = False
        self._failure: BookKeeperError | None = None
        self._failure_told = False  # raised to a caller, or given to an append's future
        self._closed = False
        self._roller = ThreadPoolExecutor(max_workers=1,
                                          thread_name_prefix=f"pybk-log-{name}")
        # The settings each append reads, as plain attributes.
        self._record_max_bytes = settings.recordMaxBytes
        self._batch_max_bytes = settings.batchMaxBytes
        self._outstanding_max = settings.maxOutstandingBatches
        self._appends = self._appended_bytes = 0  # see append_counts

    # -- opening ------------------------------------------------------------------

    @classmethod
    def open(cls, bk: "BookKeeper", name: str, settings: LogSettings | None = None,
             password: bytes = b"") -> "LogWriter":
        """Become the writer of log ``name`` (created if new), fencing any other.

        The default settings replicate (E=3, Qw=2, Qa=2, as BookKeeper's client); a log
        with one copy takes ``LogSettings(ensembleSize=1, writeQuorumSize=1,
        ackQuorumSize=1)``."""
        settings = settings or LogSettings()
        needed = entry_bytes_needed(settings)
        if needed > bk.settings.maxEntrySizeBytes:
            raise InvalidConfiguration(
                f"log {name}: records of recordMaxBytes={settings.recordMaxBytes} and "
                f"batches of batchMaxBytes={settings.batchMaxBytes} need entries of up to "
                f"{needed} bytes, over the client's maxEntrySizeBytes="
                f"{bk.settings.maxEntrySizeBytes}: raise it (ClientSettings) and the "
                "bookies' (ServerSettings) to at least that")
        store = bk.metadata
        known: dict[int, int | None] = {}  # closed ledgers' maxima, read once for all rounds
        for _ in range(OPEN_ATTEMPTS_MAX):
            metadata, version = read_log(store, name, create=True)
            taken = take_over(bk, metadata, password)
            # Before a ledger to leak.
            max_before = max_before_next(bk, taken, password, known)
            try:
                ledger = _create_segment_ledger(bk, name, settings, password)
            except NotEnoughBookies as e:
                raise NotEnoughBookies(
                    f"log {name}: {e}.  Its segments need ensembleSize={settings.ensembleSize}"
                    f" bookies (writeQuorumSize={settings.writeQuorumSize}, ackQuorumSize="
                    f"{settings.ackQuorumSize}): start more bookies, or ask for fewer in "
                    "LogSettings (ensembleSize=writeQuorumSize=ackQuorumSize=1 for a single "
                    "copy)") from None
            opened = taken.with_new_segment(ledger.id, max_before)
            try:
                version = update_log(store, opened, version)
            except (BadVersion, MetadataUnavailable) as e:
                # Another client wrote first, or ours landed and its answer was lost.
                found = _opened_after_all(bk, opened, ledger, e, version)
                if found is None:
                    continue
                opened, version = found
            if metadata.format_version != FORMAT_VERSION:
                log.info("log %s: converted from format %d to %d", name,
                         metadata.format_version, FORMAT_VERSION)
            writer = cls(bk, name, settings, password, opened.tail[-1], ledger, opened,
                         version)
            try:
                finish_take_over(bk, opened)
            except BaseException:
                writer.close()  # the next opener finishes (the steps can be repeated)
                raise
            return writer
        raise MetadataError(f"log {name}: lost the race to open it {OPEN_ATTEMPTS_MAX} times "
                            "in a row to other writers")

    # -- appending ------------------------------------------------------------------

    def append(self, data: bytes, *, key: bytes | None = None, timestamp: int | None = None,
               headers: Iterable[tuple[str, bytes]] | None = None) -> Position:
        """Append a record; return its position once it is durable (see
        :meth:`append_async`)."""
        return self.append_async(data, key=key, timestamp=timestamp,
                                 headers=headers).result()

    def append_async(self, data: bytes, *, key: bytes | None = None,
                     timestamp: int | None = None,
                     headers: Iterable[tuple[str, bytes]] | None = None) -> Future:
        """Append a record; the future gives its :class:`Position` once it is durable.

        The record's value is ``data``; ``key`` (bytes, None for none), ``timestamp``
        (milliseconds since the epoch; None: now, the wall-clock time of this call) and
        ``headers`` (``(str, bytes)`` pairs) are kept with it (:mod:`pybk.log.batch`
        says their limits: InvalidRecord past them).  The value, key and headers
        together are at most ``recordMaxBytes`` (EntryTooLarge).  Records appended from
        one thread get increasing positions in call order, whatever their timestamps."""
        # The path every record takes: one lock, no call that a check can spare (a
        # pipelining caller pays this per record; everything else is per batch).
        if type(data) is not bytes:
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise TypeError(f"a log record must be bytes, not {type(data).__name__}")
            data = bytes(data)  # a snapshot: the caller may reuse its buffer
        size = len(data)
        if timestamp is None:
            timestamp = time_ns() // 1_000_000  # batch.now_ms(), without its call
        else:
            timestamp = check_timestamp(timestamp)
        fields = None
        if key is not None or headers is not None:
            key, pairs, extra = check_fields(key, headers)
            fields = (key, pairs)
            size += extra
        if size > self._record_max_bytes:
            raise EntryTooLarge(f"record of {size} bytes (value, key and headers) is over "
                                f"recordMaxBytes={self._record_max_bytes}")
        with self._lock:
            if self._failure is not None or self._closed:
                self._check_open()
            self._appends += 1
            self._appended_bytes += size
            batch = self._batch
            grown = batch.size + batch.overhead + size
            if fields is not None and batch.fields is None:  # the others' fields too
                grown += FIELDS_OVERHEAD_BYTES * (len(batch.records) + 1)
            if grown > self._batch_max_bytes and batch.records:
                self._seal()  # full: it goes out now, the record starts the next
                batch = self._batch
                grown = batch.size + batch.overhead + size
                if fields is not None:
                    grown += FIELDS_OVERHEAD_BYTES
            if fields is not None:
                batch.add_fields(*fields)
            batch.records.append(data)
            batch.timestamps.append(timestamp)
            future = batch.futures.new()
            batch.size = grown
            if len(self._outstanding) < self._outstanding_max \
                    or grown >= self._batch_max_bytes:
                self._seal()
            elif not self._ready:
                return future  # it goes out with the batch when one in flight completes
        self._send_ready()
        return future

    def append_counts(self) -> tuple[int, int]:
        """``(records, bytes)`` appends took since the writer opened, whether or not they
        then became durable."""
        with self._lock:
            return self._appends, self._appended_bytes

    def _check_open(self) -> None:
        if self._failure is not None:
            self._failure_told = True
            raise self._failure
        if self._closed:
            raise LogClosed(f"the writer of log {self.name} is closed")

    def _roll_due(self) -> bool:
        """Whether the segment is full or too old.  An empty segment is never too old: it
        takes a batch before it rolls, so each roll makes progress however short the age
        limit is.  Caller holds the lock."""
        s = self.settings
        return self._segment_bytes >= s.segmentMaxBytes or (
            s.segmentMaxAgeSeconds > 0 and self._segment_bytes > 0
            and time.monotonic() - self._segment_started >= s.segmentMaxAgeSeconds)

    def _seal(self) -> None:
        """Queue the current batch for sending.  Caller holds the lock."""
        if self._batch.records:
            self._ready.append(self._batch)
            self._outstanding.add(self._batch)
            self._batch = _Batch()

    def _send_ready(self) -> None:
        """Send queued batches in order; a thread that finds another sending leaves the
        queue to it (so no caller ever waits here for another's send).

        A segment due to roll takes no more batches: they stay queued, the roll is
        started if it is not running, and the roll sends them to the next segment.
        Deciding that and giving up the sender role happen under one hold of the lock,
        so the roll's own call finds either this thread still sending or the role free."""
        with self._lock:
            if self._sending:
                return
            self._sending = True
        roll = False
        # Batches ready together go out in one add_entries call (at most the client's
        # throttle of them, which one call may not pass).
        throttle = self._bk.settings.throttle
        while True:
            with self._lock:
                due = self._failure is None and self._roll_due()
                if due and not self._rolling:
                    self._rolling = roll = True
                if not self._ready or self._failure is not None or due:
                    self._sending = False
                    break
                group: list[_Batch] = []
                while self._ready and not (group and (
                        self._roll_due() or len(group) == throttle)):
                    batch = self._ready.popleft()
                    batch.segment, batch.ledger = self._segment, self._ledger
                    # Under the lock that orders the sends: the ledger's running maximum.
                    batch.max_floor = floor = self._segment_max
                    top = max(batch.timestamps)
                    self._segment_max = top if floor is None or top > floor else floor
                    self._in_flight[batch.ledger.id] += 1
                    self._segment_bytes += batch.size
                    group.append(batch)
            ledger = group[0].ledger
            assert ledger is not None
            try:
                if len(group) == 1:
                    ledger.add_entry_then(group[0].encode(),
                                          functools.partial(self._on_batch_done, group[0]))
                else:
                    ledger.add_entries_then([b.encode() for b in group],
                                            functools.partial(self._on_group_done, group))
            except BookKeeperError as e:
                for batch in group:
                    self._batch_failed(batch, e)
        if roll:
            self._start_roll()

    def _on_group_done(self, group: list[_Batch], last: int | None,
                       error: BaseException | None) -> None:
        """The completion of batches sent in one add_entries call: each batch's own,
        in order; after a failure, the batches the call acknowledged (the error's
        ``acknowledged``) still succeed."""
        if error is None:
            assert last is not None
            first, acknowledged = last - len(group) + 1, len(group)
        else:
            done = getattr(error, "acknowledged", None) or range(0)
            first, acknowledged = done.start, len(done)
        for i, batch in enumerate(group):
            if i < acknowledged:
                self._on_batch_done(batch, first + i, None)
            else:
                self._on_batch_done(batch, None, error)

    def _on_batch_done(self, batch: _Batch, entry_id: int | None,
                       error: BaseException | None) -> None:
        if error is not None:
            self._batch_failed(batch, error)
            return
        with self._lock:
            self._finished(batch)
            if len(self._outstanding) < self._outstanding_max:
                self._seal()
            # Nothing to send and no roll to start (a lone append's case): no send round.
            send = bool(self._ready) or (not self._rolling and self._roll_due())
        if send:
            self._send_ready()  # the next batch first: the pipeline stays busy
        assert batch.segment is not None and entry_id is not None  # sent, then acknowledged
        batch.futures.set_results(positions(batch.segment.number, entry_id,
                                            len(batch.futures)))

    def _finished(self, batch: _Batch) -> None:
        """Account for a completed batch.  Caller holds the lock."""
        self._outstanding.discard(batch)
        if batch.ledger is not None and batch.ledger.id in self._in_flight:
            self._in_flight[batch.ledger.id] -= 1
        if self._progress_waiters:  # a notify_all is a dozen Python calls, even for none
            self._progress.notify_all()

    def _wait_for_progress(self, timeout: float | None) -> None:
        """Wait until a batch completes or ``timeout`` passes.  Caller holds the lock."""
        self._progress_waiters += 1
        try:
            self._progress.wait(timeout)
        finally:
            self._progress_waiters -= 1

    def _batch_failed(self, batch: _Batch, error: BaseException) -> None:
        if not isinstance(error, BookKeeperError):
            error = BookKeeperError(f"log {self.name}: append failed: {error}")
        error = _taken_over(self.name, error)
        with self._lock:
            self._finished(batch)
        self._fail(error)
        with self._lock:
            self._failure_told = True
        batch.futures.set_exception(error)

    def _fail(self, error: BookKeeperError) -> None:
        """Stop the writer: every record not yet acknowledged fails with ``error``."""
        with self._lock:
            if self._failure is None:
                self._failure = error
                log.error("log %s: the writer stops: %s", self.name, error)
            unsent = list(self._ready) + [self._batch]
            self._ready.clear()
            self._batch = _Batch()
            for batch in unsent:
                self._finished(batch)
                if batch.records:
                    self._failure_told = True
        for batch in unsent:
            batch.futures.set_exception(self._failure)

    # -- waiting ------------------------------------------------------------------

    def sync(self, timeout: float | None = None) -> None:
        """Return once every record appended before the call is durable and readable
        (with ``deferredSync``: acknowledged, then forced), or raise.

        Raises the failure that stopped the writer, if one did (with ``deferredSync``:
        a segment a roll could not force, see the module's docstring), the force's
        error if one failed (the records stay appended: a later ``sync()`` forces them
        again), and Timeout after ``timeout`` seconds."""
        with self._lock:
            self._seal()
            waiting = set(self._outstanding)
            ledgers = [self._ledger, *self._closing.values()]
        self._send_ready()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while waiting & self._outstanding and self._failure is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise Timeout(f"log {self.name}: appends still in flight after "
                                       f"{timeout} s")
                self._wait_for_progress(remaining)
            if self._failure is not None:
                self._failure_told = True
                raise self._failure
            if self.settings.deferredSync:
                ledgers += [b.ledger for b in waiting if b.ledger is not None]
        if self.settings.deferredSync:
            self._force({ledger.id: ledger for ledger in ledgers}.values())

    def _force(self, ledgers: Iterable["LedgerHandle"]) -> None:
        """Deferred sync: make what ``ledgers`` acknowledged durable.  A segment a roll
        closed was forced up to its last acknowledged entry first (see _close_segment):
        one that could not be stopped the writer, which sync() raised before this."""
        for ledger in ledgers:
            try:
                ledger.force()
            except LedgerClosed:
                pass
            except BookKeeperError as e:
                raise _taken_over(self.name, e) from None
            if ledger.last_add_forced < ledger.last_add_acknowledged:
                raise BookKeeperError(
                    f"log {self.name}: segment ledger {ledger.id} closed before its appends "
                    f"were forced: those after entry {ledger.last_add_forced} are lost")

    # -- rolling ------------------------------------------------------------------

    def _start_roll(self) -> None:
        try:
            self._roller.submit(self._roll)
        except RuntimeError:  # closed meanwhile: no roll, which matters only to batches
            with self._lock:  # waiting for one (they cannot go)
                self._rolling = False
                stranded = bool(self._ready)
            if stranded:
                self._fail(LogClosed(f"the writer of log {self.name} closed before a roll"))

    def _roll(self) -> None:
        """Start the next segment, then close the previous one (background thread)."""
        try:
            with self._meta_lock:
                self._roll_locked()
        except BookKeeperError as e:  # closing the previous ledger finds it recovered too
            self._fail(_taken_over(self.name, e))
        except Exception as e:  # never leave the writer half-rolled without a reason
            log.exception("log %s: rolling failed", self.name)
            self._fail(BookKeeperError(f"log {self.name}: rolling failed: {e}"))
        finally:
            with self._lock:
                self._rolling = False
            self._send_ready()  # the new segment may be due already

    def _roll_locked(self) -> None:
        self._refresh_head()
        ledger = _create_segment_ledger(self._bk, self.name, self.settings, self._password)
        with self._lock:  # final: no batch goes to a segment due to roll
            max_before = next_max_before(self._segment, self._segment_max)
        rolled = self._metadata.with_new_segment(ledger.id, max_before)
        try:
            self._store_metadata(rolled)
        except BookKeeperError:
            # A CAS answered MetadataUnavailable may still land (self._unanswered).
            _abandon(self._bk, self.name, ledger, rolled.tail[-1],
                     may_land=self._unanswered is not None)
            raise
        write_segment(self._bk.metadata, self.name, rolled.tail[-1])
        with self._lock:
            previous = self._ledger
            self._closing[previous.id] = previous
            self._segment, self._ledger = rolled.tail[-1], ledger
            self._segment_max = None
            self._in_flight[ledger.id] = 0
            self._segment_bytes, self._segment_started = 0, time.monotonic()
        self._send_ready()  # the batches that waited for this segment
        with self._lock:
            deadline = time.monotonic() + 2 * self._bk.settings.addEntryTimeout
            while self._in_flight[previous.id] and self._failure is None \
                    and time.monotonic() < deadline:
                self._wait_for_progress(0.1)
            del self._in_flight[previous.id]
        try:
            self._close_segment(previous)
        except BookKeeperError as e:
            # Stopped before the segment leaves _closing, so that no sync() misses it.
            self._fail(_taken_over(self.name, e))
            raise
        finally:
            with self._lock:
                del self._closing[previous.id]
        log.info("log %s: rolled to segment %d (ledger %d); ledger %d closed at entry %d",
                 self.name, rolled.tail[-1].number, ledger.id, previous.id,
                 previous.last_add_confirmed)

    def _close_segment(self, ledger: "LedgerHandle") -> None:
        """Close a segment ledger the writer is done with (rolled away from, or current at
        its close).

        With deferredSync a ledger closes at its durable LAC, and the records past it
        were returned to their appends, promised to survive this process dying.  So the
        segment is forced first, up to FORCE_ATTEMPTS_MAX times, and closed only once a
        force covered every entry it acknowledged; otherwise it is left open, for the
        next writer's recovery (which keeps every entry its bookies hold), and
        BookKeeperError says so (the roll stops the writer with it)."""
        if self.settings.deferredSync:
            self._force_before_close(ledger)
        ledger.close()

    def _force_before_close(self, ledger: "LedgerHandle") -> None:
        """Force ``ledger`` until it has no add pending and its durable LAC is the last
        entry it acknowledged; raise BookKeeperError if that does not happen."""
        error: BookKeeperError | None = None
        for attempt in range(1, FORCE_ATTEMPTS_MAX + 1):
            try:
                ledger.force()
            except LedgerFenced:
                return  # recovered by another writer: its close says where
            except (LedgerClosed, ClientClosed) as e:
                if ledger.last_add_forced >= ledger.last_add_acknowledged:
                    return  # nothing returned past the durable LAC: its close says so
                # Closed already below an append that returned (a bookie failed an add,
                # possibly after Qa others acknowledged it: no append of the writer
                # failed), or no force can come any more: never go on silently.
                raise BookKeeperError(
                    f"log {self.name}: segment ledger {ledger.id} cannot be forced past "
                    f"entry {ledger.last_add_forced} ({e}); its records up to entry "
                    f"{ledger.last_add_acknowledged} were appended (written, not synced) "
                    "and those after the last sync() may be lost: the writer stops") \
                    from None
            except BookKeeperError as e:
                error = e
                log.warning("log %s: forcing segment ledger %d before closing it failed "
                            "(attempt %d of %d): %s", self.name, ledger.id, attempt,
                            FORCE_ATTEMPTS_MAX, e)
            if not ledger.pending_adds \
                    and ledger.last_add_forced >= ledger.last_add_acknowledged:
                return
            if attempt < FORCE_ATTEMPTS_MAX:
                time.sleep(FORCE_RETRY_PAUSE_S * attempt)
        raise BookKeeperError(
            f"log {self.name}: segment ledger {ledger.id} could not be forced "
            f"({error or 'adds still pending'}); "
            f"its records past entry {ledger.last_add_forced} were appended (written, not "
            "synced), so it is left open rather than closed without them, and the writer "
            "stops: the next writer of the log recovers the segment with them")

    def _store_metadata(self, metadata: LogMetadata) -> None:
        """Compare-and-set the log's head.  Caller holds the metadata lock, and built
        ``metadata`` from this writer's head after :meth:`_refresh_head`.

        It clears ``dropping``: this writer finished those deletions when it opened.  A
        CAS answered BadVersion or MetadataUnavailable may have landed (its answer lost):
        the head is read again, and if it says what ``metadata`` says (:func:`_holds`),
        the change is made.  Otherwise a head that changed in job bookkeeping or
        truncation's progress only (an orphan cleaner's CAS, a truncation walk's) is not
        a takeover: after BadVersion the change is made again on it, never moving
        oldest_segment back (see :mod:`pybk.log.metadata`), and MetadataUnavailable is
        raised (the store failed the CAS); any other head, LogFenced.  If the head cannot
        be read, MetadataUnavailable.  After MetadataUnavailable the CAS may have landed
        or still land, and the next change of the head tells (:meth:`_refresh_head`)."""
        metadata = dataclasses.replace(metadata, dropping=())
        version = self._version
        for _ in range(OPEN_ATTEMPTS_MAX):
            unavailable: MetadataUnavailable | None = None
            try:
                self._version = update_log(self._bk.metadata, metadata, version)
                self._metadata = metadata
                return
            except BadVersion:
                pass  # another client wrote first, or ours landed and its answer was lost
            except MetadataUnavailable as e:
                unavailable = e  # ours may have landed
            try:
                current, version = read_log(self._bk.metadata, self.name)
            except MetadataUnavailable:
                self._unanswered = metadata
                raise
            if _holds(current, metadata):
                self._metadata, self._version = current, version
                return
            if not self._metadata.same_owner(current):
                raise LogFenced(f"log {self.name}: another writer or a commit changed its "
                                "head")
            if unavailable is not None:
                self._unanswered = metadata  # (it may still land: see the module's doc)
                raise unavailable
            metadata = dataclasses.replace(
                metadata, committing=current.committing, aborted=current.aborted,
                oldest_segment=max(metadata.oldest_segment, current.oldest_segment))
        raise MetadataError(f"log {self.name}: lost the race to change its head "
                            f"{OPEN_ATTEMPTS_MAX} times in a row to job bookkeeping")

    def _refresh_head(self) -> None:
        """Tell what became of a head CAS that :meth:`_store_metadata` answered with
        MetadataUnavailable: read the head, and take it as this writer's
        if it says what that CAS said (it landed) or what the head before it said (it
        did not), job bookkeeping and truncation's progress apart; LogFenced otherwise.
        Nothing if no answer is missing.  Caller holds the metadata lock."""
        unanswered = self._unanswered
        if unanswered is None:
            return
        current, version = read_log(self._bk.metadata, self.name)
        if not (_holds(current, unanswered) or self._metadata.same_owner(current)):
            raise LogFenced(f"log {self.name}: another writer or a commit changed its head")
        self._metadata, self._version, self._unanswered = current, version, None

    # -- truncation -----------------------------------------------------------------

    def truncate(self, before: Position | str) -> int:
        """Make the records before ``before`` (a Position or its text) unreadable,
        deleting every segment that lies wholly before it; return how many ledgers were
        deleted.

        Truncation stops at the slowest registered consumer's committed position
        (:mod:`pybk.log.consumers`; logged at INFO when it holds truncation back).
        Truncating to an earlier position than before changes nothing, except that it
        finishes the deletions of a truncation that stopped half-way (a metadata error)."""
        before = Position.of(before, "truncate(before)")
        slowest = consumers.slowest(self._bk.metadata, self.name)
        if slowest is not None and slowest.position < before:
            log.info("log %s: truncation held back from %s to %s, consumer %r's committed "
                     "position", self.name, before, slowest.position, slowest.consumer_id)
            before = slowest.position
        with self._meta_lock:
            with self._lock:
                self._check_open()
                current = self._segment.number
            self._refresh_head()
            if before.segment > current:
                raise ValueError(f"log {self.name}: cannot truncate before {before}, past "
                                 f"the current segment {current}")
            metadata = self._metadata
            if before <= metadata.truncated_before:
                if metadata.oldest_segment == metadata.truncated_before.segment:
                    return 0
                before = metadata.truncated_before  # an earlier walk stopped: finish it
            else:
                # Readers start at truncated_before's segment: make it one that exists
                # (no record lies between a dead number and the next segment).
                first = find_segment(self._bk.metadata, metadata, before.segment)
                assert first is not None  # the current segment, at least
                if first.number > before.segment:
                    before = Position(first.number, 0, 0)
                self._store_metadata(dataclasses.replace(
                    metadata, truncated_before=before,
                    tail=tuple(s for s in metadata.tail if s.number >= before.segment)))
            deleted = delete_segments(self._bk, self._metadata)
            if self._metadata.oldest_segment != before.segment:
                self._store_metadata(dataclasses.replace(self._metadata,
                                                         oldest_segment=before.segment))
            return deleted

    # -- state --------------------------------------------------------------------

    @property
    def metadata(self) -> LogMetadata:
        """The log's head as this writer last wrote it."""
        return self._metadata

    def ledger_for(self, ledger_id: int) -> "LedgerHandle | None":
        """This writer's handle of ledger ``ledger_id`` if it is being written or closed
        after a roll (readers in this process use it: it knows the newest acknowledged
        entry)."""
        with self._lock:
            ledger = self._ledger
            return ledger if ledger.id == ledger_id else self._closing.get(ledger_id)

    def is_closing(self, ledger_id: int) -> bool:
        """Whether the writer rolled away from ``ledger_id`` and is still closing it
        (entries in flight to it may still be acknowledged)."""
        with self._lock:
            return ledger_id in self._closing

    # -- closing ------------------------------------------------------------------

    def close(self) -> None:
        """Send what is batched, wait for it, and close the current segment (with
        ``deferredSync``: once forced; one that cannot be is left open for the next
        writer's recovery, and this raises).

        Appends fail with LogClosed from now on.  A failure that stopped the writer
        earlier was reported to the appends it failed and is not raised again here;
        with ``deferredSync``, one that no caller was told (a roll's, with no append
        waiting) is raised: records whose appends returned may not be durable."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            failed_before = self._failure is not None
            untold = failed_before and not self._failure_told \
                and self.settings.deferredSync
        try:
            if not failed_before:
                self.sync(timeout=2 * self._bk.settings.addEntryTimeout)
        finally:
            self._roller.shutdown(wait=True)
            try:
                self._close_segment(self._ledger)
            except BookKeeperError:
                if not failed_before:
                    raise
        if untold:
            assert self._failure is not None
            self._failure_told = True
            raise self._failure

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def entry_bytes_needed(settings: LogSettings) -> int:
    """The largest entry a writer with ``settings`` makes: a full batch, or one record of
    ``recordMaxBytes`` (value, key and headers) alone, with the batch's header and the
    largest digest."""
    return MAX_OVERHEAD + BATCH_HEADER_BYTES + max(
        settings.batchMaxBytes,
        RECORD_OVERHEAD_BYTES + FIELDS_OVERHEAD_BYTES + settings.recordMaxBytes)


def _taken_over(name: str, error: BookKeeperError) -> BookKeeperError:
    """``error``, as LogFenced if it says that another writer recovered a segment."""
    if isinstance(error, LedgerFenced) and not isinstance(error, LogFenced):
        return LogFenced(f"log {name}: another writer opened the log ({error})")
    return error


def _create_segment_ledger(bk: "BookKeeper", name: str, settings: LogSettings,
                           password: bytes) -> "LedgerHandle":
    return bk.create_ledger(settings.ensembleSize, settings.writeQuorumSize,
                            settings.ackQuorumSize, settings.digestType, password,
                            batch_ledger_metadata(name),
                            {WriteFlag.DEFERRED_SYNC} if settings.deferredSync else ())


def batch_ledger_metadata(name: str, extra: Mapping[str, bytes] | None = None
                          ) -> dict[str, bytes]:
    """The custom metadata of a new ledger of log ``name`` whose entries are record
    batches with running maxima (its writer passes ``max_floor``): the log's name, the
    running-maxima tag (:data:`~pybk.log.batch.MAXIMA_KEY`: a commit and a search by time
    trust its headers only with it) and ``extra``.  Every creator of such a ledger calls
    this, so that none is left untagged."""
    return {LOG_NAME_KEY: name.encode("utf-8"), MAXIMA_KEY: RUNNING_MAXIMA, **(extra or {})}


def take_over(bk: "BookKeeper", metadata: LogMetadata, password: bytes) -> LogMetadata:
    """The first steps of taking the log over (an opening writer's, a commit's): finish
    what the writers and committers before left undone, fence and recover the last two
    segments; return the head to extend and CAS: the empty segments recovered are
    ``dropping``, the jobs it settled are no longer listed, and the epoch is one more."""
    _finish_what_was_left(bk, metadata)
    empty = _recover_last_segments(bk, metadata, password)
    return dataclasses.replace(
        metadata, tail=tuple(s for s in metadata.tail if s not in empty),
        oldest_segment=metadata.truncated_before.segment,
        dropping=tuple(Dropped(s.number, s.ledger_id) for s in empty), epoch=metadata.epoch + 1,
        committing=(), aborted=(), format_version=FORMAT_VERSION)


def finish_take_over(bk: "BookKeeper", taken: LogMetadata) -> None:
    """The steps right after a takeover's CAS of ``taken``: the new segments' records,
    then the dead records and ledgers of what was dropped."""
    store_records(bk.metadata, taken.name, taken.tail)
    _finish_dropping(bk, taken)


def _recover_last_segments(bk: "BookKeeper", metadata: LogMetadata,
                           password: bytes) -> list[Segment]:
    """Fence and close the log's last two segments; return those to drop: empty ones,
    except the tail's first (it starts the run of numbers the others leave: see
    :mod:`pybk.log.metadata`), and any whose ledger is gone."""
    drop = []
    for segment in metadata.tail[-2:]:
        try:
            handle = bk.open_ledger(segment.ledger_id, password, recovery=True)
        except NoSuchLedger:
            log.warning("log %s: segment %d's ledger %d is gone; dropping it from the log",
                        metadata.name, segment.number, segment.ledger_id)
            drop.append(segment)
            continue
        if handle.metadata.state is LedgerState.CLOSED \
                and handle.metadata.closed_last_entry_id() < 0 and segment != metadata.tail[0]:
            drop.append(segment)
        handle.close()
    return drop


def _finish_what_was_left(bk: "BookKeeper", metadata: LogMetadata) -> None:
    """Before an opening writer's CAS, do again what the writers before it may have left
    undone when they died (each step can be repeated; see :mod:`pybk.log.metadata`)."""
    _finish_dropping(bk, metadata)
    ensure_records(bk.metadata, metadata)
    delete_segments(bk, metadata)
    settle_listed(bk, metadata)


def _finish_dropping(bk: "BookKeeper", metadata: LogMetadata) -> None:
    """Mark the head's dropped segments dead, then delete their ledgers."""
    mark_dropped(bk.metadata, metadata)
    for dropped in metadata.dropping:
        delete_ledger(bk, dropped.ledger_id)


def delete_segments(bk: "BookKeeper", metadata: LogMetadata) -> int:
    """Delete the ledgers and records of the segments numbered from the stored head's
    oldest_segment up to ``metadata``'s truncated_before's; return how many ledgers were
    deleted."""
    deleted = []
    delete_records(bk.metadata, metadata.name, metadata.truncated_before.segment,
                   lambda ledger_id: deleted.append(delete_ledger(bk, ledger_id)))
    return sum(deleted)


def _opened_after_all(bk: "BookKeeper", opened: LogMetadata, ledger: "LedgerHandle",
                      error: BookKeeperError, expected: int) -> VersionedLog | None:
    """After the opening CAS of ``opened`` answered ``error`` (BadVersion or
    MetadataUnavailable): the stored head and its version if that CAS landed and no
    writer or commit took the log over since (:meth:`LogMetadata.same_owner`: the head
    still has ``ledger`` last in its tail, with the epoch that CAS gave it); the opener
    is the log's writer then.  Else None (the opener tries again), once ``ledger`` is
    given up (:func:`_abandon`: deleted only if the CAS did not land); ``error`` itself
    if it is MetadataUnavailable and the CAS did not land (the store failed it).
    MetadataUnavailable too if the head cannot be read: the outcome is unknown, and the
    ledger is left (the next opener recovers it if the log has it)."""
    name = opened.name
    try:
        current, version = read_log(bk.metadata, name)
    except MetadataUnavailable as e:
        _close_quietly(name, ledger)
        raise MetadataUnavailable(
            f"log {name}: the outcome of opening it is unknown: its head's CAS was sent "
            f"({error}), then the head could not be read ({e}).  Its new ledger "
            f"{ledger.id} is left to the next writer to open the log") from e
    if opened.same_owner(current):
        log.info("log %s: the CAS that opened it landed (its answer was lost: %s)", name,
                 error)
        return VersionedLog(current, version)
    # A CAS answered MetadataUnavailable that the head does not show may still land
    # (the store may have it in flight) while the head is at the version it expects.
    added = _abandon(bk, name, ledger, opened.tail[-1], current,
                     may_land=isinstance(error, MetadataUnavailable) and version == expected)
    if added is False and isinstance(error, MetadataUnavailable):
        raise error
    log.info("log %s: another writer or commit changed the log's head while this one "
             "opened (%s); trying again", name, error)
    return None


def _holds(head: LogMetadata, change: LogMetadata) -> bool:
    """Whether the stored ``head`` says what a writer's CAS of ``change`` says: it is
    that head, changed since in job bookkeeping or truncation's progress only (which
    moves on, never back).  A change that adds a segment (its ledger named by no other
    CAS) or truncates (this writer's own) is in the head only if its CAS landed."""
    return change.same_owner(head) and head.oldest_segment >= change.oldest_segment


def _added(store: "MetadataStore", head: LogMetadata, segment: Segment) -> bool | None:
    """Whether the head CAS that was to add ``segment`` (its ledger new, named by no
    other CAS) landed, as the stored ``head``, read after it, and the segment's record
    tell: True if either names its ledger; False if no CAS gave out its number yet, or
    one gave it to another ledger (the number is taken once, by the first CAS to add a
    segment from the head that CAS saw); None if that cannot be told any more (the
    number was dropped, or truncated away, since: whoever did it deleted the ledger if
    it was that segment's)."""
    if head.next_segment <= segment.number:
        return False
    named: list[Segment | Dropped] = [*head.tail, *head.dropping]
    if any(s.ledger_id == segment.ledger_id for s in named):
        return True
    if any(s.number == segment.number for s in named):
        return False
    record = read_segment(store, head.name, segment.number)
    if record is None or record.ledger_id is None:
        return None
    return record.ledger_id == segment.ledger_id


def _abandon(bk: "BookKeeper", name: str, ledger: "LedgerHandle", segment: Segment,
             head: LogMetadata | None = None, may_land: bool = False) -> bool | None:
    """Give up ``ledger``, created to be ``segment`` of log ``name`` by a head CAS that
    failed or whose answer was lost, ``head`` being the stored head read after it (read
    here if not given).  It is deleted only if that CAS did not land (:func:`_added`)
    and cannot land any more (``may_land``: a CAS answered MetadataUnavailable, the
    head still at the version it expects, may be in flight in the store and land after
    the delete, naming a deleted ledger as the log's last segment: readers fail with
    NoSuchLedger until a writer opens the log); if it did, may, or if that cannot be
    told, it is closed and left: a segment of the log
    is deleted only by whoever drops it or truncates it away, and a ledger no head
    names wastes space but harms nothing.  Returns what :func:`_added` told."""
    try:
        if head is None:
            head = read_log(bk.metadata, name).metadata
        added = _added(bk.metadata, head, segment)
    except BookKeeperError as e:
        log.warning("log %s: cannot tell whether ledger %d was added to the log as segment "
                    "%d (%s); leaving it", name, ledger.id, segment.number, e)
        added = None
    if added is False and not may_land:
        _discard_ledger(bk, ledger)
        return added
    if added is False:
        log.info("log %s: ledger %d is in no head, but the CAS that names it may still "
                 "land (MetadataUnavailable): closed and left, not deleted (a head naming "
                 "a deleted ledger fails readers until the next writer opens)", name,
                 ledger.id)
    if added:
        log.info("log %s: ledger %d is segment %d of the log (a CAS whose answer was lost "
                 "added it); leaving it to the log", name, ledger.id, segment.number)
    _close_quietly(name, ledger)
    return added


def _close_quietly(name: str, ledger: "LedgerHandle") -> None:
    """Close a segment ledger this writer will not write, which another writer may have
    recovered or deleted already."""
    try:
        ledger.close()
    except BookKeeperError as e:
        log.info("log %s: closing unused ledger %d: %s", name, ledger.id, e)


def _discard_ledger(bk: "BookKeeper", ledger: "LedgerHandle") -> None:
    """Delete a ledger this writer created and no head names (its CAS did not land)."""
    try:
        ledger.close()
        bk.delete_ledger(ledger.id)
    except BookKeeperError as e:  # an orphan ledger wastes space but harms nothing
        log.warning("log: could not delete unused ledger %d: %s", ledger.id, e)
