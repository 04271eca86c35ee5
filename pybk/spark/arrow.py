"""Rows of the ``pybk`` data source as Arrow record batches, built from whole log entries.

A task reads a range of a segment (:func:`pybk.log.ranges.read_entries`) and turns its
entries into :class:`pyarrow.RecordBatch` values of the source's schema
(:data:`pybk.spark.source.SCHEMA`) without making a Python object per record: a log
entry is a record batch (:mod:`pybk.log.batch`) whose records lie back to back after
its lengths, so the ``value`` column's data is the entries' record bytes joined, and its
offsets come from the lengths.  ``position`` is formatted by Arrow's compute kernels.

Measured against yielding one tuple per record (which PySpark then converts to Arrow
itself), 1 KiB values, 2-core machine: turning entries into Arrow batches in one
process, 3.9 M rows/s against 0.69 M rows/s for tuples and PySpark's conversion (5.6x);
a whole ``count(*), sum(length(value))`` job over 200,000 records on three local bookie
processes (``local[2]``, sharing the two cores with the bookies), 87-98 MiB/s against
62-80 MiB/s (reading from the bookies bounds both).

A batch is emitted once it holds :data:`BATCH_ROWS_MAX` rows or
:data:`BATCH_BYTES_MAX` bytes of values (a larger entry makes one batch of its own), so a
task's memory stays about one batch plus the read-ahead.
"""

from __future__ import annotations

from array import array
from itertools import accumulate
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from pybk.log.batch import batch_lengths
from pybk.log.ranges import ReadRange, slots

#: Rows and value bytes at which a record batch is emitted.
BATCH_ROWS_MAX = 8192
BATCH_BYTES_MAX = 16 * 1024 * 1024

#: The Arrow schema of :data:`pybk.spark.source.SCHEMA` (Spark checks batches against it).
ARROW_SCHEMA = pa.schema([("log", pa.string()), ("segment", pa.int64()),
                          ("entry", pa.int64()), ("slot", pa.int32()),
                          ("position", pa.string()), ("value", pa.binary())])


class _Builder:
    """The columns of one record batch as it fills."""

    def __init__(self) -> None:
        self.entries = array("q")
        self.slots = array("i")
        self.offsets = array("i", [0])
        self.chunks: list[memoryview] = []

    @property
    def rows(self) -> int:
        return len(self.slots)

    @property
    def value_bytes(self) -> int:
        return self.offsets[-1]

    def add(self, entry_id: int, data: bytes, first: int, end: int,
            lengths: tuple[int, ...], body: int) -> None:
        """Slots ``first..end-1`` of an entry whose records have ``lengths``, starting at
        byte ``body``."""
        starts = list(accumulate(lengths[:end], initial=body))
        base = self.offsets[-1] - starts[first]
        self.offsets.extend(s + base for s in starts[first + 1:end + 1])
        self.chunks.append(memoryview(data)[starts[first]:starts[end]])
        self.entries.extend([entry_id] * (end - first))
        self.slots.extend(range(first, end))

    def batch(self, log: str, segment: int) -> pa.RecordBatch:
        n = self.rows
        values = pa.Array.from_buffers(pa.binary(), n, [
            None, pa.py_buffer(self.offsets), pa.py_buffer(b"".join(self.chunks))])
        entries = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(self.entries)])
        slot_column = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(self.slots)])
        segments = pa.Array.from_buffers(pa.int64(), n,
                                         [None, pa.py_buffer(array("q", [segment]) * n)])
        positions = pc.binary_join_element_wise(
            pc.cast(segments, pa.string()), pc.cast(entries, pa.string()),
            pc.cast(slot_column, pa.string()), ":")
        logs = pa.repeat(pa.scalar(log, pa.string()), n)
        return pa.RecordBatch.from_arrays(
            [logs, segments, entries, slot_column, positions, values], schema=ARROW_SCHEMA)


def record_batches(log: str, r: ReadRange,
                   entries: Iterable[tuple[int, bytes]]) -> Iterator[pa.RecordBatch]:
    """The rows of range ``r`` of log ``log`` from its ``entries`` (entry id, bytes), in
    position order, as record batches of :data:`ARROW_SCHEMA`."""
    builder = _Builder()
    for entry_id, data in entries:
        lengths, body = batch_lengths(data)
        first, end = slots(r, entry_id, len(lengths))
        if first >= end:
            continue
        builder.add(entry_id, data, first, end, lengths, body)
        if builder.rows >= BATCH_ROWS_MAX or builder.value_bytes >= BATCH_BYTES_MAX:
            yield builder.batch(log, r.segment)
            builder = _Builder()
    if builder.rows:
        yield builder.batch(log, r.segment)
