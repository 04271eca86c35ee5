"""A WAL read from another process while its owner runs (``pybk.open_readonly``), its
positions and figures, and ``pybk tail``.  The owner is a real process
(``tests/wal_child.py``) appending from several threads, killed with SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from aioutil import LoopWatch
from crashutil import ROOT, children, count_lines  # noqa: F401
from recordutil import write_version_1
from test_aio import aio_threads
from walutil import acknowledged, who

import pybk
import pybk.aio
from pybk.errors import DirectoryLocked, LogClosed, MetadataError, NoSuchLog
from pybk.fileio import lock_file
from pybk.log import Position
from pybk.meta.embedded import LOCK_FILE, EmbeddedMetadataStore
from pybk.testing import WAIT_S, wait_until

pytestmark = pytest.mark.timeout(120)

TESTS = os.path.dirname(os.path.abspath(__file__))
WAL_CHILD = os.path.join(TESTS, "wal_child.py")
DEFERRED_CHILD = os.path.join(TESTS, "wal_deferred_child.py")
THREADS = 3
#: How long after its acknowledgement a record is visible while the owner runs: the
#: owner's explicit LAC (explicitLacInterval, 50 ms) and its journal write, with room.
#: What must become visible is waited for up to WAIT_S; this is how long a test waits
#: before it shows that something must not.
VISIBLE_WITHIN_S = 1.0
#: Records a tail must bring to show that it follows the owner.
TAILED_ENOUGH = 100


def _owner(children, directory, acks, *options: str):
    child = children.spawn(WAL_CHILD, str(directory), str(acks), "0", str(THREADS),
                           *options)
    children.wait_for_acks(child, acks, 200)
    return child


def _missing(records, acked) -> set[Position]:
    """The acknowledged positions that ``records`` lack or hold other data at."""
    found = {p: who(data) for p, data in records}
    return {p for p, ids in acked.items() if found.get(p) != ids}


def _tailed(tail) -> list:
    """What ``tail`` gives until it brought more than TAILED_ENOUGH records (at most
    WAIT_S)."""
    tailed = []
    deadline = time.monotonic() + WAIT_S
    for record in tail:
        tailed.append(record)
        if len(tailed) > TAILED_ENOUGH or time.monotonic() > deadline:
            break
    return tailed


def _check_records(records) -> None:
    """Positions strictly increase, and every record holds exactly what its writer
    wrote."""
    positions = [p for p, _ in records]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    for _, data in records:
        who(data)


def test_a_running_owners_acknowledged_records_are_read_and_tailed(tmp_path, children):
    directory, acks = tmp_path / "wal", tmp_path / "acks"
    child = _owner(children, directory, acks)
    with pybk.open_readonly(directory) as wal:
        acked = acknowledged(acks)

        def every_acknowledged_one() -> list | None:
            records = list(wal.read())
            return None if _missing(records, acked) else records

        records = wait_until(every_acknowledged_one, "every acknowledged record is read")
        _check_records(records)
        stats = wal.stats()
        assert stats.owner_running and stats.journal_records_read > 0
        assert stats.first_position == Position(0, 0, 0)
        assert stats.last_position >= max(acked) and stats.space_used_bytes > 0

        # Tailing from where the read ended follows the owner's new records.
        reader = wal.reader(records[-1][0])
        assert next(reader.tail(5.0))[0] == records[-1][0]
        tailed = _tailed(reader.tail(5.0, poll_interval=0.02))
        _check_records(records + tailed)
        assert len(tailed) > TAILED_ENOUGH, "the tail did not follow the owner"
        assert child.poll() is None, children.stderr(child)


@pytest.mark.asyncio
async def test_the_asyncio_face_reads_tails_and_counts_a_running_owner(tmp_path, children):
    """``pybk.aio.open_readonly``: the same records, positions and figures as the
    thread-based handle, a tail that follows the owner, the loop never held, and nothing
    left running once it is closed (or failed to open)."""
    directory, acks = tmp_path / "wal", tmp_path / "acks"
    child = _owner(children, directory, acks)
    with pytest.raises(NoSuchLog):
        await pybk.aio.open_readonly(tmp_path / "nothing")
    async with LoopWatch() as watch:
        async with await pybk.aio.open_readonly(directory) as wal:
            acked = acknowledged(acks)
            deadline = time.monotonic() + WAIT_S
            while (missing := _missing(records := [r async for r in wal.read()], acked)) \
                    and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert not missing, f"acknowledged records not read: {sorted(missing)[:3]}"
            _check_records(records)
            assert await wal.first_position() == Position(0, 0, 0)
            assert await wal.last_position() >= records[-1][0]
            assert await wal.space_used() > 0
            stats = await wal.stats()
            assert stats.owner_running and stats.journal_records_read > 0

            tailed = []
            deadline = time.monotonic() + WAIT_S
            async with wal.reader(records[-1][0]).tail(5.0) as tail:
                async for record in tail:
                    tailed.append(record)
                    if len(tailed) > TAILED_ENOUGH or time.monotonic() > deadline:
                        break
            assert tailed[0] == records[-1]
            _check_records(records + tailed[1:])
            assert len(tailed) > TAILED_ENOUGH, "the tail did not follow the owner"
        with pytest.raises(LogClosed):
            wal.reader()
        await wal.close()  # again: nothing happens
    assert watch.ticks > 0 and not watch.waits, watch.waits[:3]
    assert not aio_threads()
    assert child.poll() is None, children.stderr(child)


def test_after_the_owner_is_killed_every_acknowledged_record_is_read(tmp_path, children):
    """SIGKILL leaves the owner's last segment open (or two, in the middle of a roll),
    with records past its LAC whose acknowledgements the owner had given: with no owner
    running, the reader reads them too, and exactly what the owner's next open
    recovers.  Four owners, killed at random moments."""
    directory, acks = tmp_path / "wal", tmp_path / "acks"
    rng = random.Random(20261126)
    for round_no in range(4):
        child = children.spawn(WAL_CHILD, str(directory), str(acks), str(round_no),
                               str(THREADS))
        children.wait_for_acks(child, acks, count_lines(acks) + 200)
        time.sleep(rng.uniform(0.0, 0.3))
        with pybk.open_readonly(directory) as wal:
            children.kill(child)
            acked = acknowledged(acks)
            assert not wal.stats().owner_running
            records = list(wal.read())
            last = wal.last_position
        _check_records(records)
        found = dict(records)
        missing = {p for p, ids in acked.items() if p not in found or who(found[p]) != ids}
        assert not missing, f"round {round_no}: acknowledged records not read: " \
                            f"{sorted(missing)[:3]}"
        assert last == records[-1][0]
        with pybk.open(directory) as owner:  # recovers the open segments
            assert list(owner.read()) == records


def test_beside_a_deferred_sync_owner_unsynced_records_show_only_once_it_died(tmp_path,
                                                                             children):
    """A ``deferredSync=True`` owner stopped after a sync and more appends (returned:
    written to its journal, not synced).  While it runs the reader sees exactly the
    synced records (the durable LAC), though the others are in the journal it reads;
    once the owner is SIGKILLed, the page cache still holds them, and the reader sees
    every appended record: exactly what the owner's next open recovers."""
    directory, acks = tmp_path / "wal", tmp_path / "acks"
    child = children.spawn(DEFERRED_CHILD, str(directory), str(acks), "60", "25")
    children.wait_for_acks(child, acks, 85)
    acked = acknowledged(acks)
    synced = sorted(p for p, (_, thread, _) in acked.items() if thread == 0)
    with pybk.open_readonly(directory) as wal:
        time.sleep(VISIBLE_WITHIN_S)  # the owner's explicit LAC, were it to send one
        records = list(wal.read())
        assert [p for p, _ in records] == synced and len(synced) == 60
        assert wal.last_position == synced[-1] and wal.stats().owner_running
        children.kill(child)
        records = list(wal.read())
        assert not wal.stats().owner_running
    _check_records(records)
    assert {p: who(data) for p, data in records} == acked
    with pybk.open(directory) as owner:
        assert list(owner.read()) == records


def test_truncation_gc_and_compaction_under_a_tailing_reader(tmp_path, children):
    """The owner truncates every 0.2 s and compacts: segments and entry logs go under the
    reader, which goes on past them and serves only what the writers wrote, in order."""
    directory, acks = tmp_path / "wal", tmp_path / "acks"
    child = _owner(children, directory, acks, "truncate")
    current = directory / "bookie" / "ledgers" / "current"

    def entry_logs() -> set[str]:
        return {name for name in os.listdir(current) if name.endswith(".log")}

    def truncated_under_the_reader() -> bool:
        first = wal.first_position
        return (len(records) > 1000 and first is not None and first > records[0][0]
                and bool(logs_seen - entry_logs()))

    logs_seen: set[str] = set()
    with pybk.open_readonly(directory) as wal:
        reader = wal.reader()
        records = []
        deadline = time.monotonic() + WAIT_S
        for record in reader.tail(5.0, poll_interval=0.005):
            records.append(record)
            logs_seen |= entry_logs()
            if time.monotonic() > deadline:
                break
            if len(records) % 500 == 0:
                if truncated_under_the_reader():
                    break
                time.sleep(0.3)  # fall behind a truncation now and then
        first = wal.first_position
    assert child.poll() is None, children.stderr(child)
    _check_records(records)
    assert len(records) > 1000
    assert first is not None and first > records[0][0], "the owner never truncated"
    remaining = entry_logs()
    assert logs_seen - remaining, "no entry log was removed while the reader read"


def test_positions_space_and_stats_of_the_owner(tmp_path):
    with pybk.open(tmp_path / "wal") as wal:
        assert (wal.first_position, wal.last_position) == (None, None)
        positions = [wal.append(b"record %d" % i) for i in range(20)]
        futures = [wal.append_async(b"async %d" % i) for i in range(20)]
        positions += [f.result(timeout=30) for f in futures]
        assert (wal.first_position, wal.last_position) == (positions[0], positions[-1])
        wal.truncate(positions[10])
        assert wal.first_position == positions[10]
        stats = wal.stats()
        assert (stats.appends, stats.appended_bytes) == (40, sum(
            len(b"record %d" % i) + len(b"async %d" % i) for i in range(20)))
        assert stats.syncs > 0 and stats.journal_bytes_written > stats.appended_bytes
        assert stats.space_used_bytes == wal.space_used > 0
        assert stats.journal_records_read is None and stats.owner_running is None
    with pybk.open(tmp_path / "wal") as wal:  # a new segment: truncation takes the old one
        later = wal.append(b"later")
        wal.truncate(later)
        assert wal.first_position == wal.last_position == later


def test_read_only_bad_input_gets_clear_errors(tmp_path):
    with pytest.raises(NoSuchLog, match="holds no pybk WAL"):
        pybk.open_readonly(tmp_path / "none")
    with pybk.open(tmp_path / "wal") as wal:
        wal.append(b"x")
        with pytest.raises(DirectoryLocked, match="open in this process"):
            pybk.open_readonly(tmp_path / "wal")
    with pybk.open_readonly(tmp_path / "wal") as wal:
        assert [d for _, d in wal.read()] == [b"x"]
        with pytest.raises(ValueError, match="past the end"):
            wal.read("7:0:0")
    with pytest.raises(pybk.errors.LogClosed):
        wal.read()


def _pybk(*args: str, stdout=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen((sys.executable, "-m", "pybk", *args),
                            env=dict(os.environ, PYTHONPATH=ROOT), stdout=stdout,
                            stderr=subprocess.PIPE, text=True)


def _printed(path) -> list[tuple[Position, bytes]]:
    """The records ``pybk tail --hex`` printed so far (whole lines only)."""
    lines = path.read_text().split("\n")[:-1]
    return [(Position.parse(p), bytes.fromhex(data[2:]))
            for p, data in (line.split("\t") for line in lines)]


def test_pybk_tail_follows_a_running_owner_until_terminated(tmp_path, children):
    """The command prints records while the owner appends, and, once the owner is
    killed, every record it acknowledged; SIGTERM ends it with status 0."""
    directory, acks, out = tmp_path / "wal", tmp_path / "acks", tmp_path / "out"
    child = _owner(children, directory, acks)
    with open(out, "w") as out_file:  # a pipe would fill up: a file does not
        tail = _pybk("tail", str(directory), "--follow", "--poll-ms", "20", "--hex",
                     stdout=out_file)
        try:
            deadline = time.monotonic() + 60
            while len(_printed(out)) < 1000 and time.monotonic() < deadline:
                time.sleep(0.05)
            early = len(_printed(out))
            time.sleep(1.0)
            assert child.poll() is None, children.stderr(child)
            assert len(_printed(out)) > early >= 1000, "the tail did not follow the owner"
            children.kill(child)
            acked = acknowledged(acks)
            while not set(acked) <= {p for p, _ in _printed(out)} \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            tail.send_signal(signal.SIGTERM)
            _, err = tail.communicate(timeout=30)
        finally:
            if tail.poll() is None:
                tail.kill()
                tail.wait(timeout=30)
    assert tail.returncode == 0 and not err, err
    records = _printed(out)
    _check_records(records)
    printed = dict(records)
    missing = {p for p, ids in acked.items() if p not in printed or who(printed[p]) != ids}
    assert not missing, f"{len(missing)} acknowledged records not printed: " \
                        f"{sorted(missing)[:3]}"


def test_pybk_tail_bad_input_is_one_line(tmp_path):
    with pybk.open(tmp_path / "wal") as wal:
        wal.append(b"text record")
        wal.append(b"\x00\x01binary")
    tail = _pybk("tail", str(tmp_path / "wal"))
    out, err = tail.communicate(timeout=60)
    assert (tail.returncode, err) == (0, "")
    assert out == "0:0:0\ttext record\n0:1:0\t0x0001" + b"binary".hex() + "\n"
    for args, reason in [((str(tmp_path / "none"),), "holds no pybk WAL"),
                         ((str(tmp_path / "wal"), "--from", "1:x:0"), "not a log position"),
                         ((str(tmp_path / "wal"), "--from", "5:0:0"), "past the end")]:
        tail = _pybk("tail", *args)
        out, err = tail.communicate(timeout=60)
        assert tail.returncode == 1 and out == ""
        assert err.startswith("pybk tail: ") and reason in err and err.count("\n") == 1, err


def test_pybk_tail_json_prints_every_field_of_each_record(tmp_path, monkeypatch):
    with pybk.open(tmp_path / "wal") as wal:
        with monkeypatch.context() as old_pybk:
            write_version_1(old_pybk)
            old = wal.append(b"old")
        text = wal.append("héllo".encode(), key=b"user-1", timestamp=1_767_225_600_123,
                          headers=[("trace", b"abc"), ("raw", b"\xff\x00"), ("trace", b"")])
        binary = wal.append(b"\xff\xfe", key=b"\x80", timestamp=0)
    tail = _pybk("tail", str(tmp_path / "wal"), "--json")
    out, err = tail.communicate(timeout=60)
    assert (tail.returncode, err) == (0, "")
    assert [json.loads(line) for line in out.splitlines()] == [
        {"position": str(old), "timestamp": None, "time": None, "key": None,
         "key_encoding": None, "value": "old", "value_encoding": "utf-8", "headers": []},
        {"position": str(text), "timestamp": 1_767_225_600_123,
         "time": "2026-01-01T00:00:00.123Z", "key": "user-1", "key_encoding": "utf-8",
         "value": "héllo", "value_encoding": "utf-8", "headers": [
             {"name": "trace", "value": "abc", "value_encoding": "utf-8"},
             {"name": "raw", "value": "/wA=", "value_encoding": "base64"},
             {"name": "trace", "value": "", "value_encoding": "utf-8"}]},
        {"position": str(binary), "timestamp": 0, "time": "1970-01-01T00:00:00.000Z",
         "key": "gA==", "key_encoding": "base64", "value": "//4=",
         "value_encoding": "base64", "headers": []}]
    tail = _pybk("tail", str(tmp_path / "wal"), "--json", "--hex")
    assert tail.wait(timeout=60) == 2  # one or the other


def test_pybk_tail_from_a_time(tmp_path):
    """--from-time: from the first record whose timestamp is at least the time, in
    position order (pybk.log.timeindex), or nothing past them all."""
    with pybk.open(tmp_path / "timed") as wal:
        for ms in (100, 300, 200):  # event times, out of order
            wal.append(b"at %d" % ms, timestamp=ms)
    for from_time, printed in (("150", "0:1:0\tat 300\n0:2:0\tat 200\n"), ("301", "")):
        tail = _pybk("tail", str(tmp_path / "timed"), "--from-time", from_time)
        assert tail.communicate(timeout=60) == (printed, "")


def test_a_read_only_metadata_store_reads_and_refuses_changes(tmp_path):
    with EmbeddedMetadataStore(tmp_path / "meta") as store:
        store.create("/a", b"one")
    with EmbeddedMetadataStore(tmp_path / "meta", read_only=True) as store:
        assert store.get("/a") == (b"one", 0)
        with pytest.raises(MetadataError, match="read-only"):
            store.set("/a", b"two", 0)
        with pytest.raises(MetadataError, match="read-only"):
            store.next_ledger_id()
        os.close(lock_file(str(tmp_path / "meta" / LOCK_FILE)))  # it holds no lock


def test_a_tail_goes_on_across_owner_crashes_and_restarts(tmp_path, children):
    """Three owners in turn, each killed with SIGKILL: one reader tails them all, and
    what it read is exactly what the WAL holds once reopened, acknowledged records
    included."""
    directory, acks = tmp_path / "wal", tmp_path / "acks"
    child = _owner(children, directory, acks)
    tailed = []
    with pybk.open_readonly(directory) as wal:
        reader = wal.reader()
        for round_no in range(1, 4):
            deadline = time.monotonic() + 1.0
            for record in reader.tail(30.0, poll_interval=0.01):
                tailed.append(record)
                if time.monotonic() > deadline:
                    break
            children.kill(child)
            if round_no < 3:
                child = children.spawn(WAL_CHILD, str(directory), str(acks), str(round_no),
                                       str(THREADS))
        tailed += reader.tail(1.0)  # the last owner's records past its LAC, too
    _check_records(tailed)
    with pybk.open(directory) as owner:
        held = list(owner.read())
    assert tailed == held
    rounds = {who(data)[0] for _, data in tailed}
    assert rounds == {0, 1, 2}
    assert set(acknowledged(acks)) <= {p for p, _ in held}
