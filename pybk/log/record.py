"""Records as readers return them with all their fields: :class:`Record`.

``LogReader.read()`` (and the WAL's) yields ``(position, value)`` pairs, as it always
did; ``records()`` and its kin yield :class:`Record` values: position, value, key,
timestamp and headers (:mod:`pybk.log.batch` says what a record holds, and what a
record of a version 1 batch reads as).
"""

from __future__ import annotations

from functools import partial
from operator import itemgetter
from typing import NamedTuple

from pybk.log.batch import Headers, decode_fields
from pybk.log.position import Position, positions

#: What ``read()`` yields: a record's position and value.
PositionedValue = tuple[Position, bytes]


class Record(NamedTuple):
    """A record of a log, with all its fields.

    ``key`` is None for a record appended without one (``b""`` is a key, an empty
    one); ``timestamp`` is in milliseconds since the epoch (the append's wall-clock
    time unless its caller gave one), None for a record an older pybk wrote (batch
    version 1); ``headers`` are ``(name, value)`` pairs in the order appended, ``()``
    for none."""

    position: Position
    value: bytes
    key: bytes | None
    timestamp: int | None
    headers: Headers


_new_record = partial(tuple.__new__, Record)  # Record._make without its checks
#: A record's ``(position, value)``, as a plain tuple.
position_and_value = itemgetter(0, 1)


def batch_records(segment: int, entry_id: int, data: bytes, first_slot: int = 0
                  ) -> list[Record]:
    """The records of entry ``entry_id`` of segment ``segment``, whose bytes are
    ``data`` (a record batch), from slot ``first_slot`` on; built by C-level passes
    (a Python-level constructor per record would cost more than decoding)."""
    fields = decode_fields(data)
    built = list(map(_new_record, zip(positions(segment, entry_id, len(fields.values)),
                                      fields.values, fields.keys, fields.timestamps,
                                      fields.headers)))
    return built[first_slot:] if first_slot else built
