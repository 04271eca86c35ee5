"""The ZooKeeper store beyond the contract: BookKeeper's layout as ZooKeeper holds it (read
back with a plain kazoo client), formatting, roots, bounded failures, a ZooKeeper restart
under a working client, and a session expiry.  Always a real ZooKeeper server.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time

import pytest
import zkutil

from pybk.errors import MetadataError, MetadataUnavailable
from pybk.meta import DigestType, LedgerManager, LedgerMetadata, zkclient
from pybk.meta.address import open_metadata_store
from pybk.meta.embedded import EmbeddedMetadataStore
from pybk.meta.layout import FLAT, HIERARCHICAL
from pybk.meta.zookeeper import SessionState, ZooKeeperMetadataStore, format_cluster
from pybk.testing import WAIT_S, returns_in_time, wait_until

pytestmark = pytest.mark.timeout(90)

ENSEMBLE = ["b1:3181", "b2:3181", "b3:3181"]


@pytest.fixture
def address(zookeeper) -> str:
    """A freshly formatted (hierarchical) cluster of this test's own."""
    address = zookeeper.address(zkutil.fresh_root())
    format_cluster(address, settings=zkutil.settings())
    return address


def create_ledger(manager: LedgerManager):
    return manager.create_ledger(ENSEMBLE, 2, 2, DigestType.CRC32C, b"pw")


def next_state(states: queue.Queue) -> SessionState:
    try:
        return states.get(timeout=WAIT_S)
    except queue.Empty:
        pytest.fail(f"no session change within {WAIT_S} s")


# -- layouts as ZooKeeper holds them -----------------------------------------------------

def test_hierarchical_layout_puts_ledger_1_at_ledgers_00_0000_L0001(zookeeper, kazoo):
    address = zookeeper.address()  # the default root, /ledgers: BookKeeper's own paths
    # A cluster another test left at the default root would have taken ids 0 and 1.
    kazoo.delete("/ledgers", recursive=True)
    format_cluster(address, settings=zkutil.settings())
    with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
        assert store.layout is HIERARCHICAL
        manager = LedgerManager(store)
        created = [create_ledger(manager) for _ in range(2)]
        assert [c.metadata.ledger_id for c in created] == [0, 1]
        data, stat = kazoo.get("/ledgers/00/0000/L0001")
        assert LedgerMetadata.from_bytes(data) == created[1].metadata
        assert sorted(kazoo.get_children("/ledgers/00/0000")) == ["L0000", "L0001"]
        assert manager.ledger_ids() == [0, 1]
        manager.delete(1)
        assert manager.ledger_ids() == [0]
        assert kazoo.get("/ledgers/LAYOUT")[0] == (
            b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1")
        assert kazoo.get("/ledgers/INSTANCEID")[0].decode() == store.instance_id
        # Nothing outside the root is a record of the store: ZooKeeper's own node and
        # other tests' roots are out of reach
        store.create("/zookeeper", b"mine")
        assert kazoo.get("/ledgers/pybk/zookeeper")[0] == b"mine"
        assert store.children("/") == ["ledgers", "zookeeper"]
        store.delete("/zookeeper", -1)


def test_flat_layout_keeps_ledgers_under_the_root(zookeeper, kazoo):
    root = zkutil.fresh_root()
    address = zookeeper.address(root)
    format_cluster(address, layout="flat", settings=zkutil.settings())
    with ZooKeeperMetadataStore(address, zkutil.settings(), layout="flat") as store:
        assert store.layout is FLAT
        created = create_ledger(LedgerManager(store))
        path = f"{root}/L{created.metadata.ledger_id:010d}"
        assert LedgerMetadata.from_bytes(kazoo.get(path)[0]) == created.metadata
        assert kazoo.get(f"{root}/LAYOUT")[0].endswith(b"FlatLedgerManagerFactory:1")


def test_a_root_not_named_ledgers_maps_ledgers_to_it_and_the_rest_under_it(zookeeper,
                                                                            kazoo):
    parent = zkutil.fresh_root().rsplit("/", 1)[0]
    address = zookeeper.address(f"{parent}/cluster1")
    format_cluster(address, settings=zkutil.settings())
    with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
        store.register_bookie("b1:3181")
        store.create("/logs/orders", b"ledger list")
        assert kazoo.exists(f"{parent}/cluster1/available/b1:3181")
        assert kazoo.get(f"{parent}/cluster1/pybk/logs/orders")[0] == b"ledger list"
        assert kazoo.get_children(parent) == ["cluster1"]
        assert store.children("/") == ["ledgers", "logs"]
        store.create("/cluster1", b"no alias")  # the root's name is a name like any
        assert kazoo.get(f"{parent}/cluster1/pybk/cluster1")[0] == b"no alias"
        assert "pybk" not in store.children("/ledgers")
        for aliased in ("/ledgers/pybk", "/ledgers/pybk/logs", "/ledgers/pybk-migration"):
            with pytest.raises(MetadataError, match="records outside /ledgers"):
                store.exists(aliased)


# -- formatting ---------------------------------------------------------------------------

def test_an_unformatted_root_is_refused(zookeeper):
    with pytest.raises(MetadataError, match="no cluster is formatted.*format_cluster"):
        ZooKeeperMetadataStore(zookeeper.address(zkutil.fresh_root()), zkutil.settings())


def test_a_layout_mismatch_is_refused_at_open_and_at_format(zookeeper):
    address = zookeeper.address(zkutil.fresh_root())
    instance_id = format_cluster(address, layout="flat", settings=zkutil.settings())
    assert format_cluster(address, layout="flat", settings=zkutil.settings()) == instance_id
    with pytest.raises(MetadataError, match="formatted with the flat ledger layout, not "
                                            "hierarchical"):
        ZooKeeperMetadataStore(address, zkutil.settings(), layout="hierarchical")
    with pytest.raises(MetadataError, match="flat ledger layout, not hierarchical"):
        format_cluster(address, layout="hierarchical", settings=zkutil.settings())
    with pytest.raises(MetadataError, match="unknown ledger layout 'long'"):
        format_cluster(address, layout="long", settings=zkutil.settings())


def test_format_refuses_a_root_with_foreign_records_and_open_a_foreign_layout(zookeeper,
                                                                              kazoo):
    root = zkutil.fresh_root()
    kazoo.create(f"{root}/something", makepath=True)
    with pytest.raises(MetadataError, match="holds records .*something.* but no LAYOUT"):
        format_cluster(zookeeper.address(root), settings=zkutil.settings())
    kazoo.create(f"{root}/LAYOUT", b"2\norg.example.OtherLedgerManagerFactory:1")
    with pytest.raises(MetadataError, match="does not implement"):
        ZooKeeperMetadataStore(zookeeper.address(root), zkutil.settings())


# -- bounded failures ---------------------------------------------------------------------

def closed_port() -> int:
    """A loopback port nothing listens on (it refuses connections)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_refused_connection_fails_at_once_naming_the_address_quietly(caplog):
    """Nothing listens at the address: the open fails after a few refused attempts, not
    after zkTimeout (ten minutes here), for a store and for formatting alike."""
    address = f"zk://127.0.0.1:{closed_port()}/ledgers"
    threads_before = threading.active_count()
    caplog.set_level(logging.DEBUG)
    patient = zkutil.settings(zkTimeout=600_000)
    for attempt in (lambda: ZooKeeperMetadataStore(address, patient),
                    lambda: format_cluster(address, settings=patient)):
        with pytest.raises(MetadataUnavailable) as refused:
            returns_in_time(attempt, "opening a store where nothing listens")
        assert str(refused.value) == (
            f"no ZooKeeper server listens at {address[5:-8]}: the connection was refused "
            f"({zkclient.REFUSED_ROUNDS} attempts): is ZooKeeper running there, on that "
            "port?")
    wait_until(lambda: threading.active_count() <= threads_before, "kazoo's threads ending")
    # kazoo's retries are there for whoever asks for DEBUG, and only then
    assert any(r.name == "pybk.meta.kazoo" and "Connection refused" in r.getMessage()
               for r in caplog.records)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_server_that_does_not_answer_fails_within_the_timeout_saying_why():
    """A port that takes connections and never answers (a hung or overloaded server):
    the open waits for zkTimeout, as for a slow ZooKeeper, then names the time-out."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes connections; nothing reads them
        address = f"zk://127.0.0.1:{silent.getsockname()[1]}/ledgers"
        with pytest.raises(MetadataUnavailable, match=r"within 1 s \(last: Connection "
                                                      r"time-out"):
            ZooKeeperMetadataStore(address, zkutil.settings(zkTimeout=1000))


def test_a_refusing_host_is_skipped_when_another_answers(zookeeper):
    address = zkutil.formatted_cluster(zookeeper).replace(
        "zk://", f"zk://127.0.0.1:{closed_port()},", 1)
    with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
        assert store.bookies() == []


def test_a_host_name_that_does_not_resolve_fails_at_once():
    with pytest.raises(MetadataUnavailable, match="no ZooKeeper host of no-such-host"
                                                  ".invalid:2181 resolves .*check the"):
        returns_in_time(lambda: ZooKeeperMetadataStore(  # not waiting the ten minutes
            "zk://no-such-host.invalid/ledgers", zkutil.settings(zkTimeout=600_000)),
            "opening a store whose one host does not resolve")


def test_a_host_that_does_not_resolve_is_skipped_when_another_does(zookeeper, caplog):
    address = zkutil.formatted_cluster(zookeeper).replace(
        "zk://", "zk://no-such-host.invalid:2181,", 1)
    with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
        assert store.bookies() == []
    assert "ZooKeeper host no-such-host.invalid does not resolve" in caplog.text


def test_a_bookie_id_registered_by_another_session_is_refused(address):
    with ZooKeeperMetadataStore(address, zkutil.settings()) as first:
        first.register_bookie("b1:3181")
        with ZooKeeperMetadataStore(address, zkutil.settings(zkTimeout=1000)) as second:
            started = time.monotonic()
            with pytest.raises(MetadataError, match="held by ZooKeeper session"):
                second.register_bookie("b1:3181")
            assert time.monotonic() - started >= 2.0  # it waited 2 x zkTimeout first
            first.close()  # the holder's session ends: the id is free at once
            second.register_bookie("b1:3181")
            assert second.bookies() == ["b1:3181"]


def test_open_metadata_store_picks_the_store_by_address(address, tmp_path):
    with open_metadata_store(address, zkutil.settings()) as store:
        assert isinstance(store, ZooKeeperMetadataStore)
    with open_metadata_store(tmp_path / "meta") as store:
        assert isinstance(store, EmbeddedMetadataStore)


# -- restarts and expiry --------------------------------------------------------------------


def test_a_client_rides_out_a_zookeeper_restart(own_zookeeper):
    """A thread increments a counter with compare-and-set while ZooKeeper is killed and
    restarted: no call fails, none is lost or applied twice, the session, registration
    and watches survive, the listener hears SUSPENDED then CONNECTED, and a store with a
    short operation timeout fails in bounded time while ZooKeeper is down."""
    address = own_zookeeper.address(zkutil.fresh_root())
    format_cluster(address, settings=zkutil.settings())
    states: queue.Queue[SessionState] = queue.Queue()
    watched: queue.Queue[str] = queue.Queue()
    with ZooKeeperMetadataStore(address, zkutil.settings()) as store, \
            ZooKeeperMetadataStore(address, zkutil.settings(zkOperationTimeoutMs=1000)) \
            as impatient:
        store.add_session_listener(states.put)
        store.register_bookie("b1:3181")
        store.create("/counter", b"0")
        store.watch("/counter", watched.put)
        session = store.session_id
        increments, errors, stop = [0], [], threading.Event()

        def work() -> None:
            try:
                while not stop.is_set():
                    data, version = store.get("/counter")
                    store.set("/counter", b"%d" % (int(data) + 1), version)
                    increments[0] += 1
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        try:
            wait_until(lambda: increments[0] >= 20, "progress before the restart")
            own_zookeeper.shutdown(graceful=False)
            with pytest.raises(MetadataUnavailable, match="did not answer within 1 s"):
                impatient.get("/counter")  # its zkOperationTimeoutMs, 1000 ms
            own_zookeeper.start()
            before = increments[0]
            wait_until(lambda: increments[0] >= before + 20 or errors, "progress after it")
        finally:
            stop.set()
            worker.join(WAIT_S)
        assert not errors, errors
        assert store.get("/counter")[0] == b"%d" % increments[0]
        assert next_state(states) is SessionState.SUSPENDED
        assert next_state(states) is SessionState.CONNECTED
        assert store.session_id == session
        assert store.bookies() == ["b1:3181"]
        while not watched.empty():
            watched.get()
        store.set("/counter", b"after", -1)
        assert watched.get(timeout=WAIT_S) == "/counter"


def test_session_expiry_brings_registrations_back_and_tells_listeners(address, kazoo):
    states: queue.Queue[SessionState] = queue.Queue()
    with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
        store.add_session_listener(states.put)
        store.register_bookie("b1:3181", endpoint="tcp://b1:3181", location="/r/a")
        store.register_bookie("b2:3181", read_only=True)
        store.create("/plain-ephemeral", b"", ephemeral=True)
        old_session = store.session_id
        zkutil.expire_session(store)
        heard = [next_state(states)]
        while heard[-1] is not SessionState.CONNECTED:
            heard.append(next_state(states))
        assert SessionState.EXPIRED in heard
        assert heard.index(SessionState.EXPIRED) == len(heard) - 2
        assert store.session_id != old_session
        assert store.bookies(read_only=False) == ["b1:3181"]
        assert store.bookies(read_only=True) == ["b2:3181"]
        assert store.bookie_endpoint("b1:3181") == "tcp://b1:3181"
        assert store.bookie_location("b1:3181") == "/r/a"
        root = store.address.root
        assert kazoo.exists(f"{root}/available/b1:3181").ephemeralOwner == store.session_id
        assert not store.exists("/plain-ephemeral")  # other ephemeral records stay gone
