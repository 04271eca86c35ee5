"""Records with keys, timestamps and headers: the record batch format's version 2, the
appends that take them (the embedded WAL, a log writer over bookies on ZeroMQ, their
asyncio faces), the readers that give them back as :class:`~pybk.log.Record` values
while ``read()`` goes on giving ``(position, value)``, the limits, and logs an older
pybk wrote (version 1 batches) appended to by this one, read back in order by every
read path (readers, planned ranges, Spark's Arrow decoding)."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from clientutil import Cluster
from recordutil import version_1_batch, write_version_1

import pybk
import pybk.aio
from pybk.aio import AsyncBookKeeper
from pybk.errors import CorruptData, EntryTooLarge, InvalidRecord
from pybk.log import LogReader, LogWriter, Position, Record
from pybk.log.batch import (
    BATCH_HEADER_BYTES,
    FIELDS_OVERHEAD_BYTES,
    HEADER_NAME_MAX_BYTES,
    HEADER_VALUE_MAX_BYTES,
    HEADERS_MAX,
    KEY_MAX_BYTES,
    RECORD_OVERHEAD_BYTES,
    TIMESTAMP_MAX,
    batch_lengths,
    batch_time_range,
    check_fields,
    decode_batch,
    decode_fields,
    encode_batch,
    encode_batch_parts,
    now_ms,
)
from pybk.log.ranges import plan, read_entries, read_records
from pybk.log.readonly import readonly_client
from pybk.log.writer import _Batch
from pybk.settings import LogSettings

pytestmark = pytest.mark.timeout(120)

T0 = 1_764_028_800_000
SINGLE_COPY = LogSettings(ensembleSize=1, writeQuorumSize=1, ackQuorumSize=1)
#: Records of every kind: (value, key, timestamp, headers) as appended (None: left out).
VARIED = [
    (b"plain", None, None, None),
    (b"event time", None, T0, None),
    (b"keyed", b"user-1", T0 - 3_600_000, None),
    (b"empty key", b"", None, None),
    (b"headers", None, None, [("trace", b"\x00\x01"), ("trace", b""), ("r\u00e9gion", b"eu")]),
    (b"", b"k", TIMESTAMP_MAX, (("only", b"one"),)),
    (b"no headers", None, 0, []),
]


def expected(position: Position, value: bytes, key: bytes | None, timestamp: int | None,
             headers) -> Record:
    return Record(position, value, key, timestamp, tuple(map(tuple, headers or ())))


def check_read_back(records: list[Record], appended: list[tuple], before_ms: int,
                    after_ms: int) -> None:
    """``records`` are the ``appended`` ones ((position, value, key, timestamp,
    headers)), a timestamp left out being the wall-clock time of its append."""
    assert len(records) == len(appended)
    for record, (position, value, key, timestamp, headers) in zip(records, appended):
        if timestamp is None:
            assert before_ms <= record.timestamp <= after_ms, record
            timestamp = record.timestamp
        assert record == expected(position, value, key, timestamp, headers)


# -- the format ------------------------------------------------------------------------


@pytest.mark.parametrize("span_ms, delta_bytes", [(0, 0), (255, 1), (65_535, 2),
                                                  (2**32 - 1, 4), (2**32, 8)])
def test_a_record_without_key_or_headers_costs_its_timestamp_delta_more_than_in_version_1(
        span_ms, delta_bytes):
    values = [b"v%d" % i for i in range(100)]
    timestamps = [T0 + span_ms * i // 99 for i in range(100)]
    batch = encode_batch(values, timestamps)
    extra_header = BATCH_HEADER_BYTES - 5  # version 1's header is 5 bytes
    assert len(batch) == len(version_1_batch(values)) + extra_header + 100 * delta_bytes
    assert delta_bytes <= RECORD_OVERHEAD_BYTES - 4
    fields = decode_fields(batch)
    assert fields == (values, timestamps, [None] * 100, [()] * 100)
    assert batch_time_range(batch) == (T0, T0 + span_ms)
    lengths, start = batch_lengths(batch)  # the values lie back to back (Spark's slice)
    assert batch[start:start + sum(lengths)] == b"".join(values)


def test_batches_keep_every_field_and_their_time_range_whatever_the_order():
    values = [value for value, _, _, _ in VARIED]
    timestamps = [T0 + 5 if t is None else t for _, _, t, _ in VARIED]
    keys = [key for _, key, _, _ in VARIED]
    headers = [tuple(map(tuple, h or ())) for _, _, _, h in VARIED]
    for with_keys, with_headers in ((True, True), (True, False), (False, True)):
        batch = encode_batch(values, timestamps, keys if with_keys else None,
                             headers if with_headers else None)
        assert decode_fields(batch) == (values, timestamps,
                                        keys if with_keys else [None] * len(values),
                                        headers if with_headers else [()] * len(values))
        assert decode_batch(batch) == values
        assert batch_time_range(batch) == (0, TIMESTAMP_MAX)
    one_time = encode_batch_parts([1, 2], b"abc", T0)
    assert decode_fields(one_time) == ([b"a", b"bc"], [T0, T0], [None, None], [(), ()])
    assert len(one_time) == len(version_1_batch([b"a", b"bc"])) + BATCH_HEADER_BYTES - 5
    before = now_ms()
    assert before <= decode_fields(encode_batch([b"now"])).timestamps[0] <= now_ms()
    old = version_1_batch([b"a", b"", b"ccc"])
    assert decode_fields(old) == ([b"a", b"", b"ccc"], [None] * 3, [None] * 3, [()] * 3)
    assert batch_time_range(old) is None
    with pytest.raises(ValueError, match="2 timestamps for 1 records"):
        encode_batch([b"x"], [T0, T0])
    with pytest.raises(InvalidRecord):
        encode_batch([b"x", b"y"], [T0, -1])


def test_decoding_refuses_bytes_no_pybk_writer_wrote():
    good = encode_batch([b"ab", b"c"], [T0, T0 + 1], [b"k", None], [(("h", b"v"),), ()])
    assert decode_fields(good).keys == [b"k", None]
    header = bytearray(good)
    header[1] |= 0x20  # a flag version 2 does not define
    flags_5 = bytearray(good)
    flags_5[1] = (flags_5[1] & ~0x07) | 5  # no such delta width
    wrong_max = bytearray(good)
    struct.pack_into(">q", wrong_max, 14, T0)  # below the largest delta (1 ms)
    bad_key = bytearray(good)
    struct.pack_into(">i", bad_key, 22 + 8 + 2, -2)
    not_utf8 = bytes(good).replace(b"hv", b"\xffv")
    for bad in (b"", b"\x02" + bytes(20), b"\x03" + good[1:], good[:-1], good + b"\x00",
                bytes(header), bytes(flags_5), bytes(wrong_max), bytes(bad_key), not_utf8,
                version_1_batch([b"abc"])[:-1], b"\x01\x00\x00\x00\x00"):
        with pytest.raises(CorruptData):
            decode_fields(bad)
    with pytest.raises(CorruptData):
        batch_time_range(b"\x03" + good[1:])


# -- the embedded WAL --------------------------------------------------------------------


def test_the_wal_keeps_keys_timestamps_and_headers_and_read_gives_what_it_gave(tmp_path):
    path = tmp_path / "wal"
    before = now_ms()
    appended = []
    with pybk.open(path) as wal:
        for value, key, timestamp, headers in VARIED:
            position = wal.append(value, key=key, timestamp=timestamp, headers=headers)
            appended.append((position, value, key, timestamp, headers))
        reused = bytearray(b"buffer key")
        future = wal.append_async(b"async", key=reused, headers=[("h", bytearray(b"hv"))])
        reused[:] = b"changed!!!"  # the append took a copy
        appended.append((future.result(timeout=30), b"async", b"buffer key", None,
                         [("h", b"hv")]))
        pipelined = [(wal.append_async(b"p%d" % i, key=b"%d" % i if i % 7 == 0 else None),
                      b"p%d" % i, b"%d" % i if i % 7 == 0 else None) for i in range(500)]
        appended += [(f.result(timeout=30), value, key, None, None)
                     for f, value, key in pipelined]
        check_read_back(list(wal.records()), appended, before, now_ms())
        reader = wal.reader()
        assert reader.read_next(1.0) == (appended[0][0], b"plain")
        assert reader.next_record(1.0).value == b"event time"  # both kinds, one position
        assert [value for _, value in reader.read()] == [a[1] for a in appended[2:]]
    after = now_ms()
    with pybk.open(path) as wal:  # after a restart, as appended
        check_read_back(list(wal.records()), appended, before, after)
        read = list(wal.read())
        assert read == [(a[0], a[1]) for a in appended]
        assert all(type(item) is tuple and len(item) == 2 for item in read)
        tail = wal.reader(appended[-1][0]).tail_records(0.2)
        assert [r.position for r in tail] == [appended[-1][0]]
    with pybk.open_readonly(path) as readonly:
        records = list(readonly.records())
        check_read_back(records, appended, before, after)
        assert list(readonly.read()) == read
    # The class users import from pybk (and pybk.aio) is the one readers give.
    assert pybk.Record is pybk.aio.Record is Record and type(records[0]) is pybk.Record


def test_the_limits_raise_clear_errors_and_nothing_is_appended(tmp_path):
    with pybk.open(tmp_path / "wal", recordMaxBytes=200_000) as wal:
        refused = [
            (TypeError, "int of milliseconds", {"timestamp": 1.5}),
            (TypeError, "not bool", {"timestamp": True}),
            (InvalidRecord, "from 0 to", {"timestamp": -1}),
            (InvalidRecord, "nanoseconds", {"timestamp": T0 * 1_000_000}),
            (InvalidRecord, "from 0 to", {"timestamp": TIMESTAMP_MAX + 1}),
            (TypeError, "key must be bytes", {"key": "text"}),
            (InvalidRecord, "key of 65537 bytes", {"key": bytes(KEY_MAX_BYTES + 1)}),
            (TypeError, "sequence of", {"headers": b"raw"}),
            (TypeError, "pair", {"headers": [("lonely",)]}),
            (TypeError, "name is a str", {"headers": [(b"bytes", b"v")]}),
            (TypeError, "must be bytes", {"headers": [("n", "text")]}),
            (InvalidRecord, "1025 headers", {"headers": [("n", b"")] * (HEADERS_MAX + 1)}),
            (InvalidRecord, "name", {"headers": [("n" * (HEADER_NAME_MAX_BYTES + 1), b"")]}),
            (InvalidRecord, "UTF-8", {"headers": [("\ud800", b"")]}),
            (InvalidRecord, "value of 65537", {"headers": [("n", bytes(HEADER_VALUE_MAX_BYTES
                                                                         + 1))]}),
            (EntryTooLarge, "value, key and headers", {"key": bytes(KEY_MAX_BYTES),
                                                       "headers": [("n", bytes(60_000))] * 3}),
        ]
        for error, message, fields in refused:
            with pytest.raises(error, match=message):
                wal.append(b"x", **fields)
            with pytest.raises(error, match=message):
                wal.append_async(b"x", **fields)
        assert wal.last_position is None
        widest = dict(key=bytes(KEY_MAX_BYTES), timestamp=TIMESTAMP_MAX,
                      headers=[("n" * HEADER_NAME_MAX_BYTES, bytes(HEADER_VALUE_MAX_BYTES))])
        position = wal.append(b"at the limits", **widest)
        assert list(wal.records()) == [Record(position, b"at the limits", widest["key"],
                                              TIMESTAMP_MAX, tuple(widest["headers"]))]


def test_a_wal_an_older_pybk_wrote_reads_back_in_order_when_this_one_appends(
        tmp_path, monkeypatch):
    """Version 1 entries, then version 2 ones, in one log: every read path reads both."""
    path = tmp_path / "wal"
    with monkeypatch.context() as old:
        write_version_1(old)
        with pybk.open(path) as wal:
            first = [(wal.append(b"old %d" % i), b"old %d" % i) for i in range(3)]
    before = now_ms()
    with pybk.open(path) as wal:
        new = [(wal.append(b"new %d" % i, key=b"k%d" % i, headers=[("n", b"%d" % i)]),
                b"new %d" % i) for i in range(3)]
        assert wal.last_position == new[-1][0]
    after = now_ms()
    with pybk.open(path) as wal:
        records = list(wal.records())
        assert list(wal.read()) == first + new
    assert records[:3] == [Record(p, v, None, None, ()) for p, v in first]
    check_read_back(records[3:], [(p, v, b"k%d" % i, None, [("n", b"%d" % i)])
                                  for i, (p, v) in enumerate(new)], before, after)
    assert first[-1][0].segment < new[0][0].segment
    with readonly_client(path) as bk:
        planned = plan(bk, "wal")
        assert [r for rng in planned.ranges for r in read_records(bk, rng)] == first + new
        check_arrow(bk, "wal", planned.ranges, first + new)


def check_arrow(bk, name: str, ranges, written: list[tuple[Position, bytes]]) -> None:
    """Spark's decoding of entries into Arrow batches gives ``written``."""
    pytest.importorskip("pyarrow")
    from pybk.spark.arrow import record_batches
    rows = [row for r in ranges for batch in record_batches(name, r, read_entries(bk, r))
            for row in batch.to_pylist()]
    assert [(Position.parse(row["position"]), row["value"]) for row in rows] == written


# -- a log writer over bookies on ZeroMQ ---------------------------------------------------


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(str(tmp_path), 3, transport="zmq")
    yield c
    c.close()


def test_a_log_writer_over_zeromq_keeps_every_field_in_full_batches_after_old_entries(
        cluster, monkeypatch):
    """An older pybk's writer leaves version 1 entries; this one appends records with
    and without keys and headers, pipelined so that batches fill up: each entry stays
    within batchMaxBytes however its records mix, and every reader reads the lot in
    order."""
    bk = cluster.client()
    settings = dataclasses.replace(SINGLE_COPY, batchMaxBytes=4096)
    with monkeypatch.context() as old:
        write_version_1(old)
        with LogWriter.open(bk, "log", settings) as writer:
            first = [(writer.append(b"old %d" % i), b"old %d" % i, None, None, None)
                     for i in range(3)]
    before = now_ms()
    with LogWriter.open(bk, "log", settings) as writer:
        futures = []
        for i in range(600):
            key = b"key %d" % i if i % 5 == 0 else None
            headers = [("i", b"%d" % i)] * (i % 3) if i % 4 == 0 else None
            timestamp = T0 + i if i % 2 else None
            futures.append((writer.append_async(bytes(i % 200), key=key, timestamp=timestamp,
                                                headers=headers),
                            bytes(i % 200), key, timestamp, headers))
        appended = [(f.result(timeout=60), *rest) for f, *rest in futures]
    after = now_ms()
    records = list(LogReader(bk, "log").records())
    assert records[:3] == [Record(p, v, None, None, ()) for p, v, *_ in first]
    check_read_back(records[3:], appended, before, after)
    assert list(LogReader(bk, "log").read()) == [(p, v) for p, v, *_ in first + appended]
    planned = plan(bk, "log")
    entries = [data for r in planned.ranges for _, data in read_entries(bk, r)]
    assert len(entries) < 100, "pipelined appends fill batches"
    assert all(len(data) <= settings.batchMaxBytes for data in entries
               if len(batch_lengths(data)[0]) > 1)
    assert any(decode_fields(data).keys.count(None) not in (0, len(decode_fields(data).keys))
               for data in entries), "a batch mixes records with and without keys"
    check_arrow(bk, "log", planned.ranges, [(p, v) for p, v, *_ in first + appended])


def test_the_writer_counts_the_fields_of_a_batch_s_earlier_records():
    """A record with a key in a batch of plain records gives them all key and header
    fields: what the writer counts for the batch covers its bytes."""
    batch = _Batch()
    size = BATCH_HEADER_BYTES
    for i in range(10):
        batch.records.append(b"x" * i)
        batch.timestamps.append(T0 + 1000 * i)
        size += RECORD_OVERHEAD_BYTES + i
    batch.add_fields(b"key", (("h", b"v"),))
    batch.records.append(b"keyed")
    batch.timestamps.append(0)
    size += FIELDS_OVERHEAD_BYTES * 11 + RECORD_OVERHEAD_BYTES + len(b"keyed") \
        + check_fields(b"key", [("h", b"v")])[2]
    encoded = batch.encode()
    assert len(encoded) <= size
    assert decode_fields(encoded).keys == [None] * 10 + [b"key"]


# -- the asyncio faces ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_asyncio_wal_and_log_writer_append_and_read_every_field(tmp_path):
    before = now_ms()
    async with await pybk.aio.open(tmp_path / "wal") as wal:
        appended = []
        for value, key, timestamp, headers in VARIED:
            position = await wal.append(value, key=key, timestamp=timestamp, headers=headers)
            appended.append((position, value, key, timestamp, headers))
        reused = bytearray(b"submitted")
        future = await wal.submit(b"queued", key=reused, timestamp=T0)
        reused[:] = b"reused!!!"  # submit took a copy
        appended.append((await future, b"queued", b"submitted", T0, None))
        with pytest.raises(InvalidRecord):
            await wal.submit(b"x", timestamp=-5)  # refused at once, nothing queued
        with pytest.raises(TypeError):
            await wal.append(b"x", headers=[(1, b"")])
        check_read_back([r async for r in wal.records()], appended, before, now_ms())
        assert [item async for item in wal.read()] == [(a[0], a[1]) for a in appended]
        reader = wal.reader()
        assert (await reader.next_record(1.0)).value == b"plain"
        assert await reader.read_next(1.0) == (appended[1][0], b"event time")
        tail = reader.tail_records(idle_timeout=0.2)
        assert [r.value async for r in tail] == [a[1] for a in appended[2:]]
    cluster = Cluster(str(tmp_path / "cluster"), 1)
    try:
        async with AsyncBookKeeper(cluster.client()) as bk:
            writer = await bk.open_log_writer("log", SINGLE_COPY)
            position = await writer.append(b"v", key=b"k", timestamp=T0,
                                           headers=[("h", b"")])
            await writer.close()
            assert [r async for r in bk.log_reader("log").records()] == \
                [Record(position, b"v", b"k", T0, (("h", b""),))]
    finally:
        cluster.close()
