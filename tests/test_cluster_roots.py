"""Clusters sharing one ZooKeeper: everything a cluster writes lives under its root, and a
cluster of pybk's former layout (logs at ``<root's parent>/logs``) is moved under its
root when it is opened (:mod:`pybk.meta.migrate`).

Real ZooKeeper (the session's server) and real bookies in this process, one per cluster
(both clusters number their ledgers from 0).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import uuid
from typing import Iterator

import pytest
import zkutil
from clientutil import FAST
from clusterutil import failed, ok
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss
from kazoo.security import Permissions
from securityutil import zookeeper_credentials

from pybk.client import BookKeeper
from pybk.client.transport import InProcessBookieClient
from pybk.errors import MalformedMetadata, MetadataError
from pybk.log import LogReader, LogWriter, consumers, jobs
from pybk.log.metadata import LogMetadata, list_logs, read_log
from pybk.log.position import Position
from pybk.meta import migrate
from pybk.meta.interface import ANY_VERSION
from pybk.meta.underreplication import UnderreplicationManager
from pybk.meta.zookeeper import ZooKeeperMetadataStore, format_cluster
from pybk.settings import LogSettings

pytestmark = pytest.mark.timeout(180)

ONE_COPY = LogSettings(ensembleSize=1, writeQuorumSize=1, ackQuorumSize=1)
SMALL_SEGMENTS = dataclasses.replace(ONE_COPY, segmentMaxBytes=256)
ROWS = 12  # each of 300 bytes: a segment each


def _unique() -> str:
    return f"pybk-test-{uuid.uuid4().hex[:12]}"


class ClusterUnderTest:
    """A formatted cluster at ``root`` with one bookie of its own, B1; :meth:`write`
    leaves one record of every kind the cluster keeps."""

    def __init__(self, zookeeper, stack: contextlib.ExitStack, bookie_factory,
                 settings_factory, tmp_path, root: str, name: str) -> None:
        self.root = root
        self.address = zookeeper.address(root)
        self.name = name
        self._stack = stack
        format_cluster(self.address, settings=zkutil.settings())
        base = tmp_path / name
        self._bookie = bookie_factory(settings_factory(
            journalDirectory=str(base / "journal"),
            ledgerDirectories=(str(base / "ledgers"),)))
        self.open()

    def open(self) -> None:
        """Open the cluster's store and a client (closed with the test's stack, or by
        :meth:`close`)."""
        self._opened = contextlib.ExitStack()
        self._stack.callback(self._opened.close)
        self.store = self._opened.enter_context(ZooKeeperMetadataStore(self.address,
                                                                       zkutil.settings()))
        self.bk = self._opened.enter_context(BookKeeper(
            self.store, {"B1": InProcessBookieClient("B1", self._bookie)}, FAST))

    def close(self) -> None:
        self._opened.close()

    def write(self, log: str) -> list[bytes]:
        """Rows in ``log`` (several segments), a consumer, a job, a bookie location and
        an under-replication mark, each naming this cluster."""
        rows = [f"{self.name} row {i} ".encode() + bytes(300) for i in range(ROWS)]
        writer = LogWriter.open(self.bk, log, SMALL_SEGMENTS)
        try:
            for row in rows:
                writer.append(row)
        finally:
            writer.close()
        consumers.set_position(self.store, log, f"consumer-{self.name}", Position(1, 0, 0))
        jobs.begin_job(self.store, log, f"job{self.name}")
        self.store.register_bookie(f"bookie-{self.name}", location=f"/region/{self.name}")
        UnderreplicationManager(self.store).mark_underreplicated(7, [f"bookie-{self.name}"])
        return rows

    def check(self, log: str, rows: list[bytes], registered: bool = True) -> None:
        """This cluster holds what :meth:`write` left (the bookie's registration only
        while ``registered``: it ends with the store's session) and nothing of another
        cluster."""
        assert [data for _position, data in LogReader(self.bk, log).read()] == rows
        assert [c.consumer_id for c in consumers.list_consumers(self.store, log)] == [
            f"consumer-{self.name}"]
        assert jobs.read_job(self.store, log, f"job{self.name}") is not None
        assert self.store.children(f"/logs/{log}/jobs") == [f"job{self.name}"]
        assert len(read_log(self.store, log).metadata.tail) > 1
        if registered:
            assert self.store.bookies() == [f"bookie-{self.name}"]
            assert self.store.bookie_location(f"bookie-{self.name}") == \
                f"/region/{self.name}"
        mark = UnderreplicationManager(self.store).get(7)
        assert mark is not None and list(mark.replicas) == [f"bookie-{self.name}"]

    def append(self, log: str, row: bytes) -> None:
        """Append ``row`` with a new writer of ``log``."""
        writer = LogWriter.open(self.bk, log, SMALL_SEGMENTS)
        try:
            writer.append(row)
        finally:
            writer.close()


@pytest.fixture
def make_cluster(zookeeper, bookie_factory, settings_factory, tmp_path):
    """``make(root, name)``: a cluster on the session's ZooKeeper, closed at the end."""
    with contextlib.ExitStack() as stack:
        def make(root: str, name: str) -> ClusterUnderTest:
            return ClusterUnderTest(zookeeper, stack, bookie_factory, settings_factory,
                                    tmp_path, root, name)
        yield make


@pytest.fixture
def cluster_pair(make_cluster):
    """``make(root_a, root_b)``: two clusters on the session's ZooKeeper."""
    return lambda root_a, root_b: (make_cluster(root_a, "a"), make_cluster(root_b, "b"))


def _pair_roots(case: str) -> tuple[str, str]:
    parent = f"/{_unique()}"
    return {"default ledgers beside a root at the top": ("/ledgers", parent),
            "siblings": (f"{parent}/ra", f"{parent}/rb"),
            "siblings deeper": (f"{parent}/x/ra", f"{parent}/x/rb")}[case]


@pytest.mark.parametrize("case", ["default ledgers beside a root at the top", "siblings",
                                  "siblings deeper"])
def test_two_clusters_on_one_zookeeper_see_nothing_of_each_other(cluster_pair, kazoo,
                                                                 case):
    root_a, root_b = _pair_roots(case)
    a, b = cluster_pair(root_a, root_b)
    log = f"L-{uuid.uuid4().hex[:8]}"  # the default root is shared by the session's tests
    rows = {a: a.write(log), b: b.write(log)}
    for cluster in (a, b):
        cluster.check(log, rows[cluster])
        assert list_logs(cluster.store) == [log]
    parent = root_b.rsplit("/", 1)[0] or "/"
    if case != "default ledgers beside a root at the top":
        # Nothing outside the roots: the parent holds the two roots only
        assert sorted(kazoo.get_children(parent)) == ["ra", "rb"]
    assert not kazoo.exists("/logs")


# -- clusters of the former layout --------------------------------------------------------


def _tree(kazoo, top: str) -> dict[str, bytes]:
    """``top`` and every node below it: path relative to ``top`` -> data, parents first."""
    found = {}

    def walk(rel: str) -> None:
        found[rel] = kazoo.get(top + rel)[0]
        for name in sorted(kazoo.get_children(top + rel)):
            walk(f"{rel}/{name}")

    walk("")
    return found


def _to_former_layout(kazoo, cluster: ClusterUnderTest) -> None:
    """Make the (closed) cluster one that pybk before the namespace node wrote: its logs
    at ``<parent>/logs`` (shared with its siblings' logs), no ``<root>/pybk``."""
    parent = cluster.root.rsplit("/", 1)[0]
    kazoo.ensure_path(f"{parent}/logs")
    for rel, data in _tree(kazoo, f"{cluster.root}/pybk/logs").items():
        if rel:
            kazoo.create(f"{parent}/logs{rel}", data)
    kazoo.delete(f"{cluster.root}/pybk", recursive=True)


def _former_cluster(make_cluster, kazoo, root: str, name: str, logs: list[str]
                    ) -> tuple[ClusterUnderTest, dict[str, list[bytes]]]:
    """A closed cluster of the former layout holding ``logs`` (the first with a record
    of every kind), and the rows of each."""
    cluster = make_cluster(root, name)
    rows = {logs[0]: cluster.write(logs[0])}
    for log in logs[1:]:
        cluster.append(log, f"{log} row".encode())
        rows[log] = [f"{log} row".encode()]
    cluster.close()
    _to_former_layout(kazoo, cluster)
    return cluster, rows


def _check_moved(kazoo, cluster: ClusterUnderTest, rows: dict[str, list[bytes]]) -> None:
    """The cluster holds its logs (and writers go on); their old heads are moved records
    with nothing below, on which a pybk of the former layout fails."""
    parent = cluster.root.rsplit("/", 1)[0]
    assert list_logs(cluster.store) == sorted(rows)
    first = min(rows)
    cluster.check(first, rows[first], registered=False)
    for log, written in rows.items():
        cluster.append(log, b"after the move")
        assert [data for _p, data in LogReader(cluster.bk, log).read()] == [
            *written, b"after the move"]
        assert kazoo.get_children(f"{parent}/logs/{log}") == []
        with pytest.raises(MalformedMetadata, match="PBKM"):
            LogMetadata.from_bytes(kazoo.get(f"{parent}/logs/{log}")[0])
    assert kazoo.get(f"{cluster.root}/pybk")[0] == migrate.READY


def test_a_cluster_of_the_former_layout_opens_with_its_logs_moved_under_its_root(
        make_cluster, kazoo, caplog):
    parent = f"/{_unique()}"
    cluster, rows = _former_cluster(make_cluster, kazoo, f"{parent}/ra", "a", ["L1", "L2"])
    former = _tree(kazoo, f"{parent}/logs")
    with caplog.at_level(logging.WARNING, logger="pybk.meta.migrate"):
        cluster.open()
    assert f"moved 2 log(s) (L1, L2) from {parent}/logs to {parent}/ra/pybk/logs" \
        in caplog.text
    assert _tree(kazoo, f"{parent}/ra/pybk/logs") == former  # record for record
    _check_moved(kazoo, cluster, rows)


def test_clusters_of_the_former_layout_that_shared_their_logs_are_told_apart_by_the_operator(
        make_cluster, kazoo):
    parent = f"/{_unique()}"
    a, rows_a = _former_cluster(make_cluster, kazoo, f"{parent}/ra", "a", ["La"])
    b, rows_b = _former_cluster(make_cluster, kazoo, f"{parent}/rb", "b", ["Lb"])
    former = _tree(kazoo, f"{parent}/logs")
    for cluster in (a, b):
        with pytest.raises(MetadataError, match=f"other clusters of that layout "
                                                f"\\({parent}/r.\\).*cannot tell whose.*"
                                                f"pybk migrate-logs --zk zk://"):
            cluster.open()
    assert _tree(kazoo, f"{parent}/logs") == former  # refused before anything changed
    assert "holds no log of pybk's former layout named Nope" in failed(
        "migrate-logs", "--zk", a.address, "--logs", "La,Nope")
    said = ok("migrate-logs", "--zk", a.address, "--logs", "La")
    assert f"moved 1 log(s) (La) from {parent}/logs to {parent}/ra/pybk/logs" in said
    a.open()
    b.open()  # the last cluster of the former layout takes the rest
    _check_moved(kazoo, a, rows_a)
    _check_moved(kazoo, b, rows_b)


def test_a_head_that_a_former_pybk_changes_during_the_move_fails_the_switch_and_is_copied_again(
        make_cluster, kazoo, monkeypatch):
    parent = f"/{_unique()}"
    cluster, rows = _former_cluster(make_cluster, kazoo, f"{parent}/ra", "a", ["L1"])
    original = migrate._copy_tree

    def copy_then_a_former_writer_takes_the_log_over(conn, source, target, *rest):
        version = original(conn, source, target, *rest)
        monkeypatch.setattr(migrate, "_copy_tree", original)  # once
        data, stat = kazoo.get(source)
        head = LogMetadata.from_bytes(data)
        kazoo.set(source, dataclasses.replace(head, epoch=head.epoch + 1).to_bytes(),
                  version=stat.version)
        return version

    epoch = LogMetadata.from_bytes(kazoo.get(f"{parent}/logs/L1")[0]).epoch
    monkeypatch.setattr(migrate, "_copy_tree", copy_then_a_former_writer_takes_the_log_over)
    cluster.open()
    assert read_log(cluster.store, "L1").metadata.epoch == epoch + 1  # the change moved
    _check_moved(kazoo, cluster, rows)


def test_processes_opening_a_cluster_of_the_former_layout_together_move_it_once(
        make_cluster, kazoo, caplog):
    parent = f"/{_unique()}"
    cluster, rows = _former_cluster(make_cluster, kazoo, f"{parent}/ra", "a", ["L1"])
    opened: list[ZooKeeperMetadataStore] = []
    with contextlib.ExitStack() as stack, caplog.at_level(logging.WARNING,
                                                          logger="pybk.meta.migrate"):
        threads = [threading.Thread(target=lambda: opened.append(stack.enter_context(
            ZooKeeperMetadataStore(cluster.address, zkutil.settings())))) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert len(opened) == 3
        assert all(list_logs(store) == ["L1"] for store in opened)
    assert caplog.text.count("moved 1 log(s) (L1)") == 1
    cluster.open()
    _check_moved(kazoo, cluster, rows)


class Crash(Exception):
    """The migrating process dies here."""


def _crash_in(monkeypatch, name: str, after: bool,
              when=lambda *args: True) -> None:
    """Make migrate's step ``name`` crash (before or ``after`` it did its work) the
    first time it is called with arguments that ``when`` accepts."""
    original = getattr(migrate, name)

    def crashing(*args):
        if not when(*args):
            return original(*args)
        monkeypatch.setattr(migrate, name, original)  # once
        if not after:
            raise Crash(name)
        original(*args)
        raise Crash(name)

    monkeypatch.setattr(migrate, name, crashing)


@pytest.mark.parametrize("where, switched", [
    ("copying a record", False), ("before the switch", False),
    ("after the switch", True), ("deleting the old records", True)])
def test_a_migration_that_crashes_leaves_one_layout_whole_and_the_next_opening_finishes(
        make_cluster, kazoo, monkeypatch, where, switched):
    parent = f"/{_unique()}"
    cluster, rows = _former_cluster(make_cluster, kazoo, f"{parent}/ra", "a", ["L1", "L2"])
    former = _tree(kazoo, f"{parent}/logs")
    old_records = f"{parent}/logs/"
    {"copying a record": lambda: _crash_in(monkeypatch, "_create_all", after=False),
     "before the switch": lambda: _crash_in(monkeypatch, "_switch", after=False),
     "after the switch": lambda: _crash_in(monkeypatch, "_switch", after=True),
     "deleting the old records": lambda: _crash_in(
         monkeypatch, "_delete_below", after=True,
         when=lambda _conn, top, *_rest: top.startswith(old_records)),
     }[where]()
    with pytest.raises(Crash):
        cluster.open()
    monkeypatch.undo()
    found = kazoo.exists(f"{parent}/ra/pybk") and kazoo.get(f"{parent}/ra/pybk")[0]
    if switched:  # the new layout is complete
        assert found == migrate.CLEANING
        assert _tree(kazoo, f"{parent}/ra/pybk/logs") == former
    else:  # the former layout is whole, and the new one not in use
        assert found not in (migrate.READY, migrate.CLEANING)
        assert _tree(kazoo, f"{parent}/logs") == former
    assert not kazoo.exists(f"{parent}/ra/{migrate.LOCK_NAME}")
    cluster.open()
    _check_moved(kazoo, cluster, rows)


# -- a migrator whose session expires ---------------------------------------------------------


def _expire(conn) -> None:
    """End the session of a migrating connection from outside, as ZooKeeper does when
    the process pauses for longer than its session timeout (its ephemeral lock goes)."""
    intruder = KazooClient(hosts=conn.address.connect_string, client_id=conn.client.client_id)
    intruder.start(timeout=10)
    intruder.stop()
    intruder.close()


def test_a_migrator_whose_session_expired_leaves_alone_the_layout_another_one_completed(
        make_cluster, kazoo, monkeypatch):
    parent = f"/{_unique()}"
    cluster, rows = _former_cluster(make_cluster, kazoo, f"{parent}/ra", "a", ["L1"])
    namespace = f"{parent}/ra/{migrate.NAMESPACE_NAME}"
    original = migrate._delete_below

    def paused_past_its_session_before_step_1(conn, top, *rest):
        if top == namespace:
            monkeypatch.setattr(migrate, "_delete_below", original)  # once
            _expire(conn)  # A loses its session, and the lock with it
            cluster.open()  # B takes the lock and moves the logs
            cluster.append("L1", b"after the move")  # acknowledged in the new layout
            cluster.close()
        return original(conn, top, *rest)

    monkeypatch.setattr(migrate, "_delete_below", paused_past_its_session_before_step_1)
    with contextlib.suppress(MetadataError):  # A may give up; it must not undo B's move
        ZooKeeperMetadataStore(cluster.address, zkutil.settings()).close()
    monkeypatch.undo()
    cluster.open()
    assert [data for _p, data in LogReader(cluster.bk, "L1").read()] == [
        *rows["L1"], b"after the move"]


def test_a_migrator_whose_session_expired_cannot_delete_the_copy_another_one_is_making(
        make_cluster, kazoo, monkeypatch):
    parent = f"/{_unique()}"
    cluster, rows = _former_cluster(make_cluster, kazoo, f"{parent}/ra", "a", ["L1", "L2"])
    namespace = f"{parent}/ra/{migrate.NAMESPACE_NAME}"
    delete_below, copy_tree = migrate._delete_below, migrate._copy_tree

    def paused_past_its_session_before_step_1(conn_a, top, *rest_a):
        if top != namespace:
            return delete_below(conn_a, top, *rest_a)
        monkeypatch.setattr(migrate, "_delete_below", delete_below)  # once
        _expire(conn_a)  # A loses its session, and the lock with it

        def step_1_of_a_while_b_copies(conn_b, source, target, *rest_b):
            if source.endswith("/L2"):  # B copied L1: A wakes up and does its step 1
                monkeypatch.setattr(migrate, "_copy_tree", copy_tree)
                with contextlib.suppress(MetadataError):
                    delete_below(conn_a, top, *rest_a)
            return copy_tree(conn_b, source, target, *rest_b)

        monkeypatch.setattr(migrate, "_copy_tree", step_1_of_a_while_b_copies)
        cluster.open()  # B takes the lock and moves the logs
        cluster.close()
        raise Crash("A")  # and A dies

    monkeypatch.setattr(migrate, "_delete_below", paused_past_its_session_before_step_1)
    with pytest.raises(Crash):
        ZooKeeperMetadataStore(cluster.address, zkutil.settings()).close()
    monkeypatch.undo()
    cluster.open()
    _check_moved(kazoo, cluster, rows)


def test_a_migrator_whose_session_expired_leaves_the_lock_another_one_took(
        make_cluster, kazoo, monkeypatch):
    parent = f"/{_unique()}"
    cluster, rows = _former_cluster(make_cluster, kazoo, f"{parent}/ra", "a", ["L1"])
    lock = f"{parent}/ra/{migrate.LOCK_NAME}"
    original = migrate._delete_below

    def paused_past_its_session_then_dies(conn, top, *rest):
        monkeypatch.setattr(migrate, "_delete_below", original)  # once
        _expire(conn)  # A loses its session, and the lock with it
        kazoo.create(lock, b"", ephemeral=True)  # B takes the lock
        raise Crash("A")

    monkeypatch.setattr(migrate, "_delete_below", paused_past_its_session_then_dies)
    with pytest.raises(Crash):
        ZooKeeperMetadataStore(cluster.address, zkutil.settings()).close()
    found = kazoo.exists(lock)  # A, unlocking, left B's lock alone
    assert found is not None and found.ephemeralOwner == kazoo.client_id[0]
    kazoo.delete(lock)
    monkeypatch.undo()
    cluster.open()
    _check_moved(kazoo, cluster, rows)


def test_a_copy_whose_answer_is_lost_is_made_again_from_what_the_retry_reads(
        make_cluster, kazoo, monkeypatch):
    parent = f"/{_unique()}"
    cluster, rows = _former_cluster(make_cluster, kazoo, f"{parent}/ra", "a", ["L1"])
    consumer = f"{parent}/logs/L1/consumers/consumer-a"
    assert kazoo.exists(consumer)
    original = migrate._create_all

    def answer_lost(*args):
        if "consumers/consumer-a" not in repr(args):
            return original(*args)
        monkeypatch.setattr(migrate, "_create_all", original)  # once
        original(*args)
        kazoo.delete(consumer)  # gone before the copy is made again
        raise ConnectionLoss("the answer is lost")

    monkeypatch.setattr(migrate, "_create_all", answer_lost)
    former = _tree(kazoo, f"{parent}/logs")
    del former["/L1/consumers/consumer-a"]
    cluster.open()
    assert _tree(kazoo, f"{parent}/ra/pybk/logs") == former
    assert consumers.list_consumers(cluster.store, "L1") == []


@contextlib.contextmanager
def _as_former_pybk(store: ZooKeeperMetadataStore) -> Iterator[None]:
    """Within the block, ``store`` is a process of the former pybk still running (say a
    Spark executor not yet upgraded): it maps the contract's /logs to <parent>/logs."""
    store._ns.base = store.address.root.rsplit("/", 1)[0]
    try:
        yield
    finally:
        store._ns.base = f"{store.address.root}/{migrate.NAMESPACE_NAME}"


def _check_former_pybk_refused(cluster: ClusterUnderTest, moved: str) -> None:
    """What a process of the former pybk still running writes is refused, not
    acknowledged and lost: a new log, and a consumer of the moved log ``moved``."""
    with _as_former_pybk(cluster.store):
        with pytest.raises(MetadataError, match="NoAuth"):
            cluster.append("L9", b"never acknowledged")
        with pytest.raises(MetadataError, match="NoAuth"):
            consumers.set_position(cluster.store, moved, "late", Position(1, 0, 0))
    assert "L9" not in list_logs(cluster.store)
    assert [c.consumer_id for c in consumers.list_consumers(cluster.store, moved)] == [
        f"consumer-{cluster.name}"]


def test_a_log_that_a_pybk_of_the_former_layout_still_running_creates_is_not_lost(
        make_cluster, kazoo):
    parent = f"/{_unique()}"
    cluster, rows = _former_cluster(make_cluster, kazoo, f"{parent}/ra", "a", ["L1"])
    cluster.open()  # the logs move, and the former place is fenced
    _check_former_pybk_refused(cluster, "L1")
    _check_moved(kazoo, cluster, rows)  # what the cluster itself does goes on


def test_the_former_place_is_fenced_once_no_cluster_beside_uses_it(make_cluster, kazoo):
    parent = f"/{_unique()}"
    a, rows_a = _former_cluster(make_cluster, kazoo, f"{parent}/ra", "a", ["La"])
    b, rows_b = _former_cluster(make_cluster, kazoo, f"{parent}/rb", "b", ["Lb"])
    ok("migrate-logs", "--zk", a.address, "--logs", "La")
    # rb is still of the former layout: a process of its pybk makes a log there
    kazoo.create(f"{parent}/logs/Lb2", LogMetadata("Lb2").to_bytes())
    b.open()  # the last cluster of the former layout takes it
    assert list_logs(b.store) == ["Lb", "Lb2"]
    b.close()
    kazoo.delete(f"{parent}/rb/pybk/logs/Lb2")
    b.open()
    a.open()
    _check_former_pybk_refused(a, "La")
    _check_former_pybk_refused(b, "Lb")
    _check_moved(kazoo, a, rows_a)
    _check_moved(kazoo, b, rows_b)


def test_migrate_logs_on_a_moved_cluster_fences_what_a_retired_sibling_kept_open(
        make_cluster, kazoo):
    parent = f"/{_unique()}"
    a, rows_a = _former_cluster(make_cluster, kazoo, f"{parent}/ra", "a", ["La"])
    _former_cluster(make_cluster, kazoo, f"{parent}/rb", "b", ["Lb"])
    ok("migrate-logs", "--zk", a.address, "--logs", "La")
    acls, _stat = kazoo.get_acls(f"{parent}/logs")
    assert all(acl.perms & Permissions.CREATE for acl in acls)  # rb's logs live there
    kazoo.delete(f"{parent}/rb", recursive=True)  # rb is retired, never moved
    assert "in the current layout already" in ok("migrate-logs", "--zk", a.address)
    a.open()
    _check_former_pybk_refused(a, "La")
    _check_moved(kazoo, a, rows_a)


def test_a_read_only_command_leaves_a_cluster_of_the_former_layout_as_it_is(
        make_cluster, kazoo, monkeypatch):
    parent = f"/{_unique()}"
    cluster, rows = _former_cluster(make_cluster, kazoo, f"{parent}/ra", "a", ["L1"])
    # The cluster still runs pybk of the former layout: a writer has L1 open
    monkeypatch.setattr(migrate, "ensure_namespace", lambda _conn, _root: None)
    cluster.open()
    monkeypatch.undo()
    cluster.store._ns.base = parent  # the former layout's /logs
    writer = LogWriter.open(cluster.bk, "L1", SMALL_SEGMENTS)
    try:
        writer.append(b"before the look " + bytes(300))
        # An operator looks: the consumers where they are
        assert "consumer-a\t" in ok("consumers", "list", "--zk", cluster.address,
                                      "--log", "L1")
        ok("listledgers", "--zk", cluster.address)  # the admin commands, through the
        assert "999999" in failed("readledger", "--zk", cluster.address, "999999")  # client
        for i in range(3):  # rolls
            writer.append(f"after the look {i} ".encode() + bytes(300))
    finally:
        writer.close()
    with ZooKeeperMetadataStore(cluster.address, zkutil.settings(), move_logs=False) as store:
        assert list_logs(store) == ["L1"]
        with pytest.raises(MetadataError, match="former layout.*move_logs=False"):
            consumers.set_position(store, "L1", "consumer-a", Position(2, 0, 0))
    assert not kazoo.exists(f"{parent}/ra/{migrate.NAMESPACE_NAME}")


def test_the_fence_of_a_cluster_with_zookeeper_credentials_keeps_them_reading_and_deleting(
        zookeeper, kazoo, tmp_path):
    settings = zookeeper_credentials(tmp_path)
    parent = f"/{_unique()}"
    address = zookeeper.address(f"{parent}/ra")
    format_cluster(address, settings=settings)
    with ZooKeeperMetadataStore(address, settings) as store:  # made by the former pybk
        with _as_former_pybk(store):
            read_log(store, "L1", create=True)
            consumers.set_position(store, "L1", "c", Position(1, 0, 0))
        store._conn.client.delete(f"{parent}/ra/{migrate.NAMESPACE_NAME}", recursive=True)
    with ZooKeeperMetadataStore(address, settings) as store:  # moves L1
        assert list_logs(store) == ["L1"]
        with _as_former_pybk(store):
            with pytest.raises(MetadataError, match="NoAuth"):
                read_log(store, "L9", create=True)
            with pytest.raises(MetadataError, match="NoAuth"):
                consumers.set_position(store, "L1", "late", Position(1, 0, 0))
            assert store.get("/logs/L1")[0].startswith(migrate.MOVED_MAGIC)
            store.delete("/logs/L1", ANY_VERSION)
            assert store.children("/logs") == []
    acls, _stat = kazoo.get_acls(f"{parent}/logs")
    assert {acl.id.scheme: acl.perms for acl in acls} == {
        "digest": Permissions.READ | Permissions.DELETE | Permissions.ADMIN,
        "world": Permissions.READ}
