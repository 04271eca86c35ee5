"""Bookie nodes in this process (pybk.cluster.node) on a real ZooKeeper, and cluster
clients (pybk.connect) reaching them over ZeroMQ: registration with endpoints,
session expiry, disk state changes, placement on writable bookies only, a bookie that
comes back on another port under the id its disks recorded, and cookies (also of
``pybk bookie`` and ``pybk updatecookie`` processes)."""

from __future__ import annotations

import dataclasses
import queue
import shutil
import socket
import subprocess
import threading

import pytest
import zkutil
from clusterutil import address, bookies, child_env, pybk_command  # noqa: F401 (fixtures)
from conftest import KEY, entry

import pybk
import pybk.cluster.node as node_module
from pybk.client import BookKeeper
from pybk.cluster.cookies import cluster_cookie, update_cookies
from pybk.cluster.node import BookieNode
from pybk.errors import (
    BookieReadOnly,
    InvalidConfiguration,
    InvalidCookie,
    MetadataUnavailable,
    NotEnoughBookies,
)
from pybk.meta.zookeeper import SessionState, ZooKeeperMetadataStore, format_cluster
from pybk.net.connect import ClusterBookKeeper
from pybk.settings import ClientSettings, ServerSettings
from pybk.storage import Bookie, format_bookie
from pybk.storage.cookie import directory_cookie, is_formatted
from pybk.testing import WAIT_S

pytestmark = pytest.mark.timeout(60)

FAST = ClientSettings(addEntryTimeout=2.0, readTimeout=1.0, explicitLacInterval=20)
PASSWORD = b"node-test"


class Usage:
    """A settable used fraction for every directory of one bookie."""

    def __init__(self, fraction: float = 0.5) -> None:
        self.fraction = fraction

    def __call__(self, _path: str) -> float:
        return self.fraction


class Nodes:
    """Bookie nodes of one test on a freshly formatted cluster; each is closed (before
    its bookie, if the test made that) when the test ends."""

    def __init__(self, tmp_path, address: str, closing) -> None:
        self.tmp_path = tmp_path
        self.address = address
        self.closing = closing

    def settings(self, name: str, **overrides) -> ServerSettings:
        base = self.tmp_path / name
        values = dict(journalDirectory=str(base / "journal"),
                      ledgerDirectories=(str(base / "ledgers"),), journalPreAllocSizeMB=1,
                      metadataServiceUri=self.address, listenAddress="127.0.0.1:0",
                      zkTimeout=zkutil.SESSION_TIMEOUT_MS)
        values.update(overrides)
        settings = ServerSettings(**values)
        if not is_formatted(settings):
            format_bookie(settings)
        return settings

    def start(self, name: str, usage: Usage | None = None, **overrides) -> BookieNode:
        settings = self.settings(name, **overrides)
        bookie = None
        if usage is not None:
            bookie = self.closing.enter_context(Bookie(settings, disk_usage=usage))
        return self.closing.enter_context(BookieNode(settings, bookie=bookie))

    def observer(self) -> ZooKeeperMetadataStore:
        """A session of the test's own, to look at the registry."""
        return self.closing.enter_context(ZooKeeperMetadataStore(self.address,
                                                                 zkutil.settings()))

    def client(self) -> BookKeeper:
        """A cluster client, made the way users write it: ``pybk.connect("zk://...")``."""
        bk = pybk.connect(self.address, FAST, zk_settings=zkutil.settings())
        assert isinstance(bk, ClusterBookKeeper)
        return self.closing.enter_context(bk)


@pytest.fixture
def nodes(tmp_path, zookeeper, closing) -> Nodes:
    address = zookeeper.address(zkutil.fresh_root())
    format_cluster(address, settings=zkutil.settings())
    return Nodes(tmp_path, address, closing)


def payload(i: int) -> bytes:
    return b"node entry %d " % i * 8


def test_nodes_register_their_endpoints_and_serve_cluster_clients(nodes):
    started = [nodes.start(f"b{i}") for i in range(3)]
    observer = nodes.observer()
    for node in started:  # the default id is BookKeeper's: host:port of the endpoint
        assert node.endpoint.startswith("tcp://127.0.0.1:")
        assert node.bookie_id == node.endpoint[len("tcp://"):]
        assert observer.bookie_endpoint(node.bookie_id) == node.endpoint
    assert observer.bookies(read_only=False) == sorted(n.bookie_id for n in started)
    bk = nodes.client()
    with bk.create_ledger(3, 2, 2, password=PASSWORD) as lh:
        for i in range(20):
            lh.add_entry(payload(i))
    reader = nodes.client().open_ledger(lh.id, password=PASSWORD)
    assert [e.data for e in reader.read_entries(0, 19)] == [payload(i) for i in range(20)]
    started[0].close()  # unregisters at once, not when its session times out
    assert observer.bookies() == sorted(n.bookie_id for n in started[1:])


def test_an_expired_session_refuses_adds_until_the_node_is_registered_again(nodes):
    node = nodes.start("b1")
    heard: queue.Queue = queue.Queue()

    def probe(state: SessionState) -> None:
        # Runs after the node's own listener, before the store registers again.
        if state is SessionState.EXPIRED:
            try:
                node.bookie.add_entry_async(1, 0, entry(1, 0), KEY)
                heard.put("took an add")
            except BookieReadOnly as e:
                heard.put(str(e))
        heard.put(state)

    node.metadata.add_session_listener(probe)
    zkutil.expire_session(node.metadata)
    events = []
    while SessionState.CONNECTED not in events:
        events.append(heard.get(timeout=WAIT_S))
    refusal = events[events.index(SessionState.EXPIRED) - 1]
    assert "not registered in the cluster" in refusal and "expired" in refusal
    assert nodes.observer().bookie_endpoint(node.bookie_id) == node.endpoint
    node.bookie.add_entry(1, 0, entry(1, 0), KEY)  # registered again: adds are taken


def test_shutdown_on_session_expiry_closes_the_node(nodes):
    node = nodes.start("b1", shutdownOnSessionExpiry=True)
    zkutil.expire_session(node.metadata)
    assert node.wait(WAIT_S), "the node did not shut down"
    assert "session expired" in node.shutdown_reason
    assert node.bookie.is_closed
    assert nodes.observer().bookies() == []


def test_full_disks_move_the_registration_and_new_ledgers_avoid_read_only_bookies(nodes):
    usages = [Usage() for _ in range(4)]
    started = [nodes.start(f"b{i}", usage=usages[i]) for i in range(4)]
    full = started[3]
    observer = nodes.observer()
    usages[3].fraction = 0.99
    full.bookie.check_disks()  # what the housekeeping thread does every diskCheckInterval
    assert observer.bookies(read_only=True) == [full.bookie_id]
    assert observer.bookie_endpoint(full.bookie_id) == full.endpoint
    bk = nodes.client()
    for _ in range(10):
        lh = bk.create_ledger(3, 2, 2, password=PASSWORD)
        assert full.bookie_id not in lh.metadata.fragments[0].ensemble
        lh.add_entry(b"x")
    with pytest.raises(NotEnoughBookies):
        bk.create_ledger(4, 2, 2, password=PASSWORD)
    usages[3].fraction = 0.5
    full.bookie.check_disks()
    assert observer.bookies(read_only=False) == sorted(n.bookie_id for n in started)
    assert full.bookie_id in bk.create_ledger(4, 2, 2, password=PASSWORD).metadata \
        .fragments[0].ensemble


def test_a_client_finds_a_bookie_that_came_back_on_another_port(nodes):
    node = nodes.start("b1", bookieId="b1")
    bk = nodes.client()
    with bk.create_ledger(1, 1, 1, password=PASSWORD) as lh:
        for i in range(5):
            lh.add_entry(payload(i))
    reader = bk.open_ledger(lh.id, password=PASSWORD, recovery=False)
    assert reader.read_entry(0).data == payload(0)
    old_endpoint = node.endpoint
    node.close()
    moved = nodes.start("b1", bookieId="b1")
    assert moved.endpoint != old_endpoint
    assert [e.data for e in reader.read_entries(0, 4)] == [payload(i) for i in range(5)]


def test_the_first_start_writes_the_cookie_and_a_restart_on_the_same_disks_finds_it(nodes):
    node = nodes.start("b1", bookieId="b1")
    local = directory_cookie(nodes.settings("b1"))
    assert (local.instance_id, local.bookie_id) == (node.bookie.instance_id, "b1")
    expected = cluster_cookie("b1", local)
    observer = nodes.observer()
    assert observer.read_cookie("b1") == (expected, 0)
    assert expected.journal_directory == str(nodes.tmp_path / "b1" / "journal")
    node.close()
    again = nodes.start("b1", bookieId="b1")  # same disks, same id
    assert again.bookie.instance_id == expected.instance_id
    assert observer.read_cookie("b1") == (expected, 0)  # found, not written again
    assert observer.bookies() == ["b1"]


def test_a_bookie_formatted_again_under_a_known_id_is_refused(nodes):
    node = nodes.start("b1", bookieId="b1")
    old_instance = node.bookie.instance_id
    node.close()
    settings = nodes.settings("b1", bookieId="b1")
    new_instance = format_bookie(settings, force=True)  # wiped and formatted again
    with pytest.raises(InvalidCookie) as refused:
        BookieNode(settings)
    message = str(refused.value)
    assert "bookie b1 refuses to start" in message and "/ledgers/cookies/b1" in message
    assert f"instance id {old_instance} in the cluster, {new_instance} on disk" in message
    observer = nodes.observer()
    assert observer.bookies() == []  # never registered
    assert observer.read_cookie("b1")[0].instance_id == old_instance  # left as it was
    # Other disks under the id are refused alike; under an id of their own they start.
    with pytest.raises(InvalidCookie, match="bookie b1 refuses to start"):
        nodes.start("b9", bookieId="b1")
    assert nodes.start("b9", bookieId="b9").bookie_id == "b9"


def test_a_bookie_whose_directories_differ_from_its_cookie_is_refused(nodes):
    nodes.start("b1", bookieId="b1").close()
    observer = nodes.observer()
    cookie, version = observer.read_cookie("b1")
    # The cluster remembers b1 with a second ledger directory that it no longer names.
    observer.write_cookie(dataclasses.replace(
        cookie, ledger_directories=cookie.ledger_directories + ("/gone/ledgers",)), version)
    with pytest.raises(InvalidCookie, match=r"ledger directories .*'/gone/ledgers'\] in "
                                            r"the cluster, .* on disk.*ledgerDirectories"):
        nodes.start("b1", bookieId="b1")
    assert observer.bookies() == []


def test_two_bookie_ids_coexist_each_with_its_cookie(nodes):
    first, second = nodes.start("b1", bookieId="b1"), nodes.start("b2", bookieId="b2")
    observer = nodes.observer()
    assert observer.children("/ledgers/cookies") == ["b1", "b2"]
    assert observer.read_cookie("b1")[0].instance_id == first.bookie.instance_id
    assert observer.read_cookie("b2")[0].instance_id == second.bookie.instance_id
    assert first.bookie.instance_id != second.bookie.instance_id
    assert observer.bookies() == ["b1", "b2"]


def test_connect_fails_clearly(tmp_path):
    with socket.socket() as sock:  # a port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(MetadataUnavailable, match="listens at .*was refused"):
        pybk.connect(f"zk://127.0.0.1:{port}/ledgers",
                           zk_settings=zkutil.settings(zkTimeout=1000))
    with pytest.raises(InvalidConfiguration, match="zk://"):
        pybk.connect(str(tmp_path / "meta"))


def test_a_node_needs_the_cluster_address(nodes):
    with pytest.raises(InvalidConfiguration, match="metadataServiceUri"):
        BookieNode(nodes.settings("b1", metadataServiceUri=""))


# -- the bookie id belongs to the disks ---------------------------------------------------

def test_a_restarted_node_keeps_the_id_its_disks_recorded_and_refuses_another(nodes):
    node = nodes.start("b1")  # no bookieId: host:port of its first start
    first_id, first_endpoint = node.bookie_id, node.endpoint
    assert first_id == first_endpoint[len("tcp://"):]
    assert directory_cookie(nodes.settings("b1")).bookie_id == first_id
    bk = nodes.client()
    with bk.create_ledger(1, 1, 1, password=PASSWORD) as lh:
        for i in range(10):
            lh.add_entry(payload(i))
    node.close()
    again = nodes.start("b1")  # listens on another free port
    assert again.endpoint != first_endpoint
    assert again.bookie_id == first_id  # the ledger's ensemble names this id
    assert nodes.observer().bookie_endpoint(first_id) == again.endpoint
    reader = nodes.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    assert [e.data for e in reader.read_entries(0, 9)] == [payload(i) for i in range(10)]
    again.close()
    with pytest.raises(InvalidCookie, match=f"serve as bookie {first_id} .*not as b7: .*"
                                            f"pybk bookie --bookie-id {first_id}"):
        nodes.start("b1", bookieId="b7")
    assert nodes.observer().bookies() == []
    assert nodes.observer().read_cookie("b7") is None  # refused before the cluster's check


def test_an_id_the_cluster_refused_is_not_recorded(nodes):
    nodes.start("b1", bookieId="b1").close()
    with pytest.raises(InvalidCookie, match="bookie b1 refuses to start"):
        nodes.start("b2", bookieId="b1")  # other disks under a known id
    assert directory_cookie(nodes.settings("b2")).bookie_id is None
    assert nodes.start("b2", bookieId="b2").bookie_id == "b2"


def test_pybk_bookie_restarted_on_another_port_keeps_its_id_and_refuses_another(bookies):
    first = bookies.start("b1").wait_serving()  # --listen 127.0.0.1:0, no --bookie-id
    assert first.terminate() == 0, first.output
    again = bookies.start("b1").wait_serving()
    assert again.endpoint != first.endpoint
    assert again.bookie_id == first.bookie_id, again.output
    assert again.terminate() == 0, again.output
    other = bookies.start("b1", "--bookie-id", "b7")
    assert other.process.wait(60) == 1, other.output
    assert f"serve as bookie {first.bookie_id} " in other.output
    assert f"pybk bookie --bookie-id {first.bookie_id}" in other.output


# -- updatecookie -------------------------------------------------------------------------

def _updatecookie(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(pybk_command("updatecookie", *args), env=child_env(),
                          capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def test_pybk_updatecookie_moves_a_bookie_of_the_cluster(nodes):
    node = nodes.start("b1", bookieId="b1")
    bk = nodes.client()
    with bk.create_ledger(1, 1, 1, password=PASSWORD) as lh:
        for i in range(10):
            lh.add_entry(payload(i))
    node.close()
    shutil.move(nodes.tmp_path / "b1", nodes.tmp_path / "new-disks")
    new = ["--journal-dir", str(nodes.tmp_path / "new-disks" / "journal"),
           "--ledger-dir", str(nodes.tmp_path / "new-disks" / "ledgers")]
    with pytest.raises(InvalidCookie, match="run pybk updatecookie"):
        nodes.start("new-disks")
    result = _updatecookie(*new)
    assert result.returncode == 1 and "serve as bookie b1 in a cluster: give the cluster" \
        in result.stderr, result.stderr
    result = _updatecookie(*new, "--zk", nodes.address)
    assert result.returncode == 0, result.stderr
    assert "bookie b1" in result.stdout and "new-disks" in result.stdout, result.stdout
    cookie, version = nodes.observer().read_cookie("b1")
    assert version == 1
    assert cookie.journal_directory == str(nodes.tmp_path / "new-disks" / "journal")
    moved = nodes.start("new-disks")  # no bookieId: the recorded b1
    assert moved.bookie_id == "b1"
    reader = nodes.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    assert [e.data for e in reader.read_entries(0, 9)] == [payload(i) for i in range(10)]


def test_updatecookie_refuses_disks_the_cluster_knows_as_another_instance(nodes):
    nodes.start("b1", bookieId="b1").close()
    before = nodes.observer().read_cookie("b1")
    settings = nodes.settings("b9")  # other disks, which recorded no id
    with pytest.raises(InvalidCookie, match="is of instance .*nothing was changed"):
        update_cookies(settings.replace(bookieId="b1"), nodes.observer())
    assert nodes.observer().read_cookie("b1") == before
    assert directory_cookie(settings).bookie_id is None


def test_a_stalled_unregistration_does_not_hold_the_close_up(nodes, monkeypatch):
    """ZooKeeper that takes no unregistration (stalled, its loss not yet noticed) holds a
    closing node up for UNREGISTER_WAIT_S, not for the store's whole operation timeout:
    the registration ends with the session the close ends next."""
    node = nodes.start("stalled")
    release = threading.Event()
    calls: list[str] = []

    def stalled_unregister(bookie_id: str, host: str = "") -> None:
        # the fault: no answer until released
        calls.append(bookie_id)
        release.wait(60)

    monkeypatch.setattr(node.metadata, "unregister_bookie", stalled_unregister)
    closer = threading.Thread(target=node.close)
    try:
        closer.start()
        closer.join(node_module.UNREGISTER_WAIT_S + 20)
        assert not closer.is_alive(), "close() waited for the stalled unregistration"
        assert calls == [node.bookie_id]
        assert nodes.observer().bookies() == []  # gone with the closed session
    finally:
        release.set()
        closer.join(30)
