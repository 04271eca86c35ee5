"""The write cache: entries acknowledged by the journal but not yet in an entry log.

Adds land here (and in the journal); the checkpoint takes the whole cache, writes it to
an entry log sorted by ledger and entry, and points the index at it.  Reads look here
first.  A cache is filled by one "active" generation while the previous one is flushed.
"""

from __future__ import annotations

from pybk.storage.entrylog import CacheEntry


class WriteCache:
    """Entries by ledger id and entry id, with their byte count."""

    __slots__ = ("_ledgers", "_last", "size_bytes", "count")

    def __init__(self) -> None:
        self._ledgers: dict[int, dict[int, tuple[bytes, int]]] = {}
        self._last: dict[int, int] = {}
        self.size_bytes = 0
        self.count = 0

    def put(self, ledger_id: int, entry_id: int, data: bytes, crc: int) -> None:
        entries = self._ledgers.get(ledger_id)
        if entries is None:
            entries = self._ledgers[ledger_id] = {}
            self._last[ledger_id] = entry_id
        elif entry_id > self._last[ledger_id]:
            self._last[ledger_id] = entry_id
        previous = entries.get(entry_id)
        if previous is not None:
            self.size_bytes -= len(previous[0])
            self.count -= 1
        entries[entry_id] = (data, crc)
        self.size_bytes += len(data)
        self.count += 1

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        entries = self._ledgers.get(ledger_id)
        if entries is None:
            return None
        found = entries.get(entry_id)
        return found[0] if found is not None else None

    def last_entry_id(self, ledger_id: int) -> int | None:
        return self._last.get(ledger_id)

    def entry_ids(self, ledger_id: int) -> list[int]:
        return list(self._ledgers.get(ledger_id, ()))

    def drop_ledger(self, ledger_id: int) -> None:
        entries = self._ledgers.pop(ledger_id, None)
        if entries:
            self._last.pop(ledger_id, None)
            self.size_bytes -= sum(len(data) for data, _crc in entries.values())
            self.count -= len(entries)

    def sorted_entries(self, skip_ledgers: set[int] = frozenset()) -> list[CacheEntry]:
        """Every entry of the ledgers not in ``skip_ledgers``, by ledger id, then entry id.

        Items are plain ``(ledger id, entry id, data, crc)`` tuples (the checkpoint's hot
        loop; a named tuple costs several times more to build).
        """
        out: list[CacheEntry] = []
        for ledger_id in sorted(self._ledgers):
            if ledger_id in skip_ledgers:
                continue
            entries = self._ledgers[ledger_id]
            out.extend([(ledger_id, entry_id, data, crc)
                        for entry_id, (data, crc) in sorted(entries.items())])
        return out
