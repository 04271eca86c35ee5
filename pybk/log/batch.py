"""Record batches: many small log records in one ledger entry.

A record is a value (bytes) with a timestamp (milliseconds since the Unix epoch, UTC),
an optional key (bytes) and headers (``(name, value)`` pairs, str and bytes, in order,
names may repeat), as a Kafka record has.  A log writer gathers records into batches,
one batch per entry.  This pybk writes version 2 and reads versions 1 and 2, so a log
written by an older pybk and appended to by this one holds both.  Integers are
big-endian.

Version 2::

    size       field
    1          format version: 2
    1          flags: bits 0-2, the code c of the timestamp deltas' width w (c = 0, 1,
               2, 3, 4: w = 0, 1, 2, 4, 8 bytes); bit 3 (K): the records have key
               fields; bit 4 (H): they have header fields; bits 5-7: 0
    4          record count n, unsigned, at least 1
    8          base timestamp: the smallest of the records' timestamps, signed
    8          max timestamp: at least the largest of the records' timestamps, and at
               least the max timestamp of every batch before it in the same ledger
               (the ledger's running maximum: see "Maxima" below), signed
    4*n        each record's value length, unsigned
    w*n        each record's timestamp delta, unsigned: its timestamp is the base
               timestamp plus its delta (with w = 0 every record has the base
               timestamp); the largest delta is at most the max timestamp minus the
               base
    4*n        if K: each record's key length, signed; -1: the record has no key
    2*n        if H: each record's header count, unsigned
    6*h        if H: each header's name length (2 bytes) and value length (4 bytes),
               unsigned, record by record and in each record's order (h: the sum of
               the counts)
    ...        the values, one after the other
    ...        if K: the keys, one after the other (a record without key has none)
    ...        if H: each header's name (UTF-8) then its value, in the order of their
               lengths; nothing after

The header is :data:`BATCH_HEADER_BYTES` (22) bytes.  A writer sets K only if a record
of the batch has a key, H only if one has headers, and takes the narrowest width that
holds the largest delta: a record without key or headers costs its value, 4 bytes of
length and 0 to 8 bytes of delta (0 when the batch's records share a millisecond, 1 or
2 when they were appended within 255 ms or 65 s of each other).  Whatever the number of
records, encoding and decoding are a few C-level passes (``struct`` formats repeated n
times, ``map``, ``bytes.join``); only keys and headers take a Python loop per record.
The values lie back to back (as in version 1), so a column of values is one slice of
the entry (:func:`batch_lengths`); the batch's time range is in its header
(:func:`batch_time_range`), so a search by time reads no record.

**Maxima.**  A writer gives each batch of a ledger the largest timestamp of that batch
and of the batches it wrote to the ledger before (:func:`encode_batch`'s ``max_floor``:
the max timestamp of the ledger's previous entry), so the max timestamps of a ledger's
entries never decrease with the entry id, whatever order the records' timestamps come
in.  A search by time (:mod:`pybk.log.timeindex`) bisects a ledger's entries on them:
every record before the first entry whose max is at least a time has a smaller
timestamp, and that entry holds a record at or after it.  The field is still an upper
bound of the batch's own timestamps, which is all a filter that prunes batches by time
needs (:func:`batch_time_range`); the largest timestamp of the batch itself is the base
plus the largest delta.  (The first pybk writing version 2 wrote each batch's own
maximum there: a ledger written by it reads the same.)  A ledger's creator says that
its entries carry running maxima in the ledger's custom metadata, when it creates it:
:data:`MAXIMA_KEY` = :data:`RUNNING_MAXIMA` (every pybk writer of record batches does:
a log writer's segments, a Spark task's ledgers).  A ledger's last header is trusted as
its largest timestamp, and its entries bisected, only where
:func:`keeps_running_maxima` says so: a tagged ledger, or a log writer's segment of a
pybk before the tag that kept running maxima already; the others (a Spark task's ledger
of an older executor, any other writer's) are read entry by entry: see
:mod:`pybk.log.timeindex`, "Untagged ledgers".

Version 1 (written by pybk before records had keys, timestamps and headers)::

    size       field
    1          format version: 1
    4          record count n, unsigned, at least 1
    4*n        each record's value length, unsigned
    ...        the values, one after the other, nothing after them

A version 1 record reads with no key (None), no headers (``()``) and no timestamp
(None): pybk did not keep when it was appended, and a time made up from its segment
(the ledger's creation time) would pass for one a search by time could trust.

Limits, checked when a record is appended (:func:`check_timestamp`,
:func:`check_fields`: :class:`~pybk.errors.InvalidRecord`, TypeError for a value of the
wrong type): timestamps from 0 to :data:`TIMESTAMP_MAX` (9999-12-31T23:59:59.999Z, the
largest Spark's timestamps hold; a time in micro- or nanoseconds is refused, not taken
for one thousands of years ahead); keys up to :data:`KEY_MAX_BYTES`; up to
:data:`HEADERS_MAX` headers a record, names up to :data:`HEADER_NAME_MAX_BYTES` in UTF-8
and values up to :data:`HEADER_VALUE_MAX_BYTES`.  A record's key and headers count in its
size, which ``recordMaxBytes`` bounds (:data:`RECORD_OVERHEAD_BYTES` and
:data:`FIELDS_OVERHEAD_BYTES` say what a batch adds per record).

The entry's digest already protects the bytes, so the decoders finding any
inconsistency means the entry was not written by a pybk log writer: they raise
:class:`~pybk.errors.CorruptData`.
"""

from __future__ import annotations

import operator
import struct
import time
from itertools import accumulate, chain, compress, repeat
from typing import Iterable, Mapping, NamedTuple, Sequence

from pybk.errors import CorruptData, InvalidRecord

VERSION = 2
VERSION_1 = 1
#: A record's headers: (name, value) pairs, in order.
Headers = tuple[tuple[str, bytes], ...]

_HEADER = struct.Struct(">BBIqq")
_HEADER_1 = struct.Struct(">BI")
assert _HEADER.size == 22, "a version 2 batch header is documented as 22 bytes"
assert _HEADER_1.size == 5, "a version 1 batch header is documented as 5 bytes"
#: Timestamp delta widths by code (flags bits 0-2), and their struct formats.
_WIDTHS = (0, 1, 2, 4, 8)
_DELTA_FORMATS = ("", "B", "H", "I", "Q")
_WIDTH_MASK = 0x07
_KEYS = 0x08
_HEADERS = 0x10
_NO_KEY = -1
_VERSION_BYTE, _VERSION_1_BYTE = bytes((VERSION,)), bytes((VERSION_1,))

TIMESTAMP_MAX = 253_402_300_799_999
KEY_MAX_BYTES = 64 * 1024
HEADERS_MAX = 1024
HEADER_NAME_MAX_BYTES = 1024
HEADER_VALUE_MAX_BYTES = 64 * 1024

#: Bytes a batch adds to its records: its header...
BATCH_HEADER_BYTES = _HEADER.size
#: ...then the most it adds per record without key or headers: a length, a delta at
#: the widest...
RECORD_OVERHEAD_BYTES = 4 + _WIDTHS[-1]
#: ...and, in a batch whose records have key or header fields, per record (with or
#: without key or headers): a key length and a header count.
FIELDS_OVERHEAD_BYTES = 4 + 2
#: A header's lengths (its name and value count on top).
HEADER_OVERHEAD_BYTES = 6
#: Ledger custom metadata keys (:mod:`pybk.meta.ledger_metadata`) of ledgers of record
#: batches.  The name of the log (UTF-8) whose ledger it is: on a log writer's segments
#: and a Spark task's ledgers, since each was first written.
LOG_NAME_KEY = "pybk.log"
#: The id of the job (ASCII) a Spark task's ledger was written for, since tasks wrote
#: ledgers: a ledger with LOG_NAME_KEY and without it is a log writer's segment.
JOB_KEY = "pybk.job"
#: Its value :data:`RUNNING_MAXIMA` says that the ledger's header maxima are running
#: maxima ("Maxima" above): every pybk writer of batches sets it, since the tag came in.
MAXIMA_KEY = "pybk.maxima"
RUNNING_MAXIMA = b"running"


def keeps_running_maxima(custom_metadata: Mapping[str, bytes], max_before: int | None
                         ) -> bool:
    """Whether the header maxima of a ledger with ``custom_metadata`` are running maxima
    ("Maxima" above), so that its last header is its largest timestamp and its entries
    can be bisected; ``max_before``: the max_before of the log segment the ledger is
    (:mod:`pybk.log.metadata`, "Maxima before"), None if unknown or if the ledger is no
    segment (yet: a job's ledger before its commit).  The one place that decides it:

    * tagged (:data:`MAXIMA_KEY` = :data:`RUNNING_MAXIMA`): its creator says so;
    * a log writer's segment (:data:`LOG_NAME_KEY`, no :data:`JOB_KEY`) whose
      max_before is known: only a LogWriter that kept running maxima made such a one
      (max_before and ``max_floor`` came in together, with head format 4; an older
      writer's segments keep max_before unknown), so a log upgraded from a pybk before
      the tag keeps its fast search and opens;
    * anything else is not trusted: a Spark task's ledger without the tag (an older
      executor wrote each batch's own max), a log writer's segment whose max_before is
      unknown (its records came before running maxima), a ledger of another writer."""
    if custom_metadata.get(MAXIMA_KEY) == RUNNING_MAXIMA:
        return True
    return (max_before is not None and LOG_NAME_KEY in custom_metadata
            and JOB_KEY not in custom_metadata)


def now_ms() -> int:
    """The wall-clock time in milliseconds since the epoch: an append's timestamp when
    its caller gives none."""
    return time.time_ns() // 1_000_000


# -- checks of what an append is given ---------------------------------------------------


def check_timestamp(timestamp: object) -> int:
    """``timestamp`` if it is an int from 0 to :data:`TIMESTAMP_MAX`; TypeError for
    another type, InvalidRecord outside those bounds."""
    if type(timestamp) is not int:
        if isinstance(timestamp, bool) or not isinstance(timestamp, int):
            raise TypeError(f"a record's timestamp is an int of milliseconds since the "
                            f"epoch, not {type(timestamp).__name__} ({timestamp!r})")
        timestamp = int(timestamp)
    if not 0 <= timestamp <= TIMESTAMP_MAX:
        raise InvalidRecord(f"timestamp {timestamp} is not a time in milliseconds since "
                            f"the epoch from 0 to {TIMESTAMP_MAX} (years 1970 to 9999; "
                            "one in micro- or nanoseconds is too large)")
    return timestamp


def check_fields(key: object, headers: object) -> tuple[bytes | None, Headers, int]:
    """A record's key and headers as a batch holds them (a bytes copy of a key given as
    a buffer, headers as a tuple of pairs), and the bytes they add to the record's
    size; TypeError for values of the wrong type, InvalidRecord past the limits."""
    size = 0
    if key is not None:
        key = _bytes(key, "key")
        if len(key) > KEY_MAX_BYTES:
            raise InvalidRecord(f"a key of {len(key)} bytes is over the {KEY_MAX_BYTES} "
                                "a record's key may have")
        size += len(key)
    pairs: Headers = ()
    if headers is not None:
        if isinstance(headers, (str, bytes, bytearray, memoryview)) \
                or not isinstance(headers, Iterable):
            raise TypeError("a record's headers are a sequence of (str, bytes) pairs, not "
                            f"{type(headers).__name__}")
        pairs = tuple(map(_header, headers))
        if len(pairs) > HEADERS_MAX:
            raise InvalidRecord(f"{len(pairs)} headers are over the {HEADERS_MAX} a record "
                                "may have")
        size += sum(HEADER_OVERHEAD_BYTES + len(name.encode("utf-8")) + len(value)
                    for name, value in pairs)
    return key, pairs, size


def _header(pair: object) -> tuple[str, bytes]:
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(f"a record's header is a (str, bytes) pair, not {pair!r}")
    name, value = pair
    if not isinstance(name, str):
        raise TypeError(f"a header's name is a str, not {type(name).__name__} ({name!r})")
    try:
        name_bytes = len(name.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise InvalidRecord(f"header name {name!r} is not encodable in UTF-8: {e}") from None
    if name_bytes > HEADER_NAME_MAX_BYTES:
        raise InvalidRecord(f"header name {name[:40]!r}... of {name_bytes} bytes is over the "
                            f"{HEADER_NAME_MAX_BYTES} a header's name may have")
    value = _bytes(value, f"value of header {name!r}")
    if len(value) > HEADER_VALUE_MAX_BYTES:
        raise InvalidRecord(f"header {name!r}'s value of {len(value)} bytes is over the "
                            f"{HEADER_VALUE_MAX_BYTES} a header's value may have")
    return name, value


def _bytes(value: object, what: str) -> bytes:
    if type(value) is bytes:
        return value
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"a record's {what} must be bytes, not {type(value).__name__}")
    return bytes(value)  # a snapshot: the caller may reuse its buffer


# -- encoding ------------------------------------------------------------------------------


def encode_batch(values: Sequence[bytes], timestamps: Sequence[int] | None = None,
                 keys: Sequence[bytes | None] | None = None,
                 headers: Sequence[Headers] | None = None,
                 max_floor: int | None = None) -> bytes:
    """One entry (version 2) holding the records of ``values`` (at least one) in
    order, with ``timestamps`` (None: all now), ``keys`` (None: none has a key) and
    ``headers`` (None: none has headers), as :func:`check_timestamp` and
    :func:`check_fields` give them (timestamps out of bounds raise InvalidRecord).
    ``max_floor``: the max timestamp of the ledger's previous entry (None for a
    ledger's first), which the batch's max timestamp is raised to ("Maxima" in the
    module docstring; :func:`batch_max` gives it back to chain the next batch)."""
    return b"".join((_header_bytes(list(map(len, values)), timestamps, keys, headers,
                                   max_floor=max_floor),
                     *values, *_field_bytes(keys, headers)))


def encode_batch_parts(lengths: Sequence[int], body: bytes | memoryview,
                       timestamp: int | None = None, max_floor: int | None = None) -> bytes:
    """One entry (version 2) holding records of ``lengths`` (at least one) whose bytes,
    one after the other, are ``body`` (as a column of values lies in an Arrow buffer),
    all with ``timestamp`` (None: now), without keys or headers; ``max_floor`` as for
    :func:`encode_batch`."""
    if sum(lengths) != len(body):
        raise ValueError(f"records of {sum(lengths)} bytes in all, in a body of {len(body)}")
    stamp = None if timestamp is None else check_timestamp(timestamp)
    return b"".join((_header_bytes(lengths, None, None, None, stamp, max_floor), body))


def batch_max(data: bytes) -> int:
    """The max timestamp in the header of a version 2 batch that this module encoded
    (the ``max_floor`` of the ledger's next batch)."""
    return int(_HEADER.unpack_from(data)[4])


def _header_bytes(lengths: Sequence[int], timestamps: Sequence[int] | None,
                  keys: Sequence[bytes | None] | None, headers: Sequence[Headers] | None,
                  stamp: int | None = None, max_floor: int | None = None) -> bytes:
    """Everything of a batch before its values; without ``timestamps``, every record
    has timestamp ``stamp`` (None: now); the max timestamp raised to ``max_floor``."""
    count = len(lengths)
    for what, column in (("timestamps", timestamps), ("keys", keys), ("headers", headers)):
        if column is not None and len(column) != count:
            raise ValueError(f"{len(column)} {what} for {count} records")
    if timestamps is None:
        base = top = now_ms() if stamp is None else stamp
    else:
        base, top = min(timestamps), max(timestamps)
        if base < 0 or top > TIMESTAMP_MAX:
            check_timestamp(base if base < 0 else top)
    span = top - base
    code = 0 if span == 0 else 1 if span < 1 << 8 else 2 if span < 1 << 16 \
        else 3 if span < 1 << 32 else 4
    flags = code | (_KEYS if keys is not None else 0) | (_HEADERS if headers is not None else 0)
    if max_floor is not None and max_floor > top:
        if not 0 <= max_floor <= TIMESTAMP_MAX:
            check_timestamp(max_floor)
        top = max_floor  # the ledger's running maximum (the deltas are already sized)
    head = struct.pack(f">BBIqq{count}I", VERSION, flags, count, base, top, *lengths)
    if code:
        assert timestamps is not None
        head += struct.pack(f">{count}{_DELTA_FORMATS[code]}",
                            *map(operator.sub, timestamps, repeat(base, count)))
    if keys is not None:
        head += struct.pack(f">{count}i", *(_NO_KEY if k is None else len(k) for k in keys))
    if headers is not None:
        head += struct.pack(f">{count}H", *map(len, headers))
        pairs = list(chain.from_iterable(headers))
        head += struct.pack(">" + "HI" * len(pairs), *chain.from_iterable(
            (len(name.encode("utf-8")), len(value)) for name, value in pairs))
    return head


def _field_bytes(keys: Sequence[bytes | None] | None,
                 headers: Sequence[Headers] | None) -> list[bytes]:
    """The keys' and headers' bytes of a batch, after its values."""
    parts: list[bytes] = []
    if keys is not None:
        parts.extend(filter(None, keys))  # a record without key (or an empty one): none
    if headers is not None:
        for name, value in chain.from_iterable(headers):
            parts += (name.encode("utf-8"), value)
    return parts


# -- decoding ------------------------------------------------------------------------------


class _Layout(NamedTuple):
    """Where the parts of a batch lie (see the module docstring)."""

    version: int
    flags: int
    base: int | None  # None: version 1
    top: int | None
    lengths: tuple[int, ...]
    deltas_at: int
    keys_at: int      # the key lengths
    counts_at: int    # the header counts
    header_count: int
    values_at: int


def _layout(data: bytes) -> _Layout:
    """The layout of an entry's batch, its lengths checked against its size;
    CorruptData otherwise."""
    if not data:
        raise CorruptData("log entry of 0 bytes is no record batch")
    version = data[0]
    if version == VERSION_1:
        if len(data) < _HEADER_1.size:
            raise CorruptData(f"log entry of {len(data)} bytes is shorter than a batch "
                              "header")
        _, count = _HEADER_1.unpack_from(data)
        flags, base, top, lengths_at = 0, None, None, _HEADER_1.size
    elif version == VERSION:
        if len(data) < _HEADER.size:
            raise CorruptData(f"log entry of {len(data)} bytes is shorter than a batch "
                              "header")
        _, flags, count, base, top = _HEADER.unpack_from(data)
        if flags & ~(_WIDTH_MASK | _KEYS | _HEADERS) or flags & _WIDTH_MASK >= len(_WIDTHS):
            raise CorruptData(f"log entry's batch flags {flags:#04x} are not version 2's")
        lengths_at = _HEADER.size
    else:
        raise CorruptData(f"log entry in batch format {version}; this pybk reads "
                          f"{VERSION_1} and {VERSION}")
    deltas_at = lengths_at + 4 * count
    keys_at = deltas_at + _WIDTHS[flags & _WIDTH_MASK] * count
    counts_at = keys_at + (4 * count if flags & _KEYS else 0)
    header_lengths_at = counts_at + (2 * count if flags & _HEADERS else 0)
    if count == 0 or header_lengths_at > len(data):
        raise CorruptData(f"log entry claims {count} records, which its "
                          f"{len(data)} bytes cannot hold")
    lengths = struct.unpack_from(f">{count}I", data, lengths_at)
    body = sum(lengths)
    if flags & _KEYS:
        key_lengths = struct.unpack_from(f">{count}i", data, keys_at)
        if min(key_lengths) < _NO_KEY:
            raise CorruptData(f"log entry holds a key length of {min(key_lengths)}")
        body += sum(key_lengths) + key_lengths.count(_NO_KEY)
    header_count = sum(struct.unpack_from(f">{count}H", data, counts_at)) \
        if flags & _HEADERS else 0
    values_at = header_lengths_at + HEADER_OVERHEAD_BYTES * header_count
    if values_at > len(data):
        raise CorruptData(f"log entry claims {header_count} headers, which its "
                          f"{len(data)} bytes cannot hold")
    if header_count:
        body += sum(struct.unpack_from(">" + "HI" * header_count, data, header_lengths_at))
    if values_at + body != len(data):
        raise CorruptData(f"log entry's record lengths add up to {body} bytes, its body "
                          f"holds {len(data) - values_at}")
    return _Layout(version, flags, base, top, lengths, deltas_at, keys_at, counts_at,
                   header_count, values_at)


def batch_lengths(data: bytes) -> tuple[tuple[int, ...], int]:
    """The value lengths of the records of an entry (either version), and the offset
    of the first record's value (the others follow it); CorruptData otherwise."""
    layout = _layout(data)
    return layout.lengths, layout.values_at


def batch_time_range(data: bytes) -> tuple[int, int] | None:
    """The smallest timestamp of an entry's records and an upper bound of the largest
    (its header's max: the ledger's running maximum, "Maxima" in the module docstring),
    from its header only; None for a version 1 batch (its records have none).  CorruptData if the
    entry starts with no batch header (its lengths are not checked: the decoders do)."""
    version = data[:1]
    if version == _VERSION_1_BYTE:
        return None
    if version != _VERSION_BYTE or len(data) < _HEADER.size:
        raise CorruptData(f"log entry of {len(data)} bytes starts with no record batch "
                          f"header of version {VERSION_1} or {VERSION}")
    _, _, _, base, top = _HEADER.unpack_from(data)
    return base, top


def decode_batch(data: bytes) -> list[bytes]:
    """The values of the records of an entry (either version); CorruptData otherwise."""
    layout = _layout(data)
    return _slices(data, layout.values_at, layout.lengths)


def _slices(data: bytes, start: int, lengths: Sequence[int]) -> list[bytes]:
    """The pieces of ``data`` of ``lengths``, one after the other from ``start``."""
    ends = list(accumulate(lengths, initial=start))
    return list(map(data.__getitem__, map(slice, ends, ends[1:])))


class BatchColumns(NamedTuple):
    """A batch as a reader that builds columns of its own (Arrow's) takes it, with no
    Python object per record: see :func:`batch_columns`."""

    lengths: tuple[int, ...]
    values_at: int
    #: The records' timestamps: ``base`` plus each one's delta, the ``deltas`` bytes
    #: holding them one after the other, unsigned big-endian, ``delta_width`` bytes each
    #: (0: no bytes, every delta is 0); ``base`` None for a version 1 batch.
    base: int | None
    delta_width: int
    deltas: bytes
    #: Whether the records have key fields (header fields): else none has a key
    #: (headers).
    keyed: bool
    with_headers: bool


def batch_columns(data: bytes) -> BatchColumns:
    """The value lengths and where the values start (as :func:`batch_lengths`), the
    timestamps' base and raw deltas, and whether the records have key and header fields
    (:func:`decode_fields` decodes those, and checks the deltas against the header);
    CorruptData otherwise."""
    layout = _layout(data)
    if layout.base is None:
        return BatchColumns(layout.lengths, layout.values_at, None, 0, b"", False, False)
    width = _WIDTHS[layout.flags & _WIDTH_MASK]
    return BatchColumns(layout.lengths, layout.values_at, layout.base, width,
                        data[layout.deltas_at:layout.keys_at],
                        bool(layout.flags & _KEYS), bool(layout.flags & _HEADERS))


class BatchFields(NamedTuple):
    """The records of a batch, field by field, each a sequence of the batch's length."""

    values: list[bytes]
    timestamps: Sequence[int | None]
    keys: Sequence[bytes | None]
    headers: Sequence[Headers]


def decode_fields(data: bytes) -> BatchFields:
    """Every field of the records of an entry (either version: a version 1 record has
    no timestamp, key nor headers); CorruptData otherwise."""
    layout = _layout(data)
    count = len(layout.lengths)
    values = _slices(data, layout.values_at, layout.lengths)
    if layout.base is None or layout.top is None:
        return BatchFields(values, [None] * count, [None] * count, [()] * count)
    code = layout.flags & _WIDTH_MASK
    timestamps: Sequence[int]
    if code:
        deltas = struct.unpack_from(f">{count}{_DELTA_FORMATS[code]}", data, layout.deltas_at)
        if max(deltas) > layout.top - layout.base:
            raise CorruptData(f"log entry's timestamps span {max(deltas)} ms, past its "
                              f"header's max, {layout.top - layout.base} ms after its base")
        timestamps = list(map(operator.add, deltas, repeat(layout.base, count)))
    elif layout.top < layout.base:
        raise CorruptData(f"log entry's records share timestamp {layout.base}, over its "
                          f"header's max {layout.top}")
    else:
        timestamps = [layout.base] * count
    at = layout.values_at + sum(layout.lengths)
    keys: Sequence[bytes | None] = [None] * count
    if layout.flags & _KEYS:
        key_lengths = struct.unpack_from(f">{count}i", data, layout.keys_at)
        present = list(map(operator.ne, key_lengths, repeat(_NO_KEY, count)))
        found = iter(_slices(data, at, list(compress(key_lengths, present))))
        keys = [next(found) if has else None for has in present]
        at += sum(compress(key_lengths, present))
    headers: Sequence[Headers] = [()] * count
    if layout.flags & _HEADERS:
        counts = struct.unpack_from(f">{count}H", data, layout.counts_at)
        lengths_at = layout.counts_at + 2 * count
        pieces = _slices(data, at, struct.unpack_from(">" + "HI" * layout.header_count,
                                                        data, lengths_at))
        try:
            pairs = list(zip(map(bytes.decode, pieces[::2]), pieces[1::2]))
        except UnicodeDecodeError as e:
            raise CorruptData(f"log entry holds a header name that is not UTF-8: {e}") \
                from None
        ends = list(accumulate(counts, initial=0))
        headers = list(map(tuple, map(pairs.__getitem__, map(slice, ends, ends[1:]))))
    return BatchFields(values, timestamps, keys, headers)
