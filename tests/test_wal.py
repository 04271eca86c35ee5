"""The embedded WAL (``pybk.open``): appends, reads, truncation, restarts, kill -9."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import defaultdict

import pytest
from crashutil import children, count_lines  # noqa: F401
from walutil import acknowledged, who

import pybk
from pybk.errors import BookKeeperError, EntryTooLarge, InvalidConfiguration, LogClosed
from pybk.log import Position
from pybk.storage import make_entry
from pybk.testing import WAIT_S

pytestmark = pytest.mark.timeout(120)

TESTS = os.path.dirname(os.path.abspath(__file__))
WAL_CHILD = os.path.join(TESTS, "wal_child.py")


def test_appends_are_read_back_in_order_with_their_positions(tmp_path):
    with pybk.open(tmp_path / "wal") as wal:
        first = wal.append(b"first")
        futures = [wal.append_async(b"record %d" % i) for i in range(1000)]
        positions = [f.result(timeout=30) for f in futures]
        last = wal.append(b"")
        assert first == Position(0, 0, 0)
        assert positions == sorted(positions) and len(set(positions)) == 1000
        assert first < positions[0] and positions[-1] < last
        assert any(p.slot > 0 for p in positions), "concurrent appends were not batched"
        records = list(wal.read())
    assert [data for _, data in records] == \
        [b"first"] + [b"record %d" % i for i in range(1000)] + [b""]
    assert [pos for pos, _ in records] == [first] + positions + [last]


def test_records_survive_a_restart_and_reads_start_anywhere(tmp_path):
    with pybk.open(tmp_path / "wal") as wal:
        written = {wal.append(b"r%d" % i): b"r%d" % i for i in range(50)}
    with pybk.open(tmp_path / "wal") as wal:
        later = wal.append(b"after restart")
        records = dict(wal.read())
        middle = sorted(written)[25]
        from_middle = list(wal.read(start=middle))
    assert records == {**written, later: b"after restart"}
    assert later.segment > max(written).segment
    assert [p for p, _ in from_middle] == sorted(written)[25:] + [later]


def test_reading_from_the_middle_of_a_batch(tmp_path):
    with pybk.open(tmp_path / "wal") as wal:
        positions = [f.result(timeout=30) for f in
                     [wal.append_async(b"%d" % i) for i in range(200)]]
        batched = next(p for p in positions if p.slot > 0)
        got = list(wal.read(start=batched))
    assert got[0] == (batched, b"%d" % positions.index(batched))
    assert [p for p, _ in got] == positions[positions.index(batched):]


def test_many_threads_share_fsyncs(tmp_path):
    with pybk.open(tmp_path / "wal") as wal:
        results: dict[int, list[Position]] = defaultdict(list)

        def writer(t: int) -> None:
            for i in range(100):
                results[t].append(wal.append(b"%d/%d" % (t, i)))

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        entries = {(p.segment, p.entry) for ps in results.values() for p in ps}
        records = list(wal.read())
    assert len(records) == 1600
    for positions in results.values():
        assert positions == sorted(positions)  # one thread's records in call order
    assert len(entries) < 1600, "no two threads' records shared an entry"


def test_segments_roll_by_size_and_reads_cross_them(tmp_path):
    with pybk.open(tmp_path / "wal", segmentMaxBytes=4096) as wal:
        positions = [wal.append(bytes(300) + b"%d" % i) for i in range(200)]
        wal.sync()
        segments = {p.segment for p in positions}
        got = [p for p, _ in wal.read()]
    # 60 KB in 4 KiB segments; a roll runs in the background while appends go on into
    # the old segment, so a slow machine makes fewer, larger segments.
    assert len(segments) >= 3
    assert got == positions


def test_truncation_deletes_whole_segments_and_gc_reclaims_their_space(tmp_path):
    def entry_log_bytes() -> int:
        current = tmp_path / "wal" / "bookie" / "ledgers" / "current"
        return sum(f.stat().st_size for f in current.glob("*.log"))

    with pybk.open(tmp_path / "wal", segmentMaxBytes=512 * 1024, maxEntrySizeBytes=1 << 20,
                   logSizeLimit=2 << 20, recordMaxBytes=512 * 1024, gcWaitTime=100,
                   flushInterval=100) as wal:
        positions = [wal.append(os.urandom(64 * 1024)) for _ in range(160)]  # 10 MiB
        wal.sync()
        wal.bookie.checkpoint()
        before_bytes = entry_log_bytes()
        keep = positions[120]
        segments_before = {p.segment for p in positions}
        wal.truncate(keep)
        assert [p for p, _ in wal.read()] == positions[120:]
        ledgers_left = wal._bk.list_ledgers()
        deadline = time.monotonic() + 30
        while entry_log_bytes() > before_bytes // 2 and time.monotonic() < deadline:
            wal.bookie.checkpoint()
            time.sleep(0.1)
        after_bytes = entry_log_bytes()
    assert len(ledgers_left) <= len(segments_before) - keep.segment + 1
    assert after_bytes <= before_bytes // 2, \
        f"entry logs still hold {after_bytes} of {before_bytes} bytes after truncation"
    with pybk.open(tmp_path / "wal", maxEntrySizeBytes=1 << 20, logSizeLimit=2 << 20,
                   recordMaxBytes=512 * 1024) as wal:
        assert [p for p, _ in wal.read()] == positions[120:]  # the truncation point holds


def test_a_reader_tails_the_wal(tmp_path):
    with pybk.open(tmp_path / "wal") as wal:
        reader = wal.reader()
        assert reader.read_next(timeout=0.05) is None
        got: list = []

        def follow() -> None:
            for record in reader.tail(idle_timeout=WAIT_S):
                got.append(record)
                if len(got) == 20:
                    return

        tailing = threading.Thread(target=follow)
        tailing.start()
        written = []
        for i in range(20):
            written.append((wal.append(b"%d" % i), b"%d" % i))
            time.sleep(0.005)
        tailing.join(timeout=WAIT_S)
    assert got == written


def test_bad_input_gets_clear_errors(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "precious.txt").write_text("not a WAL")
    with pytest.raises(InvalidConfiguration, match="not empty"):
        pybk.open(tmp_path / "other")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidConfiguration, match="not a directory"):
        pybk.open(tmp_path / "file")
    with pytest.raises(InvalidConfiguration, match="unknown setting 'bogus'"):
        pybk.open(tmp_path / "wal", bogus=1)
    with pytest.raises(InvalidConfiguration, match="one bookie"):
        pybk.open(tmp_path / "wal", ensembleSize=3, writeQuorumSize=2, ackQuorumSize=2)
    with pytest.raises(InvalidConfiguration, match="journalDirectory"):
        pybk.open(tmp_path / "wal", journalDirectory="/tmp/x")
    with pytest.raises(InvalidConfiguration, match="maxEntrySizeBytes=5242880 is too small"):
        pybk.open(tmp_path / "wal", recordMaxBytes=8 << 20, maxEntrySizeBytes=5 << 20)
    with pybk.open(tmp_path / "wal", recordMaxBytes=1000) as wal:
        with pytest.raises(EntryTooLarge):
            wal.append(bytes(1001))
        with pytest.raises(TypeError):
            wal.append("text")  # type: ignore[arg-type]
        with pytest.raises(Exception, match="locked"):
            pybk.open(tmp_path / "wal")
        with pytest.raises(ValueError, match="past the current segment"):
            wal.truncate(Position(99, 0, 0))
        errors: list = []
        done = threading.Event()

        def append_from_callback(_error) -> None:  # runs on the journal's thread
            try:
                wal.append(b"would wait for itself")
            except BookKeeperError as e:
                errors.append(e)
            finally:
                done.set()

        wal.bookie.add_entry_async(999, 0, make_entry(999, 0, -1, b"x"), b"key",
                                   callback=append_from_callback)
        assert done.wait(10)
        assert "would wait for itself" in str(errors[0])
    with pytest.raises(LogClosed):
        wal.append(b"after close")


# -- kill -9 ---------------------------------------------------------------------------

ROUNDS = 20
THREADS = 4


def _check(directory, acked) -> int:
    """Open the WAL and check it against every acknowledgement so far; return the count
    of records in it."""
    with pybk.open(directory) as wal:
        records = list(wal.read())
    positions = [p for p, _ in records]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    found = {p: who(data) for p, data in records}  # every record is exactly one we wrote
    assert len(set(found.values())) == len(found), "a record appears twice"
    lost = {p: ids for p, ids in acked.items() if found.get(p) != ids}
    assert not lost, f"{len(lost)} acknowledged records missing or moved, e.g. " \
                     f"{sorted(lost.items())[:3]}"
    by_writer: dict[tuple[int, int], list[int]] = defaultdict(list)
    for round_no, thread, index in found.values():
        by_writer[round_no, thread].append(index)
    for writer, indexes in by_writer.items():  # in order, and no gap before the last
        assert indexes == list(range(len(indexes))), f"writer {writer}: {indexes[:10]}..."
    return len(records)


@pytest.mark.timeout(300)
def test_kill_minus_nine_loop_keeps_every_acknowledged_record(tmp_path, children):
    """Twenty rounds: a child appends from 4 threads (one pipelining), is SIGKILLed at a
    random moment, and the WAL reopened here holds every acknowledged record at its
    position with its bytes, in order, and nothing it did not write."""
    directory, acks_path = tmp_path / "wal", tmp_path / "acks"
    rng = random.Random(20261121)
    total = 0
    for round_no in range(ROUNDS):
        child = children.spawn(WAL_CHILD, str(directory), str(acks_path), str(round_no),
                               str(THREADS))
        children.wait_for_acks(child, acks_path, count_lines(acks_path) + 20)
        time.sleep(rng.uniform(0.02, 0.3))
        children.kill(child)
        acked = acknowledged(acks_path)
        total = _check(directory, acked)
        assert total >= len(acked)
    assert len(acknowledged(acks_path)) > ROUNDS * 20


@pytest.mark.timeout(180)
def test_kill_minus_nine_keeps_a_deferred_wal_up_to_its_last_sync(tmp_path, children):
    """deferredSync=True: appends return before fdatasync, and a record counts once a
    sync after it returned.  After each SIGKILL the reopened WAL holds every synced
    record, in order, with nothing foreign (a power cut may lose the unsynced ones; a
    SIGKILL, which keeps the page cache, does not)."""
    directory, acks_path = tmp_path / "wal", tmp_path / "acks"
    rng = random.Random(20261126)
    for round_no in range(6):
        child = children.spawn(WAL_CHILD, str(directory), str(acks_path), str(round_no),
                               str(THREADS), "sync=16")
        children.wait_for_acks(child, acks_path, count_lines(acks_path) + 40)
        time.sleep(rng.uniform(0.02, 0.3))
        children.kill(child)
        acked = acknowledged(acks_path)
        assert _check(directory, acked) >= len(acked)


def test_a_deferred_wal_shows_records_to_readers_once_synced(tmp_path):
    with pybk.open(tmp_path / "wal", deferredSync=True) as wal:
        first = wal.append(b"one")
        wal.append(b"two")
        assert list(wal.read()) == []  # written, not yet durable: readers wait
        wal.sync()
        assert [data for _, data in wal.read()] == [b"one", b"two"]
        assert next(iter(wal.read(first)))[1] == b"one"
    with pybk.open(tmp_path / "wal") as wal:
        assert [data for _, data in wal.read()] == [b"one", b"two"]


def test_a_larger_max_entry_size_holds_for_the_client_side_too(tmp_path):
    """maxEntrySizeBytes is a bookie and a client setting: a WAL sets both, so a record
    over the client's default of 5 MiB goes through when the setting allows it."""
    record = os.urandom(6 << 20)
    with pybk.open(tmp_path / "wal", maxEntrySizeBytes=8 << 20,
                   recordMaxBytes=7 << 20) as wal:
        position = wal.append(record)
        assert [data for _, data in wal.read(position)] == [record]


# -- use after close, position arguments, the end of the log ---------------------------


def test_a_closed_wal_refuses_every_call_with_one_error(tmp_path):
    wal = pybk.open(tmp_path / "wal")
    position = wal.append(b"only")
    wal.close()
    calls = {
        "append": lambda: wal.append(b"x"),
        "append_async": lambda: wal.append_async(b"x"),
        "read": lambda: list(wal.read()),
        "reader": lambda: wal.reader(),
        "truncate": lambda: wal.truncate(position),
        "sync": lambda: wal.sync(),
    }
    for name, call in calls.items():
        with pytest.raises(LogClosed, match=r"the WAL at .* is closed") as raised:
            call()
        assert str(tmp_path / "wal") in str(raised.value), name
    wal.close()  # closing again is harmless


def test_a_reader_of_a_closed_wal_says_it_is_closed(tmp_path):
    wal = pybk.open(tmp_path / "wal")
    wal.append(b"one")
    reader = wal.reader()
    records = wal.read()
    wal.close()
    with pytest.raises(LogClosed, match="closed"):
        reader.read_next(timeout=0.1)
    with pytest.raises(LogClosed, match="closed"):
        list(records)


def test_positions_are_taken_as_text_too_and_nonsense_is_refused(tmp_path):
    with pybk.open(tmp_path / "wal") as wal:
        positions = [f.result(timeout=30) for f in
                     [wal.append_async(b"%d" % i) for i in range(50)]]
        middle = positions[20]
        assert list(wal.read(start=str(middle))) == list(wal.read(start=middle))
        assert [p for p, _ in wal.reader(start=str(middle)).read()] == positions[20:]
        for bad in (None, 5, "first", "1:2", (1, 2), Position(0, -1, 0), (0, 1.5, 0),
                    (True, 0, 0)):
            with pytest.raises((TypeError, ValueError),
                               match=r"truncate\(before\).*segment:entry:slot"):
                wal.truncate(bad)
        for bad in (5, "first", "0:1", (0, 0, -1)):
            with pytest.raises((TypeError, ValueError),
                               match=r"start.*segment:entry:slot"):
                wal.read(start=bad)
        wal.truncate(str(middle))
        assert [p for p, _ in wal.read()] == positions[20:]


def test_reading_from_past_the_end_of_the_log_says_so(tmp_path):
    with pybk.open(tmp_path / "wal") as wal:
        last = wal.append(b"last")
        # Where the next record may go is not past the end: nothing to read yet.
        assert list(wal.read(start=Position(last.segment, last.entry, last.slot + 1))) == []
        assert list(wal.read(start=Position(last.segment, last.entry + 1, 0))) == []
        for beyond in (Position(last.segment + 1, 0, 0), Position(99, 0, 0),
                       Position(last.segment, last.entry + 2, 0)):
            with pytest.raises(ValueError, match=f"{beyond} is past the end of the log"):
                wal.read(start=beyond)
            with pytest.raises(ValueError, match="past the end"):
                wal.reader(start=beyond).read_next(timeout=0.1)


def test_a_closed_in_process_client_refuses_every_call(tmp_path, bookie):
    from pybk.client import BookKeeper
    from pybk.errors import ClientClosed
    from pybk.meta.embedded import EmbeddedMetadataStore
    from pybk.meta.ledgers import LedgerManager

    with EmbeddedMetadataStore(tmp_path / "meta") as store:
        bk = BookKeeper.in_process({"b1": bookie}, store)
        ledger = bk.create_ledger(1, 1, 1)
        ledger.add_entry(b"x")
        ledger.close()
        bk.close()
        calls = {
            "create_ledger": lambda: bk.create_ledger(1, 1, 1),
            "open_ledger": lambda: bk.open_ledger(ledger.id),
            "delete_ledger": lambda: bk.delete_ledger(ledger.id),
            "list_ledgers": lambda: bk.list_ledgers(),
        }
        for call in calls.values():
            with pytest.raises(ClientClosed, match="client is closed"):
                call()
        assert LedgerManager(store).ledger_ids() == [ledger.id], \
            "a closed client created or deleted a ledger"
        bk.close()  # closing again is harmless


# -- a WAL dropped without close() ------------------------------------------------------


def test_a_wal_dropped_without_close_releases_its_directory(tmp_path):
    wal = pybk.open(tmp_path / "wal")
    written = [(wal.append(b"r%d" % i), b"r%d" % i) for i in range(10)]
    with pytest.warns(ResourceWarning, match="was not closed"):
        del wal  # as in a notebook: no close(), no with
    with pybk.open(tmp_path / "wal") as wal:  # the lock went with the object
        assert list(wal.read()) == written


def test_a_wal_still_referenced_elsewhere_names_what_to_do(tmp_path):
    wal = pybk.open(tmp_path / "wal")
    kept = [wal]  # as a notebook's Out[] or _ keeps the last value shown
    del wal
    try:
        with pytest.raises(BookKeeperError,
                           match=r"WAL object of this process still has it open.*close\(\)"):
            pybk.open(tmp_path / "wal")
    finally:
        kept.pop().close()
    with pybk.open(tmp_path / "wal") as wal:
        wal.append(b"reopened")
