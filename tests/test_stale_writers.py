"""Stale writers against bookies that no longer know their ledger (issue 31, section 6):
bookie nodes in this process on a real ZooKeeper, clients over ZeroMQ, real files.

A writer paused while its ledger was recovered (and deleted) must never be told that an
add is durable by bookies that forgot the ledger (garbage-collected after the deletion,
before or after a restart) or lost it (wiped and started again at the same address):
the bookie checks such adds against the ledger's metadata (pybk/cluster/admission.py,
docs/DESIGN.md "Stale writers").  A read of a ledger a bookie never held answers
NoSuchLedger, and recovery counts it as "not there", unless the ledger is older than the
bookie's disks (EntryMaybeLost: not counted).  The checks cost no metadata read
on the normal path, and one per ledger per bookie at an ensemble change.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
from functools import partial
from typing import Callable

import pytest
import zkutil
from conftest import entry

import pybk
from pybk.client import BookKeeper
from pybk.client.transport import InProcessBookieClient
from pybk.cluster.admission import LedgerAdmission
from pybk.cluster.node import BookieNode
from pybk.errors import (
    BookieUnavailable,
    BookKeeperError,
    EntryMaybeLost,
    LedgerFenced,
    LedgerRecoveryError,
    NoSuchEntry,
    NoSuchLedger,
    Timeout,
)
from pybk.meta.embedded import EmbeddedMetadataStore
from pybk.meta.interface import ANY_VERSION, MetadataStore
from pybk.meta.zookeeper import ZooKeeperMetadataStore, format_cluster
from pybk.settings import ClientSettings, ServerSettings
from pybk.storage import LAST_ENTRY, Bookie, format_bookie
from pybk.storage import bookie as bookie_module
from pybk.storage.cookie import is_formatted
from pybk.testing.faults import Faults, FaultyBookieClient
from pybk.testing.waiting import WAIT_S, wait_until

pytestmark = pytest.mark.timeout(120)

FAST = ClientSettings(addEntryTimeout=2.0, readTimeout=2.0, explicitLacInterval=20)
PASSWORD = b"stale-writer-test"
#: A ledger id far above any the cluster hands out: the filler that rolls entry logs.
FILLER = 2 ** 40


def payload(i: int) -> bytes:
    return b"stale writer entry %d " % i * 8


class CountingStore:
    """A metadata store that counts the reads of ledger metadata (``get`` and
    ``get_latest`` of a ledger's path) and passes every call through."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self.ledger_reads = 0

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def _count(self, path: str) -> None:
        leaf = path.rpartition("/")[2]  # a ledger's record is L<digits> in every layout
        if leaf.startswith("L") and leaf[1:].isdigit():
            self.ledger_reads += 1

    def get(self, path: str):
        self._count(path)
        return self._store.get(path)

    def get_latest(self, path: str):
        self._count(path)
        return self._store.get_latest(path)


class Cluster:
    """Bookie nodes of one test on a freshly formatted cluster, each on a port it keeps
    when started again; everything is closed when the test ends, also on failure."""

    def __init__(self, tmp_path, address: str, closing: contextlib.ExitStack) -> None:
        self.tmp_path = tmp_path
        self.address = address
        self.closing = closing
        self.ports: dict[str, int] = {}
        self.nodes: dict[str, BookieNode] = {}
        self.stores: dict[str, CountingStore] = {}

    def settings(self, name: str) -> ServerSettings:
        base = self.tmp_path / name
        port = self.ports.get(name, 0)
        settings = ServerSettings(
            journalDirectory=str(base / "journal"), ledgerDirectories=(str(base / "ledgers"),),
            journalPreAllocSizeMB=1, metadataServiceUri=self.address,
            listenAddress=f"127.0.0.1:{port}", zkTimeout=zkutil.SESSION_TIMEOUT_MS,
            autoRecoveryDaemonEnabled=False,
            # GC runs when a test says so; small entry logs roll soon.
            gcWaitTime=3_600_000, minorCompactionInterval=0, majorCompactionInterval=0,
            logSizeLimit=2 << 20, maxEntrySizeBytes=1 << 20, writeCacheMaxSizeMb=4)
        if not is_formatted(settings):
            format_bookie(settings)
        return settings

    def start(self, name: str) -> BookieNode:
        store = CountingStore(self.closing.enter_context(
            ZooKeeperMetadataStore(self.address, zkutil.settings())))
        node = BookieNode(self.settings(name), metadata=store)  # type: ignore[arg-type]
        self.closing.callback(node.close)
        self.ports[name] = int(node.endpoint.rpartition(":")[2])
        self.nodes[name], self.stores[name] = node, store
        return node

    def stop(self, name: str) -> None:
        self.nodes.pop(name).close()

    def wipe(self, name: str) -> None:
        """Stop the bookie, lose its disks and its cookie in the cluster (an operator
        replacing it), and format new disks in their place."""
        self.stop(name)
        bookie_id = f"127.0.0.1:{self.ports[name]}"
        self.observer().remove_cookie(bookie_id, ANY_VERSION)
        shutil.rmtree(self.tmp_path / name)
        self.settings(name)

    def observer(self) -> ZooKeeperMetadataStore:
        return self.closing.enter_context(ZooKeeperMetadataStore(self.address,
                                                                 zkutil.settings()))

    def client(self, settings: ClientSettings = FAST) -> BookKeeper:
        return self.closing.enter_context(pybk.connect(self.address, settings,
                                                       zk_settings=zkutil.settings()))

    def faulty_client(self, settings: ClientSettings = FAST
                      ) -> tuple[BookKeeper, Callable[[str], FaultyBookieClient]]:
        """A client whose every bookie client goes through a FaultyBookieClient, and what
        gives a bookie's (its ``faults``: none until the test sets some)."""
        bk = self.client(settings)
        plain = bk.bookie_client
        wrapped: dict[str, FaultyBookieClient] = {}

        def faulty(bookie_id: str) -> FaultyBookieClient:
            if bookie_id not in wrapped:
                wrapped[bookie_id] = FaultyBookieClient(plain(bookie_id), Faults())
            return wrapped[bookie_id]
        bk.bookie_client = faulty  # type: ignore[method-assign]
        return bk, faulty

    def bookie(self, bookie_id: str) -> Bookie:
        return next(n.bookie for n in self.nodes.values() if n.bookie_id == bookie_id)


@pytest.fixture
def cluster(tmp_path, zookeeper):
    address = zookeeper.address(zkutil.fresh_root())
    format_cluster(address, settings=zkutil.settings())
    with contextlib.ExitStack() as closing:
        yield Cluster(tmp_path, address, closing)


def _forget(bookie: Bookie, ledger_id: int) -> None:
    """Have ``bookie`` garbage-collect the deleted ``ledger_id`` until nothing of it is
    left: roll the entry log past it with a filler ledger, then compact."""
    for e in range(20):
        bookie.add_entry(FILLER, e, entry(FILLER, e, body=b"x" * 120_000), b"filler")
    bookie.checkpoint()
    bookie.compact(1.0)
    with pytest.raises(NoSuchLedger) as unknown:
        bookie.read_entry(ledger_id, 0)
    assert "deleted" not in str(unknown.value)  # forgotten: no state left to say so


def _reach(bk: BookKeeper, ledger_id: int, bookie_ids) -> None:
    """Wait until ``bk`` reaches each of ``bookie_ids`` again: ZeroMQ reconnects to a
    bookie started again at its address in the background, and an add meanwhile would
    fail as to a bookie that is down (an ensemble change)."""
    def reached(bookie_id: str) -> bool:
        try:
            bk.bookie_client(bookie_id).read_lac(ledger_id).result(timeout=WAIT_S)
        except (BookieUnavailable, Timeout):
            return False
        except BookKeeperError:
            pass  # an answer (NoSuchLedger): the bookie is reached
        return True
    for bookie_id in bookie_ids:
        wait_until(partial(reached, bookie_id), f"the writer's client reaches {bookie_id}",
                   WAIT_S)


def _holds_nothing_of(cluster: Cluster, ledger_id: int) -> None:
    for node in cluster.nodes.values():
        assert not node.bookie.ledger_exists(ledger_id), node.bookie_id


@pytest.mark.parametrize("restart,written", [(False, 10), (True, 10), (False, 0)],
                         ids=["running", "restarted", "empty"])
def test_bookies_that_forgot_a_fenced_deleted_ledger_refuse_its_stale_writer(
        cluster, restart, written):
    """``empty``: the writer paused before its first add (entry 0 is the one a new
    ledger's bookies would take unchecked: the tombstone covers it too)."""
    for name in ("b1", "b2", "b3"):
        cluster.start(name)
    client = cluster.client()
    writer = client.create_ledger(3, 3, 2, password=PASSWORD)
    for i in range(written):
        writer.add_entry(payload(i))
    # Meanwhile (the writer paused): recovered, closed and deleted by another client.
    recoverer = cluster.client()
    recovered = recoverer.open_ledger(writer.id, password=PASSWORD)
    assert recovered.last_add_confirmed == written - 1
    recoverer.delete_ledger(writer.id)
    for node in cluster.nodes.values():
        _forget(node.bookie, writer.id)
    if restart:
        for name in list(cluster.nodes):
            cluster.stop(name)
            cluster.start(name)
        _reach(client, writer.id, writer.metadata.fragments[-1].ensemble)
    with pytest.raises(LedgerFenced):
        writer.add_entry(payload(written))
    _holds_nothing_of(cluster, writer.id)


def recovery_keeps(cluster: Cluster, ledger_id: int, down_name: str, last: int) -> None:
    """While bookie ``down_name`` is down (the caller stopped it), a recovering client
    closes the ledger at ``last`` or later, or refuses to decide (LedgerRecoveryError),
    never closes it below ``last``, an entry the writer was told is durable whose other
    copy is on the bookie down; then that bookie is started again."""
    try:
        recovered = cluster.client().open_ledger(ledger_id, password=PASSWORD)
    except LedgerRecoveryError:
        recovered = None  # undecided while the only copy is down: acceptable
    cluster.start(down_name)
    if recovered is not None:
        assert recovered.last_add_confirmed >= last, (
            f"recovery closed the ledger at {recovered.last_add_confirmed}, below entry "
            f"{last}, which the writer was told is durable")


def _recover_without(cluster: Cluster, spared: str, ledger_id: int):
    """Recover the ledger with a client whose fencing reads never reach ``spared``."""
    recoverer = cluster.client()
    plain = recoverer.bookie_client
    unfenced = FaultyBookieClient(plain(spared), Faults(fail={"read"}))
    recoverer.bookie_client = lambda b: unfenced if b == spared else plain(b)  # type: ignore
    return recoverer.open_ledger(ledger_id, password=PASSWORD)


def test_a_bookie_wiped_at_its_address_after_recovery_refuses_the_stale_writer(cluster):
    """apache/bookkeeper#4812: recovery fenced two of three bookies (E3/Qw3/Qa2); one of
    them is replaced by a fresh bookie at the same address; the stale writer's add then
    reaches the unfenced bookie and the fresh one: two acknowledgements, before the fenced
    bookie's refusal (held back here: a slow bookie), were enough until the fix."""
    for name in ("b1", "b2", "b3"):
        cluster.start(name)
    client, faulty = cluster.faulty_client()
    writer = client.create_ledger(3, 3, 2, password=PASSWORD)
    for i in range(10):
        writer.add_entry(payload(i))
    spared, fenced, wiped = writer.metadata.fragments[-1].ensemble
    assert _recover_without(cluster, spared, writer.id).last_add_confirmed == 9
    name = next(n for n, node in cluster.nodes.items() if node.bookie_id == wiped)
    cluster.wipe(name)
    assert cluster.start(name).bookie_id == wiped
    _reach(client, writer.id, [wiped])
    faulty(fenced).faults.hold = {"add"}
    with pytest.raises(LedgerFenced):
        writer.add_entry(payload(10))
    faulty(fenced).faults.release()
    assert not cluster.bookie(wiped).ledger_exists(writer.id)
    # The refusal can come back before the unfenced bookie has stored the entry.
    wait_until(lambda: cluster.bookie(spared).entry_ids(writer.id) == list(range(11)),
               "the unfenced bookie stores entry 10", WAIT_S)
    reader = cluster.client().open_ledger(writer.id, password=PASSWORD)
    assert reader.last_add_confirmed == 9


def test_reads_of_ledgers_a_wiped_bookie_does_not_hold(cluster):
    """A ledger created before the wiped bookie joined (below its join floor): a read
    answers EntryMaybeLost (its disks before may have held it).  A ledger no bookie ever
    held, created after: a fencing read answers NoSuchLedger (BookKeeper's
    NoSuchLedgerExists), a later one NoSuchEntry (the fence made the ledger).  Recovery,
    whose fencing reads meet the wiped bookie first, counts its fence, finds the end
    from the other two bookies' NoSuchEntry, closes the ledger and re-writes what it
    re-read there; the stale writer is refused."""
    for name in ("b1", "b2", "b3"):
        cluster.start(name)
    writer_client = cluster.client()
    writer = writer_client.create_ledger(3, 3, 2, password=PASSWORD)
    for i in range(10):
        writer.add_entry(payload(i))
    wiped = writer.metadata.fragments[-1].ensemble[2]
    name = next(n for n, node in cluster.nodes.items() if node.bookie_id == wiped)
    cluster.wipe(name)
    cluster.start(name)
    _reach(writer_client, writer.id, [wiped])
    reader = cluster.client()
    key = BookKeeper.master_key(PASSWORD)
    bookie = reader.bookie_client(wiped)
    with pytest.raises(EntryMaybeLost):
        bookie.read(writer.id, 0).result(timeout=WAIT_S)
    never = writer_client.create_ledger(3, 3, 2, password=PASSWORD).id  # held nowhere
    with pytest.raises(NoSuchLedger):
        bookie.read(never, LAST_ENTRY, True, key).result(timeout=WAIT_S)
    with pytest.raises(NoSuchEntry):
        bookie.read(never, LAST_ENTRY, True, key).result(timeout=WAIT_S)
    recovered = reader.open_ledger(writer.id, password=PASSWORD)
    assert recovered.last_add_confirmed == 9
    assert [e.data for e in recovered.read_entries(0, 9)] == [payload(i) for i in range(10)]
    # Recovery fenced the wiped bookie and re-wrote there what it re-reads: the entries
    # past the highest LAC answered (entry 9 carries LAC 8).
    assert cluster.bookie(wiped).is_fenced(writer.id)
    assert cluster.bookie(wiped).entry_ids(writer.id) == [9]
    with pytest.raises(LedgerFenced):
        writer.add_entry(payload(10))


def test_a_fencing_read_of_an_unknown_ledger_in_process_answers_no_such_ledger(bookie):
    client = InProcessBookieClient("b1", bookie)
    with pytest.raises(NoSuchLedger):
        client.read(7, LAST_ENTRY, True, b"key").result(timeout=WAIT_S)
    with pytest.raises(NoSuchEntry):
        client.read(7, LAST_ENTRY, True, b"key").result(timeout=WAIT_S)


def test_checks_cost_no_metadata_read_per_add_and_one_per_ledger_at_ensemble_changes(
        cluster):
    """Normal adds read no ledger metadata on any bookie; a bookie started after the
    ledger was created, brought in by an ensemble change, reads it once however many
    adds it then takes (and none again after that)."""
    for name in ("b1", "b2", "b3"):
        cluster.start(name)
    writer = cluster.client().create_ledger(3, 2, 2, password=PASSWORD)
    for i in range(100):
        writer.add_entry(payload(i))
    assert {n: s.ledger_reads for n, s in cluster.stores.items()} == \
        {"b1": 0, "b2": 0, "b3": 0}
    newcomer = cluster.start("b4")  # its guard's floor is above the ledger's id
    failed = writer.metadata.fragments[-1].ensemble[0]
    cluster.stop(next(n for n, node in cluster.nodes.items() if node.bookie_id == failed))
    done = threading.Event()
    futures = [writer.add_entry_async(payload(i)) for i in range(100, 300)]
    futures[-1].add_done_callback(lambda _f: done.set())
    assert done.wait(WAIT_S)
    assert [f.result() for f in futures] == list(range(100, 300))
    assert newcomer.bookie_id in writer.metadata.fragments[-1].ensemble
    assert len(newcomer.bookie.entry_ids(writer.id)) > 100
    assert cluster.stores["b4"].ledger_reads == 1
    assert sum(cluster.stores[n].ledger_reads for n in cluster.nodes if n != "b4") == 0


def test_recovery_closes_a_ledger_whose_last_fragment_has_a_newcomer_without_entries(
        cluster):
    """A bookie started after the ledger was created (its join floor above the ledger's
    id) is brought in by an ensemble change and gets none of the new fragment's entries
    before the writer dies: it answers EntryMaybeLost for every entry of the ledger, yet
    recovery closes it: its fence counts, and each write set's other bookie says
    NoSuchEntry past the end (E3/Qw2/Qa2: (Qw - Qa) + 1 = 1 is enough)."""
    for name in ("b1", "b2", "b3"):
        cluster.start(name)
    # A writer whose adds to the newcomer never arrive, and never time out meanwhile.
    client, faulty = cluster.faulty_client(ClientSettings(
        addEntryTimeout=60.0, readTimeout=2.0, explicitLacInterval=0))
    writer = client.create_ledger(3, 2, 2, password=PASSWORD)
    for i in range(10):
        writer.add_entry(payload(i))
    newcomer = cluster.start("b4").bookie_id
    faulty(newcomer).faults.drop = {"add"}
    replaced = writer.metadata.fragments[-1].ensemble[2]  # in entry 10's write set
    faulty(replaced).faults.unreachable = True
    pending = writer.add_entry_async(payload(10))
    wait_until(lambda: newcomer in writer.metadata.fragments[-1].ensemble,
               "the writer replaces the unreachable bookie by the newcomer", WAIT_S)
    assert not pending.done()  # one acknowledgement of two: the writer is stuck (dead)
    with pytest.raises(EntryMaybeLost):
        cluster.client().bookie_client(newcomer).read(writer.id, 10).result(timeout=WAIT_S)
    recovered = cluster.client().open_ledger(writer.id, password=PASSWORD)
    # Entry 10 reached the bookie of its write set that stayed: recovery re-wrote it.
    assert recovered.last_add_confirmed == 10
    assert recovered.metadata.fragments[-1].ensemble[2] == newcomer
    assert cluster.bookie(newcomer).entry_ids(writer.id) == [10]
    assert cluster.bookie(newcomer).is_fenced(writer.id)


def hold_metadata_reads(store: MetadataStore, monkeypatch) -> threading.Event:
    """Holds ``store``'s ledger metadata reads (``get_latest``), as a ZooKeeper that does
    not answer would, until the returned event is set (or for WAIT_S at most)."""
    zookeeper_back = threading.Event()
    real_get_latest = store.get_latest

    def unanswered(path):
        zookeeper_back.wait(WAIT_S)
        return real_get_latest(path)
    monkeypatch.setattr(store, "get_latest", unanswered)
    return zookeeper_back


def test_adds_past_the_admission_bound_are_refused_at_once(cluster, monkeypatch):
    """At most ADDS_AWAITING_ADMISSION_MAX adds wait for the metadata checks of ledgers
    the bookie does not know (here 2, ZooKeeper not answering): one more is refused at
    once with an error its writer takes for a bookie failure, while those waiting are
    decided once ZooKeeper answers."""
    monkeypatch.setattr(bookie_module, "ADDS_AWAITING_ADMISSION_MAX", 2)
    observer = cluster.observer()
    for _ in range(5):  # ids 0..4: ledgers created before the node, unknown to it
        observer.next_ledger_id()
    node = cluster.start("b1")
    zookeeper_back = hold_metadata_reads(cluster.stores["b1"], monkeypatch)
    # Its adds wait for the held checks on purpose: they must not time out meanwhile.
    flooder = cluster.client(ClientSettings(addEntryTimeout=3 * WAIT_S, readTimeout=2.0,
                                            explicitLacInterval=20)
                             ).bookie_client(node.bookie_id)
    try:
        waiting = [flooder.add(ledger_id, 0, entry(ledger_id, 0), b"any key")
                   for ledger_id in range(2)]
        wait_until(lambda: node.bookie._adds_awaiting_admission == 2,
                   "two adds wait for their checks", WAIT_S)
        with pytest.raises(BookKeeperError, match="wait for the metadata check") as refused:
            flooder.add(2, 0, entry(2, 0), b"any key").result(timeout=WAIT_S)
        assert not isinstance(refused.value, LedgerFenced)
        assert not any(add.done() for add in waiting)
    finally:
        zookeeper_back.set()
    for add in waiting:  # no metadata: refused as a stale writer's
        with pytest.raises(LedgerFenced):
            add.result(timeout=WAIT_S)
    assert node.bookie._adds_awaiting_admission == 0


def test_the_admission_thread_starts_with_the_check_and_ends_with_its_close(tmp_path):
    """The thread of a node's ledger admission exists from the node's start to its
    close, not from its first check on: a check then never waits for a thread to start,
    and a node's threads are all there once it serves (so none appears in the middle of
    a client's work, as a test that counts the threads it left would see)."""
    def admission_threads() -> list[str]:
        return [t.name for t in threading.enumerate()
                if t.name.startswith("pybk-ledger-admission")]

    with EmbeddedMetadataStore(tmp_path / "meta") as store:
        before = admission_threads()
        admission = LedgerAdmission(store)
        try:
            assert len(admission_threads()) == len(before) + 1  # before any check
        finally:
            admission.close()
        assert admission_threads() == before
