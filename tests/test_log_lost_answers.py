"""A log writer whose compare-and-set of the log's head lands and whose answer is lost
(pybk.log.writer, "Lost answers"): at its open, at a roll, at a truncation.

Every test runs on a real bookie in this process and a real metadata store: the embedded
one and a real ZooKeeper.  The writer's client reaches the store through a
LosesHeadAnswer (tests/commitutil.py): the writer's CAS lands, another client acts on
the log, then the CAS raises what the ZooKeeper store raises when the answer was lost
with its connection: BadVersion (its retry found the head moved on) or
MetadataUnavailable.
"""

from __future__ import annotations

import contextlib

import pytest
import zkutil
from clientutil import FAST
from commitutil import LosesHeadAnswer

from pybk.client import BookKeeper
from pybk.client.transport import InProcessBookieClient
from pybk.errors import BadVersion, BookKeeperError, LogFenced, MetadataUnavailable
from pybk.log import LogReader, LogWriter, Position, jobs
from pybk.log.commit import abort_job
from pybk.log.metadata import log_path, read_log
from pybk.meta.ledger_metadata import LedgerState
from pybk.settings import LogSettings
from pybk.testing.faulty_metadata import FaultyMetadataStore

pytestmark = pytest.mark.timeout(240)

LOG = "events"
SMALL_SEGMENTS = LogSettings(ensembleSize=1, writeQuorumSize=1, ackQuorumSize=1,
                             segmentMaxBytes=256)
#: A record that fills a segment of SMALL_SEGMENTS: the append after it rolls.
FULL = bytes(300)
ERRORS = [BadVersion, MetadataUnavailable]


@pytest.fixture(params=["embedded", "zookeeper"])
def client(request, tmp_path, bookie):
    """Makes BookKeeper clients of one bookie and one metadata store, closed at the end."""
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(zkutil.store_of_kind(request, tmp_path / "meta"))

        def make() -> BookKeeper:
            return stack.enter_context(BookKeeper(
                store, {"B1": InProcessBookieClient("B1", bookie)}, FAST))

        yield make


@pytest.fixture
def writers(client):
    """Opens LogWriters of LOG, closed at the end of the test (quietly: another writer
    may have fenced them)."""
    opened: list[LogWriter] = []

    def open_(bk) -> LogWriter:
        writer = LogWriter.open(bk, LOG, SMALL_SEGMENTS)
        opened.append(writer)
        return writer

    yield open_
    for writer in opened:
        with contextlib.suppress(BookKeeperError):
            writer.close()


def read_all(bk) -> list[tuple[Position, bytes]]:
    return list(LogReader(bk, LOG).read())


def ledger_exists(bk, ledger_id: int) -> bool:
    return ledger_id in bk.list_ledgers()


def append_all(writer: LogWriter, values: list[bytes]) -> list[tuple[Position, bytes]]:
    return [(writer.append(value), value) for value in values]


def give_a_job_up(bk) -> None:
    """Another client begins a job and aborts it: CASes of the head's job lists, which
    take the log over from no one."""
    assert abort_job(bk, LOG, jobs.begin_job(bk.metadata, LOG))


def open_and_write(bk, values: list[bytes]) -> list[tuple[Position, bytes]]:
    """Another client opens a writer of the log (taking it over), appends ``values``
    and closes it."""
    with LogWriter.open(bk, LOG, SMALL_SEGMENTS) as writer:
        return append_all(writer, values)


# -- opening ------------------------------------------------------------------------------


@pytest.mark.parametrize("error", ERRORS)
def test_an_open_whose_cas_landed_goes_on_as_the_writer(client, writers, error):
    """The opening CAS lands, another client gives a job up, then its answer is lost:
    the opener is the log's writer in the segment that CAS added (not deleted, and no
    second takeover), and what it appends reads back after what was there."""
    bk, bk2 = client(), client()
    before = open_and_write(bk2, [b"before"])
    bk.metadata = lost = LosesHeadAnswer(bk.metadata, LOG, lambda head: head.epoch == 2,
                                         lambda: give_a_job_up(bk2), error)

    writer = writers(bk)

    assert lost.written is not None
    added = lost.written.tail[-1]
    assert writer.metadata.epoch == 2 and writer.metadata.tail[-1] == added
    after = append_all(writer, [b"after"])
    assert after[0][0].segment == added.number
    writer.close()
    assert read_all(bk2) == before + after
    assert read_log(bk2.metadata, LOG).metadata.epoch == 2


@pytest.mark.parametrize("error", ERRORS)
def test_an_open_whose_cas_landed_before_another_writer_took_over_keeps_its_segment(
        client, writers, error):
    """The opening CAS of a new log lands (its segment is the log's first), another
    writer opens the log and rolls twice, then the answer is lost: the opener's segment
    stays a segment of the log (a segment is never deleted by the writer that lost its
    answer), the opener takes the log over again, and every record reads back.  (Before,
    the opener took the answer for a lost race and deleted the ledger: readers failed
    with NoSuchLedger at segment 0 for good.)"""
    bk, bk2 = client(), client()
    other: list[tuple[Position, bytes]] = []
    bk.metadata = lost = LosesHeadAnswer(
        bk.metadata, LOG, lambda head: head.epoch == 1,
        lambda: other.extend(open_and_write(bk2, [b"a" + FULL, b"b" + FULL, b"c" + FULL])),
        error)

    writer = writers(bk)

    assert lost.written is not None
    first = lost.written.tail[-1]
    assert first.number == 0 and ledger_exists(bk2, first.ledger_id)
    assert [p.segment for p, _ in other] == [1, 2, 3]
    assert writer.metadata.epoch == 3
    after = append_all(writer, [b"after"])
    writer.close()
    assert read_all(bk2) == other + after


def test_an_open_whose_cas_answer_is_lost_with_the_store_says_its_outcome_is_unknown(
        client, writers):
    """The opening CAS lands and the store stays unreachable: the open fails saying the
    outcome is unknown, and deletes nothing; the next writer opens the log (recovering
    the segment that CAS added) and every record reads back."""
    bk, bk2 = client(), client()
    before = open_and_write(bk2, [b"before"])
    bk.metadata = lost = LosesHeadAnswer(bk.metadata, LOG, lambda head: head.epoch == 2,
                                         lambda: None, MetadataUnavailable,
                                         unreachable_calls=1000)

    with pytest.raises(MetadataUnavailable, match="unknown"):
        writers(bk)

    assert lost.written is not None
    assert ledger_exists(bk2, lost.written.tail[-1].ledger_id)
    after = open_and_write(bk2, [b"after"])
    assert read_all(bk2) == before + after


def test_an_open_whose_cas_failed_with_the_store_unreachable_leaves_its_ledger_closed(
        client, writers):
    """The opening CAS fails with MetadataUnavailable without landing (the head says so
    when read again): the open fails with it.  The head is still at the version that CAS
    expected, so it may still land (a store that had it in flight): its ledger is closed
    and left, not deleted (a head naming a deleted ledger fails readers:
    tests/test_log_late_cas.py)."""
    bk, bk2 = client(), client()
    before = open_and_write(bk2, [b"before"])
    ledgers = set(bk2.list_ledgers())
    bk.metadata = faults = FaultyMetadataStore(bk.metadata, log_path(LOG))
    faults.fail_when = lambda operation, path: path == log_path(LOG)

    with pytest.raises(MetadataUnavailable):
        writers(bk)

    left = set(bk2.list_ledgers()) - ledgers
    assert len(left) == 1 and set(bk2.list_ledgers()) >= ledgers
    assert bk2.open_ledger(left.pop(), b"").metadata.state is LedgerState.CLOSED
    assert read_log(bk2.metadata, LOG).metadata.epoch == 1
    assert read_all(bk2) == before


# -- rolling --------------------------------------------------------------------------------


@pytest.mark.parametrize("error", ERRORS)
def test_a_roll_whose_cas_landed_goes_on(client, writers, error):
    """A roll's CAS lands, another client gives a job up, then its answer is lost: the
    writer goes on in the segment that CAS added, and every record reads back.  (Before,
    the writer stopped with LogFenced and deleted that segment's ledger.)"""
    bk, bk2 = client(), client()
    writer = writers(bk)
    bk.metadata = lost = LosesHeadAnswer(bk.metadata, LOG,
                                         lambda head: head.next_segment == 2,
                                         lambda: give_a_job_up(bk2), error)

    written = append_all(writer, [b"a" + FULL, b"b" + FULL, b"c" + FULL])

    assert lost.written is not None
    assert [p.segment for p, _ in written] == [0, 1, 2]
    assert writer.metadata.tail[1] == lost.written.tail[-1]
    writer.close()
    assert read_all(bk2) == written


@pytest.mark.parametrize("error", ERRORS)
def test_a_roll_whose_cas_landed_before_another_writer_took_over_is_fenced(
        client, writers, error):
    """A roll's CAS lands, another writer opens the log (dropping the empty segment the
    roll added) and appends, then the answer is lost: the writer stops with LogFenced,
    and every record acknowledged reads back."""
    bk, bk2 = client(), client()
    writer = writers(bk)
    other: list[tuple[Position, bytes]] = []
    bk.metadata = lost = LosesHeadAnswer(
        bk.metadata, LOG, lambda head: head.next_segment == 2,
        lambda: other.extend(open_and_write(bk2, [b"other"])), error)
    written = append_all(writer, [b"a" + FULL])

    with pytest.raises(LogFenced):
        writer.append(b"b")

    assert lost.written is not None
    assert read_all(bk2) == written + other


# -- truncating -----------------------------------------------------------------------------


@pytest.mark.parametrize("error", ERRORS)
def test_a_truncation_whose_cas_landed_deletes_the_segments_and_goes_on(
        client, writers, error):
    """A truncation's CAS lands, another client gives a job up, then its answer is lost:
    the truncation deletes the segments before its position, and the writer goes on.
    (Before, truncate() raised LogFenced or MetadataUnavailable and deleted nothing.)"""
    bk, bk2 = client(), client()
    writer = writers(bk)
    written = append_all(writer, [b"a" + FULL, b"b" + FULL, b"c" + FULL])
    bound = written[2][0]
    bk.metadata = lost = LosesHeadAnswer(bk.metadata, LOG,
                                         lambda head: head.truncated_before == bound,
                                         lambda: give_a_job_up(bk2), error)

    assert writer.truncate(bound) == 2

    assert lost.hit
    after = append_all(writer, [b"d" + FULL, b"e"])
    writer.close()
    assert read_all(bk2) == written[2:] + after
    head = read_log(bk2.metadata, LOG).metadata
    assert head.truncated_before == bound and head.oldest_segment == bound.segment


def test_a_writer_whose_truncation_cas_answer_was_never_told_goes_on(client, writers):
    """A truncation's CAS lands and the store is unreachable until after the truncation
    fails (MetadataUnavailable): the writer's next change of the head (a roll) is not
    taken for another writer's takeover; the writer goes on, and truncating again
    finishes the deletions."""
    bk, bk2 = client(), client()
    writer = writers(bk)
    written = append_all(writer, [b"a" + FULL, b"b" + FULL, b"c" + FULL])
    bound = written[2][0]
    bk.metadata = LosesHeadAnswer(bk.metadata, LOG,
                                  lambda head: head.truncated_before == bound,
                                  lambda: give_a_job_up(bk2), MetadataUnavailable,
                                  unreachable_calls=1)
    with pytest.raises(MetadataUnavailable):
        writer.truncate(bound)

    after = append_all(writer, [b"d" + FULL, b"e" + FULL, b"f"])

    assert [p.segment for p, _ in after] == [3, 4, 5]
    assert writer.truncate(bound) == 2
    writer.close()
    assert read_all(bk2) == written[2:] + after
