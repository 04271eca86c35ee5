"""The write cache: entries acknowledged by the journal but not yet in an entry log.

Adds land here (and in the journal); the checkpoint takes the whole cache and writes it
to an entry log one ledger after the other, so a ledger's entries sit together.  Reads
look here first.  A cache is filled by one "active" generation while the previous one is
flushed.

Layout: one flat append buffer for the whole generation, whatever the number of
ledgers.  Record ``i`` (in arrival order) is ``headers[i]`` (the record header the
journal wrote) and ``entries[i]``, of ledger ``ledger_ids[i]`` and entry
``entry_ids[i]`` (two ``array('Q')``, as entry headers hold them: no Python object per
record).  Lookups go
through two dicts holding only ints, which the garbage collector does not track:
``(ledger id << 64 | entry id) -> record`` (the latest put of an entry id wins) and
``ledger id -> highest entry id``.  So an add appends to four sequences and sets two
dict slots, and neither a ledger nor an add leaves an object the collector must walk:
the cost of an add does not depend on how many ledgers the cache holds.  The checkpoint
groups the records by ledger with one stable sort (:meth:`WriteCache.records`).
"""

from __future__ import annotations

import itertools
import operator
from array import array
from collections.abc import Set
from typing import Iterable, Sequence

from pybk.fileio import Buffer


class WriteCache:
    """Entries by ledger id and entry id, with their byte count (see the module doc)."""

    __slots__ = ("_headers", "_entries", "_ledger_ids", "_entry_ids", "_records", "_last",
                 "_dropped", "size_bytes")

    def __init__(self) -> None:
        self._headers: list[bytes] = []
        self._entries: list[Buffer] = []
        self._ledger_ids = array("Q")
        self._entry_ids = array("Q")
        self._records: dict[int, int] = {}   # ledger id << 64 | entry id -> record
        self._last: dict[int, int] = {}      # ledger id -> highest entry id
        self._dropped: set[int] = set()      # records of dropped ledgers
        self.size_bytes = 0

    def put(self, ledger_id: int, entry_id: int, record_header: bytes, entry: bytes) -> None:
        """Add an entry with its record header (a later put of the same id wins)."""
        entries = self._entries
        self._ledger_ids.append(ledger_id)  # first: the one step that checks the ids
        self._entry_ids.append(entry_id)
        self._records[ledger_id << 64 | entry_id] = len(entries)
        entries.append(entry)
        self._headers.append(record_header)
        if entry_id > self._last.get(ledger_id, -1):
            self._last[ledger_id] = entry_id
        self.size_bytes += len(entry)

    def put_run(self, ledger_id: int, entry_ids: Sequence[int],
                record_headers: Sequence[bytes], entries: Sequence[Buffer],
                nbytes: int) -> None:
        """Add one ledger's entries (``nbytes`` in all) with their record headers, in
        order (a later put of the same id wins): a few C-level operations for the whole
        run.  The entries are kept as given (a server's are views of the message they
        came in, which they keep alive until the checkpoint lets go of this cache)."""
        first = len(self._entries)
        self._ledger_ids.extend(itertools.repeat(ledger_id, len(entry_ids)))
        self._entry_ids.extend(entry_ids)
        self._records.update(zip(map(operator.or_, itertools.repeat(ledger_id << 64),
                                     entry_ids), itertools.count(first)))
        self._entries += entries
        self._headers += record_headers
        last = max(entry_ids)
        if last > self._last.get(ledger_id, -1):
            self._last[ledger_id] = last
        self.size_bytes += nbytes

    def get(self, ledger_id: int, entry_id: int) -> Buffer | None:
        record = self._records.get(ledger_id << 64 | entry_id)
        return self._entries[record] if record is not None else None

    @property
    def entry_count(self) -> int:
        """Entries held (an entry put twice counts once)."""
        return len(self._records)

    def last_entry_id(self, ledger_id: int) -> int | None:
        return self._last.get(ledger_id)

    def entry_ids(self, ledger_id: int) -> list[int]:
        """The ledger's entry ids held, each once, in order of first arrival (a scan of
        the cache, in C)."""
        if ledger_id not in self._last:
            return []
        records: Iterable[int] = itertools.compress(itertools.count(),
                                                    map(ledger_id.__eq__, self._ledger_ids))
        if self._dropped:
            records = itertools.filterfalse(self._dropped.__contains__, records)
        return list(dict.fromkeys(map(self._entry_ids.__getitem__, records)))

    def entry_ids_between(self, ledger_id: int, first: int, last: int) -> list[int]:
        """The ledger's entry ids held from ``first`` to ``last``: a lookup per id of
        the range, or a scan of the cache when the range is longer than the cache holds
        records (so never more work than the cache's size, whatever range is asked)."""
        if ledger_id not in self._last or last < first:
            return []
        if last - first < len(self._records):
            key, records = ledger_id << 64, self._records
            return [e for e in range(first, last + 1) if key | e in records]
        return [e for e in self.entry_ids(ledger_id) if first <= e <= last]

    def drop_ledger(self, ledger_id: int) -> None:
        """Forget a ledger's records (a scan of the cache, in C, plus a step per record
        of the ledger); their slots stay, marked dropped, and hold no entry.  The bytes
        of entries that were views stay in :attr:`size_bytes` until this cache goes
        (their message may be kept alive by other ledgers' views of it)."""
        if self._last.pop(ledger_id, None) is None:
            return
        for record in itertools.compress(itertools.count(),
                                         map(ledger_id.__eq__, self._ledger_ids)):
            if record in self._dropped:
                continue  # an earlier incarnation's, dropped before
            self._dropped.add(record)
            # An entry put twice (a recovery's re-write) has one key for both records.
            self._records.pop(ledger_id << 64 | self._entry_ids[record], None)
            held = self._entries[record]
            # A view's bytes stay counted: other entries of its message (other ledgers')
            # may still keep the whole message alive, until the checkpoint lets go.
            if type(held) is not memoryview:
                self.size_bytes -= len(held)
            self._entries[record] = self._headers[record] = b""

    def ledger_ids(self) -> list[int]:
        return list(self._last)

    def absorb(self, newer: "WriteCache") -> None:
        """Add every record of ``newer`` after this cache's own (newer records win)."""
        first = len(self._entries)
        self._records.update(zip(newer._records, map(first.__add__,
                                                     newer._records.values())))
        self._entries += newer._entries
        self._headers += newer._headers
        self._ledger_ids += newer._ledger_ids
        self._entry_ids += newer._entry_ids
        self._dropped.update(map(first.__add__, newer._dropped))
        for ledger_id, last in newer._last.items():
            if last > self._last.get(ledger_id, -1):
                self._last[ledger_id] = last
        self.size_bytes += newer.size_bytes

    def records(self, skip_ledgers: Set[int] = frozenset()
                ) -> tuple[list[Buffer], list[int], list[tuple[int, int]]]:
        """Every record but those of ``skip_ledgers``, grouped by ledger, in arrival order
        within a ledger: ``(buffers, entry ids, runs)`` with ``buffers`` = record header,
        entry, record header, entry, ..., one entry id per record and ``runs`` = ``(ledger
        id, number of records)`` in order, as :func:`pybk.storage.checkpoint.flush_records`
        takes them.  A few C-level passes, and a stable sort by ledger id when some
        ledger's records are not already together, whatever the number of ledgers.  A
        re-added entry id appears twice; the later record is the one that counts.
        """
        ledger_ids = self._ledger_ids
        order: Iterable[int] | None = None  # the records to take, in order (None: all)
        runs = _runs(ledger_ids)
        if len(set(map(_first, runs))) < len(runs):
            order = sorted(range(len(ledger_ids)), key=ledger_ids.__getitem__)
            runs = _runs(list(map(ledger_ids.__getitem__, order)))
        if self._dropped or not skip_ledgers.isdisjoint(map(_first, runs)):
            taken = itertools.filterfalse(self._dropped.__contains__, range(
                len(ledger_ids)) if order is None else order)
            order = list(itertools.filterfalse(
                lambda record: ledger_ids[record] in skip_ledgers, taken))
            runs = _runs(list(map(ledger_ids.__getitem__, order)))
        if order is None:
            return (list(itertools.chain.from_iterable(zip(self._headers, self._entries))),
                    list(self._entry_ids), runs)
        return (list(itertools.chain.from_iterable(zip(
                    map(self._headers.__getitem__, order), map(self._entries.__getitem__, order)))),
                list(map(self._entry_ids.__getitem__, order)), runs)


_first = operator.itemgetter(0)


def _runs(ledger_ids: Sequence[int]) -> list[tuple[int, int]]:
    """``(ledger id, length)`` of each run of equal ledger ids (C-level passes)."""
    if not ledger_ids:
        return []
    starts = [0, *itertools.compress(itertools.count(1), map(
        operator.ne, ledger_ids, itertools.islice(ledger_ids, 1, None)))]
    lengths = map(operator.sub, itertools.chain(itertools.islice(starts, 1, None),
                                                (len(ledger_ids),)), starts)
    return list(zip(map(ledger_ids.__getitem__, starts), lengths))
