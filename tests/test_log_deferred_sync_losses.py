"""A deferred-sync log writer's sync() and close() after a bookie failed an add late.

A bookie that fails an add of a deferred segment closes it at its durable LAC
(docs/guide/ledgers.md, "Deferred sync"): the records appended since the last sync() may
be lost, "and the writer stops". With Qw > Qa the add was confirmed by Qa bookies before
the third one's error came: no add of the writer fails, so nothing stops it. If a roll
then closes the segment, the roll finds it closed (its force fails with LedgerClosed)
and goes on, and a later sync() returns: a record appended before that sync() is gone.
"""

from __future__ import annotations

import contextlib

import pytest
from clientutil import clusters

from pybk.errors import BookKeeperError
from pybk.log import LogReader, LogWriter, Position
from pybk.log.batch import BATCH_HEADER_BYTES, RECORD_OVERHEAD_BYTES
from pybk.settings import LogSettings
from pybk.testing.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

FORCE = "force_ledger"


def record(i: int) -> bytes:
    return b"record %d;" % i + b"x" * 80


#: One record fills a segment: the batch after it goes to the next one.
ONE_RECORD = BATCH_HEADER_BYTES + RECORD_OVERHEAD_BYTES + len(record(0))
LATE_QW = LogSettings(ensembleSize=3, writeQuorumSize=3, ackQuorumSize=2,
                      segmentMaxBytes=ONE_RECORD, deferredSync=True)


@pytest.fixture
def cluster(tmp_path):
    with clusters(tmp_path) as make:
        yield make(3)


def lift(cluster) -> None:
    for faults in cluster.faults.values():
        faults.fail.clear()
        faults.hold.clear()
        faults.release()


def close_segment_late(cluster, bk, writer) -> Position:
    """Append a record (returned) and have its segment closed at its durable LAC (-1)
    by B3 failing its add after B1 and B2 acknowledged it, while the roll it set off
    forces the segment; return the record's position once the roll is done."""
    first = writer.metadata.tail[-1].ledger_id
    # B3's answer to the first record's add is held back (B1 and B2 acknowledge it: the
    # append returns), and so is B1's answer to the roll's force of segment 0.
    cluster.faults["B3"].hold.add("add")
    cluster.faults["B3"].only_entries = {0}
    cluster.faults["B1"].hold.add(FORCE)
    appended = writer.append(record(0))
    cluster.faults["B1"].wait_held(1)        # the roll is forcing segment 0
    # B3 fails the add late: the segment is closed at its durable LAC (-1).
    cluster.faults["B3"].wait_answered()
    cluster.faults["B3"].release(BookKeeperError("injected: B3's journal failed"))
    wait_until(lambda: bk.ledger_manager.read(first)[0].state.name == "CLOSED",
               "segment 0 closed by the failed add")
    lift(cluster)                            # the roll's force answers, too late
    wait_until(lambda: not writer.is_closing(first), "the roll is done")
    return appended


def test_a_late_add_failure_then_a_roll_never_lets_sync_return_without_the_record(
        cluster):
    bk = cluster.client()
    writer = LogWriter.open(bk, "log", LATE_QW)
    try:
        appended = close_segment_late(cluster, bk, writer)
        try:
            writer.append(record(1))
            writer.sync()
        except BookKeeperError:
            return  # the writer stopped: sync() did not promise the record
        # sync() returned: every record appended before it must be in the log.
        read = [(p, data) for p, data in LogReader(bk, "log", writer=writer).read()]
        assert (appended, record(0)) in read, \
            f"sync() returned, yet the record appended before it at {appended} is " \
            f"gone; the log holds {read}"
    finally:
        lift(cluster)
        try:
            writer.close()
        except BookKeeperError:
            pass


def test_close_never_returns_normally_after_a_record_whose_append_returned_was_lost(
        cluster):
    """No sync(): the writer stopped in its roll (the segment closed below the record),
    and nothing told any caller; close() syncs a writer that did not stop, so returning
    normally here says the same: the record would have to be there."""
    bk = cluster.client()
    writer = LogWriter.open(bk, "log", LATE_QW)
    try:
        appended = close_segment_late(cluster, bk, writer)
    except BaseException:
        lift(cluster)
        with contextlib.suppress(BookKeeperError):
            writer.close()
        raise
    lift(cluster)
    try:
        writer.close()
    except BookKeeperError:
        return  # told: the record was not promised
    successor = LogWriter.open(cluster.client(), "log", LATE_QW)
    try:
        read = [(p, data) for p, data in LogReader(cluster.client(), "log").read()]
    finally:
        successor.close()
    assert (appended, record(0)) in read, \
        f"close() returned normally, yet the record at {appended} whose append " \
        f"returned is gone (no call raised); the log holds {read}"
