"""A small cluster for client tests: real bookies, a real metadata store, and fault hooks
between the client and each bookie.

Transports: ``"inprocess"`` calls each bookie directly; ``"zmq"`` serves each bookie
through a :class:`~pybk.cluster.BookieServer` on a loopback TCP port and reaches it with
a :class:`~pybk.cluster.ZmqBookieClient` (one :class:`~pybk.cluster.ClientLoop` per
BookKeeper client); ``"zmq-curve"`` is ``"zmq"`` with CURVE on both sides (keys of
:mod:`curveutil`, the bookies' public keys pinned); ``"processes"`` reaches ``pybk
bookie`` processes of a :class:`BookiePool` the same way, with the metadata on the pool's
ZooKeeper.  Either way
the fault hooks wrap the transport, and the ``stored_*``/``holders`` helpers look at
what a bookie holds without them (directly, or over the network for processes)."""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Callable, Iterator, Mapping

import zkutil
from clusterutil import BookieProcesses
from curveutil import make_keys
from zmqutil import LOOPBACK

from pybk.client import BookKeeper
from pybk.client.transport import AddsDone, BookieClient, InProcessBookieClient
from pybk.errors import NoSuchEntry, NoSuchLedger
from pybk.meta.embedded import EmbeddedMetadataStore
from pybk.meta.zookeeper import ZooKeeperMetadataStore, format_cluster
from pybk.net import BookieServer, ClientLoop, ZmqBookieClient
from pybk.settings import ClientSettings, ServerSettings
from pybk.storage import Bookie, format_bookie
from pybk.testing import WAIT_S
from pybk.testing.faults import Faults, FaultyBookieClient
from pybk.testing.faulty_metadata import FaultyMetadataStore

FAST = ClientSettings(addEntryTimeout=2.0, readTimeout=1.0, explicitLacInterval=20)
CURVE = "zmq-curve"
TRANSPORTS = ("inprocess", "zmq", CURVE)
PROCESSES = "processes"


class BookiePool:
    """``size`` bookie processes B1..B<size> on a fresh cluster of ``zookeeper``, shared by
    the :class:`Cluster` objects of many tests (ledger ids come from the one cluster, so
    tests never meet each other's ledgers).  :meth:`close` kills them."""

    def __init__(self, workdir: Path, zookeeper, size: int,
                 locations: Mapping[str, str] | None = None) -> None:
        """``locations``: bookie id -> the network location it registers."""
        self.address = zookeeper.address(zkutil.fresh_root())
        format_cluster(self.address, settings=zkutil.settings())
        self._processes = BookieProcesses(workdir, self.address)
        try:
            for i in range(1, size + 1):
                location = (locations or {}).get(f"B{i}")
                self._processes.start(f"B{i}", "--bookie-id", f"B{i}", *(
                    ("--set", f"bookieNetworkLocation={location}") if location else ()))
            self.endpoints = {b.bookie_id: b.endpoint for b in
                              (b.wait_serving() for b in self._processes.started)}
        except BaseException:
            self._processes.close()
            raise

    def kill(self, bookie_id: str) -> None:
        """SIGKILL the bookie process ``bookie_id`` (a crash: for a pool of one test)."""
        next(b for b in self._processes.started if b.bookie_id == bookie_id).kill()

    def close(self) -> None:
        self._processes.close()


class Cluster:
    """``n`` bookies named B1..Bn under ``root``; every client made here shares the faults.
    :meth:`close` stops everything it started, in reverse order, even if a part fails."""

    def __init__(self, root: str, n: int, transport: str = "inprocess",
                 pool: BookiePool | None = None) -> None:
        if transport not in (*TRANSPORTS, PROCESSES):
            raise ValueError(f"transport must be one of {TRANSPORTS + (PROCESSES,)}, not "
                             f"{transport!r}")
        self.root = root
        self.transport = transport
        self.bookie_ids = [f"B{i}" for i in range(1, n + 1)]
        self.bookies: dict[str, Bookie] = {}
        self.servers: dict[str, BookieServer] = {}
        self.faults: dict[str, Faults] = {b: Faults() for b in self.bookie_ids}
        self.clients: list[BookKeeper] = []
        self._endpoints: dict[str, str] = {}
        # Per bookie, every in-process client made here (inspectors and client()'s), so
        # that restart_bookie() can point them at the restarted bookie.
        self._in_process: dict[str, list[InProcessBookieClient]] = {}
        self._stack = contextlib.ExitStack()
        self._keys = make_keys(os.path.join(root, "keys")) if transport == CURVE else None
        try:
            if transport == PROCESSES:
                assert pool is not None and n <= len(pool.endpoints), "a pool big enough"
                self._endpoints = {b: pool.endpoints[b] for b in self.bookie_ids}
                self.store = self._stack.enter_context(
                    ZooKeeperMetadataStore(pool.address, zkutil.settings()))
            else:
                for bookie_id in self.bookie_ids:
                    self.start_bookie(bookie_id)
                self.store = self._stack.enter_context(
                    EmbeddedMetadataStore(os.path.join(root, "meta")))
            # Every client's metadata goes through here, so tests can hold its writes.
            self.metadata_faults = FaultyMetadataStore(self.store)
            self._inspectors = self._clients(ClientSettings(), self._loop())
        except BaseException:
            self._stack.close()
            raise

    def start_bookie(self, bookie_id: str) -> Bookie:
        base = os.path.join(self.root, bookie_id)
        settings = ServerSettings(journalDirectory=os.path.join(base, "journal"),
                                  ledgerDirectories=(os.path.join(base, "ledgers"),),
                                  journalPreAllocSizeMB=1,
                                  **(self._keys.server() if self._keys else {}))
        if not os.path.exists(os.path.join(settings.journalDirectory, "current", "COOKIE")):
            format_bookie(settings)
        bookie = self._stack.enter_context(Bookie(settings))
        self.bookies[bookie_id] = bookie
        if self.transport in ("zmq", CURVE):
            # A restarted bookie serves at its former address: its clients reconnect.
            where = self._endpoints.get(bookie_id, LOOPBACK)
            server = self._stack.enter_context(BookieServer(bookie, where))
            self.servers[bookie_id] = server
            self._endpoints[bookie_id] = server.address
        return bookie

    def client(self, settings: ClientSettings = FAST, metrics_registry=None) -> BookKeeper:
        wrapped = {b: FaultyBookieClient(client, self.faults[b])
                   for b, client in self._clients(settings, self._loop()).items()}
        bk = self._stack.enter_context(BookKeeper(self.metadata_faults, wrapped, settings,
                                                  metrics_registry=metrics_registry))
        self.clients.append(bk)
        return bk

    def _loop(self) -> ClientLoop | None:
        return None if self.transport == "inprocess" else self._stack.enter_context(
            ClientLoop())

    def _clients(self, settings: ClientSettings,
                 loop: ClientLoop | None) -> dict[str, BookieClient]:
        if loop is None:
            made = {b: InProcessBookieClient(b, self.bookies[b]) for b in self.bookie_ids}
            for bookie_id, client in made.items():
                self._in_process.setdefault(bookie_id, []).append(client)
            return made
        server_key = None
        if self._keys is not None:
            settings, server_key = self._keys.client(settings), self._keys.bookie_public
        # Closed with their loop, which fails whatever is still outstanding.
        return {b: ZmqBookieClient(b, self._endpoints[b], settings, loop=loop,
                                   server_key=server_key)
                for b in self.bookie_ids}

    def register_locations(self, locations: Mapping[str, str]) -> None:
        """Record the bookies' network locations as their registrations do, for
        rack-aware clients; a pool's processes registered theirs (checked here)."""
        for bookie_id in self.bookie_ids:
            if self.transport == PROCESSES:
                assert self.store.bookie_location(bookie_id) == locations[bookie_id]
            else:
                self.store.register_bookie(bookie_id, location=locations[bookie_id])

    def stop_bookie(self, bookie_id: str) -> None:
        """Stop the bookie (not ``"processes"``): in process, every call of a client
        reaching it fails with BookieClosed until :meth:`restart_bookie`; over ZeroMQ
        its server closes too, and requests get no answer until it is restarted.  A
        clean stop, which loses nothing acknowledged (the journal is fsynced before an
        add is)."""
        self._require_bookies_here("stop_bookie")
        if bookie_id in self.servers:
            self.servers[bookie_id].close()
        self.bookies[bookie_id].close()

    def restart_bookie(self, bookie_id: str) -> Bookie:
        """Stop the bookie if it runs, open a new one on the same directories (replaying
        its journal), served at the same address over ZeroMQ, and make every in-process
        client of this cluster (the inspectors' and those of :meth:`client`) call the
        new one from now on."""
        self._require_bookies_here("restart_bookie")
        self.stop_bookie(bookie_id)  # no-op if stopped already
        bookie = self.start_bookie(bookie_id)
        for client in self._in_process.get(bookie_id, ()):
            client._bookie = bookie
        return bookie

    def _require_bookies_here(self, what: str) -> None:
        if self.transport == PROCESSES:
            raise ValueError(f"{what} needs bookies of this process, not {PROCESSES!r} "
                             "(kill those)")

    # -- what the bookies hold, seen without the fault hooks ---------------------------

    def bookie_client(self, bookie_id: str) -> BookieClient:
        """A client of the bookie over this cluster's transport, without the fault hooks:
        for requests no ledger client would send."""
        return self._inspectors[bookie_id]

    def stored_entry(self, bookie_id: str, ledger_id: int, entry_id: int) -> bytes:
        """The entry's bytes as the bookie holds them (NoSuchEntry, NoSuchLedger)."""
        return self._inspectors[bookie_id].read(ledger_id, entry_id).result(timeout=WAIT_S)

    def put_entry(self, bookie_id: str, ledger_id: int, entry_id: int, data: bytes,
                  master_key: bytes) -> None:
        """Store ``data`` as the entry on the bookie (a recovery add: fenced or not)."""
        self._inspectors[bookie_id].add(ledger_id, entry_id, data, master_key,
                                        recovery=True).result(timeout=WAIT_S)

    def holds_ledger(self, bookie_id: str, ledger_id: int) -> bool:
        try:
            self._inspectors[bookie_id].read_lac(ledger_id).result(timeout=WAIT_S)
        except NoSuchLedger:
            return False
        return True

    def holders(self, ledger_id: int, entry_id: int) -> list[str]:
        """The bookies that store the entry."""
        held = []
        for bookie_id in self.bookie_ids:
            try:
                self.stored_entry(bookie_id, ledger_id, entry_id)
            except (NoSuchEntry, NoSuchLedger):
                continue
            held.append(bookie_id)
        return held

    def close(self) -> None:
        """Lift every fault (so no client thread stays blocked on one), then stop."""
        self.metadata_faults.release_all()
        for faults in self.faults.values():
            faults.drop.clear()
            faults.hold.clear()
            faults.unreachable = False
            faults.release()
        self._stack.close()


class Spy:
    """Stands between the ledger client and a bookie's client (its fault hooks): records
    the reads and batch reads asked of the bookie, how many requests of all spies
    sharing ``counter`` were in flight at once, and how the bookie's adds were made and
    answered: ``future_adds``, adds made with a Future each (:meth:`add`);
    ``answered``, per answer of grouped adds (:meth:`ledger_adds`, :meth:`add_grouped`),
    how many adds it answered."""

    def __init__(self, inner: BookieClient, counter: dict) -> None:
        self.inner = inner
        self.reads: list[int] = []
        self.batches: list[tuple[list[int], int, Future]] = []
        self.future_adds = 0
        self.answered: list[int] = []
        self._counter = counter
        self._sinks: dict[AddsDone, AddsDone] = {}  # the caller's sink -> its counting one

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def read(self, ledger_id, entry_id, fence=False, master_key=b""):
        self.reads.append(entry_id)
        return self._track(self.inner.read(ledger_id, entry_id, fence, master_key))

    def read_batch(self, ledger_id, entry_ids, max_bytes):
        future = self._track(self.inner.read_batch(ledger_id, entry_ids, max_bytes))
        self.batches.append((list(entry_ids), max_bytes, future))
        return future

    def add(self, *args, **kwargs):
        self.future_adds += 1
        return self.inner.add(*args, **kwargs)

    def ledger_adds(self, ledger_id, master_key, sink, recovery=False, *, deferred=False):
        return self.inner.ledger_adds(ledger_id, master_key, self._counting(sink), recovery,
                                      deferred=deferred)

    def add_grouped(self, ledger_id, entry_id, entry, master_key, token, sink, recovery=False,
                    *, deferred=False):
        self.inner.add_grouped(ledger_id, entry_id, entry, master_key, token,
                               self._counting(sink), recovery, deferred=deferred)

    def _counting(self, sink: AddsDone) -> AddsDone:
        """One counting sink per caller's sink (so the transport still groups by it)."""
        counting = self._sinks.get(sink)
        if counting is None:
            def counting(tokens, errors, sink=sink):
                self.answered.append(len(tokens))
                sink(tokens, errors)
            self._sinks[sink] = counting
        return counting

    def _track(self, future: Future) -> Future:
        counter = self._counter
        with counter["lock"]:
            counter["now"] += 1
            counter["most"] = max(counter["most"], counter["now"])

        def done(_future: Future) -> None:
            with counter["lock"]:
                counter["now"] -= 1
        future.add_done_callback(done)
        return future

    def asked(self) -> list[int]:
        """Every entry id asked of this bookie, singly or in batches."""
        return self.reads + [e for entry_ids, _, _ in self.batches for e in entry_ids]


def spy_on(bk, cluster: Cluster) -> tuple[dict[str, Spy], dict]:
    """Spies on every bookie client ``bk`` hands out from now on."""
    counter = {"lock": threading.Lock(), "now": 0, "most": 0}
    spies = {b: Spy(bk.bookie_client(b), counter) for b in cluster.bookie_ids}
    bk.bookie_client = spies.__getitem__
    return spies, counter


@contextlib.contextmanager
def clusters(root: Path, transport: str = "inprocess",
             pool: BookiePool | None = None) -> Iterator[Callable[[int], Cluster]]:
    """``make(n)`` makes a :class:`Cluster` of ``n`` bookies under ``root``; every one made
    is closed on the way out, also when the test failed."""
    made: list[Cluster] = []

    def make(n: int) -> Cluster:
        cluster = Cluster(str(root / f"cluster{len(made)}"), n, transport, pool)
        made.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in made:
            cluster.close()
