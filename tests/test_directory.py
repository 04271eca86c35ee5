"""The bookie directory (pybk.net.directory): bookie ids to clients without a
metadata read on the data path.  Ledger bookies are resolved when the ledger is created
or opened; other lookups run on the directory's own thread while callers get a stand-in
that queues their requests; a real ZooKeeper stopped under a client does not stall its
ZeroMQ loop; a bookie that came back elsewhere is found."""

from __future__ import annotations

import queue
import threading
import time

import pytest
import zkutil
from conftest import KEY, entry

from pybk.client.transport import InProcessBookieClient
from pybk.cluster.node import BookieNode
from pybk.errors import BookieUnavailable
from pybk.net import directory as directory_module
from pybk.net.client import ClientLoop, ZmqBookieClient
from pybk.net.connect import connect
from pybk.net.directory import REFRESH_WAIT_S, BookieDirectory
from pybk.net.server import BookieServer
from pybk.settings import ClientSettings, ServerSettings
from pybk.storage import format_bookie
from pybk.storage.cookie import is_formatted
from pybk.testing import WAIT_S, wait_until

pytestmark = pytest.mark.timeout(120)

FAST = ClientSettings(addEntryTimeout=2.0, readTimeout=1.0, explicitLacInterval=20)
PASSWORD = b"directory-test"


class GatedRegistry:
    """The one store method a directory reads, answering only once ``gate`` is open
    (a store that is slow or cut off), and counting the reads."""

    def __init__(self, endpoints: dict[str, str]) -> None:
        self.endpoints = endpoints
        self.gate = threading.Event()
        self.reads: list[tuple[str, str]] = []  # (bookie id, reading thread's name)

    def bookie_endpoint(self, bookie_id: str) -> str:
        self.reads.append((bookie_id, threading.current_thread().name))
        assert self.gate.wait(WAIT_S), "the test never opened the gate"
        if bookie_id not in self.endpoints:
            raise BookieUnavailable(f"bookie {bookie_id} is not registered")
        return self.endpoints[bookie_id]


# -- without ZooKeeper: a registry the test holds back ------------------------------------

def test_a_lookup_runs_in_the_background_and_waiting_requests_go_out_once_it_ends(
        bookie, closing):
    server = closing.enter_context(BookieServer(bookie, "tcp://127.0.0.1:*"))
    registry = GatedRegistry({"b1": server.address})
    loop = closing.enter_context(ClientLoop())
    directory = BookieDirectory(registry, loop, FAST)  # type: ignore[arg-type]
    closing.callback(directory.close)

    stand_in = directory.client("b1")  # returns while the registry does not answer
    assert not isinstance(stand_in, ZmqBookieClient)
    adds = [stand_in.add(1, i, entry(1, i), KEY) for i in range(50)]
    time.sleep(0.1)
    assert not any(f.done() for f in adds)  # waiting for the address, not failed
    assert directory.client("b1") is stand_in  # one lookup, whoever asks
    registry.gate.set()
    for f in adds:
        assert f.result(timeout=WAIT_S) is None
    assert [bookie.read_entry(1, i) for i in range(50)] == [entry(1, i) for i in range(50)]
    assert registry.reads == [("b1", "pybk-bookie-lookup")]  # off the callers' threads
    resolved = directory.client("b1")
    assert isinstance(resolved, ZmqBookieClient) and resolved.address == server.address
    assert stand_in.read(1, 3).result(timeout=WAIT_S) == entry(1, 3)  # it forwards now

    unknown = directory.client("nobody")  # not registered: fails, after the lookup
    with pytest.raises(BookieUnavailable, match="not registered"):
        unknown.read(1, 0).result(timeout=WAIT_S)


def test_local_bookies_are_handed_out_as_given_and_never_looked_up(bookie, closing):
    registry = GatedRegistry({})  # would block any lookup
    loop = closing.enter_context(ClientLoop())
    local = InProcessBookieClient("me", bookie)
    directory = BookieDirectory(registry, loop, FAST,  # type: ignore[arg-type]
                                local={"me": local})
    closing.callback(directory.close)
    closing.callback(registry.gate.set)
    directory.resolve(["me"])
    assert directory.client("me") is local
    assert directory.client("me").add(1, 0, entry(1, 0), KEY).result(timeout=WAIT_S) is None
    assert registry.reads == []


def test_waiting_requests_are_bounded_and_fail_when_the_directory_closes(
        closing, monkeypatch):
    monkeypatch.setattr(directory_module, "WAITING_REQUESTS_MAX", 3)
    registry = GatedRegistry({})
    loop = closing.enter_context(ClientLoop())
    directory = BookieDirectory(registry, loop, FAST)  # type: ignore[arg-type]
    closing.callback(directory.close)
    closing.callback(registry.gate.set)  # lets the lookup thread end, after close too
    stand_in = directory.client("b1")
    waiting = [stand_in.read(1, i) for i in range(3)]
    with pytest.raises(BookieUnavailable, match="3 requests already wait"):
        stand_in.read(1, 3).result(timeout=1)  # over the bound: fails at once
    errors: queue.Queue = queue.Queue()
    stand_in.add_then(1, 0, entry(1, 0), KEY, errors.put)
    assert errors.get(timeout=1) is not None
    directory.close()  # returns while its lookup thread is still in the registry read
    assert not registry.gate.is_set()
    for f in waiting:
        with pytest.raises(BookieUnavailable, match="closed"):
            f.result(timeout=1)
    with pytest.raises(BookieUnavailable, match="closed"):
        directory.client("b2").read(1, 0).result(timeout=1)


# -- with ZooKeeper --------------------------------------------------------------------------

class Nodes:
    """In-process bookie nodes of one test, each closed when the test ends."""

    def __init__(self, tmp_path, address: str, closing) -> None:
        self.tmp_path, self.address, self.closing = tmp_path, address, closing

    def start(self, name: str, **overrides) -> BookieNode:
        base = self.tmp_path / name
        values = dict(journalDirectory=str(base / "journal"),
                      ledgerDirectories=(str(base / "ledgers"),), journalPreAllocSizeMB=1,
                      metadataServiceUri=self.address, listenAddress="127.0.0.1:0",
                      zkTimeout=zkutil.SESSION_TIMEOUT_MS, bookieId=name)
        values.update(overrides)
        settings = ServerSettings(**values)
        if not is_formatted(settings):
            format_bookie(settings)
        return self.closing.enter_context(BookieNode(settings))


def test_a_ledgers_bookies_are_resolved_when_it_is_created_or_opened(tmp_path, zookeeper,
                                                                     closing):
    address = zkutil.formatted_cluster(zookeeper)
    nodes = Nodes(tmp_path, address, closing)
    for i in range(4):
        nodes.start(f"b{i}")
    writer = closing.enter_context(connect(address, FAST, zk_settings=zkutil.settings()))
    lh = writer.create_ledger(3, 2, 2, password=PASSWORD)
    ensemble = lh.metadata.fragments[0].ensemble
    # Before any add: the first adds need no lookup on the sending thread.
    assert all(isinstance(writer.bookie_client(b), ZmqBookieClient) for b in ensemble)
    for i in range(10):
        lh.add_entry(b"entry %d" % i)
    lh.close()
    reader = closing.enter_context(connect(address, FAST, zk_settings=zkutil.settings()))
    handle = reader.open_ledger(lh.id, password=PASSWORD, recovery=False)
    assert all(isinstance(reader.bookie_client(b), ZmqBookieClient) for b in ensemble)
    assert [e.data for e in handle.read_entries(0, 9)] == [b"entry %d" % i for i in range(10)]


class LookupWatch:
    """Wraps a store's ``bookie_endpoint``: which threads read it, and how many reads
    are in progress."""

    def __init__(self, store, monkeypatch) -> None:
        self.threads: list[str] = []
        self.running = 0
        read = store.bookie_endpoint

        def watched(bookie_id: str) -> str:
            self.threads.append(threading.current_thread().name)
            self.running += 1
            try:
                return read(bookie_id)
            finally:
                self.running -= 1
        monkeypatch.setattr(store, "bookie_endpoint", watched)


def test_lookups_never_stall_the_client_loop_while_zookeeper_is_down_and_a_moved_bookie_is_found(
        tmp_path, own_zookeeper, closing, monkeypatch):
    address = zkutil.formatted_cluster(own_zookeeper)
    nodes = Nodes(tmp_path, address, closing)
    # Sessions that outlive the outage: b2 keeps taking adds while ZooKeeper is down.
    b1 = nodes.start("b1", zkTimeout=30_000)
    nodes.start("b2", zkTimeout=30_000)
    # Lookups wait this long for the absent ZooKeeper: the test sees them in progress.
    operation_timeout_ms = 10_000
    bk = closing.enter_context(connect(address, FAST, zk_settings=zkutil.settings(
        zkOperationTimeoutMs=operation_timeout_ms)))
    bk.resolve_bookies(["b1", "b2"])
    old_b1 = bk.bookie_client("b1")
    assert old_b1.add(1, 0, entry(1, 0), KEY).result(timeout=WAIT_S) is None
    old_endpoint = b1.endpoint
    b1.close()  # unregistered while ZooKeeper is up; the client's connection drops
    wait_until(lambda: old_b1.is_down, "the client seeing b1 go")
    own_zookeeper.shutdown(graceful=False)

    # On the ZeroMQ loop's thread, in an add's completion (as the log writer sends its
    # next batch): a refresh of a known bookie, a first lookup of an unknown one.
    seen: queue.Queue = queue.Queue()

    lookups = LookupWatch(bk.metadata, monkeypatch)

    def on_added(_future) -> None:
        known, unknown = bk.bookie_client("b1"), bk.bookie_client("b9")
        requests = (known.read(1, 0), unknown.read(1, 0))
        seen.put((threading.current_thread().name, requests))

    bk.bookie_client("b2").add(2, 0, entry(2, 0), KEY).add_done_callback(on_added)
    thread_name, (known_read, unknown_read) = seen.get(timeout=60)
    assert thread_name == "pybk-zmq-client"
    # the loop goes on serving the other bookies
    assert bk.bookie_client("b2").add(2, 1, entry(2, 1), KEY).result(timeout=60) is None
    wait_until(lambda: lookups.running, "a lookup waiting for ZooKeeper")
    assert "pybk-zmq-client" not in lookups.threads  # never looked up on the loop
    # Past REFRESH_WAIT_S, requests to the known bookie no longer wait for the lookup:
    # they go to its last client, which fails them while the lookup still waits.
    time.sleep(REFRESH_WAIT_S)
    with pytest.raises(BookieUnavailable):
        bk.bookie_client("b1").read(1, 0).result(timeout=60)
    assert lookups.running, "the request waited for the lookup"
    # Those that waited end with the lookups, bounded by zkOperationTimeoutMs.
    for request in (known_read, unknown_read):
        with pytest.raises(BookieUnavailable):
            request.result(timeout=3 * operation_timeout_ms / 1000 + 5)

    own_zookeeper.start()
    moved = nodes.start("b1", zkTimeout=30_000)  # same disks and id, another port
    assert moved.endpoint != old_endpoint
    wait_until(lambda: _endpoint_or_none(bk.metadata, "b1") == moved.endpoint,
             "the client's session seeing b1 again")
    time.sleep(directory_module.REFRESH_INTERVAL_S)  # the last lookup's interval passes
    # The next request starts a refresh and waits for it: it reaches the new address.
    assert bk.bookie_client("b1").read(1, 0).result(timeout=WAIT_S) == entry(1, 0)
    current = bk.bookie_client("b1")
    assert isinstance(current, ZmqBookieClient) and current.address == moved.endpoint


def _endpoint_or_none(store, bookie_id: str) -> str | None:
    try:
        return store.bookie_endpoint(bookie_id)
    except Exception:  # noqa: BLE001 - still reconnecting
        return None
