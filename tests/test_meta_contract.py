"""The metadata store contract (pybk.meta.interface), tested once for every store.

The ``stores`` fixture is parametrized over :data:`STORE_KINDS` (the embedded store, and
the ZooKeeper store on the session's real ZooKeeper server under a root of the test's
own): each kind opens sessions on one shared store, so "close and open again" is a
restart, and it tells a crash child how to open the store.
"""

from __future__ import annotations

import hashlib
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import lmdb
import pytest
import zkutil

from pybk.cluster.cookies import check_cluster_cookie
from pybk.errors import (
    BadVersion,
    BookieUnavailable,
    DirectoryLocked,
    InvalidCookie,
    MalformedMetadata,
    MetadataError,
    NodeExists,
    NoNode,
)
from pybk.meta import ANY_VERSION, MAX_DATA_BYTES, EmbeddedMetadataStore, MetadataStore, paths
from pybk.meta.cookies import Cookie
from pybk.meta.interface import MAX_BATCH_BYTES, MAX_BATCH_RECORDS, batches
from pybk.meta.zookeeper import ZooKeeperMetadataStore, format_cluster
from pybk.testing import WAIT_S, wait_until

pytestmark = pytest.mark.timeout(60)

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


# -- the stores ----------------------------------------------------------------------

class EmbeddedStores:
    """Sessions on one embedded store directory; :meth:`close_all` closes every one."""

    kind = "embedded"
    single_session = True  # a second session on the directory is refused while one is open
    format_records: list[str] = []  # what /ledgers holds before anything is written
    dead_session_end_s = 0.0  # a dead process's records are gone once the store opens

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.location = str(tmp_path / "meta")
        self._opened: list[MetadataStore] = []

    def _open(self) -> MetadataStore:
        return EmbeddedMetadataStore(self.location)

    def open(self) -> MetadataStore:
        store = self._open()
        self._opened.append(store)
        return store

    def close_all(self) -> None:
        for store in self._opened:
            store.close()


class ZooKeeperStores(EmbeddedStores):
    """Sessions on a freshly formatted root of the session's ZooKeeper server."""

    kind = "zookeeper"
    single_session = False
    format_records = ["INSTANCEID", "LAYOUT", "available", "cookies", "idgen"]
    # A killed process's session ends when ZooKeeper times it out (crash children use
    # SHORT_SESSION_TIMEOUT_MS), checked once per tick.
    dead_session_end_s = 3 * zkutil.SHORT_SESSION_TIMEOUT_MS / 1000

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        super().__init__(request, tmp_path)
        self.location = request.getfixturevalue("zookeeper").address(zkutil.fresh_root())
        format_cluster(self.location, settings=zkutil.settings())

    def _open(self) -> MetadataStore:
        return ZooKeeperMetadataStore(self.location, zkutil.settings())


STORE_KINDS = {kind.kind: kind for kind in (EmbeddedStores, ZooKeeperStores)}


def open_store(kind: str, location: str) -> MetadataStore:
    """How a crash child opens a store of ``kind`` (the same one the test uses)."""
    if kind == ZooKeeperStores.kind:
        return ZooKeeperMetadataStore(
            location, zkutil.settings(zkTimeout=zkutil.SHORT_SESSION_TIMEOUT_MS))
    assert kind == EmbeddedStores.kind, kind
    return EmbeddedMetadataStore(location)


@pytest.fixture(params=sorted(STORE_KINDS))
def stores(request, tmp_path):
    group = STORE_KINDS[request.param](request, tmp_path)
    yield group
    group.close_all()


@pytest.fixture
def store(stores) -> MetadataStore:
    return stores.open()


# -- helpers -------------------------------------------------------------------------

class Events:
    """A watch callback that queues the paths it is called with."""

    def __init__(self) -> None:
        self._queue: queue.Queue[str] = queue.Queue()
        self.threads: set[int] = set()

    def __call__(self, path: str) -> None:
        self.threads.add(threading.get_ident())
        self._queue.put(path)

    def next(self) -> str:
        try:
            return self._queue.get(timeout=WAIT_S)
        except queue.Empty:
            pytest.fail(f"no watch call within {WAIT_S} s")

    def expect(self, *paths_: str) -> None:
        assert [self.next() for _ in paths_] == list(paths_)

    def assert_quiet(self, seconds: float = 0.2) -> None:
        time.sleep(seconds)
        assert self._queue.empty(), f"unexpected watch call on {self._queue.get()}"


def run_threads(count: int, target, barrier: threading.Barrier | None = None) -> None:
    """Run ``target(i)`` on ``count`` threads; re-raise the first failure; never leak one."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            target(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            if barrier is not None:
                barrier.abort()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 40
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    if barrier is not None:
        barrier.abort()
    assert not any(t.is_alive() for t in threads), "a worker thread did not finish"
    if errors:
        raise errors[0]


# -- records and compare-and-set ---------------------------------------------------------

def test_versions_start_at_zero_and_count_sets(store):
    assert store.create("/r", b"v0") == 0
    assert store.get("/r") == (b"v0", 0)
    assert store.set("/r", b"v1", 0) == 1
    assert store.set("/r", b"", 1) == 2
    assert store.get("/r") == (b"", 2)
    store.delete("/r", 2)
    assert not store.exists("/r")
    assert store.create("/r", b"again") == 0  # a new record starts over


def test_create_on_a_taken_path_raises_node_exists(store):
    store.create("/r", b"first")
    with pytest.raises(NodeExists):
        store.create("/r", b"second")
    assert store.get("/r") == (b"first", 0)


def test_missing_records_raise_no_node(store):
    with pytest.raises(NoNode):
        store.get("/missing")
    with pytest.raises(NoNode):
        store.set("/missing", b"x", 0)
    with pytest.raises(NoNode):
        store.delete("/missing", ANY_VERSION)
    with pytest.raises(NoNode):
        store.children("/missing")
    assert not store.exists("/missing")
    assert not store.exists("/missing")


def test_get_latest_sees_what_another_session_wrote(stores):
    """A check that must not act on an old answer (a bookie's, of a ledger a recoverer
    closed: pybk/cluster/admission.py) reads as ``get`` does, and sees every write
    another session completed (ZooKeeper: after a sync)."""
    reader = stores.open()
    # The embedded store is opened once per directory: its one session writes too.
    writer = stores.open() if stores.kind == ZooKeeperStores.kind else reader
    writer.create("/r", b"v0")
    writer.set("/r", b"v1", 0)
    assert reader.get_latest("/r") == (b"v1", 1)
    writer.delete("/r", 1)
    with pytest.raises(NoNode):
        reader.get_latest("/r")


def test_stale_set_and_delete_raise_bad_version_and_change_nothing(store):
    store.create("/r", b"v0")
    store.set("/r", b"v1", 0)
    with pytest.raises(BadVersion):
        store.set("/r", b"stale", 0)
    with pytest.raises(BadVersion):
        store.set("/r", b"future", 5)
    with pytest.raises(BadVersion):
        store.delete("/r", 0)
    assert store.get("/r") == (b"v1", 1)


def test_set_and_delete_sets_one_record_and_deletes_another_in_one_step(store):
    """Both, or neither: a stale version or a delete refused (children) changes nothing;
    a record to delete that is not there (any more) leaves the set alone."""
    store.create("/head", b"v0")
    store.create("/runs/h", b"hollow")
    store.create("/runs/p/child", b"")
    with pytest.raises(BadVersion):
        store.set_and_delete("/head", b"stale", 5, "/runs/h")
    with pytest.raises(MetadataError, match="children"):
        store.set_and_delete("/head", b"refused", 0, "/runs/p")
    with pytest.raises(NoNode):
        store.set_and_delete("/missing", b"x", ANY_VERSION, "/runs/h")
    assert store.get("/head") == (b"v0", 0) and store.exists("/runs/h")
    assert store.set_and_delete("/head", b"v1", 0, "/runs/h") == 1
    assert store.get("/head") == (b"v1", 1) and not store.exists("/runs/h")
    assert store.set_and_delete("/head", b"v2", 1, "/runs/h") == 2  # nothing to delete
    assert store.get("/head") == (b"v2", 2)
    assert store.children("/runs") == ["p"]


def test_any_version_skips_the_check(store):
    store.create("/r", b"v0")
    store.set("/r", b"v1", 0)
    assert store.set("/r", b"v2", ANY_VERSION) == 2
    store.delete("/r", ANY_VERSION)
    assert not store.exists("/r")


def test_create_makes_ancestors_and_children_lists_names(store):
    store.create("/a/b/c", b"leaf")
    assert store.get("/a") == (b"", 0)
    assert store.get("/a/b") == (b"", 0)
    for name in ("z", "m", "b2"):
        store.create(f"/a/{name}", name.encode())
    assert store.children("/a") == ["b", "b2", "m", "z"]
    assert store.children("/a/b") == ["c"]
    assert store.children("/a/b/c") == []
    assert "a" in store.children("/")
    assert store.exists("/") and store.exists("/a/b/c")
    assert not store.exists("/a/b/c/d")
    # a sibling whose name extends another's is not its child
    store.create("/ab", b"")
    assert store.children("/a") == ["b", "b2", "m", "z"]


def test_delete_refuses_a_record_with_children(store):
    store.create("/a/b", b"")
    with pytest.raises(MetadataError, match="children"):
        store.delete("/a", ANY_VERSION)
    store.delete("/a/b", 0)
    store.delete("/a", 0)
    assert not store.exists("/a")


@pytest.mark.parametrize("path", ["", "a", "a/b", "/a/", "//a", "/a//b", "/a/./b",
                                  "/a/../b", "/a\0b", "/\ud800", "/" + "x" * 600, b"/a"])
def test_invalid_paths_are_refused(store, path):
    with pytest.raises(MetadataError):
        store.create(path, b"")
    with pytest.raises(MetadataError):
        store.get(path)


def test_the_root_is_not_a_record(store):
    for call in (lambda: store.create("/", b""), lambda: store.get("/"),
                 lambda: store.set("/", b"", 0), lambda: store.delete("/", 0)):
        with pytest.raises(MetadataError, match="root"):
            call()


def test_invalid_data_and_versions_are_refused(store):
    store.create("/r", b"")
    with pytest.raises(MetadataError):
        store.create("/big", b"x" * (MAX_DATA_BYTES + 1))
    with pytest.raises(MetadataError):
        store.set("/r", "text", 0)
    for version in (-2, 1.0, True, "0"):
        with pytest.raises(MetadataError):
            store.set("/r", b"x", version)
    assert store.create("/limit", bytearray(MAX_DATA_BYTES)) == 0
    assert store.get("/limit") == (bytes(MAX_DATA_BYTES), 0)
    assert store.get("/r") == (b"", 0)


def test_create_many_creates_every_record_and_its_ancestors_in_one_step(store):
    events = Events()
    store.watch("/b", events)
    store.create("/c", b"there")
    store.create_many([("/b/1", b"one"), ("/b/2", b"two"), ("/c/d/3", b"three")])
    assert [store.get(p) for p in ("/b/1", "/b/2", "/c/d/3")] == [
        (b"one", 0), (b"two", 0), (b"three", 0)]
    assert store.get("/b") == (b"", 0) and store.get("/c/d") == (b"", 0)
    assert store.get("/c") == (b"there", 0)
    events.expect("/b")  # one step: one call for /b made and given children at once
    events.assert_quiet()
    store.create_many([])  # nothing to do


def test_a_batch_meeting_a_taken_path_creates_none_of_its_records(store):
    store.create("/b/2", b"first")
    with pytest.raises(NodeExists, match="/b/2"):
        store.create_many([("/b/1", b""), ("/b/2", b"second"), ("/b/3", b""),
                           ("/new/4", b"")])
    assert store.children("/b") == ["2"] and store.get("/b/2") == (b"first", 0)
    assert not store.exists("/new")
    with pytest.raises(NodeExists, match="/b/5"):  # a path given twice
        store.create_many([("/b/5", b""), ("/b/6", b""), ("/b/5", b"")])
    assert store.children("/b") == ["2"]


def test_a_batch_refused_as_invalid_creates_nothing(store):
    store.create("/e", b"", ephemeral=True)
    for batch in ([("/f/1", b""), ("/e/x", b"")],           # under an ephemeral record
                  [("/f/1", b""), ("/f/x/y", b""), ("/f/x", b"")],  # child before parent
                  [("/f/1", b""), ("/f/2", "text")],          # not bytes
                  [("/f/1", b""), ("f/2", b"")],              # not a path
                  [(f"/f/{i}", b"") for i in range(MAX_BATCH_RECORDS + 1)],
                  [("/f/1", bytes(MAX_BATCH_BYTES // 2)), ("/f/2", bytes(MAX_BATCH_BYTES // 2))]):
        with pytest.raises(MetadataError):
            store.create_many(batch)
        assert not store.exists("/f")


def test_batches_cut_a_long_list_into_batches_the_store_takes(store):
    records = [(f"/g/{i:05d}", b"%d" % i) for i in range(MAX_BATCH_RECORDS + 10)]
    records += [("/g/big1", bytes(MAX_DATA_BYTES)), ("/g/big2", b"x")]
    cut = list(batches(records))
    assert [r for batch in cut for r in batch] == records
    assert [len(batch) for batch in cut] == [MAX_BATCH_RECORDS, 10, 1, 1]
    for batch in cut:
        store.create_many(batch)
    assert len(store.children("/g")) == len(records)
    assert store.get(f"/g/{MAX_BATCH_RECORDS + 9:05d}") == (b"%d" % (MAX_BATCH_RECORDS + 9), 0)


def test_records_versions_and_ids_survive_a_restart(stores):
    store = stores.open()
    store.create("/ledgers/L0000000001", b"one")
    store.set("/ledgers/L0000000001", b"uno", 0)
    store.create("/persistent", bytes(range(256)))
    ids = [store.next_ledger_id() for _ in range(3)]
    store.close()
    store = stores.open()
    assert store.get("/ledgers/L0000000001") == (b"uno", 1)
    assert store.get("/persistent") == (bytes(range(256)), 0)
    assert store.children("/ledgers") == sorted(stores.format_records + ["L0000000001"])
    assert store.next_ledger_id() > max(ids)


# -- ledger ids ------------------------------------------------------------------------------

def test_ledger_ids_are_unique_and_increasing_across_threads_and_restarts(stores):
    store = stores.open()
    first = [store.next_ledger_id() for _ in range(5)]
    assert first == sorted(first) and len(set(first)) == 5
    taken: list[list[int]] = [[] for _ in range(4)]
    run_threads(4, lambda i: taken[i].extend(store.next_ledger_id() for _ in range(50)))
    for ids in taken:
        assert ids == sorted(ids)
    every = first + [i for ids in taken for i in ids]
    assert len(set(every)) == len(every)
    store.close()
    assert stores.open().next_ledger_id() > max(every)


# -- ephemeral records and the bookie registry -------------------------------------------------

def test_ephemeral_records_end_with_their_session(stores):
    store = stores.open()
    store.create("/eph/session", b"mine", ephemeral=True)
    store.create("/eph/kept", b"persistent")
    with pytest.raises(MetadataError, match="ephemeral"):
        store.create("/eph/session/child", b"")
    assert store.get("/eph/session") == (b"mine", 0)
    store.close()
    store = stores.open()
    assert store.children("/eph") == ["kept"]


def test_sequential_records_are_numbered_in_creation_order(stores):
    store = stores.open()
    first = store.create_sequential("/seq/vote_", b"a")
    assert first.startswith("/seq/vote_") and len(first) == len("/seq/vote_") + 10
    made = [first] + [store.create_sequential("/seq/vote_", b"%d" % i) for i in range(3)]
    numbers = [int(path[-10:]) for path in made]
    assert numbers == sorted(set(numbers)), made  # increasing, never twice
    assert store.get(made[1]) == (b"0", 0)
    bare = store.create_sequential("/seq/", b"")  # a name of digits only
    assert paths.split(bare)[1].isdigit() and int(bare[-10:]) > numbers[-1]
    ephemeral = store.create_sequential("/seq/e_", b"mine", ephemeral=True)
    with pytest.raises(MetadataError, match="ephemeral"):
        store.create_sequential(ephemeral + "/child_", b"")
    for bad in ("seq/x_", "/seq//x_", "/seq/x\0_", 7):
        with pytest.raises(MetadataError):
            store.create_sequential(bad, b"")
    store.close()
    store = stores.open()  # the ephemeral one ended with its session
    assert sorted(store.children("/seq")) == sorted(paths.split(p)[1]
                                                    for p in made + [bare])
    later = store.create_sequential("/seq/vote_", b"")
    assert int(later[-10:]) > int(bare[-10:])


def test_bookie_registry(store):
    assert store.bookies() == []
    store.register_bookie("b1:3181")
    store.register_bookie("b2:3181")
    store.register_bookie("b3:3181", read_only=True)
    assert store.bookies() == ["b1:3181", "b2:3181", "b3:3181"]
    assert store.bookies(read_only=False) == ["b1:3181", "b2:3181"]
    assert store.bookies(read_only=True) == ["b3:3181"]
    store.register_bookie("b1:3181", read_only=True)  # b1's disks filled up
    store.register_bookie("b3:3181")                  # b3 has room again
    store.register_bookie("b3:3181")                  # registering twice is harmless
    assert store.bookies(read_only=False) == ["b2:3181", "b3:3181"]
    assert store.bookies(read_only=True) == ["b1:3181"]
    store.unregister_bookie("b2:3181")
    store.unregister_bookie("b2:3181")
    store.unregister_bookie("never-registered")
    assert store.bookies() == ["b1:3181", "b3:3181"]
    for bad in ("", "a/b", "readonly", ".."):
        with pytest.raises(MetadataError):
            store.register_bookie(bad)


def test_a_registration_holds_the_bookie_endpoint(store):
    store.register_bookie("b1", endpoint="tcp://10.0.0.5:3181")
    store.register_bookie("b2")                        # a bookie of this process
    assert store.bookie_endpoint("b1") == "tcp://10.0.0.5:3181"
    assert store.bookie_endpoint("b2") == ""
    store.register_bookie("b1", read_only=True, endpoint="tcp://10.0.0.5:3181")
    assert store.bookie_endpoint("b1") == "tcp://10.0.0.5:3181"
    store.register_bookie("b1", read_only=True, endpoint="tcp://10.0.0.6:3181")  # moved
    assert store.bookie_endpoint("b1") == "tcp://10.0.0.6:3181"
    store.unregister_bookie("b1")
    with pytest.raises(BookieUnavailable, match="b1 is not registered"):
        store.bookie_endpoint("b1")
    with pytest.raises(BookieUnavailable, match="never-registered"):
        store.bookie_endpoint("never-registered")


def test_a_registration_names_the_bookie_host(store):
    store.register_bookie("b1", endpoint="tcp://10.0.0.5:3181", host="worker-1")
    store.register_bookie("b2", endpoint="tcp://10.0.0.5:3182", host="worker-1")
    store.register_bookie("b3", endpoint="tcp://10.0.0.6:3181", host="worker-2")
    store.register_bookie("b4")                        # no host: on none
    assert store.bookies_on_host("worker-1") == ["b1", "b2"]
    assert store.bookies_on_host("worker-2") == ["b3"]
    assert store.bookies_on_host("worker-3") == []
    store.register_bookie("b2", read_only=True, endpoint="tcp://10.0.0.5:3182",
                          host="worker-1")             # read-only: still on its host
    assert store.bookies_on_host("worker-1") == ["b1", "b2"]
    store.unregister_bookie("b1", "worker-1")
    assert store.bookies_on_host("worker-1") == ["b2"]
    with pytest.raises(MetadataError):
        store.register_bookie("b5", host="a/b")


def test_a_registration_carries_the_bookie_location(store):
    store.register_bookie("b1", endpoint="tcp://10.0.0.5:3181", location="/east/rack-1")
    store.register_bookie("b2", endpoint="tcp://10.0.0.6:3181")  # none: an older bookie
    assert store.bookie_location("b1") == "/east/rack-1"
    assert store.bookie_endpoint("b1") == "tcp://10.0.0.5:3181"  # older readers: unchanged
    assert store.bookie_location("b2") is None
    assert store.bookie_location("never-registered") is None
    store.register_bookie("b1", read_only=True, endpoint="tcp://10.0.0.5:3181",
                          location="/east/rack-2")  # registered again: moved
    assert store.bookie_location("b1") == "/east/rack-2"
    store.unregister_bookie("b1")
    assert store.bookie_location("b1") is None


def test_registrations_end_with_the_session(stores):
    store = stores.open()
    store.register_bookie("b1:3181", host="worker-1", location="/r/a")
    store.register_bookie("b2:3181", read_only=True)
    store.create("/ledgers/L0000000000", b"metadata stays")
    store.close()
    store = stores.open()
    assert store.bookies() == []
    assert store.bookies_on_host("worker-1") == []
    assert store.bookie_location("b1:3181") is None
    assert store.get("/ledgers/L0000000000") == (b"metadata stays", 0)


# -- cookies ------------------------------------------------------------------------------

def cookie(bookie_id: str = "b1:3181", instance_id: str = "i1") -> Cookie:
    return Cookie(bookie_id, instance_id, "/disk1/journal", ("/disk2/ledgers",))


def test_cookies_are_kept_under_compare_and_set_and_survive_a_restart(stores):
    store = stores.open()
    assert store.read_cookie("b1:3181") is None
    assert store.write_cookie(cookie()) == 0  # create-if-absent
    assert store.read_cookie("b1:3181") == (cookie(), 0)
    assert store.get("/ledgers/cookies/b1:3181") == (cookie().to_bytes(), 0)
    with pytest.raises(NodeExists):
        store.write_cookie(cookie(instance_id="i2"))
    moved = Cookie("b1:3181", "i1", "/disk3/journal", ("/disk2/ledgers", "/disk4/ledgers"))
    assert store.write_cookie(moved, 0) == 1
    with pytest.raises(BadVersion):
        store.write_cookie(cookie(), 0)
    with pytest.raises(NoNode):
        store.write_cookie(cookie("b2:3181"), 0)
    assert store.write_cookie(cookie("b2:3181", "i9")) == 0  # another id: its own record
    store.close()
    store = stores.open()  # cookies are persistent, not tied to the session
    assert store.read_cookie("b1:3181") == (moved, 1)
    assert store.read_cookie("b2:3181") == (cookie("b2:3181", "i9"), 0)
    with pytest.raises(BadVersion):
        store.remove_cookie("b1:3181", 0)
    store.remove_cookie("b1:3181", 1)
    assert store.read_cookie("b1:3181") is None
    with pytest.raises(NoNode):
        store.remove_cookie("b1:3181", ANY_VERSION)
    store.remove_cookie("b2:3181", ANY_VERSION)
    assert store.children("/ledgers/cookies") == []


def test_a_record_that_is_not_the_bookies_cookie_is_refused(store):
    store.create("/ledgers/cookies/b1", b"garbage")
    with pytest.raises(MalformedMetadata, match="bookie cookie"):
        store.read_cookie("b1")
    store.create("/ledgers/cookies/b2", cookie("b3").to_bytes())
    with pytest.raises(MalformedMetadata, match="cookie of bookie b3, not b2"):
        store.read_cookie("b2")
    for bad in ("", "a/b", ".."):
        with pytest.raises(MetadataError):
            store.read_cookie(bad)


def test_the_start_up_check_writes_a_new_cookie_and_refuses_another(store):
    assert check_cluster_cookie(store, cookie()) is True  # the first start writes it
    assert check_cluster_cookie(store, cookie()) is False  # a restart finds it
    with pytest.raises(InvalidCookie, match=r"bookie b1:3181 refuses to start.*instance id "
                                            r"i1 in the cluster, i2 on disk.*formatted again"):
        check_cluster_cookie(store, cookie(instance_id="i2"))
    other_dirs = Cookie("b1:3181", "i1", "/disk9/journal", ("/disk2/ledgers",))
    with pytest.raises(InvalidCookie, match=r"journal directory /disk1/journal in the "
                                            r"cluster, /disk9/journal on disk"):
        check_cluster_cookie(store, other_dirs)
    assert check_cluster_cookie(store, cookie("b2:3181", "i2")) is True  # ids coexist
    assert store.read_cookie("b1:3181") == (cookie(), 0)  # refusals change nothing


def test_of_bookies_racing_for_one_id_exactly_one_wins(stores):
    count = 6
    sessions = [stores.open()] if stores.single_session else \
        [stores.open() for _ in range(count)]
    barrier = threading.Barrier(count)
    outcomes: dict[int, object] = {}

    def start(i: int) -> None:
        barrier.wait(WAIT_S)
        try:
            outcomes[i] = check_cluster_cookie(sessions[i % len(sessions)],
                                               cookie("b1", f"instance-{i}"))
        except InvalidCookie as e:
            outcomes[i] = e

    run_threads(count, start, barrier)
    winners = [i for i, outcome in outcomes.items() if outcome is True]
    assert len(winners) == 1, outcomes
    assert all(isinstance(outcomes[i], InvalidCookie) for i in outcomes if i not in winners)
    assert sessions[0].read_cookie("b1")[0].instance_id == f"instance-{winners[0]}"


def test_registry_changes_fire_watches(store):
    available, read_only = Events(), Events()
    store.watch(paths.AVAILABLE, available)
    store.watch(paths.READONLY, read_only)
    store.register_bookie("b1:3181")
    available.next()
    store.register_bookie("b1:3181", read_only=True)
    read_only.next()
    assert store.bookies(read_only=True) == ["b1:3181"]
    store.unregister_bookie("b1:3181")
    read_only.next()


# -- watches ---------------------------------------------------------------------------------------

def test_watch_fires_on_create_set_delete_and_children(store):
    record, parent = Events(), Events()
    store.create("/w", b"")
    store.watch("/w/x", record)  # need not exist yet
    store.watch("/w", parent)
    store.create("/w/x", b"0")
    record.expect("/w/x")
    parent.expect("/w")
    store.set("/w/x", b"1", 0)
    record.expect("/w/x")
    store.delete("/w/x", 1)
    record.expect("/w/x")
    parent.expect("/w")
    store.set("/w", b"parent data", 0)
    parent.expect("/w")
    record.assert_quiet()
    parent.assert_quiet()


def test_a_create_that_makes_ancestors_calls_each_watch_once(store):
    made, grown = Events(), Events()
    store.create("/m", b"")
    store.watch("/m/a", made)  # made by the create below, and given a child by it
    store.watch("/m", grown)   # given a child
    store.create("/m/a/b/c", b"")
    made.expect("/m/a")
    grown.expect("/m")
    made.assert_quiet()
    grown.assert_quiet()


def test_watch_is_persistent_until_cancelled(store):
    events = Events()
    store.create("/w", b"")
    watch = store.watch("/w", events)
    for version in range(5):
        store.set("/w", b"%d" % version, version)
    events.expect(*["/w"] * 5)
    watch.cancel()
    watch.cancel()
    assert not watch.active
    store.set("/w", b"after", 5)
    events.assert_quiet()


def test_watch_callbacks_run_on_one_thread_in_commit_order(store):
    events = Events()
    names = [f"/o{i}" for i in range(4)]
    for name in names:
        store.watch(name, events)
    expected = []
    for step in range(40):
        name = names[(step * 3) % len(names)]
        if store.exists(name):
            store.set(name, b"%d" % step, ANY_VERSION)
        else:
            store.create(name, b"%d" % step)
        expected.append(name)
    events.expect(*expected)
    assert len(events.threads) == 1
    assert threading.get_ident() not in events.threads


def test_watch_callbacks_may_use_the_store_and_a_failing_one_harms_nothing(store):
    later = Events()

    def failing(_path: str) -> None:
        raise RuntimeError("a broken callback")

    def writing(_path: str) -> None:  # would deadlock if callbacks ran under a store lock
        if not store.exists("/echo"):
            store.create("/echo", store.get("/trigger")[0])

    store.watch("/trigger", failing)
    store.watch("/trigger", writing)
    store.watch("/echo", later)
    store.create("/trigger", b"ping")
    later.expect("/echo")
    assert store.get("/echo") == (b"ping", 0)


# -- concurrency -----------------------------------------------------------------------------------

def test_concurrent_compare_and_set_exactly_one_wins_per_version(store):
    threads, rounds = 6, 25
    store.create("/race", b"start")
    barrier = threading.Barrier(threads)
    winners: list[list[int]] = [[] for _ in range(rounds)]

    def contend(i: int) -> None:
        for r in range(rounds):
            barrier.wait(WAIT_S)
            _data, version = store.get("/race")
            assert version == r
            barrier.wait(WAIT_S)  # everyone read version r; now all try to move it on
            try:
                assert store.set("/race", b"%d won %d" % (i, r), version) == r + 1
                winners[r].append(i)
            except BadVersion:
                pass
            barrier.wait(WAIT_S)

    run_threads(threads, contend, barrier)
    assert all(len(w) == 1 for w in winners), winners
    assert store.get("/race") == (b"%d won %d" % (winners[-1][0], rounds - 1), rounds)


def test_concurrent_read_modify_write_loses_no_update(store):
    threads, increments = 4, 40
    store.create("/counter", b"0")

    def increment(_i: int) -> None:
        done = 0
        while done < increments:
            data, version = store.get("/counter")
            try:
                store.set("/counter", b"%d" % (int(data) + 1), version)
                done += 1
            except BadVersion:
                continue

    run_threads(threads, increment)
    total = threads * increments
    assert store.get("/counter") == (b"%d" % total, total)


# -- life cycle ------------------------------------------------------------------------------------

def test_a_closed_store_refuses_every_call(stores):
    with stores.open() as store:
        store.create("/r", b"")
    store.close()  # twice is harmless
    for call in (lambda: store.get("/r"), lambda: store.create("/s", b""),
                 lambda: store.set("/r", b"", 0), lambda: store.delete("/r", 0),
                 lambda: store.children("/"), lambda: store.exists("/r"),
                 store.next_ledger_id, lambda: store.watch("/r", print),
                 lambda: store.register_bookie("b1"), store.bookies,
                 lambda: store.read_cookie("b1"), lambda: store.write_cookie(cookie()),
                 lambda: store.create_sequential("/q_", b""),
                 lambda: store.create_many([("/m", b"")])):
        with pytest.raises(MetadataError, match="closed"):
            call()


def test_close_stops_watches(stores):
    store = stores.open()
    events = Events()
    watch = store.watch("/w", events)
    store.create("/w", b"")
    events.expect("/w")
    store.close()
    assert not watch.active
    assert not any(t.name.startswith("pybk-meta-watch") and t.is_alive()
                   for t in threading.enumerate())


# -- crashes ---------------------------------------------------------------------------------------

CRASH_PATH = "/crash/record"
CRASH_ROUNDS = 6

CHILD = f"""
import os, sys
sys.path.insert(0, {TESTS!r})
from test_meta_contract import CRASH_PATH, open_store, payload
from pybk.errors import NodeExists

store = open_store(sys.argv[1], sys.argv[2])  # never closed: the child ends by SIGKILL
acks = os.open(sys.argv[3], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
store.register_bookie("crash-child:3181")
try:
    store.create(CRASH_PATH, payload(0))
except NodeExists:
    pass
while True:
    data, version = store.get(CRASH_PATH)
    assert data == payload(version), version
    assert store.set(CRASH_PATH, payload(version + 1), version) == version + 1
    os.write(acks, b"%d %d\\n" % (version + 1, store.next_ledger_id()))
"""


def payload(version: int) -> bytes:
    """About 4 KiB derived from the version alone: a torn or mixed record cannot pass."""
    return b"%d:" % version + hashlib.sha256(b"%d" % version).digest() * 128


def read_acks(path: Path) -> list[tuple[int, int]]:
    """(version, ledger id) of every finished line the child wrote."""
    try:
        lines = path.read_bytes().split(b"\n")[:-1]
    except FileNotFoundError:
        return []
    return [tuple(map(int, line.split())) for line in lines]


@pytest.fixture
def children():
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=WAIT_S)


def start_crash_child(script_and_args: list[str], stderr_path: Path,
                      children: list[subprocess.Popen], acks: Callable[[], int],
                      progress: int) -> subprocess.Popen:
    """Start ``python -c script args...`` (its stderr kept in ``stderr_path``, the process
    in ``children`` for cleanup) and return it once ``acks()`` grew by ``progress``:
    bounded, and failing with the child's stderr if it dies first."""
    before = acks()
    with open(stderr_path, "wb") as stderr:
        child = subprocess.Popen([sys.executable, "-c", *script_and_args],
                                 env=dict(os.environ, PYTHONPATH=ROOT),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=stderr)
    children.append(child)
    deadline = time.monotonic() + WAIT_S * 3
    while acks() < before + progress:
        assert child.poll() is None, stderr_path.read_text()
        assert time.monotonic() < deadline, "the child made no progress"
        time.sleep(0.01)
    return child


def test_kill_minus_nine_during_compare_and_set_leaves_a_consistent_record(stores, tmp_path,
                                                                           children):
    """A child sets a 4 KiB record in a CAS loop (and takes a ledger id per step) and is
    SIGKILLed at random moments: every reopen finds the record whole at the last
    acknowledged version or the one after, ids never repeat, and the dead session's
    bookie registration is gone."""
    acks_path = tmp_path / "acks"
    rng = random.Random(20240611)
    for round_no in range(CRASH_ROUNDS):
        child = start_crash_child([CHILD, stores.kind, stores.location, str(acks_path)],
                                  tmp_path / f"child-{round_no}.stderr", children,
                                  lambda: len(read_acks(acks_path)), 20)
        if stores.single_session:
            with pytest.raises(DirectoryLocked, match="locked"):
                stores.open()
        time.sleep(rng.uniform(0.0, 0.1))
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=WAIT_S) == -signal.SIGKILL
        acks = read_acks(acks_path)
        last_version = acks[-1][0]
        store = stores.open()
        try:
            data, version = store.get(CRASH_PATH)
            assert last_version <= version <= last_version + 1
            assert data == payload(version)
            assert store.next_ledger_id() > max(ledger_id for _v, ledger_id in acks)
            wait_until(lambda store=store: store.bookies() == [],
                       "the dead session's bookie is gone", stores.dead_session_end_s)
        finally:
            store.close()
    versions = [v for v, _id in read_acks(acks_path)]
    assert versions == sorted(set(versions))  # no version was acknowledged twice


BATCH_RECORDS = 500
BATCH_CHILD = f"""
import os, sys
sys.path.insert(0, {TESTS!r})
from test_meta_contract import BATCH_RECORDS, open_store

store = open_store(sys.argv[1], sys.argv[2])  # never closed: the child ends by SIGKILL
acks = os.open(sys.argv[3], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
batch = int(sys.argv[4])
while True:
    store.create_many([("/batches/%06d/%03d" % (batch, i), b"%d %d" % (batch, i))
                       for i in range(BATCH_RECORDS)])
    os.write(acks, b"%d\\n" % batch)
    batch += 1
"""


def test_kill_minus_nine_during_batches_leaves_each_batch_whole_or_absent(stores, tmp_path,
                                                                         children):
    """A child creates batches of 500 records, one after another, and is SIGKILLed at
    random moments: every acknowledged batch is there whole, and of the one in flight
    all records or none."""
    acks_path = tmp_path / "acks"
    rng = random.Random(20251126)
    next_batch = 0
    for round_no in range(3):
        child = start_crash_child([BATCH_CHILD, stores.kind, stores.location, str(acks_path),
                                   str(next_batch)], tmp_path / f"child-{round_no}.stderr",
                                  children, lambda: len(read_batch_acks(acks_path)), 2)
        time.sleep(rng.uniform(0.0, 0.2))
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=WAIT_S) == -signal.SIGKILL
        acked = read_batch_acks(acks_path)
        store = stores.open()
        try:
            found = store.children("/batches")
            whole = [f"{i:03d}" for i in range(BATCH_RECORDS)]
            for name in found:
                assert store.children(f"/batches/{name}") == whole, name
            numbers = [int(name) for name in found]
            assert numbers[:len(acked)] == acked  # every acknowledged batch is there
            assert numbers[len(acked):] in ([], [acked[-1] + 1])  # and the one in flight
            next_batch = numbers[-1] + 1
            store.create_many([("/batches/ack", b"")])  # the store takes batches again
            store.delete("/batches/ack", 0)
        finally:
            store.close()
        with open(acks_path, "ab") as acks:  # what the round left counts as acknowledged
            acks.write(b"".join(b"%d\n" % n for n in numbers[len(acked):]))


def read_batch_acks(path: Path) -> list[int]:
    """The numbers of the batches the child acknowledged, in order."""
    try:
        return [int(line) for line in path.read_bytes().split(b"\n")[:-1]]
    except FileNotFoundError:
        return []


# -- embedded store specifics ----------------------------------------------------------------------

def test_embedded_refuses_a_second_store_on_its_directory(tmp_path):
    with EmbeddedMetadataStore(tmp_path / "meta"):
        with pytest.raises(DirectoryLocked, match="locked"):
            EmbeddedMetadataStore(tmp_path / "meta")
    with EmbeddedMetadataStore(tmp_path / "meta") as store:  # free again once closed
        store.create("/r", b"")


def test_embedded_refuses_an_unknown_format(tmp_path):
    EmbeddedMetadataStore(tmp_path / "meta").close()
    env = lmdb.open(str(tmp_path / "meta"), max_dbs=3)
    with env.begin(write=True) as txn:
        txn.put(b"format", b"\x00\x63", db=env.open_db(b"meta", txn=txn))
    env.close()
    with pytest.raises(MetadataError, match="format 0063"):
        EmbeddedMetadataStore(tmp_path / "meta")
    # the failed open released the directory
    with pytest.raises(MetadataError, match="format"):
        EmbeddedMetadataStore(tmp_path / "meta")
