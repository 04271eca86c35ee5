"""The entry index and the ledger state table, in LMDB.

LMDB replaces BookKeeper's per-ledger index files.  The environment lives in
``<first ledger dir>/current/index`` and holds three tables; all integers are big-endian.

``entries``
    key: ledger id (8) + entry id (8), so keys sort by ledger, then entry, and a ledger's
    last entry is one reverse cursor seek.
    value: entry log id (8) + offset of the record in that log (8) + entry length (4).

``ledgers``
    key: ledger id (8).
    value: flags (1: bit 0 fenced, bit 1 deleted, bit 2 explicit LAC set), highest LAC
    carried by a stored entry (8, signed, -1 for none), explicit LAC (8, signed), then the
    master key (the rest).

``deleted``
    key: ledger id (8) of a ledger whose deletion is committed; value: empty.  The
    bookie reads this table at start (the ledgers garbage collection has yet to forget),
    not every ledger's state.

``meta``
    ``last_entry_log_id`` (8): the highest entry log id ever used, so ids never repeat.
    The tombstones of the ledgers garbage collection forgot (:class:`Tombstones`: a
    bookie of a cluster checks a plain add to an unknown ledger they cover against the
    ledger's metadata, :meth:`pybk.storage.Bookie.guard_unknown_ledgers`), changed in
    the transaction that forgets and never lowered:
    ``forgotten_range/`` + range (8): the highest id forgotten among the ids of that
    range (``id >> FORGOTTEN_RANGE_BITS``), one key per range that holds one;
    ``forgotten_floor`` (8, signed): every id at or below it counts as forgotten (ranges
    folded into it past :data:`FORGOTTEN_RANGES_MAX`; absent in an index written before
    the ranges were kept: ``highest_forgotten_ledger`` stands for it);
    ``highest_forgotten_ledger`` (8): the highest id ever forgotten (absent: none), kept
    for readers of before the ranges, to whom it is the whole tombstone.
    ``join_floor`` (8, signed): the bookie's join floor, recorded once by
    :meth:`Index.record_join_floor` when a node first serves a cluster with these
    directories: an id from the cluster's ledger id generator if the index held nothing
    then (the disks joined the cluster at that point), else -1 (they served before the
    floor was kept).  For a ledger below it, "not here" may mean "lost with the disks
    this bookie's id had before" (:meth:`pybk.storage.Bookie.record_join_floor`).
    Absent: none recorded (an embedded bookie).
    ``join_floor_pending`` (empty): present while the node that recorded a join floor
    of at least 0 has not joined yet (:meth:`Index.confirm_join_floor`); the next
    :meth:`Index.record_join_floor` then raises the floor to the id it is given (a
    start that failed after recording must not leave a floor below the ledgers the id's
    former disks went on serving).
    ``index_version`` (4): the format of the tables, :data:`INDEX_VERSION` (absent in
    version 1, which had no ``deleted`` table: opening it for writing adds the table,
    filled from the ``ledgers`` table, and the version).

A deleted ledger keeps its ``ledgers`` row (flag deleted) and its ``deleted`` row until
garbage collection removed every entry log holding its entries; then both rows go
(:meth:`Index.forget_ledgers`) and the index holds nothing of it.  A live state committed
for a ledger with a ``deleted`` row (made again after it was forgotten, its deletion
replayed once more after a crash) removes that row.

Durability: the index is written only by the checkpoint, GC and compaction, each in one
transaction; a committed transaction is durable (LMDB syncs data pages, then the meta
page).  Everything newer than the last checkpoint is in the journal and is replayed into
the write cache at start, so adds never pay for an index sync.
"""

from __future__ import annotations

import itertools
import operator
import os
import struct
from typing import Iterable, Iterator, Mapping, NamedTuple

import lmdb

from pybk.errors import BookKeeperError

ENTRY_KEY = struct.Struct(">QQ")
LEDGER_KEY = struct.Struct(">Q")
LOCATION = struct.Struct(">QQI")
LEDGER_STATE = struct.Struct(">Bqq")
assert (ENTRY_KEY.size, LOCATION.size, LEDGER_STATE.size) == (16, 20, 17), \
    "index keys and values are documented as 16, 20 and 17 (+ key) bytes"
LAST_LOG_ID_KEY = b"last_entry_log_id"
VERSION_KEY = b"index_version"
FORGOTTEN_KEY = b"highest_forgotten_ledger"
JOIN_FLOOR_KEY = b"join_floor"
JOIN_FLOOR_PENDING_KEY = b"join_floor_pending"
FORGOTTEN_FLOOR_KEY = b"forgotten_floor"
FORGOTTEN_RANGE_PREFIX = b"forgotten_range/"
#: Forgotten ledger ids are remembered by range of 2**FORGOTTEN_RANGE_BITS ids (an
#: embedded WAL's ledger ids start at a multiple of it: one range per WAL).
FORGOTTEN_RANGE_BITS = 20
#: Ranges remembered apart at most; past it, the lowest is folded into the floor.
FORGOTTEN_RANGES_MAX = 4096
_SIGNED_ID = struct.Struct(">q")
#: The format this pybk writes; it reads this one and version 1 (upgraded on open).
INDEX_VERSION = 2
_VERSION = struct.Struct(">I")
#: Index items a checkpoint writes per LMDB call (a millisecond or two of work).
PUT_SLICE_ITEMS = 1024

FLAG_FENCED, FLAG_DELETED, FLAG_EXPLICIT_LAC = 1, 2, 4

# LMDB reserves address space, not disk: the file grows only as the index does.
_MAP_SIZE_BYTES = 1 << 40


class StoredLocation(NamedTuple):
    log_id: int
    offset: int
    length: int


class StoredLedgerState(NamedTuple):
    master_key: bytes
    fenced: bool
    deleted: bool
    lac: int
    explicit_lac: int | None


#: A ledger state as a checkpoint hands it to the index: the fields of
#: :class:`StoredLedgerState`, in order, in a plain tuple (a StoredLedgerState is one too).
#: The bookie makes one per changed ledger while adds wait for its lock, in C, which the
#: named tuple's constructor would not be.
StateRow = tuple[bytes, bool, bool, int, int | None]


def encode_ledger_state(state: StateRow) -> bytes:
    master_key, fenced, deleted, lac, explicit_lac = state
    flags = (FLAG_FENCED if fenced else 0) | (FLAG_DELETED if deleted else 0) | \
        (FLAG_EXPLICIT_LAC if explicit_lac is not None else 0)
    explicit = explicit_lac if explicit_lac is not None else -1
    return LEDGER_STATE.pack(flags, lac, explicit) + master_key


_deleted = operator.itemgetter(StoredLedgerState._fields.index("deleted"))


def deleted_ledgers_of(states: Mapping[int, StateRow]) -> Iterator[int]:
    """The ids of the deleted ledgers among ``states`` (in C)."""
    return itertools.compress(states, map(_deleted, states.values()))


def live_ledgers_of(states: Mapping[int, StateRow]) -> Iterator[int]:
    """The ids of the ledgers among ``states`` that are not deleted (in C)."""
    return itertools.compress(states, map(operator.not_, map(_deleted, states.values())))


def decode_ledger_state(value: bytes | memoryview) -> StoredLedgerState:
    flags, lac, explicit = LEDGER_STATE.unpack_from(value)
    return StoredLedgerState(
        master_key=bytes(value[LEDGER_STATE.size:]),
        fenced=bool(flags & FLAG_FENCED),
        deleted=bool(flags & FLAG_DELETED),
        lac=lac,
        explicit_lac=explicit if flags & FLAG_EXPLICIT_LAC else None,
    )


class Tombstones:
    """The ledger ids garbage collection may have forgotten: every id at or below
    :attr:`floor`, and, in each range of 2**FORGOTTEN_RANGE_BITS ids, every id at or
    below the highest one forgotten in that range (:attr:`ranges`).

    Guarantee: every id passed to :meth:`add` is covered from then on.  A forgotten id
    far above the ledger id generator's (a caller-chosen id, a promoted WAL's ledger)
    covers only its own range, not every id the generator hands out below it; at most
    FORGOTTEN_RANGES_MAX ranges are kept, the lowest folded into the floor past it."""

    __slots__ = ("floor", "ranges")

    def __init__(self, floor: int = -1, ranges: dict[int, int] | None = None) -> None:
        self.floor = floor
        #: range (``id >> FORGOTTEN_RANGE_BITS``) -> highest id forgotten in it.
        self.ranges: dict[int, int] = ranges if ranges is not None else {}

    def covers(self, ledger_id: int) -> bool:
        return ledger_id <= self.floor \
            or ledger_id <= self.ranges.get(ledger_id >> FORGOTTEN_RANGE_BITS, -1)

    def add(self, ledger_ids: Iterable[int]) -> None:
        ranges = self.ranges
        for ledger_id in ledger_ids:
            key = ledger_id >> FORGOTTEN_RANGE_BITS
            if ledger_id > ranges.get(key, -1):
                ranges[key] = ledger_id
        while len(ranges) > FORGOTTEN_RANGES_MAX:
            self.floor = max(self.floor, ranges.pop(min(ranges)))
        for key in [key for key, top in ranges.items() if top <= self.floor]:
            del ranges[key]  # the floor covers it

    def highest(self) -> int:
        """The highest id covered (-1: none)."""
        return max(self.floor, max(self.ranges.values(), default=-1))


class LocationUpdate(NamedTuple):
    ledger_id: int
    entry_id: int
    log_id: int
    offset: int
    length: int


class Index:
    """Entry locations and ledger states of one bookie."""

    def __init__(self, directory: str, read_only: bool = False,
                 beside_writer: bool = False) -> None:
        """Open (creating if missing) the index in ``directory``.

        ``read_only`` opens an existing index for reading only, without LMDB's reader
        lock table: for a caller that holds the bookie's directory lock (so no writer can
        run) and must not change the files (the offline tools).  With ``beside_writer``
        too, the reader registers in that table, as LMDB's readers in other processes of a
        running writer must (the writer then never reuses the pages a read transaction
        sees, and never waits for it).  lmdb.Error if the index or one of its tables is
        missing.
        """
        if read_only:
            self._env = lmdb.open(directory, map_size=_MAP_SIZE_BYTES, max_dbs=4,
                                  readonly=True, lock=beside_writer, create=False,
                                  readahead=False)
            if beside_writer:
                # Free the slots of readers killed inside a read transaction, which
                # would keep the writer from reusing the pages they saw.
                self._env.reader_check()
        else:
            os.makedirs(directory, exist_ok=True)
            self._env = lmdb.open(directory, map_size=_MAP_SIZE_BYTES, max_dbs=4,
                                  max_readers=256, readahead=False)
        try:
            self._entries, self._ledgers, self._meta = (
                self._env.open_db(name, create=not read_only)
                for name in (b"entries", b"ledgers", b"meta"))
            version = self.version()
            if version > INDEX_VERSION:
                raise BookKeeperError(f"the index in {directory} has format version "
                                      f"{version}, this pybk reads up to {INDEX_VERSION}")
            # Readers of a version 1 index (read-only: not upgraded) have no deleted table.
            self._deleted = (self._env.open_db(b"deleted", create=not read_only)
                             if version >= INDEX_VERSION or not read_only else None)
            if version < INDEX_VERSION and not read_only:
                self._upgrade()
        except BaseException:
            self._env.close()
            raise

    def version(self) -> int:
        """The format version of the tables (1 for an index written before it was kept)."""
        with self._env.begin(db=self._meta) as txn:
            value = txn.get(VERSION_KEY)
            return _VERSION.unpack(value)[0] if value else 1

    def _upgrade(self) -> None:
        """Version 1 to 2, in one transaction: fill the ``deleted`` table."""
        with self._env.begin(write=True) as txn:
            txn.cursor(db=self._deleted).putmulti(
                [(key, b"") for key, value in txn.cursor(db=self._ledgers)
                 if LEDGER_STATE.unpack_from(value)[0] & FLAG_DELETED])
            txn.put(VERSION_KEY, _VERSION.pack(INDEX_VERSION), db=self._meta)

    # -- reads -------------------------------------------------------------------

    def location(self, ledger_id: int, entry_id: int) -> StoredLocation | None:
        with self._env.begin(db=self._entries, buffers=True) as txn:
            value = txn.get(ENTRY_KEY.pack(ledger_id, entry_id))
            return StoredLocation._make(LOCATION.unpack(value)) if value is not None else None

    def last_entry_id(self, ledger_id: int) -> int | None:
        """The highest entry id indexed for a ledger."""
        with self._env.begin(db=self._entries, buffers=True) as txn:
            cursor = txn.cursor()
            if cursor.set_range(ENTRY_KEY.pack(ledger_id + 1, 0)):
                found = cursor.prev()
            else:
                found = cursor.last()
            if not found:
                return None
            key_ledger, key_entry = ENTRY_KEY.unpack(cursor.key())
            return key_entry if key_ledger == ledger_id else None

    def entry_ids(self, ledger_id: int) -> list[int]:
        ids = []
        with self._env.begin(db=self._entries, buffers=True) as txn:
            cursor = txn.cursor()
            if cursor.set_range(ENTRY_KEY.pack(ledger_id, 0)):
                for key in cursor.iternext(keys=True, values=False):
                    key_ledger, key_entry = ENTRY_KEY.unpack(key)
                    if key_ledger != ledger_id:
                        break
                    ids.append(key_entry)
        return ids

    def entry_ids_between(self, ledger_id: int, first: int, last: int) -> list[int]:
        """The entry ids indexed for a ledger from ``first`` to ``last``, ascending: a
        cursor over those held, whatever the range asked."""
        ids: list[int] = []
        if last < first:
            return ids
        with self._env.begin(db=self._entries, buffers=True) as txn:
            cursor = txn.cursor()
            if cursor.set_range(ENTRY_KEY.pack(ledger_id, first)):
                for key in cursor.iternext(keys=True, values=False):
                    key_ledger, key_entry = ENTRY_KEY.unpack(key)
                    if key_ledger != ledger_id or key_entry > last:
                        break
                    ids.append(key_entry)
        return ids

    def locations(self) -> Iterator[tuple[int, int, StoredLocation]]:
        """Every indexed entry as ``(ledger id, entry id, location)``, by ledger, then
        entry."""
        with self._env.begin(db=self._entries) as txn:
            for key, value in txn.cursor():
                yield (*ENTRY_KEY.unpack(key), StoredLocation._make(LOCATION.unpack(value)))

    def ledger_state(self, ledger_id: int) -> StoredLedgerState | None:
        with self._env.begin(db=self._ledgers, buffers=True) as txn:
            value = txn.get(LEDGER_KEY.pack(ledger_id))
            return decode_ledger_state(value) if value is not None else None

    def highest_ledger_id(self) -> int:
        """The highest ledger id with a state row (-1: none)."""
        with self._env.begin(db=self._ledgers) as txn:
            cursor = txn.cursor()
            return LEDGER_KEY.unpack(cursor.key())[0] if cursor.last() else -1

    def ledger_states(self) -> Iterator[tuple[int, StoredLedgerState]]:
        """Every ledger the bookie knows, deleted ones included."""
        with self._env.begin(db=self._ledgers) as txn:
            for key, value in txn.cursor():
                yield LEDGER_KEY.unpack(key)[0], decode_ledger_state(value)

    def deleted_ledgers(self) -> list[int]:
        """The ledgers whose deletion is committed and not yet forgotten."""
        if self._deleted is None:
            return [lid for lid, state in self.ledger_states() if state.deleted]
        with self._env.begin(db=self._deleted) as txn:
            return [LEDGER_KEY.unpack(key)[0]
                    for key in txn.cursor().iternext(keys=True, values=False)]

    def sizes(self) -> tuple[int, int]:
        """``(bytes used by the index's pages, ledger records)``; the ledger records
        include deleted ledgers' until garbage collection drops them."""
        with self._env.begin(db=self._ledgers) as txn:
            ledgers = txn.stat(self._ledgers)["entries"]
        used_pages = self._env.info()["last_pgno"] + 1
        return used_pages * self._env.stat()["psize"], ledgers

    def tombstones(self) -> Tombstones:
        """The tombstones of the ledgers :meth:`forget_ledgers` forgot."""
        with self._env.begin(db=self._meta) as txn:
            return self._tombstones(txn)

    def _tombstones(self, txn: lmdb.Transaction) -> Tombstones:
        floor = txn.get(FORGOTTEN_FLOOR_KEY, db=self._meta)
        if floor is None:  # written before the ranges (or nothing forgotten yet)
            highest = txn.get(FORGOTTEN_KEY, db=self._meta)
            return Tombstones(LEDGER_KEY.unpack(highest)[0] if highest else -1)
        ranges = {}
        cursor = txn.cursor(db=self._meta)
        if cursor.set_range(FORGOTTEN_RANGE_PREFIX):
            for key, value in cursor:
                key = bytes(key)
                if not key.startswith(FORGOTTEN_RANGE_PREFIX):
                    break
                ranges[LEDGER_KEY.unpack(key[len(FORGOTTEN_RANGE_PREFIX):])[0]] = \
                    LEDGER_KEY.unpack(value)[0]
        return Tombstones(_SIGNED_ID.unpack(floor)[0], ranges)

    def join_floor(self) -> int:
        """The join floor :meth:`record_join_floor` recorded (-1: none)."""
        with self._env.begin(db=self._meta) as txn:
            value = txn.get(JOIN_FLOOR_KEY)
            return _SIGNED_ID.unpack(value)[0] if value else -1

    def last_log_id(self) -> int:
        with self._env.begin(db=self._meta) as txn:
            value = txn.get(LAST_LOG_ID_KEY)
            return struct.unpack(">Q", value)[0] if value else 0

    # -- writes (each one durable transaction) -------------------------------------

    @staticmethod
    def location_items(ledger_id: int, entry_ids: Iterable[int], log_id: int,
                       offsets: Iterable[int], lengths: Iterable[int]
                       ) -> Iterator[tuple[bytes, bytes]]:
        """Encoded ``entries`` items for one ledger's records in one log (built in C)."""
        return Index.record_items(itertools.repeat(ledger_id), entry_ids, log_id, offsets,
                                  lengths)

    @staticmethod
    def record_items(ledger_ids: Iterable[int], entry_ids: Iterable[int], log_id: int,
                     offsets: Iterable[int], lengths: Iterable[int]
                     ) -> Iterator[tuple[bytes, bytes]]:
        """Encoded ``entries`` items for records of any ledgers in one log, one ledger id
        per record (built in C, whatever the number of ledgers)."""
        return zip(map(ENTRY_KEY.pack, ledger_ids, entry_ids),
                   map(LOCATION.pack, itertools.repeat(log_id), offsets, lengths))

    def commit_checkpoint(self, items: Iterable[tuple[bytes, bytes]],
                          states: dict[int, StateRow],
                          deleted: Iterable[int], last_log_id: int) -> None:
        """Point entries at their logs, store ledger states, drop deleted ledgers' entries.
        A ledger's ``deleted`` row follows its state: added with a deleted one (or a
        deletion in ``deleted``), removed with a live one.

        ``items`` come from :meth:`record_items`; a later item for the same key wins.
        """
        deleted = list(deleted)
        tombstones = sorted({*deleted, *deleted_ledgers_of(states)})
        with self._env.begin(write=True) as txn:
            _put_in_slices(txn.cursor(db=self._entries), iter(items))
            for ledger_id in deleted:
                self._delete_entries(txn, ledger_id)
            ordered = sorted(states)  # ints: cheaper to sort than (id, state) items
            # Encoded as LMDB takes them (a struct pack over columns in C costs as much
            # as this Python encoder: about 1 us a state either way).
            _put_in_slices(txn.cursor(db=self._ledgers), zip(map(LEDGER_KEY.pack, ordered), map(
                encode_ledger_state, map(states.__getitem__, ordered))))
            deletions = txn.cursor(db=self._deleted)
            rows = txn.stat(self._deleted)["entries"]
            if rows:
                # A live state of a ledger with a deletion row: a ledger forgotten and
                # made again whose deletion was replayed once more (a crash before its
                # LastLogMark).  Left there, the row would have the new ledger's entry
                # logs collected.  The smaller side is searched: the rows or the states
                # (an empty table, the usual case, costs nothing).
                live = list(map(LEDGER_KEY.pack, live_ledgers_of(states)))
                if rows < len(live):
                    wanted = set(live)
                    revived = [key for key in deletions.iternext(values=False)
                               if key in wanted]
                else:
                    revived = [key for key in live if deletions.set_key(key)]
                for key in revived:
                    txn.delete(key, db=self._deleted)
            deletions.putmulti([(LEDGER_KEY.pack(ledger_id), b"") for ledger_id in tombstones])
            txn.put(LAST_LOG_ID_KEY, struct.pack(">Q", last_log_id), db=self._meta)

    def _delete_entries(self, txn: lmdb.Transaction, ledger_id: int) -> None:
        cursor = txn.cursor(db=self._entries)
        if not cursor.set_range(ENTRY_KEY.pack(ledger_id, 0)):
            return
        while True:
            key = cursor.key()  # empty once the cursor ran off the end
            if len(key) != ENTRY_KEY.size or ENTRY_KEY.unpack(key)[0] != ledger_id:
                return
            cursor.delete()

    def forget_ledgers(self, ledger_ids: Iterable[int]) -> None:
        """Remove deleted ledgers' rows (``ledgers`` and ``deleted``), in one transaction:
        for ledgers no entry log holds any more, whose entries already left the index.
        The tombstones (:meth:`tombstones`) cover them from the same transaction on, so
        no crash separates forgetting a ledger from its tombstone."""
        ledger_ids = list(ledger_ids)
        with self._env.begin(write=True) as txn:
            for ledger_id in ledger_ids:
                key = LEDGER_KEY.pack(ledger_id)
                txn.delete(key, db=self._ledgers)
                txn.delete(key, db=self._deleted)
            tombstones = self._tombstones(txn)
            before = dict(tombstones.ranges)
            tombstones.add(ledger_ids)
            for range_key in before.keys() - tombstones.ranges.keys():
                txn.delete(FORGOTTEN_RANGE_PREFIX + LEDGER_KEY.pack(range_key),
                           db=self._meta)
            for range_key, top in tombstones.ranges.items():
                if before.get(range_key) != top:
                    txn.put(FORGOTTEN_RANGE_PREFIX + LEDGER_KEY.pack(range_key),
                            LEDGER_KEY.pack(top), db=self._meta)
            txn.put(FORGOTTEN_FLOOR_KEY, _SIGNED_ID.pack(tombstones.floor), db=self._meta)
            highest = tombstones.highest()
            if highest >= 0:
                txn.put(FORGOTTEN_KEY, LEDGER_KEY.pack(highest), db=self._meta)

    def record_join_floor(self, ledger_id: int) -> int:
        """Record the join floor, in one transaction, and return the one recorded:
        ``ledger_id`` if the index holds nothing (no ledger state, nothing forgotten),
        else -1.  A floor recorded before is kept whatever ``ledger_id`` is, unless it
        is still pending (:meth:`confirm_join_floor` was not called: the start that
        recorded it failed before the node joined): then it is raised to ``ledger_id``.
        Raising it is always safe (it only turns more "never had it" answers into
        "may have lost it"); a floor below ids the former disks of the bookie's id
        served after it was taken is not."""
        with self._env.begin(write=True, db=self._meta) as txn:
            stored = txn.get(JOIN_FLOOR_KEY)
            if stored is not None:
                floor = _SIGNED_ID.unpack(stored)[0]
                if floor >= 0 and ledger_id > floor \
                        and txn.get(JOIN_FLOOR_PENDING_KEY) is not None:
                    floor = ledger_id
                    txn.put(JOIN_FLOOR_KEY, _SIGNED_ID.pack(floor))
                return floor
            empty = (txn.stat(self._ledgers)["entries"] == 0
                     and txn.get(FORGOTTEN_KEY) is None)
            floor = ledger_id if empty else -1
            txn.put(JOIN_FLOOR_KEY, _SIGNED_ID.pack(floor))
            if floor >= 0:
                txn.put(JOIN_FLOOR_PENDING_KEY, b"")
            return floor

    def confirm_join_floor(self) -> None:
        """The node that recorded the join floor joined the cluster: keep it for good."""
        with self._env.begin(write=True, db=self._meta) as txn:
            txn.delete(JOIN_FLOOR_PENDING_KEY)

    def relocate(self, moves: Iterable[tuple[LocationUpdate, int, int]]) -> int:
        """Compaction's update: ``(new location, old log id, old offset)``.

        An entry is re-pointed only if the index still points at the old place (a newer
        write of the same entry, or a deletion, wins).  Returns how many moved.
        """
        moved = 0
        with self._env.begin(write=True, db=self._entries) as txn:
            for new, old_log_id, old_offset in moves:
                key = ENTRY_KEY.pack(new.ledger_id, new.entry_id)
                current = txn.get(key)
                if current is None:
                    continue
                log_id, offset, _length = LOCATION.unpack(current)
                if (log_id, offset) == (old_log_id, old_offset):
                    txn.put(key, LOCATION.pack(new.log_id, new.offset, new.length))
                    moved += 1
        return moved

    def close(self) -> None:
        self._env.close()


def _put_in_slices(cursor: lmdb.Cursor, items: Iterator[tuple[bytes, bytes]]) -> None:
    """Put ``items`` (lazy: LMDB consumes them in C) PUT_SLICE_ITEMS at a time.  One
    putmulti holds the GIL for its whole call, and a checkpoint's items (a second of adds,
    or a state per changed ledger) would keep the bookie's other threads, answering adds,
    waiting for tens of milliseconds."""
    while cursor.putmulti(itertools.islice(items, PUT_SLICE_ITEMS))[0] == PUT_SLICE_ITEMS:
        pass  # [0]: the items the slice held; a short slice was the last
