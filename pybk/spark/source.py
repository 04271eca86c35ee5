"""The ``pybk`` data source: pybk logs as Spark DataFrames (PySpark's Python Data Source
API, ``pyspark.sql.datasource``).

Rows (:data:`SCHEMA`): ``log`` (the log's name), ``segment``, ``entry``, ``slot`` (the
record's :class:`~pybk.log.position.Position`), ``position`` (its text,
``"segment:entry:slot"``, as ``Position.parse`` reads it), ``value`` (the record's
value), ``key`` (binary, null for a record without key) and ``timestamp`` (Spark's
``timestamp``, from the record's milliseconds; null for a record of batch version 1,
which has none); with the option ``includeHeaders``, ``headers`` too
(:data:`HEADERS_COLUMN`: the record's headers in order, null for a record without).
``key``, ``timestamp`` and ``headers`` have the types Spark's Kafka source gives them.

Writes (:func:`check_write_schema`) take a DataFrame with a column ``value`` (binary,
or string written as UTF-8) and optionally ``key`` (binary or string, null: no key),
``timestamp`` (``timestamp``, or ``long`` milliseconds since the epoch; null: the time
of the write) and ``headers`` (as the read column; null or empty: none), in any order.

Which class does what:

================================  ==========================================
``spark.read``                    :class:`pybk.spark.batch_read.BatchReader`
``spark.readStream``              :class:`pybk.spark.stream_read.StreamReader`
``df.write``                      :class:`pybk.spark.batch_write.BatchWriter`
``df.writeStream``                :class:`pybk.spark.stream_write.StreamWriter`
================================  ==========================================

Spark builds the data source and calls these methods on the driver (in a planner
process), so options and the schema are checked there, before any task runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    LongType,
    StringType,
    StructType,
    TimestampType,
)

from pybk.errors import InvalidConfiguration
from pybk.spark.options import READ, STREAM_READ, STREAM_WRITE, WRITE, include_headers, parse

if TYPE_CHECKING:
    from pybk.spark.batch_read import BatchReader
    from pybk.spark.batch_write import BatchWriter
    from pybk.spark.stream_read import StreamReader
    from pybk.spark.stream_write import StreamWriter

NAME = "pybk"
SCHEMA = ("log string, segment long, entry long, slot int, position string, "
          "value binary, key binary, timestamp timestamp")
#: The column ``includeHeaders`` adds to :data:`SCHEMA`.
HEADERS_COLUMN = "headers array<struct<key: string, value: binary>>"
VALUE, KEY, TIMESTAMP, HEADERS = "value", "key", "timestamp", "headers"
#: The headers column's type, nullability aside.
_HEADERS_TYPE = "array<struct<key:string,value:binary>>"
#: What a write takes: each column's name, the types it may have, and how to say them.
_WRITE_COLUMNS: dict[str, tuple[tuple[type[DataType], ...], str]] = {
    VALUE: ((BinaryType, StringType), "binary or string (UTF-8)"),
    KEY: ((BinaryType, StringType), "binary or string (UTF-8)"),
    TIMESTAMP: ((TimestampType, LongType), "timestamp or long (milliseconds since the "
                                           "epoch)"),
    HEADERS: ((ArrayType,), "array<struct<key: string, value: binary>>"),
}


class PybkDataSource(DataSource):
    """Reads and writes pybk logs; options: :mod:`pybk.spark.options`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return f"{SCHEMA}, {HEADERS_COLUMN}" if include_headers(self.options) else SCHEMA

    def reader(self, schema: StructType) -> "BatchReader":
        opts = parse(self.options, READ)
        from pybk.spark.batch_read import reader
        return reader(opts)

    def streamReader(self, schema: StructType) -> "StreamReader":
        opts = parse(self.options, STREAM_READ)
        from pybk.spark.stream_read import StreamReader
        return StreamReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> "BatchWriter":
        opts = parse(self.options, WRITE)
        check_write_schema(schema)
        from pybk.spark.batch_write import BatchWriter
        return BatchWriter(opts, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> "StreamWriter":
        opts = parse(self.options, STREAM_WRITE)
        check_write_schema(schema)
        from pybk.spark.stream_write import StreamWriter
        return StreamWriter(opts, schema, overwrite)


def check_write_schema(schema: StructType) -> None:
    """Refuse a DataFrame to write unless it has a column ``value`` and its others are
    among ``key``, ``timestamp`` and ``headers``, each of a type the module docstring
    gives."""
    names = [f.name for f in schema.fields]
    others = [n for n in names if n not in _WRITE_COLUMNS]
    if VALUE not in names or others:
        raise InvalidConfiguration(
            f"the pybk data source writes a column {VALUE!r} (binary, or string written as "
            f"UTF-8) and optionally {KEY!r}, {TIMESTAMP!r} and {HEADERS!r}; this DataFrame "
            f"has {names}: select them, e.g. df.select(col(...).alias('value'))")
    for f in schema.fields:
        kinds, said = _WRITE_COLUMNS[f.name]
        kind = f.dataType
        if not isinstance(kind, kinds) \
                or (f.name == HEADERS and kind.simpleString() != _HEADERS_TYPE):
            raise InvalidConfiguration(
                f"column {f.name!r} is {kind.simpleString()}: the pybk data source writes "
                f"it as {said}; cast it, e.g. col({f.name!r}).cast(...)")
