"""Logs of many segments, built cheaply for tests and benchmarks.

A metadata store writes each record in a synced transaction of its own (about 0.5 ms in
the embedded store on these machines), so 40,000 segments made the ordinary way would
take 40,000 ledger creations and rolls.  :class:`Forge` writes records straight into a
*closed* embedded store's LMDB environment, all in one transaction, in the layout
:mod:`pybk.meta.embedded` documents; :func:`forge_segments` appends empty segments to a
log that way, and :func:`forge_format_1` writes a log's record as pybk did before format
2.  The benchmark ``benchmarks/log_segments_bench.py`` uses them too.
"""

from __future__ import annotations

import dataclasses
import struct

import lmdb

from pybk.log.batch import LOG_NAME_KEY
from pybk.log.metadata import (
    MAGIC,
    TAIL_SEGMENTS,
    LogMetadata,
    Segment,
    SegmentRecord,
    log_path,
    segment_path,
    segments_path,
)
from pybk.meta import paths
from pybk.meta.layout import FLAT
from pybk.meta.ledger_metadata import (
    DigestType,
    Fragment,
    LedgerMetadata,
    LedgerState,
    hash_password,
)
from pybk.meta.sealed import seal

_RECORD = struct.Struct(">QB")   # version, flags: the embedded store's record header
_U64 = struct.Struct(">Q")
_NEXT_LEDGER_ID_KEY = b"next_ledger_id"


def _key(path: str) -> bytes:
    parent, name = paths.split(path)
    return parent.encode() + b"\0" + name.encode()


class Forge:
    """One write transaction on the records of the closed embedded store in
    ``directory`` (a context manager: committed on a clean exit)."""

    def __init__(self, directory: str) -> None:
        self._env = lmdb.open(str(directory), max_dbs=3, map_size=1 << 36)
        self._records = self._env.open_db(b"records")
        self._meta = self._env.open_db(b"meta")
        self._txn = self._env.begin(write=True)

    def get(self, path: str) -> bytes | None:
        value = self._txn.get(_key(path), db=self._records)
        return None if value is None else bytes(value[_RECORD.size:])

    def put(self, path: str, data: bytes) -> None:
        """Create or replace the record (and create its missing ancestors)."""
        for ancestor in paths.ancestors(path):
            if self._txn.get(_key(ancestor), db=self._records) is None:
                self._txn.put(_key(ancestor), _RECORD.pack(0, 0), db=self._records)
        old = self._txn.get(_key(path), db=self._records)
        version = 0 if old is None else _RECORD.unpack_from(old)[0] + 1
        self._txn.put(_key(path), _RECORD.pack(version, 0) + data, db=self._records)

    def delete_children(self, path: str) -> None:
        """Delete the records just below ``path`` (which have no children)."""
        prefix = path.encode() + b"\0"
        cursor = self._txn.cursor(db=self._records)
        if cursor.set_range(prefix):
            while cursor.key().startswith(prefix):
                if not cursor.delete():
                    break

    def ledger_ids(self, count: int) -> range:
        """``count`` ledger ids the store has not handed out (it will not either)."""
        first = _U64.unpack(self._txn.get(_NEXT_LEDGER_ID_KEY, db=self._meta))[0]
        self._txn.put(_NEXT_LEDGER_ID_KEY, _U64.pack(first + count), db=self._meta)
        return range(first, first + count)

    def __enter__(self) -> "Forge":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                self._txn.commit()
            else:
                self._txn.abort()
        finally:
            self._env.close()


def empty_ledger(ledger_id: int, bookie_id: str, log_name: str) -> LedgerMetadata:
    """A closed ledger without entries, as a log's writer makes one (E=Qw=Qa=1)."""
    return LedgerMetadata(
        ledger_id=ledger_id, ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
        fragments=(Fragment(0, (bookie_id,)),), digest_type=DigestType.CRC32C,
        password_hash=hash_password(b""), state=LedgerState.CLOSED, last_entry_id=-1,
        length=0, custom_metadata={LOG_NAME_KEY: log_name.encode()})


def forge_segments(directory: str, name: str, count: int, bookie_id: str,
                   with_ledgers: range | None = None) -> LogMetadata:
    """Append ``count`` empty segments to log ``name`` (format 2) in the closed embedded
    store in ``directory``: their segment records, their closed empty ledgers on
    ``bookie_id`` (only for the segments numbered in ``with_ledgers``, if given: the
    others name ledger ids no ledger has, which is enough for segments nobody opens),
    and the head with the newest of them as its tail.  Returns the new head."""
    with Forge(directory) as forge:
        head = LogMetadata.from_bytes(forge.get(log_path(name)))
        first = head.next_segment
        ledger_ids = forge.ledger_ids(count)
        for number, ledger_id in zip(range(first, first + count), ledger_ids):
            forge.put(segment_path(name, number), SegmentRecord(number, ledger_id).to_bytes())
            if with_ledgers is None or number in with_ledgers:
                forge.put(FLAT.ledger_path(ledger_id),
                          empty_ledger(ledger_id, bookie_id, name).to_bytes())
        new = tuple(Segment(first + i, ledger_ids[i]) for i in range(count))
        head = dataclasses.replace(head, tail=(head.tail + new)[-TAIL_SEGMENTS:],
                                   next_segment=first + count)
        forge.put(log_path(name), head.to_bytes())
    return head


def format_1_record(name: str, segments: list[Segment], next_segment: int) -> bytes:
    """Log ``name``'s record in format 1, as pybk wrote it before format 2: the whole
    list of segments in one record (nothing truncated, nothing being deleted)."""
    return seal(MAGIC, 1, {"name": name,
                           "segments": [[s.number, s.ledger_id] for s in segments],
                           "next_segment": next_segment, "truncated_before": [0, 0, 0],
                           "deleting": []})


def forge_format_1(directory: str, name: str, segments: list[Segment], bookie_id: str,
                   fill_bytes: int) -> bytes:
    """Make log ``name`` of the closed embedded store in ``directory`` a format-1 log of
    ``segments`` followed by as many empty segments (closed empty ledgers on
    ``bookie_id``) as its record can take without passing ``fill_bytes``; its segment
    records are deleted (format 1 had none).  Returns the record."""
    first = segments[-1].number + 1
    with Forge(directory) as forge:
        # Each [number, ledger id] takes 16 bytes or more (ids have 7 digits or more).
        ledger_ids = forge.ledger_ids(fill_bytes // 16)

        def record(count: int) -> bytes:
            forged = [Segment(first + i, ledger_ids[i]) for i in range(count)]
            return format_1_record(name, segments + forged, first + count)

        low, high = 0, len(ledger_ids)  # the most that fit is in [low, high)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if len(record(middle)) <= fill_bytes else (low, middle)
        forged = [Segment(first + i, ledger_ids[i]) for i in range(low)]
        for segment in forged:
            forge.put(FLAT.ledger_path(segment.ledger_id),
                      empty_ledger(segment.ledger_id, bookie_id, name).to_bytes())
        forge.delete_children(segments_path(name))
        data = record(low)
        forge.put(log_path(name), data)
    return data
