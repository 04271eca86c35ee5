"""Records with keys, timestamps and headers in Spark (pybk.spark): the source's ``key``,
``timestamp`` and (with ``includeHeaders``) ``headers`` columns, the sinks' columns of
the same names, version 1 records (null key and timestamp), write schemas refused on the
driver, and pushdown of ``timestamp`` and ``key`` filters (entries skipped, rows exact).

Real Spark in local mode (the worker's shared session); logs of a cluster (a real
ZooKeeper and three bookie processes) and of WAL directories (their own metadata store).
"""

from __future__ import annotations

import contextlib
import datetime
import uuid

import pytest
from pyspark.sql import types as T
from recordutil import write_version_1

import pybk
from pybk.errors import InvalidConfiguration
from pybk.log import Position
from pybk.spark import arrow
from pybk.spark.batch_read import FilteringBatchReader
from pybk.spark.options import READ, parse
from pybk.spark.source import check_write_schema

pytestmark = pytest.mark.timeout(300)

UTC = datetime.UTC
#: Rows of every kind: key or none, string or binary, headers or none (repeated names
#: too), timestamps out of order.
ROWS = [
    (b"k1", b"v0", datetime.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC),
     [("h", b"x"), ("h", b"y")]),
    (None, b"v1", datetime.datetime(2025, 12, 31, 23, 59, 59, 999000, tzinfo=UTC), None),
    (b"", b"", datetime.datetime(1970, 1, 1, tzinfo=UTC), [("empty", b"")]),
    (b"k1", bytes(range(256)), datetime.datetime(2026, 1, 2, 3, 4, 5, 7000, tzinfo=UTC),
     None),
]
FIELDS = "key binary, value binary, timestamp timestamp, " \
         "headers array<struct<key: string, value: binary>>"


@pytest.fixture(params=["cluster", "wal"])
def where(request, tmp_path, address):
    """Options naming a new log: of the cluster (ZooKeeper's metadata store), or of a
    new WAL directory (its own metadata store); and a second one to copy to.  (The
    module's cluster is asked for either way: a module fixture set up inside a test
    would leave its threads to the test.)"""
    if request.param == "cluster":
        run = uuid.uuid4().hex[:8]
        return ({"metadataServiceUri": address, "log": f"records-{run}"},
                {"metadataServiceUri": address, "log": f"copy-{run}"})
    return {"path": str(tmp_path / "wal")}, {"path": str(tmp_path / "copy")}


def _read(spark, options, **more):
    return spark.read.format("pybk").options(**options, **more).load()


def _fields(rows) -> list[tuple]:
    """Rows as (key, value, timestamp, headers), in ROWS' types."""
    return [(None if r.key is None else bytes(r.key), bytes(r.value), r.timestamp,
             None if r.headers is None else [(h.key, bytes(h.value)) for h in r.headers])
            for r in rows]


def _utc(rows: list[tuple]) -> list[tuple]:
    """ROWS as collected: Spark gives timestamps in the session's zone, without one."""
    return [(k, v, t.astimezone(UTC).replace(tzinfo=None) if t else t, h)
            for k, v, t, h in rows]


@pytest.fixture
def utc_session(spark):
    """The shared session with its time zone UTC (conftest leaves it as found)."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return spark


def test_key_value_timestamp_and_headers_are_written_and_read_back_equal_batch_and_stream(
        utc_session, where, tmp_path):
    spark = utc_session
    source, copy = where
    df = spark.createDataFrame(ROWS, FIELDS).repartition(1)
    df.write.format("pybk").options(**source).mode("append").save()
    with_headers = _read(spark, source, includeHeaders="true")
    assert _fields(with_headers.collect()) == _utc(ROWS)
    plain = _read(spark, source)  # headers only with includeHeaders
    assert "headers" not in plain.columns
    assert [(bytes(r.key) if r.key is not None else None, r.timestamp)
            for r in plain.collect()] == [(k, t) for k, _, t, _ in _utc(ROWS)]
    # A streaming query copies them (string keys written as UTF-8 on the way).
    stream = (spark.readStream.format("pybk").options(**source)
              .option("startingPosition", "earliest").option("includeHeaders", True).load()
              .selectExpr("cast(key as string) as key", "value", "timestamp", "headers"))
    (stream.writeStream.format("pybk").options(**copy).option("sinkId", "copy")
     .option("checkpointLocation", str(tmp_path / "checkpoint"))
     .trigger(availableNow=True).start().awaitTermination(120))
    assert _fields(_read(spark, copy, includeHeaders=True).collect()) == _utc(ROWS)


def test_long_timestamps_null_timestamps_and_no_fields_columns(utc_session, tmp_path):
    spark = utc_session
    options = {"path": str(tmp_path / "wal")}
    before = datetime.datetime.now(UTC).replace(tzinfo=None)
    (spark.createDataFrame([("a", 1_700_000_000_123), ("b", None)], "value string, timestamp long")
     .repartition(1).write.format("pybk").options(**options).mode("append").save())
    spark.createDataFrame([("c",)], "value string").write.format("pybk").options(
        **options).mode("append").save()
    rows = _read(spark, options).collect()
    assert [bytes(r.value) for r in rows] == [b"a", b"b", b"c"]
    assert rows[0].timestamp == datetime.datetime(2023, 11, 14, 22, 13, 20, 123000)
    after = datetime.datetime.now(UTC).replace(tzinfo=None)
    # A null timestamp, or none given: the time of the write.
    assert all(before - datetime.timedelta(seconds=1) <= r.timestamp <= after for r in rows[1:])
    assert {r.key for r in rows} == {None}


@pytest.mark.parametrize("row, match", [
    ((b"v", [None]), "column headers holds a null header"),
    ((b"v", [(None, b"x")]), "a header's name is a str, not NoneType"),
])
def test_a_row_the_log_cannot_hold_fails_the_write_naming_what_is_wrong(
        spark, tmp_path, row, match):
    df = spark.createDataFrame([row], "value binary, "
                                      "headers array<struct<key: string, value: binary>>")
    with pytest.raises(Exception, match=match):
        df.write.format("pybk").mode("append").save(str(tmp_path / "wal"))


def test_version_1_records_read_with_null_key_and_timestamp(spark, tmp_path, monkeypatch):
    directory = str(tmp_path / "wal")
    with contextlib.closing(pybk.open(directory)) as wal:
        with monkeypatch.context() as old_pybk:
            write_version_1(old_pybk)
            old = wal.append(b"from an older pybk")
        new = wal.append(b"from this one", key=b"k", timestamp=1_000)
    rows = spark.read.format("pybk").option("includeHeaders", True).load(directory).collect()
    assert [(Position(r.segment, r.entry, r.slot), bytes(r.value), r.key, r.timestamp,
             r.headers) for r in rows][0] == (old, b"from an older pybk", None, None, None)
    assert (Position.parse(rows[1].position), bytes(rows[1].key)) == (new, b"k")
    assert rows[1].timestamp is not None


def _struct(**columns):
    return T.StructType([T.StructField(name, kind) for name, kind in columns.items()])


HEADERS = T.ArrayType(T.StructType([T.StructField("key", T.StringType()),
                                    T.StructField("value", T.BinaryType())]))


@pytest.mark.parametrize("schema, match", [
    (_struct(value=T.BinaryType(), extra=T.IntegerType()),
     r"writes a column 'value'.*optionally 'key', 'timestamp'"),
    (_struct(key=T.BinaryType()), r"writes a column 'value'"),
    (_struct(value=T.BinaryType(), key=T.IntegerType()), r"column 'key' is int: .*binary"),
    (_struct(value=T.BinaryType(), timestamp=T.StringType()),
     r"column 'timestamp' is string: .*timestamp or long"),
    (_struct(value=T.BinaryType(), headers=T.ArrayType(T.StructType([
        T.StructField("key", T.StringType()), T.StructField("value", T.StringType())]))),
     r"column 'headers' is array<struct<key:string,value:string>>"),
    (_struct(value=T.BinaryType(), headers=T.MapType(T.StringType(), T.BinaryType())),
     r"column 'headers' is map<string,binary>"),
])
def test_write_columns_of_other_names_or_types_are_refused_clearly(schema, match):
    with pytest.raises(InvalidConfiguration, match=match):
        check_write_schema(schema)
    check_write_schema(_struct(timestamp=T.LongType(), headers=HEADERS, value=T.StringType(),
                               key=T.StringType()))  # any order


BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _at(ms: int, micros: int = 0) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, UTC) + datetime.timedelta(
        microseconds=micros)


@pytest.fixture
def timed_wal(tmp_path, monkeypatch):
    """A WAL directory of 30 entries of one record each, at BASE_MS + i seconds (i =
    0..29, the entries of 10..19 in reverse order), with key ``k{i % 3}`` for odd i and
    none for even i, then 3 version 1 records; and its records.  (The version 1 records
    come last: their appends' times, now, would raise the running maximum that the
    headers of the entries after them carry.)"""
    directory = str(tmp_path / "wal")
    records = []
    with contextlib.closing(pybk.open(directory)) as wal:
        for i in (*range(10), *range(19, 9, -1), *range(20, 30)):
            key = b"k%d" % (i % 3) if i % 2 else None
            ms = BASE_MS + 1000 * i
            records.append((wal.append(b"v%d" % i, key=key, timestamp=ms), b"v%d" % i, key,
                            ms))
        with monkeypatch.context() as old_pybk:
            write_version_1(old_pybk)
            records += [(wal.append(b"old %d" % i), b"old %d" % i, None, None)
                        for i in range(3)]
    assert len({(p.segment, p.entry) for p, *_ in records}) == len(records)  # one an entry
    return directory, records


def test_timestamp_and_key_filters_skip_entries_and_keep_exactly_the_rows_they_accept(
        timed_wal, monkeypatch):
    """In the reader (as a task runs it): the entries outside the time range, the version
    1 ones and, with a key filter, those without keys are skipped before their records
    are decoded; Spark is handed back the timestamp filters (rounded to milliseconds),
    not the key filter, which the reader applies exactly."""
    from pyspark.sql.datasource import EqualTo, GreaterThan, In, LessThanOrEqual
    directory, records = timed_wal
    decoded = []
    real = arrow.batch_columns
    monkeypatch.setattr(arrow, "batch_columns", lambda data: decoded.append(data) or real(data))

    def read(*filters) -> tuple[list, list]:
        decoded.clear()
        reader = FilteringBatchReader(parse({"path": directory}, READ))
        handed_back = list(reader.pushFilters(list(filters)))
        rows = [row for p in reader.partitions() for batch in reader.read(p)
                for row in batch.to_pylist()]
        return handed_back, [row["value"] for row in rows]

    after, until = GreaterThan(("timestamp",), _at(BASE_MS + 11_000, 500)), \
        LessThanOrEqual(("timestamp",), _at(BASE_MS + 15_000))
    back, values = read(after, until)
    assert back == [after, until]
    # Rounded outwards to milliseconds: 11 s (Spark drops it) to 15 s.  The entry of v10,
    # appended after v19, carries its ledger's running maximum, 19 s, as its header's
    # max (an upper bound): it may hold a later record, so it is decoded too (and Spark
    # drops its row).  The 27 others are skipped.
    assert values == [b"v15", b"v14", b"v13", b"v12", b"v11", b"v10"] and len(decoded) == 6
    keyed = In(("key",), (b"k1", b"k2"))
    back, values = read(keyed)
    assert back == []  # exact: Spark filters no more
    assert values == [v for _, v, k, _ in records if k in (b"k1", b"k2")]
    assert len(decoded) == 33  # every entry's header read, keys decoded where there are
    back, values = read(EqualTo(("key",), b"k1"), after, until)
    assert values == [b"v13"] and len(decoded) == 6


def test_a_lower_time_bound_plans_the_read_from_the_first_record_at_or_after_it(timed_wal):
    """``timestamp >= t`` starts the plan at position_at(t): the entries before the
    first record at or after t (in position order) are not read at all."""
    from pyspark.sql.datasource import GreaterThanOrEqual
    directory, records = timed_wal
    reader = FilteringBatchReader(parse({"path": directory}, READ))
    list(reader.pushFilters([GreaterThanOrEqual(("timestamp",), _at(BASE_MS + 12_000))]))
    partitions = reader.partitions()
    # v0..v9 (0 to 9 s) come first; v19 (19 s), the eleventh, is the first at or after.
    assert min(p.value[1].start for p in partitions) == records[10][0]
    rows = [row for p in partitions for batch in reader.read(p) for row in batch.to_pylist()]
    assert {row["value"] for row in rows} >= {v for _, v, _, ms in records
                                              if ms is not None and ms >= BASE_MS + 12_000}


def test_pushed_timestamp_and_key_filters_give_the_rows_spark_gives_without_them(
        utc_session, timed_wal):
    spark = utc_session
    directory, records = timed_wal
    queries = [
        f"timestamp > '{_at(BASE_MS + 11_000, 500).isoformat()}' "
        f"AND timestamp <= '{_at(BASE_MS + 15_000).isoformat()}'",
        f"timestamp = '{_at(BASE_MS + 7_000).isoformat()}'",
        f"timestamp < '{_at(BASE_MS + 2_000).isoformat()}' OR key = X'6B31'",
        f"timestamp >= '{_at(BASE_MS + 25_000, 1).isoformat()}' AND key IN (X'6B31', X'6B32')",
        "key = X'6B30'",
        "timestamp IS NULL",
    ]
    def collect(query):
        rows = spark.read.format("pybk").load(directory).where(query).collect()
        return [bytes(r.value) for r in rows]

    plain = [collect(q) for q in queries]
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    assert [collect(q) for q in queries] == plain
    # Some answers the records alone give, so that neither side is wrong alike.
    assert plain[0] == [b"v15", b"v14", b"v13", b"v12"]
    assert plain[4] == [b"v3", b"v9", b"v15", b"v21", b"v27"]
    assert plain[5] == [b"old 0", b"old 1", b"old 2"]
    assert plain[2] == [b"v0", b"v1", b"v7", b"v19", b"v13", b"v25"]


def test_entries_written_with_record_fields_carry_running_maximum_timestamps():
    """A task's entries keep their ledger's running maximum in their headers
    (pybk.log.batch, "Maxima") also when rows bring their own, unordered, timestamps."""
    import pyarrow as pa

    from pybk.log.batch import batch_max, decode_fields
    from pybk.spark.job_write import _entries
    stamps = [5_000, 1_000, 9_000, 2_000, 3_000, 4_000]
    batch = pa.RecordBatch.from_pydict({
        "value": [b"v%d" % i for i in range(6)], "key": [b"k", None] * 3,
        "timestamp": pa.array(stamps, pa.int64())})
    # 64 bytes: a 22-byte header and two records of 20 or 21 bytes (value, key, overheads).
    entries = list(_entries(batch, 64, 100, max_floor=7_000))
    assert [decode_fields(e).timestamps for e in entries] == [stamps[0:2], stamps[2:4],
                                                               stamps[4:6]]
    assert [batch_max(e) for e in entries] == [7_000, 9_000, 9_000]
    assert [decode_fields(e).keys for e in entries] == [[b"k", None]] * 3
