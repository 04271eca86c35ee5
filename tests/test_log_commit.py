"""Committing jobs' ledgers to a log in one compare-and-set (pybk.log.commit), giving jobs
up (abort, orphans), and the head's job bookkeeping (pybk.log.jobs, head format 3).

Every test runs on a real bookie in this process and a real metadata store: the
embedded one, and the ones marked so on a real ZooKeeper too.  Each client's metadata
goes through a FaultyMetadataStore of its own, so a test can stall one party's writes
while another goes on (a party stalled for good is one that died).
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import threading
import time

import pytest
import zkutil
from clientutil import FAST
from clusterutil import address, bookies, child_env  # noqa: F401 (fixtures)
from commitutil import LosesCommitAnswer

import pybk
from pybk.client import BookKeeper
from pybk.client.transport import InProcessBookieClient
from pybk.errors import (
    BadVersion,
    BookKeeperError,
    InvalidConfiguration,
    JobFinished,
    LogFenced,
    MetadataUnavailable,
    TooManyLedgers,
)
from pybk.log import LogReader, LogWriter, Position, jobs
from pybk.log.batch import encode_batch
from pybk.log.commit import Sink, abort_job, clean_orphans, commit_job
from pybk.log.metadata import (
    COMMIT_LEDGERS_MAX,
    FORMAT_VERSION,
    MAGIC,
    TAIL_SEGMENTS,
    LogMetadata,
    jobs_path,
    live_segments,
    log_path,
    read_log,
    read_segment,
    segments_path,
)
from pybk.meta.embedded import EmbeddedMetadataStore
from pybk.meta.sealed import seal
from pybk.settings import LogSettings
from pybk.testing.faulty_metadata import FaultyMetadataStore

pytestmark = pytest.mark.timeout(240)

LOG = "events"
ONE_COPY = LogSettings(ensembleSize=1, writeQuorumSize=1, ackQuorumSize=1)
SMALL_SEGMENTS = dataclasses.replace(ONE_COPY, segmentMaxBytes=256)


class Parties:
    """BookKeeper clients of one bookie and one metadata store, each with the
    FaultyMetadataStore its metadata goes through (:meth:`client`)."""

    def __init__(self, store, bookie, stack: contextlib.ExitStack) -> None:
        self.store, self._bookie, self._stack = store, bookie, stack
        self._faults: list[FaultyMetadataStore] = []
        stack.callback(self._release_all)

    def client(self) -> tuple[BookKeeper, FaultyMetadataStore]:
        faults = FaultyMetadataStore(self.store)
        self._faults.append(faults)
        bk = self._stack.enter_context(BookKeeper(
            faults, {"B1": InProcessBookieClient("B1", self._bookie)}, FAST))
        return bk, faults

    def _release_all(self) -> None:  # no client thread stays blocked on a held write
        for faults in self._faults:
            faults.release_all()


@pytest.fixture(params=["embedded", "zookeeper"])
def parties(request, tmp_path, bookie):
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(zkutil.store_of_kind(request, tmp_path / "meta"))
        yield Parties(store, bookie, stack)


@pytest.fixture
def embedded(tmp_path, bookie):
    """Parties on the embedded store only (for tests about the protocol's logic)."""
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(EmbeddedMetadataStore(str(tmp_path / "meta")))
        yield Parties(store, bookie, stack)


@pytest.fixture
def writers():
    """Opens LogWriters of LOG, closed at the end of the test (quietly: a commit may
    have fenced them)."""
    opened: list[LogWriter] = []

    def open_(bk, settings=SMALL_SEGMENTS) -> LogWriter:
        writer = LogWriter.open(bk, LOG, settings)
        opened.append(writer)
        return writer

    yield open_
    for writer in opened:
        with contextlib.suppress(BookKeeperError):
            writer.close()


# -- helpers ------------------------------------------------------------------------------


def task_ledger(bk, job_id: str, partition: int, records: list[bytes], attempt: int = 0,
                per_entry: int = 3) -> int:
    """What a task attempt does: create a ledger, register it in the job, write the
    records in the log's batch format (``per_entry`` a batch), close it."""
    ledger = bk.create_ledger(1, 1, 1)
    jobs.register_ledger(bk, LOG, job_id, ledger.id, partition, attempt)
    for i in range(0, len(records), per_entry):
        ledger.add_entry(encode_batch(records[i:i + per_entry]))
    ledger.close()
    return ledger.id


def partition_records(partition: int, count: int) -> list[bytes]:
    return [b"p%d r%d" % (partition, i) for i in range(count)]


def read_all(bk, writer=None) -> list[tuple[Position, bytes]]:
    return list(LogReader(bk, LOG, writer=writer).read())


def values(records) -> list[bytes]:
    return [value for _position, value in records]


def head(bk) -> LogMetadata:
    return read_log(bk.metadata, LOG).metadata


def ledger_exists(bk, ledger_id: int) -> bool:
    return ledger_id in bk.list_ledgers()


def job_exists(bk, job_id: str) -> bool:
    return bk.metadata.exists(jobs.job_path(LOG, job_id))


def only_its_marker(bk, job_id: str) -> bool:
    """Of a committed job, only its committed marker is left (kept for a day, so that an
    abort after the commit's answer was lost answers committed)."""
    found = jobs.read_job(bk.metadata, LOG, job_id)
    return found is not None and found[0].committed is not None \
        and not jobs.job_ledgers(bk.metadata, LOG, job_id)


def in_thread(function) -> tuple[threading.Thread, list]:
    """Run ``function`` in a thread; the list gets its result or its exception."""
    outcome: list = []

    def run():
        try:
            outcome.append(function())
        except BaseException as e:  # handed to the test, which asserts on it
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def release_until(faults: FaultyMetadataStore, stop, timeout_s: float = 30.0):
    """Let ``faults``' held writes land one by one until ``stop(write)`` names one held
    (returned, still held)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for write in faults.held():
            if stop(write):
                return write
            faults.release(write)
        time.sleep(0.005)
    raise AssertionError(f"no held write matched within {timeout_s} s")


def test_a_commit_of_more_ledgers_than_the_tail_holds_reads_back_in_partition_order(
        parties, writers):
    """After records a writer appended, a job of 7 partitions (one of them in 3 ledgers,
    one retried: its first attempt's ledger is not committed) is committed in one CAS:
    readers find every record once, the writer's first, then the job's in partition
    order; the head's tail is cut back to TAIL_SEGMENTS with every segment recorded; the
    failed attempt's ledger and the job's records are deleted."""
    bk, _faults = parties.client()
    with writers(bk) as writer:
        before = [writer.append(b"before %d" % i) for i in range(2)]
    job = jobs.begin_job(bk.metadata, LOG)
    failed = task_ledger(bk, job, 3, partition_records(3, 4), attempt=0)
    committed_ledgers, expected = [], [b"before 0", b"before 1"]
    for partition in range(7):
        records = partition_records(partition, 9)
        pieces = [records[:3], records[3:6], records[6:]] if partition == 5 else [records]
        for piece in pieces:
            committed_ledgers.append(task_ledger(bk, job, partition, piece,
                                                 attempt=1 if partition == 3 else 0))
        expected += records
    assert len(committed_ledgers) > TAIL_SEGMENTS

    result = commit_job(bk, LOG, job, committed_ledgers)

    assert result.committed
    assert [s.ledger_id for s in result.segments] == committed_ledgers
    records = read_all(bk)
    assert values(records) == expected
    assert [p for p, _ in records] == sorted(p for p, _ in records)
    assert records[:2] == list(zip(before, [b"before 0", b"before 1"]))
    final = head(bk)
    assert len(final.tail) == TAIL_SEGMENTS and final.committing == ()
    assert final.tail[-1][:2] == result.segments[-1][:2]
    assert [s.ledger_id for s in live_segments(bk.metadata, final)][-7:] == \
        committed_ledgers[-7:]
    for segment in result.segments:
        assert read_segment(bk.metadata, LOG, segment.number).ledger_id == segment.ledger_id
    assert not ledger_exists(bk, failed)
    assert only_its_marker(bk, job)
    with pytest.raises(JobFinished):  # a late attempt: its ledger goes too
        task_ledger(bk, job, 9, [b"late"])
    assert only_its_marker(bk, job)
    assert values(read_all(bk)) == expected
    with writers(bk) as writer:  # a writer takes the log over after the job
        after = writer.append(b"after")
    assert read_all(bk)[-1] == (after, b"after")


def test_a_committer_dying_between_its_cas_and_the_tail_cut_is_finished_by_a_writer(
        parties, writers):
    """The committer stalls after its CAS, before the first segment record: the head
    holds a long tail and no record of the job's segments; readers read the job
    through the tail already.  A LogWriter that opens meanwhile writes the missing
    records, cuts the tail, deletes the failed attempt's ledger and the job's ledger
    records, leaves the job's committed marker, and appends after the job.  The stalled
    committer then goes on, finds the log taken over, leaves the head as the writer made
    it and deletes the marker."""
    bk, faults = parties.client()
    bk2, faults2 = parties.client()
    job = jobs.begin_job(bk.metadata, LOG)
    failed = task_ledger(bk, job, 0, [b"failed attempt"], attempt=0)
    ledgers = [task_ledger(bk, job, p, partition_records(p, 2), attempt=1 if p == 0 else 0)
               for p in range(6)]
    faults.prefix = segments_path(LOG)
    faults.hold_writes = True
    committer, outcome = in_thread(lambda: commit_job(bk, LOG, job, ledgers))
    [stalled] = faults.wait_held(1)

    long = head(bk2)
    assert len(long.tail) == len(ledgers) and long.committing == (job,)
    assert all(read_segment(bk2.metadata, LOG, s.number) is None for s in long.tail)
    expected = [r for p in range(6) for r in partition_records(p, 2)]
    assert values(read_all(bk2)) == expected

    writer = writers(bk2)
    after = writer.append(b"after")
    opened = head(bk2)
    assert len(opened.tail) == TAIL_SEGMENTS and opened.committing == ()
    assert all(read_segment(bk2.metadata, LOG, s.number).ledger_id == s.ledger_id
               for s in long.tail)
    assert not ledger_exists(bk2, failed) and not jobs.job_ledgers(bk2.metadata, LOG, job)
    assert jobs.read_job(bk2.metadata, LOG, job)[0].committed is not None  # its marker
    assert all(ledger_exists(bk2, ledger_id) for ledger_id in ledgers)

    faults.hold_writes = False
    faults.release(stalled)
    committer.join(timeout=30)
    assert not committer.is_alive() and outcome[0].committed
    assert only_its_marker(bk2, job)  # kept: the committer's own answer may be lost
    assert head(bk2) == opened  # the committer saw the writer's takeover
    records = read_all(bk2, writer)
    assert values(records) == expected + [b"after"] and records[-1][0] == after


def test_a_commit_fences_a_live_writer_as_a_new_writer_would(parties, writers):
    bk, _ = parties.client()
    bk2, _ = parties.client()
    writer = writers(bk)
    first = writer.append(b"writer's")
    job = jobs.begin_job(bk2.metadata, LOG)
    ledger = task_ledger(bk2, job, 0, [b"job's"])
    commit_job(bk2, LOG, job, [ledger])
    with pytest.raises(LogFenced):
        writer.append(b"after the commit")
    records = read_all(bk2)
    assert values(records) == [b"writer's", b"job's"] and records[0][0] == first
    reopened = writers(bk)
    late = reopened.append(b"reopened")
    assert values(read_all(bk, reopened)) == [b"writer's", b"job's", b"reopened"]
    assert read_all(bk, reopened)[-1] == (late, b"reopened")


def test_giving_jobs_up_does_not_disturb_a_live_writer(embedded, writers):
    """An orphan cleaner's CAS changes the head under a writer, in job bookkeeping
    only: the writer's next rolls and its truncation make their change again on the new
    head instead of failing (no takeover happened)."""
    bk, _ = embedded.client()
    bk2, _ = embedded.client()
    writer = writers(bk)
    written = [writer.append(b"a" + bytes(300))]
    orphan = jobs.begin_job(bk2.metadata, LOG)
    orphan_ledger = task_ledger(bk2, orphan, 0, [b"orphan"])
    assert clean_orphans(bk2, LOG, 0) == [orphan]
    assert not ledger_exists(bk2, orphan_ledger)
    epoch = head(bk2).epoch
    written += [writer.append(b"b%d" % i + bytes(300)) for i in range(3)]  # rolls
    assert head(bk2).epoch == epoch and len({p.segment for p in written}) == 4
    assert writer.truncate(written[2]) == 2
    assert [p for p, _ in read_all(bk2, writer)] == written[2:]


def test_overwrite_replaces_everything_before_the_job_in_the_same_commit(parties,
                                                                         writers):
    bk, _ = parties.client()
    with writers(bk) as writer:
        for i in range(6):
            writer.append(b"old %d " % i + bytes(300))  # several segments
    old = list(live_segments(bk.metadata, head(bk)))
    assert len(old) > 3
    job = jobs.begin_job(bk.metadata, LOG)
    ledgers = [task_ledger(bk, job, p, partition_records(p, 3)) for p in range(2)]

    result = commit_job(bk, LOG, job, ledgers, overwrite=True)

    assert values(read_all(bk)) == partition_records(0, 3) + partition_records(1, 3)
    final = head(bk)
    assert final.truncated_before == Position(result.segments[0].number, 0, 0)
    assert final.oldest_segment == result.segments[0].number
    assert not {s.ledger_id for s in old} & set(bk.list_ledgers())
    assert all(read_segment(bk.metadata, LOG, n) is None
               for n in range(result.segments[0].number))

    empty = jobs.begin_job(bk.metadata, LOG)
    commit_job(bk, LOG, empty, [], overwrite=True)  # overwrite with nothing: empty log
    assert read_all(bk) == []
    assert not set(ledgers) & set(bk.list_ledgers())


def test_a_replayed_sink_batch_commits_nothing_twice(parties):
    bk, _ = parties.client()
    sink = "query-1"
    committed = []
    for batch_id, replayed in ((0, False), (1, False), (1, True), (2, False)):
        job = jobs.begin_job(bk.metadata, LOG)
        records = [b"batch %d %s" % (batch_id, b"again" if replayed else b"first")]
        ledger = task_ledger(bk, job, 0, records)
        result = commit_job(bk, LOG, job, [ledger], sink=Sink(sink, batch_id))
        assert result.committed == (not replayed)
        assert ledger_exists(bk, ledger) == (not replayed)
        assert not job_exists(bk, job)
        if not replayed:
            committed += records
    assert values(read_all(bk)) == committed
    assert head(bk).sinks == {sink: 2}
    job = jobs.begin_job(bk.metadata, LOG)
    with pytest.raises(InvalidConfiguration, match="sink"):
        commit_job(bk, LOG, job, [], sink=Sink("x" * 129, 3))


def test_a_sink_batch_older_than_the_recorded_one_is_refused_naming_a_new_sink_id(
        embedded):
    """A query whose checkpoint was deleted or reset starts again at batch 0 under the
    same sinkId: its batches are older than the one the log recorded, and would be
    skipped for ever.  Its commit fails saying so and how to start over (a new sinkId);
    nothing changes, and its job is left for the abort that follows."""
    bk, _ = embedded.client()
    for batch_id in (0, 1, 2):
        job = jobs.begin_job(bk.metadata, LOG)
        commit_job(bk, LOG, job, [task_ledger(bk, job, 0, [b"batch %d" % batch_id])],
                   sink=Sink("query", batch_id))
    before = bk.metadata.get(log_path(LOG))
    job = jobs.begin_job(bk.metadata, LOG)
    ledger = task_ledger(bk, job, 0, [b"batch 0 again"])
    with pytest.raises(InvalidConfiguration, match=r"sink 'query' .* batch 2 .* batch 0.*"
                                                   r"new sinkId"):
        commit_job(bk, LOG, job, [ledger], sink=Sink("query", 0))
    assert bk.metadata.get(log_path(LOG)) == before
    assert ledger_exists(bk, ledger) and abort_job(bk, LOG, job)
    assert not ledger_exists(bk, ledger)
    assert values(read_all(bk)) == [b"batch 0", b"batch 1", b"batch 2"]
    job = jobs.begin_job(bk.metadata, LOG)  # the same batch again: a replay, skipped
    assert not commit_job(bk, LOG, job, [task_ledger(bk, job, 0, [b"batch 2 again"])],
                          sink=Sink("query", 2)).committed


def test_an_aborted_job_leaves_nothing_and_its_late_parts_fail(parties):
    bk, _ = parties.client()
    job = jobs.begin_job(bk.metadata, LOG)
    ledgers = [task_ledger(bk, job, p, partition_records(p, 2)) for p in range(3)]
    assert abort_job(bk, LOG, job)
    assert not set(ledgers) & set(bk.list_ledgers())
    assert not job_exists(bk, job)
    assert read_all(bk) == [] and head(bk).aborted == ()
    with pytest.raises(JobFinished):
        commit_job(bk, LOG, job, [])
    late = bk.create_ledger(1, 1, 1)
    with pytest.raises(JobFinished):
        jobs.register_ledger(bk, LOG, job, late.id, 0, 1)
    assert not ledger_exists(bk, late.id) and not job_exists(bk, job)


def test_orphans_are_given_up_by_the_next_commit_or_the_cleaner(parties):
    """A job nothing wrote for orphan_timeout_s is deleted by a commit of another job
    told that timeout; a young job stays; clean_orphans gives up what is left."""
    bk, _ = parties.client()
    orphan = jobs.begin_job(bk.metadata, LOG)
    orphan_ledgers = [task_ledger(bk, orphan, p, [b"orphaned"]) for p in range(2)]
    young = jobs.begin_job(bk.metadata, LOG)
    young_ledger = task_ledger(bk, young, 0, [b"young"])
    waiting = jobs.begin_job(bk.metadata, LOG)  # its tasks have not begun writing
    # The orphan's records were last written a minute ago.
    for ledger in jobs.job_ledgers(bk.metadata, LOG, orphan):
        bk.metadata.set(jobs.ledger_path(LOG, orphan, ledger.ledger_id),
                        ledger._replace(refreshed=time.time() - 60).to_bytes(), -1)
    record, version = jobs.read_job(bk.metadata, LOG, orphan)
    bk.metadata.set(jobs.job_path(LOG, orphan),
                    record._replace(created=time.time() - 60).to_bytes(), version)

    job = jobs.begin_job(bk.metadata, LOG)
    ledger = task_ledger(bk, job, 0, [b"committed"])
    commit_job(bk, LOG, job, [ledger], orphan_timeout_s=30)

    assert not set(orphan_ledgers) & set(bk.list_ledgers()) and not job_exists(bk, orphan)
    assert ledger_exists(bk, young_ledger) and job_exists(bk, young)
    assert values(read_all(bk)) == [b"committed"]
    assert clean_orphans(bk, LOG, 3600) == []
    assert clean_orphans(bk, LOG, 0) == [young]
    assert not ledger_exists(bk, young_ledger)
    # waited for a day, as the committed job's marker does
    assert bk.metadata.children(jobs_path(LOG)) == sorted([waiting, job])
    assert head(bk).aborted == () and values(read_all(bk)) == [b"committed"]


def test_a_cleaner_that_gives_up_a_slow_committers_job_first_wins(embedded):
    """The committer stalls at its CAS; a cleaner gives its job up meanwhile (listed as
    aborted, ledgers and records deleted).  The committer's CAS then fails, and it
    finds its job given up: JobFinished, nothing committed."""
    bk, faults = embedded.client()
    cleaner, _ = embedded.client()
    job = jobs.begin_job(bk.metadata, LOG)
    ledgers = [task_ledger(bk, job, p, [b"slow"]) for p in range(2)]
    faults.hold_writes = True
    committer, outcome = in_thread(lambda: commit_job(bk, LOG, job, ledgers))
    cas = release_until(faults, lambda w: w.operation == "set" and w.path == log_path(LOG))
    assert clean_orphans(cleaner, LOG, 0) == [job]
    assert not set(ledgers) & set(cleaner.list_ledgers())
    faults.release_all()
    committer.join(timeout=30)
    assert not committer.is_alive() and isinstance(outcome[0], JobFinished)
    assert cas.path == log_path(LOG)
    assert read_all(cleaner) == [] and head(cleaner).committing == ()


def test_a_cleaner_after_a_commits_cas_keeps_the_committed_ledgers(embedded):
    """The cleaner comes after the commit's CAS, while the committer stalls before its
    records: the head lists the job as committing, so the cleaner keeps its plan's
    ledgers (and deletes only the others); aborting it then changes nothing either."""
    bk, faults = embedded.client()
    cleaner, _ = embedded.client()
    job = jobs.begin_job(bk.metadata, LOG)
    failed = task_ledger(bk, job, 0, [b"failed"], attempt=0)
    ledgers = [task_ledger(bk, job, 0, [b"kept"], attempt=1)]
    faults.prefix = segments_path(LOG)
    faults.hold_writes = True
    committer, outcome = in_thread(lambda: commit_job(bk, LOG, job, ledgers))
    faults.wait_held(1)
    assert not abort_job(cleaner, LOG, job)
    assert clean_orphans(cleaner, LOG, 0) == []
    assert ledger_exists(cleaner, ledgers[0]) and not ledger_exists(cleaner, failed)
    faults.release_all()
    committer.join(timeout=30)
    assert not committer.is_alive() and outcome[0].committed
    assert values(read_all(cleaner)) == [b"kept"]


def test_too_many_ledgers_for_one_commit_are_refused_before_anything_changes(embedded):
    bk, _ = embedded.client()
    job = jobs.begin_job(bk.metadata, LOG)
    ledger = task_ledger(bk, job, 0, [b"kept"])
    before = bk.metadata.get(log_path(LOG))
    with pytest.raises(TooManyLedgers, match="COMMIT_LEDGERS_MAX"):
        commit_job(bk, LOG, job, range(10**9, 10**9 + COMMIT_LEDGERS_MAX + 1))
    assert bk.metadata.get(log_path(LOG)) == before
    assert ledger_exists(bk, ledger) and job_exists(bk, job)
    with pytest.raises(InvalidConfiguration, match="not a ledger of job"):
        commit_job(bk, LOG, job, [ledger + 1000])
    assert commit_job(bk, LOG, job, [ledger]).committed


def test_a_format_2_head_is_read_and_the_next_commit_writes_the_newest_format(embedded):
    bk, _ = embedded.client()
    bk.metadata.create(log_path(LOG), seal(MAGIC, 2, {
        "name": LOG, "next_segment": 3, "truncated_before": [0, 0, 0], "tail": [],
        "oldest_segment": 0, "dropping": []}))
    old = head(bk)
    assert (old.format_version, old.next_segment, old.sinks, old.epoch) == (2, 3, {}, 0)
    job = jobs.begin_job(bk.metadata, LOG)
    ledger = task_ledger(bk, job, 0, [b"x"])
    result = commit_job(bk, LOG, job, [ledger], sink=Sink("s", 0))
    new = head(bk)
    assert new.format_version == FORMAT_VERSION == 4
    assert (result.segments[0].number, new.sinks, new.epoch) == (3, {"s": 0}, 1)


def test_pybk_clean_orphans_gives_up_a_logs_old_jobs(address, bookies):  # noqa: F811
    """The command on a cluster of one bookie process: the job nothing wrote for the
    given time goes, ledgers and records; the log's records stay."""
    bookies.start_serving(1)
    with pybk.connect(address) as bk:
        with LogWriter.open(bk, LOG, ONE_COPY) as writer:
            kept = writer.append(b"kept")
        orphan = jobs.begin_job(bk.metadata, LOG)
        ledger = task_ledger(bk, orphan, 0, [b"orphaned"])
        time.sleep(0.2)  # older than --older-than 0.1 below
        result = subprocess.run(
            [sys.executable, "-m", "pybk", "clean-orphans", LOG, "--zk", address,
             "--older-than", "0.1"], env=child_env(), capture_output=True, text=True,
            timeout=60, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"pybk clean-orphans: log {LOG}: 1 orphan jobs given up\n" \
            f"  {orphan}\n"
        assert not ledger_exists(bk, ledger) and not job_exists(bk, orphan)
        assert read_all(bk) == [(kept, b"kept")]


# -- lost answers ------------------------------------------------------------------------------


def _open_a_writer(bk2, job):
    """Another client opens a LogWriter of the log (and appends), then closes it."""
    with LogWriter.open(bk2, LOG, SMALL_SEGMENTS) as writer:
        writer.append(b"writer's")
    return [b"writer's"]


def _commit_another_job(bk2, job):
    other = jobs.begin_job(bk2.metadata, LOG)
    commit_job(bk2, LOG, other, [task_ledger(bk2, other, 0, [b"other job's"])])
    return [b"other job's"]


def _clean_nothing(bk2, job):
    assert clean_orphans(bk2, LOG, 3600) == []
    return []


MEANWHILE = {"writer-open": _open_a_writer, "another-commit": _commit_another_job,
             "clean-orphans": _clean_nothing}


@pytest.mark.parametrize("error", [BadVersion, MetadataUnavailable])
@pytest.mark.parametrize("meanwhile", list(MEANWHILE))
def test_a_commit_whose_answer_is_lost_is_reported_committed(parties, meanwhile, error):
    """The commit's CAS lands, another client acts on the log (and settles the job the
    head lists as committing), then the committer's store answers BadVersion (the
    ZooKeeper store's retry found the head moved on) or MetadataUnavailable: the
    committer reports the job committed, with its segments; its rows are in the log once,
    and the writer's or other job's after them; nothing of the job is left pending."""
    bk, _faults = parties.client()
    bk2, _ = parties.client()
    job = jobs.begin_job(bk.metadata, LOG)
    ledgers = [task_ledger(bk, job, p, partition_records(p, 2)) for p in range(3)]
    after: list[bytes] = []
    bk.metadata = lost = LosesCommitAnswer(
        bk.metadata, LOG, job, lambda: after.extend(MEANWHILE[meanwhile](bk2, job)), error)

    result = commit_job(bk, LOG, job, ledgers)

    assert lost.hit and result.committed
    assert [s.ledger_id for s in result.segments] == ledgers
    found = list(live_segments(bk2.metadata, head(bk2)))
    assert [s[:2] for s in found if s.ledger_id in ledgers] == [s[:2] for s in result.segments]
    job_records = [r for p in range(3) for r in partition_records(p, 2)]
    assert values(read_all(bk2)) == job_records + after
    assert only_its_marker(bk2, job) and all(ledger_exists(bk2, i) for i in ledgers)


@pytest.mark.parametrize("meanwhile", list(MEANWHILE))
def test_an_abort_after_a_commit_of_unknown_outcome_says_committed(parties, meanwhile):
    """As above, but the store stays unreachable for the committer's next calls: the
    commit fails with MetadataUnavailable, saying that its outcome is unknown.  The abort
    that follows (Spark's, once the store is back) answers that the job was committed and
    deletes none of its ledgers; a second commit of the job (a retried driver) reports
    it committed and adds nothing."""
    bk, _faults = parties.client()
    bk2, _ = parties.client()
    job = jobs.begin_job(bk.metadata, LOG)
    ledgers = [task_ledger(bk, job, p, partition_records(p, 2)) for p in range(2)]
    after: list[bytes] = []
    bk.metadata = lost = LosesCommitAnswer(
        bk.metadata, LOG, job, lambda: after.extend(MEANWHILE[meanwhile](bk2, job)),
        MetadataUnavailable, unreachable_calls=1000)

    with pytest.raises(MetadataUnavailable, match="outcome of job .* is unknown"):
        commit_job(bk, LOG, job, ledgers)

    assert lost.hit
    assert not abort_job(bk2, LOG, job)
    job_records = [r for p in range(2) for r in partition_records(p, 2)]
    assert values(read_all(bk2)) == job_records + after
    assert all(ledger_exists(bk2, i) for i in ledgers)
    again = commit_job(bk2, LOG, job, ledgers)
    assert again.committed and [s.ledger_id for s in again.segments] == ledgers
    assert values(read_all(bk2)) == job_records + after
    assert only_its_marker(bk2, job)


def test_a_commit_of_unknown_outcome_called_again_finishes_it(embedded):
    """The commit's CAS lands and the store stays unreachable: nobody has taken the job
    off the head's list when the commit is called again (a retried driver), and that
    call finishes it: committed once, nothing of the job left."""
    bk, _ = embedded.client()
    bk2, _ = embedded.client()
    job = jobs.begin_job(bk.metadata, LOG)
    ledger = task_ledger(bk, job, 0, [b"committed"])
    bk.metadata = LosesCommitAnswer(bk.metadata, LOG, job, lambda: None,
                                    MetadataUnavailable, unreachable_calls=1000)
    with pytest.raises(MetadataUnavailable, match="unknown"):
        commit_job(bk, LOG, job, [ledger])
    assert head(bk2).committing == (job,)
    result = commit_job(bk2, LOG, job, [ledger], orphan_timeout_s=3600)
    assert result.committed and [s.ledger_id for s in result.segments] == [ledger]
    assert values(read_all(bk2)) == [b"committed"] and only_its_marker(bk2, job)
    assert head(bk2).committing == ()


def test_a_commit_whose_answer_is_lost_is_committed_after_an_orphan_cleaning_of_0_s(
        embedded):
    """While the committer's answer is lost, a writer opens (it settles the job, leaving
    its committed marker) and an orphan cleaning with a timeout of 0 s runs: it does not
    take the marker away from the committer, which reports the job committed.  (Found by
    tests/test_commit_interleavings.py, seed 49.)"""
    bk, _ = embedded.client()
    bk2, _ = embedded.client()
    job = jobs.begin_job(bk.metadata, LOG)
    ledger = task_ledger(bk, job, 0, [b"committed"])

    def meanwhile():
        _open_a_writer(bk2, job)
        assert clean_orphans(bk2, LOG, 0) == []

    bk.metadata = LosesCommitAnswer(bk.metadata, LOG, job, meanwhile, BadVersion)
    assert commit_job(bk, LOG, job, [ledger]).committed
    assert values(read_all(bk2)) == [b"committed", b"writer's"]


def test_committed_markers_of_failed_committers_are_forgotten_after_a_day(embedded):
    """A committer that failed not knowing leaves its job's committed marker; orphan
    cleanings keep it (and never take it for an orphan: the plan's ledgers stay) until it
    is COMMITTED_MARKER_KEEP_S old, or the orphan timeout if that is longer."""
    bk, _ = embedded.client()
    bk2, _ = embedded.client()
    job = jobs.begin_job(bk.metadata, LOG)
    ledger = task_ledger(bk, job, 0, [b"committed"])
    bk.metadata = LosesCommitAnswer(bk.metadata, LOG, job, lambda: _clean_nothing(bk2, job),
                                    MetadataUnavailable, unreachable_calls=1000)
    with pytest.raises(MetadataUnavailable):
        commit_job(bk, LOG, job, [ledger])
    marker, version = jobs.read_job(bk2.metadata, LOG, job)
    assert marker.committed is not None
    assert clean_orphans(bk2, LOG, 0) == [] and job_exists(bk2, job)
    settled = time.time() - jobs.COMMITTED_MARKER_KEEP_S - 60  # as if settled a day ago
    bk2.metadata.set(jobs.job_path(LOG, job), marker._replace(
        committed=marker.committed._replace(settled=settled)).to_bytes(), version)
    assert clean_orphans(bk2, LOG, 2 * jobs.COMMITTED_MARKER_KEEP_S) == []
    assert job_exists(bk2, job)
    assert clean_orphans(bk2, LOG, 0) == []
    assert not job_exists(bk2, job) and ledger_exists(bk2, ledger)
    assert values(read_all(bk2)) == [b"committed"]


# -- a task killed while it rolls -------------------------------------------------------------


class Killed(BaseException):
    """The task's process dies here (nothing after it runs, no clean-up)."""


class DiesAtWrite:
    """A task's metadata store whose ``kill_at``-th write (counting from 1) kills the
    task before it lands."""

    def __init__(self, store, kill_at: int) -> None:
        self._store, self._left = store, kill_at

    def __getattr__(self, name):
        attribute = getattr(self._store, name)
        if name not in ("set", "create", "create_many", "delete", "next_ledger_id"):
            return attribute

        def write(*args, **kwargs):
            self._left -= 1
            if self._left == 0:
                raise Killed(name)
            return attribute(*args, **kwargs)
        return write


def test_a_task_killed_anywhere_in_its_roll_leaves_no_ledger_after_the_abort(embedded):
    """A Spark task's ledgers (job_write._TaskLedgers) are killed at each metadata write
    of their first roll and first entry in turn (a task killed between creating a ledger
    and registering it, among others): the job's abort then leaves no ledger of the job
    behind."""
    from pybk.spark import job_write
    from pybk.spark.options import WRITE, parse

    bk, _ = embedded.client()
    opts = parse({"metadataServiceUri": "zk://127.0.0.1/ledgers", "log": LOG,
                  "ensembleSize": "1", "writeQuorumSize": "1", "ackQuorumSize": "1"},
                 WRITE)
    store = bk.metadata
    kill_at = 1
    while True:
        job = jobs.begin_job(store, LOG)
        bk.metadata = DiesAtWrite(store, kill_at)
        ledgers = job_write._TaskLedgers(bk, opts, job, 0, 0)
        try:
            ledgers.add(encode_batch([b"row"]))
            ledgers.finish()
        except Killed:
            pass
        else:
            break  # the roll made fewer writes than kill_at: every point was tried
        finally:
            bk.metadata = store
        assert abort_job(bk, LOG, job)
        left = [i for i in bk.list_ledgers() if bk.ledger_manager.read(i).metadata
                .custom_metadata.get(job_write.JOB_KEY) == job.encode()]
        assert left == [], f"killed at write {kill_at}: ledgers {left} of job {job} stay"
        kill_at += 1
    assert kill_at > 3


def test_a_job_begun_by_an_earlier_pybk_commits(embedded):
    """A job record of version 1 (no "committed" key) reads as a pending job, and its
    commit goes through."""
    bk, _ = embedded.client()
    job = jobs.begin_job(bk.metadata, LOG)
    bk.metadata.set(jobs.job_path(LOG, job), seal(jobs.JOB_MAGIC, 1, {
        "job": job, "created": time.time(), "plan": None}), -1)
    assert jobs.is_pending(jobs.read_job(bk.metadata, LOG, job))
    ledger = task_ledger(bk, job, 0, [b"old job's"])
    assert commit_job(bk, LOG, job, [ledger]).committed
    assert values(read_all(bk)) == [b"old job's"]


# -- an abort after a commit whose answer Spark lost ---------------------------------------


def test_an_abort_after_a_commit_that_returned_answers_committed(parties):
    """Spark runs a Python data source's commit in a Python worker
    (pyspark/sql/worker/commit_data_source_write.py) and calls abort when that worker's
    answer does not come back (the worker killed, its socket broken, after
    ``writer.commit`` returned): the abort must not answer "aborted" for a job whose rows
    are in the log (issue 31 section 3), or Spark reports the write failed with nothing
    saying that its rows are in, and the user's rerun writes them again.  So a batch
    job's committed marker outlives its commit's return (a committer that deleted it
    before returning left the abort neither the head's listing nor the marker)."""
    bk, _ = parties.client()
    bk2, _ = parties.client()
    job = jobs.begin_job(bk.metadata, LOG)
    ledger = task_ledger(bk, job, 0, [b"committed"])
    assert commit_job(bk, LOG, job, [ledger]).committed
    # The commit's answer is lost on its way back to Spark, which aborts the job.
    aborted = abort_job(bk2, LOG, job)
    assert values(read_all(bk2)) == [b"committed"] and ledger_exists(bk2, ledger)
    assert not aborted, "abort_job answered 'aborted' for a job whose rows are in the log"
