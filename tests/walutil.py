"""Records of the WAL crash test, shared by the parent test and ``tests/wal_child.py``.

Every record says who wrote it, ``(round, thread, index)``, followed by a body derived
from those three numbers alone, so any record read back can be checked byte for byte.
"""

from __future__ import annotations

import hashlib
import os
import struct

from pybk.log import Position

_WHO = struct.Struct(">III")


def record(round_no: int, thread: int, index: int) -> bytes:
    """The one content of record (round, thread, index): 12 bytes to 16 KiB."""
    seed = hashlib.blake2b(_WHO.pack(round_no, thread, index), digest_size=16).digest()
    roll = int.from_bytes(seed[:8], "big")
    size = roll % 1024 if roll % 100 < 95 else roll % (16 * 1024)
    return _WHO.pack(round_no, thread, index) + hashlib.shake_128(seed).digest(size)


def who(data: bytes) -> tuple[int, int, int]:
    """``(round, thread, index)`` of a record; ValueError if its bytes are not exactly
    what :func:`record` makes for those numbers."""
    if len(data) < _WHO.size:
        raise ValueError(f"a record of {len(data)} bytes is too short")
    ids = _WHO.unpack_from(data)
    if record(*ids) != data:
        raise ValueError(f"record {ids} does not hold its own bytes")
    return ids


def acknowledged(acks_path) -> dict[Position, tuple[int, int, int]]:
    """What ``tests/wal_child.py`` wrote in its acknowledgement file: position ->
    ``(round, thread, index)`` of each acknowledged record."""
    acked = {}
    if os.path.exists(acks_path):
        for line in open(acks_path, encoding="ascii"):
            position, round_no, thread, index = line.split()
            acked[Position.parse(position)] = (int(round_no), int(thread), int(index))
    return acked
