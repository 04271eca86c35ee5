"""The write cache: entries acknowledged by the journal but not yet in an entry log.

Adds land here (and in the journal); the checkpoint takes the whole cache and writes it
to an entry log one ledger after the other, so a ledger's entries sit together.  Reads
look here first.  A cache is filled by one "active" generation while the previous one is
flushed.

Each ledger keeps its records exactly as an entry log stores them (record header, entry,
record header, entry, ... in arrival order; the record header is the one the journal
wrote), so the checkpoint hands a ledger's records to one ``writev`` without touching
them one by one.
"""

from __future__ import annotations

import itertools
from collections.abc import Set
from typing import Iterator, Sequence


class _LedgerRecords:
    __slots__ = ("entries", "buffers", "entry_ids", "last")

    def __init__(self) -> None:
        self.entries: dict[int, bytes] = {}
        self.buffers: list[bytes] = []   # header, entry, header, entry, ...
        self.entry_ids: list[int] = []   # one per record, in the same order
        self.last = -1


class WriteCache:
    """Entries by ledger id and entry id, with their byte count."""

    __slots__ = ("_ledgers", "size_bytes")

    def __init__(self) -> None:
        self._ledgers: dict[int, _LedgerRecords] = {}
        self.size_bytes = 0

    def put(self, ledger_id: int, entry_id: int, record_header: bytes, entry: bytes) -> None:
        """Add an entry with its record header (a later put of the same id wins)."""
        self.put_run(ledger_id, (entry_id,), (record_header,), (entry,))

    def put_run(self, ledger_id: int, entry_ids: Sequence[int],
                record_headers: Sequence[bytes], entries: Sequence[bytes]) -> None:
        """Add one ledger's entries with their record headers, in order (a later put of
        the same id wins): a few C-level operations for the whole run."""
        records = self._ledgers.get(ledger_id)
        if records is None:
            records = self._ledgers[ledger_id] = _LedgerRecords()
        records.entries.update(zip(entry_ids, entries))
        records.buffers += itertools.chain.from_iterable(zip(record_headers, entries))
        records.entry_ids += entry_ids
        last = max(entry_ids)
        if last > records.last:
            records.last = last
        self.size_bytes += sum(map(len, entries))

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        records = self._ledgers.get(ledger_id)
        return records.entries.get(entry_id) if records is not None else None

    def last_entry_id(self, ledger_id: int) -> int | None:
        records = self._ledgers.get(ledger_id)
        return records.last if records is not None else None

    def entry_ids(self, ledger_id: int) -> list[int]:
        records = self._ledgers.get(ledger_id)
        return list(records.entries) if records is not None else []

    def drop_ledger(self, ledger_id: int) -> None:
        records = self._ledgers.pop(ledger_id, None)
        if records is not None:
            self.size_bytes -= sum(map(len, records.buffers[1::2]))

    def ledger_ids(self) -> list[int]:
        return list(self._ledgers)

    def absorb(self, newer: "WriteCache") -> None:
        """Add every record of ``newer`` after this cache's own (newer records win)."""
        for ledger_id, entry_ids, buffers in newer.runs():
            for entry_id, header, entry in zip(entry_ids, buffers[0::2], buffers[1::2]):
                self.put(ledger_id, entry_id, header, entry)

    def runs(self, skip_ledgers: Set[int] = frozenset()) -> Iterator[tuple[int, list[int],
                                                                           list[bytes]]]:
        """``(ledger id, entry ids, record buffers)`` of each ledger, by ledger id.

        A re-added entry id appears twice; the later record is the one that counts.
        """
        for ledger_id in sorted(self._ledgers):
            if ledger_id not in skip_ledgers:
                records = self._ledgers[ledger_id]
                yield ledger_id, records.entry_ids, records.buffers
