"""The ``pybk`` data source: pybk logs as Spark DataFrames (PySpark's Python Data Source
API, ``pyspark.sql.datasource``).

Rows (:data:`SCHEMA`): ``log`` (the log's name), ``segment``, ``entry``, ``slot`` (the
record's :class:`~pybk.log.position.Position`), ``position`` (its text,
``"segment:entry:slot"``, as ``Position.parse`` reads it) and ``value`` (the record).
Writes take a DataFrame with one column, ``value``: binary, or string written as UTF-8.

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
from pyspark.sql.types import BinaryType, StringType, StructType

from pybk.errors import InvalidConfiguration
from pybk.spark.options import READ, STREAM_READ, STREAM_WRITE, WRITE, parse

if TYPE_CHECKING:
    from pybk.spark.batch_read import BatchReader
    from pybk.spark.batch_write import BatchWriter
    from pybk.spark.stream_read import StreamReader
    from pybk.spark.stream_write import StreamWriter

NAME = "pybk"
SCHEMA = ("log string, segment long, entry long, slot int, position string, "
          "value binary")
VALUE = "value"


class PybkDataSource(DataSource):
    """Reads and writes pybk logs; options: :mod:`pybk.spark.options`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

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
    """Refuse a DataFrame to write unless its one column is ``value``, binary or
    string."""
    names = [f.name for f in schema.fields]
    if names != [VALUE]:
        raise InvalidConfiguration(
            f"the pybk data source writes one column, {VALUE!r} (binary, or string written "
            f"as UTF-8); this DataFrame has {names}: select it, e.g. "
            "df.select(col(...).alias('value'))")
    kind = schema.fields[0].dataType
    if not isinstance(kind, (BinaryType, StringType)):
        raise InvalidConfiguration(
            f"column {VALUE!r} is {kind.simpleString()}: the pybk data source writes binary "
            "or string (UTF-8) values; cast it, e.g. col('value').cast('binary') or "
            "to_json(...)")
