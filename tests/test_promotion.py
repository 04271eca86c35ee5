"""Promoting an embedded WAL to a cluster member (``pybk.open(path, cluster=...)``):
real ZooKeeper, real bookie processes, the WAL's data not copied."""

from __future__ import annotations

import dataclasses
import gc
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import zkutil
from clusterutil import address, bookies, child_env, pybk_command  # noqa: F401 (fixtures)

import pybk
from pybk.client.transport import InProcessBookieClient
from pybk.errors import (
    BookKeeperError,
    ClientClosed,
    InvalidConfiguration,
    MetadataError,
    NotEnoughBookies,
)
from pybk.log import Position, promotion
from pybk.log.metadata import list_logs, live_segments, read_log
from pybk.meta.embedded import EmbeddedMetadataStore
from pybk.meta.interface import MAX_BATCH_RECORDS, MetadataStore
from pybk.meta.ledgers import LedgerManager
from pybk.meta.zookeeper import ZooKeeperMetadataStore
from pybk.testing.ledger_records import ledger_record, put_ledgers

pytestmark = pytest.mark.timeout(180)


def test_a_promoted_wal_keeps_its_records_and_replicates_new_ones(tmp_path, address,
                                                                   bookies):
    directory = tmp_path / "wal"
    with pybk.open(directory) as wal:
        before = [(wal.append(b"local %d" % i), b"local %d" % i) for i in range(100)]
    bookies.start_serving(3)
    with pybk.open(directory, cluster=address, ensemble=3, write_quorum=2, ack_quorum=2,
                   listenAddress="127.0.0.1:0", addEntryTimeout=5.0) as wal:
        assert list(wal.read()) == before  # read where they are: nothing was copied
        after = [(wal.append(b"replicated %d" % i), b"replicated %d" % i)
                 for i in range(50)]
        current = wal._writer.metadata.tail[-1]
        assert after[0][0].segment == current.number
        wal_bookie = wal.bookie_id
        with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
            metadata = LedgerManager(store).read(current.ledger_id).metadata
            assert wal_bookie in store.bookies()  # the WAL's bookie serves peers
        assert metadata.ensemble_size == 3 and metadata.write_quorum_size == 2
        assert metadata.fragments[0].ensemble[0] == wal_bookie  # local first
        assert list(wal.read()) == before + after
    with pytest.raises(InvalidConfiguration, match="promoted"):
        pybk.open(directory)
    with pybk.open(directory, cluster=address, ensemble=3, write_quorum=2, ack_quorum=2,
                   listenAddress="127.0.0.1:0") as wal:
        assert list(wal.read()) == before + after  # reopened as a member: all there


def test_a_promoted_wal_writes_to_its_own_bookie_in_process(tmp_path, address, bookies):
    """The WAL's client calls its own bookie directly, not through its ZeroMQ server:
    with the server closed (peers can no longer reach it), appends still land on the
    local bookie and no ensemble change replaces it; old and new records stay readable."""
    directory = tmp_path / "wal"
    with pybk.open(directory) as wal:
        before = [(wal.append(b"local %d" % i), b"local %d" % i) for i in range(20)]
    bookies.start_serving(3)  # four bookies in all: one could replace the WAL's own
    with pybk.open(directory, cluster=address, ensemble=3, write_quorum=2, ack_quorum=2,
                   listenAddress="127.0.0.1:0", addEntryTimeout=5.0) as wal:
        assert isinstance(wal._bk.bookie_client(wal.bookie_id), InProcessBookieClient)
        wal._node.server.close()  # nothing reaches the WAL's bookie over ZeroMQ now
        after = [(wal.append(b"replicated %d" % i), b"replicated %d" % i)
                 for i in range(30)]
        segment = wal._writer.metadata.tail[-1]
        assert {position.segment for position, _ in after} == {segment.number}
        metadata = wal._bk.ledger_manager.read(segment.ledger_id).metadata
        assert len(metadata.fragments) == 1  # no add to the local bookie failed
        assert metadata.fragments[0].ensemble[0] == wal.bookie_id
        last_entry = after[-1][0].entry
        local_entries = [e for e in range(last_entry + 1)
                         if wal.bookie_id in metadata.write_set(e)]
        assert local_entries
        for entry_id in local_entries:  # on the WAL's own disks, written without a socket
            assert wal.bookie.read_entry(segment.ledger_id, entry_id)
        assert list(wal.read()) == before + after


# -- a promotion is all or nothing ------------------------------------------------------


def _cluster_holds_nothing_of(address: str, bookie_id: str) -> None:
    """The cluster has no ledger, no log and no registration left by a failed promotion."""
    with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
        assert LedgerManager(store).ledger_ids() == [], "copied ledger records were left"
        assert list_logs(store) == [], "the copied log was left"
        assert bookie_id not in store.bookies(), "the WAL's bookie is still registered"


def test_a_promotion_without_enough_bookies_changes_nothing(tmp_path, address):
    """The default ensemble of 3 on a cluster with no other bookie: refused before
    anything is copied; the directory is still an embedded WAL with every record."""
    directory = tmp_path / "wal"
    with pybk.open(directory) as wal:
        written = [(wal.append(b"r%d" % i), b"r%d" % i) for i in range(100)]
        bookie_id = wal.bookie_id
    with pytest.raises(NotEnoughBookies,
                       match=r"ensemble=3.*0 other writable bookies.*still an embedded WAL"):
        pybk.open(directory, cluster=address, listenAddress="127.0.0.1:0")
    _cluster_holds_nothing_of(address, bookie_id)
    with pybk.open(directory) as wal:
        assert list(wal.read()) == written
        wal.append(b"still embedded")


def _promotion_fails_after_copying(directory, address: str) -> None:
    """Promote ``directory`` to ``address`` with the WAL's bookie unable to serve (its
    listen address is taken): the cluster checks pass, the copy is made, and the promotion
    fails with BookKeeperError."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BookKeeperError):
            pybk.open(directory, cluster=address, ensemble=1, write_quorum=1, ack_quorum=1,
                      listenAddress=f"127.0.0.1:{port}")


def test_a_promotion_that_fails_after_copying_is_undone(tmp_path, address):
    """The cluster checks pass, then the WAL's bookie cannot serve (its listen address is
    taken): what was copied into the cluster is removed and the directory stays an
    embedded WAL."""
    directory = tmp_path / "wal"
    with pybk.open(directory) as wal:
        written = [(wal.append(b"r%d" % i), b"r%d" % i) for i in range(100)]
        bookie_id = wal.bookie_id
    _promotion_fails_after_copying(directory, address)
    _cluster_holds_nothing_of(address, bookie_id)
    with pybk.open(directory) as wal:
        assert list(wal.read()) == written


def test_promotion_copies_more_ledgers_than_a_batch_and_undoes_them(tmp_path,
                                                                   zookeeper):
    """More ledgers than one create_many batch, one of them left in the cluster by an
    unfinished promotion: every ledger record is copied (the stale one replaced), then
    the copy is undone without a trace."""
    ids = [2 ** 40 + i for i in range(MAX_BATCH_RECORDS + 500)]
    address = zkutil.formatted_cluster(zookeeper)
    with EmbeddedMetadataStore(tmp_path / "meta") as embedded, \
            ZooKeeperMetadataStore(address, zkutil.settings()) as cluster:
        put_ledgers(embedded, ids)
        stale = LedgerManager(embedded).read(ids[MAX_BATCH_RECORDS + 1]).metadata
        cluster.create(cluster.layout.ledger_path(stale.ledger_id),
                       dataclasses.replace(stale, custom_metadata={"old": b"1"}).to_bytes())
        copied = promotion.copy(embedded, cluster, address, "wal", "wal-copy")
        remote = LedgerManager(cluster)
        assert remote.ledger_ids() == ids
        assert remote.read(stale.ledger_id).metadata == stale
        # What it keeps to undo does not grow with the ledgers copied.
        assert _held_by(copied) == _held_by(promotion.Copy(embedded, cluster, "wal-copy"))
        copied.undo()
        assert remote.ledger_ids() == [] and list_logs(cluster) == []


def _held_by(copied: promotion.Copy) -> int:
    """How many objects ``copied`` holds, not counting the stores it was given."""
    seen: set[int] = set()
    todo: list[object] = [copied]
    while todo:
        held = todo.pop()
        if id(held) in seen or isinstance(held, (type, MetadataStore)):
            continue
        seen.add(id(held))
        todo.extend(gc.get_referents(held))
    return len(seen)


def test_a_promotion_stopped_by_a_ledger_id_the_cluster_took_undoes_only_its_copies(
        tmp_path, zookeeper):
    """A ledger of the cluster (another first ensemble) has the id of one of the WAL's:
    the copy fails, and undoing it removes the WAL's copies, not that ledger."""
    ids = [2 ** 40 + i for i in range(MAX_BATCH_RECORDS + 10)]
    address = zkutil.formatted_cluster(zookeeper)
    with EmbeddedMetadataStore(tmp_path / "meta") as embedded, \
            ZooKeeperMetadataStore(address, zkutil.settings()) as cluster:
        put_ledgers(embedded, ids)
        theirs = ledger_record(ids[-1], ensemble=("elsewhere:1",))
        cluster.create(cluster.layout.ledger_path(theirs.ledger_id), theirs.to_bytes())
        with pytest.raises(MetadataError, match=f"ledger id {theirs.ledger_id} is taken"):
            promotion.copy(embedded, cluster, address, "wal", "wal-copy")
        remote = LedgerManager(cluster)
        assert remote.ledger_ids() == [theirs.ledger_id] and list_logs(cluster) == []
        assert remote.read(theirs.ledger_id).metadata == theirs
        assert promotion.promoting_to(embedded) is None  # the intent went with the copies


_KILLED_BEFORE_COMMIT = """
import os, signal, sys
import pybk
from pybk.log import promotion
promotion.commit = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
pybk.open(sys.argv[1], cluster=sys.argv[2], ensemble=1, write_quorum=1, ack_quorum=1,
          listenAddress="127.0.0.1:0")
"""


def _promote_and_kill_before_commit(directory: Path, address: str) -> None:
    """An unfinished promotion of ``directory`` to ``address``: its copies stay in the
    cluster and its intent in the directory."""
    child = subprocess.run([sys.executable, "-c", _KILLED_BEFORE_COMMIT, str(directory),
                            address], env=child_env(), capture_output=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode(errors="replace")


def test_a_promotion_killed_before_its_commit_is_redone_from_the_directory(tmp_path,
                                                                           address):
    """kill -9 at the last step of a promotion: the directory is still an embedded WAL;
    records appended and truncated there afterwards win over the stale copies in the
    cluster when it is promoted again."""
    directory = tmp_path / "wal"
    with pybk.open(directory, segmentMaxBytes=2048) as wal:
        written = [(wal.append(bytes(200) + b"%d" % i), bytes(200) + b"%d" % i)
                   for i in range(50)]
    _promote_and_kill_before_commit(directory, address)
    with pybk.open(directory, segmentMaxBytes=2048) as wal:
        assert list(wal.read()) == written
        written += [(wal.append(bytes(200) + b"late %d" % i), bytes(200) + b"late %d" % i)
                    for i in range(30)]
        keep = written[20][0]
        wal.truncate(keep)
        written = [r for r in written if r[0] >= keep]
        assert list(wal.read()) == written
    with pybk.open(directory, cluster=address, ensemble=1, write_quorum=1, ack_quorum=1,
                   listenAddress="127.0.0.1:0") as wal:
        assert list(wal.read()) == written
        with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
            log = read_log(store, wal.log_name).metadata
            assert log.truncated_before == keep
            assert log.tail == wal._writer.metadata.tail


def _truncated_after_an_unfinished_promotion(directory: Path, address: str) -> set[int]:
    """Write a WAL of several segments, promote it to ``address`` and kill the promotion
    before its commit, then truncate the WAL's leading segments as an embedded WAL: the
    ledgers the cluster holds records of and the WAL does not (those the truncation
    took, and the one the promotion's writer made in the cluster)."""
    with pybk.open(directory, segmentMaxBytes=2048) as wal:
        written = [wal.append(bytes(200) + b"%d" % i) for i in range(50)]
    _promote_and_kill_before_commit(directory, address)
    with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
        copied = set(LedgerManager(store).ledger_ids())
    with pybk.open(directory, segmentMaxBytes=2048) as wal:
        wal.truncate(written[30])
        wal.append(b"after the truncation")
    with EmbeddedMetadataStore(directory / "metadata") as embedded:
        kept = set(LedgerManager(embedded).ledger_ids())
    dropped = copied - kept
    assert len(dropped) > 1, "the truncation dropped no copied ledger"
    return dropped


def test_a_promotion_after_an_unfinished_one_removes_its_copies_of_dropped_ledgers(
        tmp_path, zookeeper):
    """An unfinished promotion copied ledgers that the embedded WAL truncated away
    since: promoting again leaves the cluster with records of the log's ledgers only,
    none naming a ledger the WAL's bookie no longer holds."""
    address = zkutil.formatted_cluster(zookeeper)
    directory = tmp_path / "wal"
    dropped = _truncated_after_an_unfinished_promotion(directory, address)
    with pybk.open(directory, cluster=address, ensemble=1, write_quorum=1, ack_quorum=1,
                   listenAddress="127.0.0.1:0") as wal:
        with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
            log = read_log(store, wal.log_name).metadata
            segments = {s.ledger_id for s in live_segments(store, log)}
            assert set(LedgerManager(store).ledger_ids()) == segments
        assert not dropped & segments


def test_a_failed_promotion_removes_the_copies_an_unfinished_one_left(tmp_path, zookeeper):
    """An unfinished promotion copied ledgers that the embedded WAL truncated away
    since; the next promotion fails after copying: undoing it removes every copy of
    this WAL's from the cluster, those of the dropped ledgers too."""
    address = zkutil.formatted_cluster(zookeeper)
    directory = tmp_path / "wal"
    _truncated_after_an_unfinished_promotion(directory, address)
    _promotion_fails_after_copying(directory, address)
    with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
        assert LedgerManager(store).ledger_ids() == [], "copied ledger records were left"
        assert list_logs(store) == [], "the copied log was left"


# -- demotion -------------------------------------------------------------------------


@pytest.mark.zookeeper
def test_demote_turns_a_directory_whose_cluster_is_gone_into_an_embedded_wal(tmp_path):
    """Promoted, written and truncated while clustered, then the cluster's ZooKeeper is
    gone for good: ``pybk.demote`` makes the directory an embedded WAL again with every
    record written before the promotion that the cluster did not truncate."""
    directory = tmp_path / "wal"
    with pybk.open(directory, segmentMaxBytes=2048) as wal:
        before = [(wal.append(bytes(200) + b"%d" % i), bytes(200) + b"%d" % i)
                  for i in range(100)]
    segments = sorted({p.segment for p, _ in before})
    assert len(segments) >= 4
    cut = next(p for p, _ in before if p.segment == segments[2])
    with zkutil.server() as zookeeper:
        address = zkutil.formatted_cluster(zookeeper)
        with pybk.open(directory, cluster=address, ensemble=1, write_quorum=1,
                       ack_quorum=1, listenAddress="127.0.0.1:0") as wal:
            clustered = [wal.append(b"clustered %d" % i) for i in range(20)]
            wal.truncate(Position(cut.segment, cut.entry + 1, 0))
    with pytest.raises(InvalidConfiguration, match=r"promoted.*pybk demote"):
        pybk.open(directory)
    demoted = pybk.demote(directory)
    assert demoted.cluster == address
    assert demoted.segments_dropped == 2
    kept = [r for r in before if r[0].segment >= cut.segment]  # the whole cut segment
    with pybk.open(directory) as wal:
        assert list(wal.read()) == kept
        later = wal.append(b"embedded again")
        assert later > max(clustered), "a position of the clustered era was given again"
    with pybk.open(directory) as wal:
        assert list(wal.read()) == kept + [(later, b"embedded again")]
    with pytest.raises(InvalidConfiguration, match="not promoted"):
        pybk.demote(directory)


def test_pybk_demote_command(tmp_path, address):
    directory = tmp_path / "wal"
    with pybk.open(directory) as wal:
        written = [(wal.append(b"r%d" % i), b"r%d" % i) for i in range(10)]
    refused = subprocess.run(pybk_command("demote", str(directory)), env=child_env(),
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "not promoted" in refused.stderr, refused
    with pybk.open(directory, cluster=address, ensemble=1, write_quorum=1, ack_quorum=1,
                   listenAddress="127.0.0.1:0"):
        pass
    done = subprocess.run(pybk_command("demote", str(directory)), env=child_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done
    assert address in done.stdout and "embedded WAL" in done.stdout, done.stdout
    with pybk.open(directory) as wal:
        assert list(wal.read()) == written


def test_a_demoted_directory_is_not_promoted_again_over_its_clustered_log(tmp_path,
                                                                          address):
    """The cluster still lists what the directory wrote while it was a member: promoting
    the demoted directory there again would hide those records, so it is refused."""
    directory = tmp_path / "wal"
    with pybk.open(directory) as wal:
        wal.append(b"before")
    member = dict(cluster=address, ensemble=1, write_quorum=1, ack_quorum=1,
                  listenAddress="127.0.0.1:0")
    with pybk.open(directory, **member) as wal:
        wal.append(b"while clustered")
    pybk.demote(directory)
    with pytest.raises(InvalidConfiguration, match="already holds the log"):
        pybk.open(directory, **member)
    with pybk.open(directory) as wal:
        assert [data for _, data in wal.read()] == [b"before"]


def test_a_closed_cluster_client_refuses_every_call(address):
    bk = pybk.connect(address)
    bk.close()
    for call in (lambda: bk.create_ledger(1, 1, 1), lambda: bk.open_ledger(0),
                 lambda: bk.delete_ledger(0), bk.list_ledgers):
        with pytest.raises(ClientClosed, match="client is closed"):
            call()
    bk.close()


def test_a_promotion_whose_commit_fails_after_its_mark_keeps_the_wal_readable(
        tmp_path, address, monkeypatch):
    """promotion.commit writes PROMOTED (the commit point), then deleting the intent
    fails (an embedded-store error): the promotion is undone (the cluster's copy of the
    log and its new segment deleted), yet the directory is marked promoted, so it opens
    as a member of a cluster that no longer has its log.  Every record must still
    read back, as a member or as an embedded WAL."""
    directory = tmp_path / "wal"
    with pybk.open(directory) as wal:
        written = [(wal.append(b"r%d" % i), b"r%d" % i) for i in range(20)]
    real_delete = promotion._delete
    calls = []

    def failing_delete(store, path):
        calls.append(path)
        if path == promotion.PROMOTING and len(calls) == 1:
            raise MetadataError("the embedded store failed (a test's fault)")
        real_delete(store, path)

    monkeypatch.setattr(promotion, "_delete", failing_delete)
    try:  # the promotion committed: it may go on, or fail; either way nothing is lost
        pybk.open(directory, cluster=address, ensemble=1, write_quorum=1, ack_quorum=1,
                  listenAddress="127.0.0.1:0").close()
    except MetadataError:
        pass
    finally:
        monkeypatch.setattr(promotion, "_delete", real_delete)
    assert calls[0] == promotion.PROMOTING
    try:
        wal = pybk.open(directory)
    except InvalidConfiguration:
        wal = pybk.open(directory, cluster=address, ensemble=1, write_quorum=1,
                        ack_quorum=1, listenAddress="127.0.0.1:0")
    with wal:
        assert list(wal.read()) == written
