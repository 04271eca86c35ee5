"""Ledger listings that page (issue: listing must not load every ledger id at once).

On the embedded store and on a real ZooKeeper (hierarchical and flat layouts), with a
small page size instead of 100,000 ledgers: every ledger is listed once, in the
documented order, a page at a time (the embedded store reads later pages later;
ZooKeeper one parent at a time); ``BookKeeper.iter_ledgers`` and its asyncio twin;
``pybk listledgers`` prints its first lines while it is still reading the cluster.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys

import pytest
import zkutil
from clusterutil import child_env, failed, ok

from pybk.aio.client import AsyncBookKeeper
from pybk.errors import ClientClosed, MetadataError, NoNode
from pybk.meta import EmbeddedMetadataStore, LedgerManager
from pybk.meta.interface import MetadataStore, batches
from pybk.meta.layout import FLAT, HIERARCHICAL, LedgerLayout
from pybk.meta.zookeeper import ZooKeeperMetadataStore, format_cluster
from pybk.testing import WAIT_S
from pybk.testing.ledger_records import put_ledgers

pytestmark = pytest.mark.timeout(120)

LONG_FROM = 2 ** 31 - 1  # the hierarchical layout's long form starts here
PAGE = 4
#: Bytes the test's end of a CLI's pipe holds: the CLI blocks once it is this far ahead.
PIPE_BYTES = 4096


def zookeeper_store(zookeeper, layout: LedgerLayout) -> ZooKeeperMetadataStore:
    address = zookeeper.address(zkutil.fresh_root())
    format_cluster(address, layout=layout.name, settings=zkutil.settings())
    return ZooKeeperMetadataStore(address, zkutil.settings())


@pytest.fixture(params=["embedded-flat", "embedded-hierarchical", "zookeeper-flat",
                        "zookeeper-hierarchical"])
def store(request, tmp_path):
    kind, layout_name = request.param.split("-")
    layout = HIERARCHICAL if layout_name == "hierarchical" else FLAT
    if kind == "zookeeper":
        opened: MetadataStore = zookeeper_store(request.getfixturevalue("zookeeper"), layout)
    else:
        opened = EmbeddedMetadataStore(tmp_path / "meta")
        opened.layout = layout
    with opened:
        yield opened


# -- the store's paged children -------------------------------------------------------------

def test_iter_children_lists_every_child_once_in_name_order(store):
    names = [f"c{i:03d}" for i in range(23)]
    store.create_many([(f"/p/{name}", b"") for name in reversed(names)])
    assert list(store.iter_children("/p", page_size=PAGE)) == names
    assert list(store.iter_children("/p", page_size=1)) == names
    assert list(store.iter_children("/p", page_size=100)) == names
    with pytest.raises(NoNode):
        next(store.iter_children("/missing", page_size=PAGE))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(MetadataError, match="page size"):
            next(store.iter_children("/p", page_size=bad))


def test_the_embedded_store_reads_each_page_when_the_listing_reaches_it(tmp_path):
    """Later pages are read later, each in its own transaction: a child deleted ahead of
    the listing is not listed, one created ahead of it is; none is listed twice."""
    with EmbeddedMetadataStore(tmp_path / "meta") as store:
        store.create_many([(f"/p/c{i:03d}", b"") for i in range(0, 20, 2)])
        listing = store.iter_children("/p", page_size=PAGE)
        first = [next(listing) for _ in range(PAGE)]
        assert first == ["c000", "c002", "c004", "c006"]
        store.delete("/p/c014", -1)  # ahead: gone before its page is read
        store.create("/p/c015", b"")  # ahead: there when its page is read
        store.create("/p/c001", b"")  # behind: the listing has passed it
        store.delete("/p/c006", -1)  # the last name listed: the next page starts after it
        assert first + list(listing) == [
            "c000", "c002", "c004", "c006", "c008", "c010", "c012", "c015", "c016", "c018"]


# -- ledger ids ------------------------------------------------------------------------------

def test_ledger_ids_page_through_every_ledger_in_order(store):
    """More ledgers than pages hold, several hierarchical parents (both id forms): each
    listed once, ascending, whatever the page size; other records are skipped."""
    ids = sorted({i * 7919 for i in range(30)} | {9999, 10_000, 10_001, 123_456_789}
                 | ({LONG_FROM, LONG_FROM + 1, 2 ** 40 + 7} if store.layout is HIERARCHICAL
                    else set()))
    put_ledgers(store, ids)
    store.create("/ledgers/available/b1:3181", b"")
    manager = LedgerManager(store)
    for page_size in (1, PAGE, 1000):
        assert list(manager.iter_ledger_ids(page_size)) == ids
    assert [v.metadata.ledger_id for v in manager.iter_ledgers(PAGE)] == ids
    assert manager.ledger_ids() == ids


def test_the_flat_layout_lists_in_name_order(tmp_path):
    """Ids of different digit counts come in their names' order, as documented."""
    with EmbeddedMetadataStore(tmp_path / "meta") as store:
        put_ledgers(store, [5, 9_999_999_999, 10 ** 10, 2 ** 60])
        assert list(LedgerManager(store).iter_ledger_ids(PAGE)) == [
            5, 10 ** 10, 2 ** 60, 9_999_999_999]


def test_iter_ledgers_leaves_out_a_ledger_deleted_after_its_id_was_listed(tmp_path):
    with EmbeddedMetadataStore(tmp_path / "meta") as store:
        put_ledgers(store, list(range(10)))
        manager = LedgerManager(store)
        listing = manager.iter_ledgers(PAGE)
        assert next(listing).metadata.ledger_id == 0
        manager.delete(2)  # its id is on the page read already
        assert [v.metadata.ledger_id for v in listing] == [1, 3, 4, 5, 6, 7, 8, 9]


def test_a_hierarchical_zookeeper_listing_reads_one_parent_at_a_time(zookeeper):
    """Ids are listed from the first parent before the next one is read: a ledger
    created in a parent the listing has not reached yet is listed, one created in a
    parent it read already is not."""
    with zookeeper_store(zookeeper, HIERARCHICAL) as store:
        put_ledgers(store, [1, 2, 3, 20_001])  # parents /00/0000 and /00/0002
        listing = LedgerManager(store).iter_ledger_ids()
        assert next(listing) == 1
        put_ledgers(store, [4, 20_005])
        assert list(listing) == [2, 3, 20_001, 20_005]


def test_a_flat_zookeeper_listing_over_a_mebibyte_is_read_whole(own_zookeeper):
    """ZooKeeper answers a getChildren over its 1 MiB jute.maxbuffer (ZooKeeper's Java
    client would refuse it; pybk's reads it), so a flat cluster of 80,000 ledgers lists
    them all.  The records are empty: only the names matter here."""
    count = 80_000  # names of 15 bytes each in the reply: about 1.2 MB
    with zookeeper_store(own_zookeeper, FLAT) as store:
        for batch in batches((FLAT.ledger_path(i), b"") for i in range(count)):
            store.create_many(batch)
        assert sum(1 for _ in LedgerManager(store).iter_ledger_ids()) == count


# -- the client ------------------------------------------------------------------------------

@pytest.fixture
def client(tmp_path):
    from clientutil import clusters
    with clusters(tmp_path) as make:
        cluster = make(3)
        yield cluster, cluster.client()


def test_bookkeeper_iter_ledgers_pages_and_list_ledgers_stays_a_list(client):
    cluster, bk = client
    created = sorted(bk.create_ledger(2, 2, 2).id for _ in range(3))
    put_ledgers(cluster.store, [created[-1] + 1 + i for i in range(20)])
    everything = created + [created[-1] + 1 + i for i in range(20)]
    assert list(bk.iter_ledgers(page_size=PAGE)) == everything  # one id length: ascending
    assert bk.list_ledgers() == everything
    listing = bk.iter_ledgers(page_size=PAGE)
    assert next(listing) == everything[0]
    bk.close()
    with pytest.raises(ClientClosed):
        next(listing)


@pytest.mark.asyncio
async def test_the_asyncio_twin_lists_a_page_at_a_time(client):
    cluster, bk = client
    ids = [bk.create_ledger(2, 2, 2).id for _ in range(2)]
    put_ledgers(cluster.store, [max(ids) + 1 + i for i in range(9)])
    expected = sorted(ids) + [max(ids) + 1 + i for i in range(9)]
    async with AsyncBookKeeper(bk) as abk:
        assert [i async for i in abk.iter_ledgers(page_size=PAGE)] == expected
        assert [i async for i in abk.iter_ledgers(page_size=len(expected))] == expected
        assert await abk.list_ledgers() == expected


# -- pybk listledgers --------------------------------------------------------------------------

@pytest.fixture
def cluster_address(zookeeper):
    address = zookeeper.address(zkutil.fresh_root())
    format_cluster(address, settings=zkutil.settings())
    return address


@pytest.fixture
def listing():
    """Start ``pybk listledgers ARGS`` with a small pipe on its standard output; killed
    and reaped at the end of the test."""
    started: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "pybk", "listledgers", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=child_env(), stdin=subprocess.DEVNULL)
        started.append(proc)
        assert proc.stdout is not None
        fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.communicate(timeout=WAIT_S)


@pytest.mark.parametrize("args", [["--meta"], ["--bookie", "b1"]], ids=["meta", "bookie"])
def test_listledgers_prints_while_it_reads(cluster_address, listing, args):
    """The first lines come while the listing is still reading ledgers: with the pipe
    full (PIPE_BYTES, far less than the whole listing), the process waits in the first
    of two hierarchical parents, so a ledger deleted ahead of it is left out and one
    created in the parent it has not read yet is listed."""
    first, second = list(range(750)), list(range(10_000, 10_750))  # /00/0000, /00/0001
    with ZooKeeperMetadataStore(cluster_address, zkutil.settings()) as store:
        put_ledgers(store, first + second)
        proc = listing(*args, "--zk", cluster_address)
        assert proc.stdout.readline().split()[0] == "LEDGER"
        assert proc.stdout.readline().split()[0] == "0"
        assert proc.poll() is None, "the listing ended before its first lines were read"
        LedgerManager(store).delete(first[-1])  # ahead of the listing: not listed
        put_ledgers(store, [second[-1] + 1])  # in the parent not read yet: listed
        rest = proc.stdout.read()
        assert proc.wait(timeout=WAIT_S) == 0
    assert "Traceback" not in proc.stderr.read()
    listed = [int(line.split()[0]) for line in rest.splitlines()]
    assert listed == first[1:-1] + second + [second[-1] + 1]


def test_listledgers_json_is_one_document_and_a_closed_reader_ends_it(cluster_address,
                                                                      listing):
    ids = list(range(0, 30_000, 7))
    with ZooKeeperMetadataStore(cluster_address, zkutil.settings()) as store:
        put_ledgers(store, ids)
    out = ok("listledgers", "--json", "--zk", cluster_address)
    assert json.loads(out) == [{"ledger": i} for i in ids]
    assert out.count("\n") == len(ids) + 1  # a ledger per line, then "]"
    proc = listing("--zk", cluster_address)
    assert proc.stdout.readline().split() == ["LEDGER"]
    proc.stdout.close()  # like `| head -1`
    assert proc.wait(timeout=WAIT_S) == 1
    assert proc.stderr.read() == ""  # no traceback


def test_listledgers_of_an_empty_cluster_and_an_unknown_bookie(cluster_address):
    assert ok("listledgers", "--zk", cluster_address) == "LEDGER\n(none)\n"
    assert ok("listledgers", "--json", "--zk", cluster_address) == "[]\n"
    with ZooKeeperMetadataStore(cluster_address, zkutil.settings()) as store:
        put_ledgers(store, list(range(5)))
    assert failed("listledgers", "--json", "--bookie", "nobody:1", "--zk",
                  cluster_address) == ("pybk listledgers: bookie nobody:1 is unknown: it is "
                                       "not registered and no ledger names it\n")
