"""Record batches: many small log records in one ledger entry.

Format, version 1, integers big-endian::

    offset      size  field
    0           1     format version: 1
    1           4     record count n, unsigned, at least 1
    5           4*n   the length of each record, unsigned
    5 + 4*n     ...   the records' bytes, one after the other, nothing after them

The entry's digest already protects the bytes, so :func:`decode_batch` finding any
inconsistency means the entry was not written by a pybk log writer: it raises
:class:`~pybk.errors.CorruptData`.
"""

from __future__ import annotations

import struct
from typing import Sequence

from pybk.errors import CorruptData

VERSION = 1
_HEADER = struct.Struct(">BI")
_LENGTH = struct.Struct(">I")
assert _HEADER.size == 5, "a batch header is documented as 5 bytes"

#: Bytes a batch adds to its records: the header, then one length per record.
BATCH_HEADER_BYTES = _HEADER.size
RECORD_OVERHEAD_BYTES = _LENGTH.size


def encode_batch(records: Sequence[bytes]) -> bytes:
    """One entry holding ``records`` (at least one) in order."""
    return b"".join((_header(list(map(len, records))), *records))


def encode_batch_parts(lengths: Sequence[int], body: bytes | memoryview) -> bytes:
    """One entry holding records of ``lengths`` (at least one) whose bytes, one after the
    other, are ``body`` (as a column of values lies in an Arrow buffer)."""
    if sum(lengths) != len(body):
        raise ValueError(f"records of {sum(lengths)} bytes in all, in a body of {len(body)}")
    return b"".join((_header(lengths), body))


def _header(lengths: Sequence[int]) -> bytes:
    count = len(lengths)
    return _HEADER.pack(VERSION, count) + struct.pack(f">{count}I", *lengths)


def batch_lengths(data: bytes) -> tuple[tuple[int, ...], int]:
    """The lengths of the records of an entry :func:`encode_batch` made, and the offset
    of the first record's bytes (the others follow it); CorruptData otherwise."""
    if len(data) < _HEADER.size:
        raise CorruptData(f"log entry of {len(data)} bytes is shorter than a batch header")
    version, count = _HEADER.unpack_from(data)
    if version != VERSION:
        raise CorruptData(f"log entry in batch format {version}; this pybk reads {VERSION}")
    lengths_end = _HEADER.size + _LENGTH.size * count
    if count == 0 or lengths_end > len(data):
        raise CorruptData(f"log entry claims {count} records, which its "
                          f"{len(data)} bytes cannot hold")
    lengths = struct.unpack_from(f">{count}I", data, _HEADER.size)
    if lengths_end + sum(lengths) != len(data):
        raise CorruptData(f"log entry's record lengths add up to {sum(lengths)} bytes, "
                          f"its body holds {len(data) - lengths_end}")
    return lengths, lengths_end


def decode_batch(data: bytes) -> list[bytes]:
    """The records of an entry :func:`encode_batch` made; CorruptData otherwise."""
    lengths, offset = batch_lengths(data)
    view = memoryview(data)
    records = []
    for length in lengths:
        records.append(bytes(view[offset:offset + length]))
        offset += length
    return records
