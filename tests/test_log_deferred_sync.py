"""Deferred sync of logs (``deferredSync=True``) when a segment cannot be forced at a roll.

The promises (docs/guide/ledgers.md, "Deferred sync"): a ``sync()`` that returns means every record
appended before it is durable and readable; a record whose append returned survives the
writer's process dying (only a power cut before a sync may take it).  So a roll never
closes a segment below a record whose append returned: it forces the segment first,
again if the force fails, and a writer whose segment still cannot be forced stops (its
``sync()`` and later appends raise) and leaves the segment open for the next writer's
recovery, which keeps those records.

On the embedded WAL (E = Qw = Qa = 1, its bookie's force failing) and on a cluster of
three bookies over ZeroMQ (E3/Qw2/Qa2, one bookie's force failing, the others' working).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import pytest
from clientutil import clusters

import pybk
from pybk.client.transport import InProcessBookieClient
from pybk.errors import BookKeeperError
from pybk.log import LogReader, LogWriter, Position, wal
from pybk.log.batch import BATCH_HEADER_BYTES, RECORD_OVERHEAD_BYTES
from pybk.settings import LogSettings
from pybk.testing.faults import Faults, FaultyBookieClient
from pybk.testing.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

FORCE = "force_ledger"


def record(i: int) -> bytes:
    return b"record %d;" % i + b"x" * 80


#: Three records (one batch each: appended one at a time) fill a segment; the fourth
#: goes to the next one.
SEGMENT_MAX_BYTES = 3 * (BATCH_HEADER_BYTES + RECORD_OVERHEAD_BYTES + len(record(0)))
CLUSTER_LOG = LogSettings(ensembleSize=3, writeQuorumSize=2, ackQuorumSize=2,
                          segmentMaxBytes=SEGMENT_MAX_BYTES, deferredSync=True)


def journal_failed() -> BookKeeperError:
    return BookKeeperError("injected: the journal's fdatasync failed")


@pytest.fixture
def wal_faults(monkeypatch) -> Iterator[Faults]:
    """The faults between every embedded WAL this test opens and its bookie."""
    faults = Faults()

    def faulty(bookie_id: str, bookie) -> FaultyBookieClient:
        return FaultyBookieClient(InProcessBookieClient(bookie_id, bookie), faults)

    monkeypatch.setattr(wal, "InProcessBookieClient", faulty)
    yield faults
    lift(faults)


def lift(faults: Faults) -> None:
    """No fault from now on; held replies answered as the bookie gave them."""
    faults.fail.clear()
    faults.hold.clear()
    faults.release()


def fail_held_forces(faults: Faults, count: int) -> None:
    """Answer the next ``count`` forces (held as they are sent) with an error."""
    for _ in range(count):
        faults.wait_held(1)
        faults.release(journal_failed())


def open_wal(path) -> pybk.WAL:
    return pybk.open(path, deferredSync=True, segmentMaxBytes=SEGMENT_MAX_BYTES)


def append_across_a_roll(append) -> list[Position]:
    """Three records, then a fourth that rolls the segment (returned before the roll
    closes the first): the positions the appends returned."""
    positions = [append(record(i)) for i in range(4)]
    assert positions[3].segment > positions[2].segment, "the fourth record rolled"
    return positions


def wait_until_stopped(sync) -> None:
    """Call ``sync`` (a force keeps failing: it raises) until it raises the error that
    stopped the writer: its roll gave up on forcing the segment it rolled from."""
    def stopped() -> bool:
        with pytest.raises(BookKeeperError) as raised:
            sync()
        return "could not be forced" in str(raised.value)
    wait_until(stopped, "the writer stopped", timeout_s=30)


def assert_log_holds(read: Iterator[tuple[Position, bytes]],
                     positions: list[Position]) -> None:
    """The log holds exactly the records at ``positions``, in order."""
    assert [(position, data) for position, data in read] == \
        [(position, record(i)) for i, position in enumerate(positions)]


# -- the embedded WAL ------------------------------------------------------------------

def test_a_wal_roll_whose_force_fails_once_forces_again_and_sync_keeps_every_record(
        tmp_path, wal_faults):
    w = open_wal(tmp_path / "wal")
    try:
        wal_faults.hold.add(FORCE)
        positions = append_across_a_roll(w.append)
        fail_held_forces(wal_faults, 1)
        lift(wal_faults)
        w.sync()
        assert_log_holds(w.read(), positions)
    finally:
        lift(wal_faults)  # so that closing does not wait for a held force
        w.close()
    with open_wal(tmp_path / "wal") as w:
        assert_log_holds(w.read(), positions)


def test_a_wal_roll_whose_force_keeps_failing_stops_the_writer_and_loses_nothing(
        tmp_path, wal_faults):
    w = open_wal(tmp_path / "wal")
    try:
        wal_faults.fail.add(FORCE)
        positions = append_across_a_roll(w.append)
        wait_until_stopped(w.sync)
        with pytest.raises(BookKeeperError, match="could not be forced"):
            w.append(record(4))
    finally:
        lift(wal_faults)
        w.close()
    # The writer left the segment open: the next open recovers every record whose
    # append returned (the bookie's process kept them: no power cut).
    with open_wal(tmp_path / "wal") as w:
        assert_log_holds(w.read(), positions)


# -- a cluster: E3/Qw2/Qa2, one bookie's force failing -----------------------------------

@pytest.fixture
def cluster(tmp_path):
    with clusters(tmp_path, "zmq") as make:
        yield make(3)


def open_writer(cluster) -> LogWriter:
    return LogWriter.open(cluster.client(), "log", CLUSTER_LOG)


def test_a_cluster_roll_whose_force_fails_on_one_bookie_forces_again(cluster):
    bk = cluster.client()
    writer = LogWriter.open(bk, "log", CLUSTER_LOG)
    try:
        faults = cluster.faults["B1"]
        faults.hold.add(FORCE)
        positions = append_across_a_roll(writer.append)
        fail_held_forces(faults, 1)
        lift(faults)
        writer.sync()
        assert_log_holds(LogReader(bk, "log", writer=writer).read(), positions)
    finally:
        lift(cluster.faults["B1"])
        writer.close()
    assert_log_holds(LogReader(cluster.client(), "log").read(), positions)


def test_a_cluster_roll_whose_force_keeps_failing_on_one_bookie_loses_nothing(cluster):
    writer = open_writer(cluster)
    try:
        cluster.faults["B1"].fail.add(FORCE)
        positions = append_across_a_roll(writer.append)
        wait_until_stopped(writer.sync)
        with pytest.raises(BookKeeperError, match="could not be forced"):
            writer.append(record(4))
    finally:
        lift(cluster.faults["B1"])
        writer.close()
    successor = LogWriter.open(cluster.client(), "log", CLUSTER_LOG)
    try:
        assert_log_holds(LogReader(cluster.client(), "log").read(), positions)
    finally:
        successor.close()


def test_the_writer_closes_no_segment_below_a_returned_append_when_its_force_fails(
        cluster):
    """The writer's own close: a force that fails leaves the segment to recovery."""
    writer = LogWriter.open(cluster.client(), "log",
                            dataclasses.replace(CLUSTER_LOG, segmentMaxBytes=1 << 20))
    positions = [writer.append(record(i)) for i in range(3)]
    cluster.faults["B1"].fail.add(FORCE)
    with pytest.raises(BookKeeperError):
        writer.close()
    lift(cluster.faults["B1"])
    successor = LogWriter.open(cluster.client(), "log", CLUSTER_LOG)
    try:
        assert_log_holds(LogReader(cluster.client(), "log").read(), positions)
    finally:
        successor.close()
