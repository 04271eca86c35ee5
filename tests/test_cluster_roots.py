"""Clusters sharing one ZooKeeper: everything a cluster writes lives under its root, and a
cluster of pybk's former layout (logs at ``<root's parent>/logs``) is moved under its
root when it is opened (:mod:`pybk.meta.migrate`).

Real ZooKeeper (the session's server) and real bookies in this process, one per cluster
(both clusters number their ledgers from 0).
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid

import pytest
import zkutil
from clientutil import FAST

from pybk.client import BookKeeper
from pybk.client.transport import InProcessBookieClient
from pybk.log import LogReader, LogWriter, consumers, jobs
from pybk.log.metadata import list_logs, read_log
from pybk.log.position import Position
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
        format_cluster(self.address, settings=zkutil.settings())
        self.store = stack.enter_context(ZooKeeperMetadataStore(self.address,
                                                                zkutil.settings()))
        base = tmp_path / name
        bookie = bookie_factory(settings_factory(
            journalDirectory=str(base / "journal"),
            ledgerDirectories=(str(base / "ledgers"),)))
        self.bk = stack.enter_context(BookKeeper(self.store, {"B1": InProcessBookieClient(
            "B1", bookie)}, FAST))
        self.name = name

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

    def check(self, log: str, rows: list[bytes]) -> None:
        """This cluster holds what :meth:`write` left and nothing of another cluster."""
        assert [data for _position, data in LogReader(self.bk, log).read()] == rows
        assert list_logs(self.store) == [log]
        assert [c.consumer_id for c in consumers.list_consumers(self.store, log)] == [
            f"consumer-{self.name}"]
        head = read_log(self.store, log).metadata
        assert jobs.read_job(self.store, log, f"job{self.name}") is not None
        assert self.store.children(f"/logs/{log}/jobs") == [f"job{self.name}"]
        assert len(head.tail) > 1
        assert self.store.bookies() == [f"bookie-{self.name}"]
        assert self.store.bookie_location(f"bookie-{self.name}") == f"/region/{self.name}"
        mark = UnderreplicationManager(self.store).get(7)
        assert mark is not None and list(mark.replicas) == [f"bookie-{self.name}"]


@pytest.fixture
def cluster_pair(zookeeper, bookie_factory, settings_factory, tmp_path):
    """``make(root_a, root_b)``: two clusters on the session's ZooKeeper."""
    with contextlib.ExitStack() as stack:
        def make(root_a: str, root_b: str) -> tuple[ClusterUnderTest, ClusterUnderTest]:
            return (ClusterUnderTest(zookeeper, stack, bookie_factory, settings_factory,
                                     tmp_path, root_a, "a"),
                    ClusterUnderTest(zookeeper, stack, bookie_factory, settings_factory,
                                     tmp_path, root_b, "b"))
        yield make


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
    parent = root_b.rsplit("/", 1)[0] or "/"
    if case != "default ledgers beside a root at the top":
        # Nothing outside the roots: the parent holds the two roots only
        assert sorted(kazoo.get_children(parent)) == ["ra", "rb"]
    assert not kazoo.exists("/logs")
