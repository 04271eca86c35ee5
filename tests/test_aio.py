"""pybk.aio, the asyncio face: many tasks appending to a real WAL (fsync'd files) and to
ledgers and logs over real bookies (in-process, ZeroMQ on loopback, and ``pybk bookie``
processes with their metadata on ZooKeeper), cancellation in the middle of appends,
tails that see new records, back-pressure from a client that blocks, and a loop that is
never held: a ticker task measures how late the loop runs it while the work goes on."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time

import pytest
from aioutil import LoopWatch
from clientutil import FAST, PROCESSES, BookiePool, clusters

import pybk
import pybk.aio
from pybk.aio import AsyncBookKeeper
from pybk.errors import (
    ClientClosed,
    DuplicateEntryId,
    InvalidConfiguration,
    LedgerClosed,
    LogClosed,
)
from pybk.log.position import Position

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]

TASKS = 50
APPENDS_PER_TASK = 20
#: How long tests hold the work underneath the loop (a held add, a full throttle), in
#: seconds: a loop that waited for it would not turn during the hold.
HOLD_S = 2.0


def aio_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("pybk-aio")]


async def append_from_tasks(append, tag: bytes) -> list[list[tuple[object, bytes]]]:
    """TASKS tasks appending APPENDS_PER_TASK records each; per task, (result, record)."""
    async def task(number: int) -> list[tuple[object, bytes]]:
        done = []
        for i in range(APPENDS_PER_TASK):
            record = b"%s-%d-%d" % (tag, number, i)
            done.append((await append(record), record))
        return done
    return await asyncio.gather(*(task(n) for n in range(TASKS)))


def check_each_task_in_order(results: list[list[tuple[object, bytes]]]) -> dict:
    """Every task's results increase; all are distinct.  Returns result -> record."""
    placed = {}
    for done in results:
        assert [r for r, _ in done] == sorted(r for r, _ in done)
        placed.update(done)
    assert len(placed) == TASKS * APPENDS_PER_TASK
    return placed


# -- the embedded WAL --------------------------------------------------------------------


async def test_1000_appends_from_50_tasks_are_durable_in_position_order(tmp_path):
    path = tmp_path / "wal"
    async with await pybk.aio.open(path) as wal:
        async with LoopWatch() as watch:
            results = await append_from_tasks(wal.append, b"r")
        placed = check_each_task_in_order(results)
        assert all(isinstance(p, Position) for p in placed)
    assert watch.ticks > 0 and not watch.waits, watch.waits[:3]
    # Durable: a new open (which recovers the log) reads each record at its position.
    async with await pybk.aio.open(path) as wal:
        read = [record async for record in wal.read()]
    assert read == sorted(placed.items())
    assert not aio_threads()


async def test_the_loop_watch_sees_a_pybk_call_that_waits_on_the_loop(tmp_path):
    """The check the tests above rely on can fail: the thread-based WAL's append, called
    on the loop's thread, waits there for its journal's sync, and the watch says so."""
    with pybk.open(tmp_path / "wal") as wal:
        async with LoopWatch() as watch:
            wal.append(b"blocking")
    assert any("pybk." in wait for wait in watch.waits), watch.waits


async def test_submit_pipelines_in_call_order_and_sync_covers_what_was_queued(tmp_path):
    async with await pybk.aio.open(tmp_path / "wal", max_pending=64) as wal:
        futures = [await wal.submit(b"p-%d" % i) for i in range(2000)]
        await wal.sync()  # covers records still queued for the submitter
        assert all(f.done() for f in futures)
        positions = [f.result() for f in futures]
        assert positions == sorted(positions) and len(set(positions)) == 2000
        assert [data async for _, data in wal.read()] == [b"p-%d" % i for i in range(2000)]


async def test_a_cancelled_append_is_still_written_and_the_wal_goes_on(tmp_path):
    """Cancelling the awaiting task stops the wait, not the append (it is durable once a
    sync returns); a task cancelled while it waits for room appended nothing."""
    async with await pybk.aio.open(tmp_path / "wal", max_pending=1) as wal:
        queued = asyncio.create_task(wal.append(b"queued"))
        waiting = asyncio.create_task(wal.append(b"never"))
        await asyncio.sleep(0)  # both ran: the first is queued, the second waits for room
        queued.cancel()
        waiting.cancel()
        for task in (queued, waiting):
            with pytest.raises(asyncio.CancelledError):
                await task
        await wal.sync()
        after = await wal.append(b"after")
        records = [data async for _, data in wal.read()]
        assert records == [b"queued", b"after"]
        # Cancelled in the middle of many appends (one queued at a time, the others
        # waiting for room): the queued one is written, the waiting ones are not, and
        # the rest complete in order.
        tasks = [asyncio.create_task(wal.append(b"m-%d" % i)) for i in range(100)]
        await asyncio.sleep(0)
        for task in tasks[::3]:
            task.cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        kept = [p for p in done if isinstance(p, Position)]
        assert kept == sorted(kept) and kept[0] > after
        await wal.sync()
        records = [data async for _, data in wal.read(after)]
        assert records[1:] == [b"m-%d" % i for i in range(100) if i == 0 or i % 3]


async def test_the_tail_sees_new_records_and_stops_on_aclose(tmp_path):
    async with await pybk.aio.open(tmp_path / "wal") as wal:
        await wal.append(b"old")
        seen: list[bytes] = []
        tail = wal.reader().tail()

        async def follow() -> None:
            async for _, data in tail:
                seen.append(data)

        follower = asyncio.create_task(follow())
        for i in range(50):
            await wal.append(b"new-%d" % i)
            if i % 10 == 0:
                await asyncio.sleep(0.05)  # the tail catches up and waits for more
        deadline = time.monotonic() + 20
        while len(seen) < 51 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert seen == [b"old"] + [b"new-%d" % i for i in range(50)]
        assert "pybk-aio-read" in aio_threads()
        await tail.aclose()
        await asyncio.wait_for(follower, 10)  # the stream ended for its consumer too
        assert "pybk-aio-read" not in aio_threads()
        # A tail with an idle timeout ends by itself; one left open is closed with the WAL.
        assert [d async for _, d in wal.reader(Position(0, 0, 0)).tail(0.2)][0] == b"old"
        async for _ in wal.reader().tail():
            break
    assert not aio_threads()


async def test_errors_reach_the_awaiting_caller_and_leave_nothing_open(tmp_path):
    async with await pybk.aio.open(tmp_path / "wal", recordMaxBytes=1024) as wal:
        with pytest.raises(pybk.BookKeeperError, match="recordMaxBytes"):
            await wal.append(bytes(2048))
        with pytest.raises(TypeError, match="bytes"):
            await wal.append("text")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="past the end"):
            async for _ in wal.read(Position(9, 0, 0)):
                pass
        assert await wal.append(b"fine") is not None
    with pytest.raises(LogClosed):
        await wal.append(b"late")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "file").write_text("not a WAL")
    with pytest.raises(InvalidConfiguration, match="not empty"):
        await pybk.aio.open(tmp_path / "other")
    # An open whose caller is cancelled is closed underneath: the directory is free.
    opening = asyncio.create_task(pybk.aio.open(tmp_path / "wal"))
    await asyncio.sleep(0.01)
    opening.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        opened = await opening
        await opened.close()  # it won the race with the cancel
    async with await pybk.aio.open(tmp_path / "wal") as wal:
        assert [d async for _, d in wal.read()] == [b"fine"]
    assert not aio_threads()


# -- ledgers and logs over real bookies ----------------------------------------------------


@pytest.fixture(scope="module")
def bookie_pool(tmp_path_factory, zookeeper):
    pool = BookiePool(tmp_path_factory.mktemp("pool"), zookeeper, 3)
    yield pool
    pool.close()


@pytest.fixture(params=("inprocess", "zmq", PROCESSES))
def cluster(tmp_path, request):
    pool = request.getfixturevalue("bookie_pool") if request.param == PROCESSES else None
    with clusters(tmp_path, request.param, pool) as make:
        yield make(3)


async def test_ledger_adds_from_50_tasks_reads_and_lac(cluster):
    async with AsyncBookKeeper(cluster.client()) as bk:
        lh = await bk.create_ledger(3, 2, 2)
        async with LoopWatch() as watch:
            results = await append_from_tasks(lh.add, b"e")
        placed = check_each_task_in_order(results)
        assert sorted(placed) == list(range(TASKS * APPENDS_PER_TASK))
        assert lh.last_add_confirmed == TASKS * APPENDS_PER_TASK - 1
        entries = [e async for e in lh.read_entries(0, lh.last_add_confirmed)]
        assert [e.data for e in entries] == [placed[i] for i in range(len(placed))]
        assert (await lh.read_entry(7)).data == placed[7]
        await lh.close()
        assert lh.is_closed
        with pytest.raises(LedgerClosed):
            await lh.add(b"late")
        reopened = await bk.open_ledger(lh.id)
        assert reopened.last_add_confirmed == len(placed) - 1
        await reopened.close()
        assert lh.id in await bk.list_ledgers()
        left_open = await bk.open_ledger(lh.id, recovery=False)
    with pytest.raises(ClientClosed, match="close"):  # raised, not a hang
        await left_open.close()
    with pytest.raises(ClientClosed):
        await bk.create_ledger()
    assert not watch.waits, watch.waits[:3]
    assert not aio_threads()


async def test_adv_adds_from_tasks_out_of_order_and_reads_past_the_lac(cluster):
    """A ledger whose caller gives ids: tasks add ids in reverse order of one another, an
    add above a missing id waits for it, each is acknowledged in id order; a reader
    reads past its (stale) LAC with read_unconfirmed and catches up with
    try_read_last_add_confirmed."""
    async with AsyncBookKeeper(cluster.client()) as bk:
        lh = await bk.create_ledger_adv(3, 2, 2)
        async with LoopWatch() as watch:
            high = asyncio.create_task(lh.add(5, b"entry 5"))
            before = watch.ticks
            await asyncio.sleep(HOLD_S / 3)
            assert not high.done()  # ids 0..4 are missing: it waits, the loop does not
            assert watch.ticks_during(before) > 1
            ids = await asyncio.gather(*(lh.add(i, b"entry %d" % i)
                                         for i in reversed(range(5))))
            assert ids == list(reversed(range(5))) and await high == 5
        assert not watch.waits, watch.waits[:3]
        assert lh.last_add_confirmed == 5
        with pytest.raises(DuplicateEntryId):
            await lh.add(3, b"again")
        reader = await bk.open_ledger(lh.id, recovery=False)
        assert [e.data async for e in reader.read_unconfirmed(0, 5)] == \
            [b"entry %d" % i for i in range(6)]
        await lh.add(6, b"entry 6")  # carries LAC 5 to the bookies
        assert await reader.try_read_last_add_confirmed() >= 5
        await reader.close()
        await lh.close()
    assert not aio_threads()


async def test_a_blocking_client_makes_callers_wait_not_the_loop(cluster):
    """With every reply held and the client's throttle full, the submitter thread waits
    in the client; further adds wait for room; the loop keeps ticking.  Released, every
    add completes in order; a cancelled one was sent all the same."""
    settings = dataclasses.replace(FAST, throttle=8, addEntryTimeout=30.0)
    async with AsyncBookKeeper(cluster.client(settings), max_pending=16) as bk:
        lh = await bk.create_ledger(3, 3, 3)
        for faults in cluster.faults.values():
            faults.hold = {"add"}
        async with LoopWatch() as watch:
            tasks = [asyncio.create_task(lh.add(b"a-%d" % i)) for i in range(40)]
            deadline = time.monotonic() + 20
            while len(cluster.faults["B1"].held()) < 8 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            before = watch.ticks
            await asyncio.sleep(HOLD_S)  # the submitter is stuck on the throttle meanwhile
            turned = watch.ticks_during(before)
            assert len(cluster.faults["B1"].held()) == 8  # the throttle: 8 outstanding
            assert not any(task.done() for task in tasks)
            tasks[3].cancel()
            for faults in cluster.faults.values():
                faults.hold = set()
                faults.release()
            done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        assert turned > 1 and not watch.waits, (turned, watch.waits[:3])
        assert isinstance(done[3], asyncio.CancelledError)
        assert [d for i, d in enumerate(done) if i != 3] == [i for i in range(40) if i != 3]
        await lh.close()
        assert lh.last_add_confirmed == 39  # the cancelled add is entry 3, acknowledged
        assert (await bk.open_ledger(lh.id, recovery=False)).metadata.last_entry_id == 39


async def test_a_failure_underneath_reaches_every_awaiting_caller(cluster):
    """A bookie failing every add, with no bookie to replace it: the ledger closes at its
    LAC, every add waiting on it fails, and nothing hangs or stays behind."""
    async with AsyncBookKeeper(cluster.client()) as bk:
        lh = await bk.create_ledger(3, 3, 3)
        assert await lh.add(b"kept") == 0
        cluster.faults["B1"].fail = {"add"}
        done = await asyncio.wait_for(asyncio.gather(
            *(lh.add(b"x-%d" % i) for i in range(20)), return_exceptions=True), 60)
        assert all(isinstance(outcome, pybk.BookKeeperError) for outcome in done), done
        with contextlib.suppress(pybk.BookKeeperError):
            await lh.close()
        assert lh.is_closed and lh.last_add_confirmed == 0
        reopened = await bk.open_ledger(lh.id, recovery=False)
        assert [e.data async for e in reopened.read_entries(0, 0)] == [b"kept"]
        await reopened.close()
    assert not aio_threads()


async def test_a_log_writer_and_a_tail_over_the_cluster(cluster):
    async with AsyncBookKeeper(cluster.client()) as bk:
        writer = await bk.open_log_writer("aio-log")
        tail = bk.log_reader("aio-log").tail()
        seen: list[bytes] = []

        async def follow() -> None:
            async for _, data in tail:
                seen.append(data)
                if len(seen) == 200:
                    return

        follower = asyncio.create_task(follow())
        positions = await asyncio.gather(*(writer.append(b"l-%d" % i) for i in range(200)))
        assert positions == sorted(positions)
        await asyncio.wait_for(follower, 60)
        assert seen == [b"l-%d" % i for i in range(200)]
        await tail.aclose()
        await writer.close()
        with pytest.raises(LogClosed):
            await writer.append(b"late")
        reader = bk.log_reader("aio-log")
        assert [d async for _, d in reader.read()] == seen
        assert await reader.read_next(0.05) is None


@pytest.mark.zookeeper
async def test_connect_to_a_cluster_of_bookie_processes(bookie_pool, tmp_path):
    async with await pybk.aio.connect(bookie_pool.address, FAST) as bk:
        lh = await bk.create_ledger(3, 2, 2)
        assert await asyncio.gather(*(lh.add(b"c-%d" % i) for i in range(100))) == \
            list(range(100))
        await lh.close()
        await bk.delete_ledger(lh.id)
        assert lh.id not in await bk.list_ledgers()
    with pytest.raises(InvalidConfiguration, match="zk://"):
        await pybk.aio.connect("tcp://nowhere:1")
    assert not aio_threads()


@pytest.mark.zookeeper
async def test_a_cancelled_connect_closes_the_clients_zookeeper_session(zookeeper,
                                                                         monkeypatch):
    """A connect whose caller is cancelled while it connects closes what it opened, the
    ZooKeeper session and ZeroMQ loop included (ClusterBookKeeper.close, not only the
    base client's threads)."""
    import zkutil

    import pybk.net.connect
    from pybk.testing import wait_until
    address = zkutil.formatted_cluster(zookeeper)
    root = address[address.index("/", len("zk://")):]
    connect = pybk.net.connect.connect
    opened: list = []
    connected, cancelled = threading.Event(), threading.Event()

    def held_connect(*args, **kwargs):
        # Connects, then returns only once its caller was cancelled.
        opened.append(connect(*args, **kwargs))
        connected.set()
        cancelled.wait(30)
        return opened[0]

    monkeypatch.setattr(pybk.net.connect, "connect", held_connect)

    def session_threads() -> list[str]:
        return [t.name for t in threading.enumerate()
                if t.name == f"pybk-zk-session {root}"]

    try:
        connecting = asyncio.create_task(pybk.aio.connect(address, FAST))
        assert await asyncio.to_thread(connected.wait, 30)
        connecting.cancel()
        cancelled.set()
        with pytest.raises(asyncio.CancelledError):
            await connecting
        await asyncio.to_thread(wait_until, lambda: opened[0].closed, "client closed")
        await asyncio.to_thread(wait_until, lambda: not session_threads(),
                                "the cancelled connect's ZooKeeper session closed", 10)
    finally:
        cancelled.set()
        for client in opened:
            client.close()
