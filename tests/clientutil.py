"""A small cluster for client tests: real bookies, a real embedded metadata store, and
fault hooks between the client and each bookie.

Transports: ``"inprocess"`` calls each bookie directly; ``"zmq"`` serves each bookie
through a :class:`~pybk.cluster.BookieServer` on a loopback TCP port and reaches it with
a :class:`~pybk.cluster.ZmqBookieClient` (one :class:`~pybk.cluster.ClientLoop` per
BookKeeper client).  Either way the fault hooks wrap the transport."""

from __future__ import annotations

import contextlib
import os

from pybk.client import BookKeeper
from pybk.client.transport import (BookieClient, Faults, FaultyBookieClient,
                                   InProcessBookieClient)
from pybk.cluster import BookieServer, ClientLoop, ZmqBookieClient
from pybk.meta.embedded import EmbeddedMetadataStore
from pybk.settings import ClientSettings, ServerSettings
from pybk.storage import Bookie, format_bookie
from zmqutil import LOOPBACK

FAST = ClientSettings(addEntryTimeout=2.0, readTimeout=1.0, explicitLacInterval=20)
TRANSPORTS = ("inprocess", "zmq")


class Cluster:
    """``n`` bookies named B1..Bn under ``root``; every client made here shares the faults.
    :meth:`close` stops everything it started, in reverse order, even if a part fails."""

    def __init__(self, root: str, n: int, transport: str = "inprocess") -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        self.root = root
        self.transport = transport
        self.bookies: dict[str, Bookie] = {}
        self.servers: dict[str, BookieServer] = {}
        self.faults: dict[str, Faults] = {}
        self.clients: list[BookKeeper] = []
        self._stack = contextlib.ExitStack()
        try:
            for i in range(1, n + 1):
                self.start_bookie(f"B{i}")
            self.store = self._stack.enter_context(
                EmbeddedMetadataStore(os.path.join(root, "meta")))
        except BaseException:
            self._stack.close()
            raise

    def start_bookie(self, bookie_id: str) -> Bookie:
        base = os.path.join(self.root, bookie_id)
        settings = ServerSettings(journalDirectory=os.path.join(base, "journal"),
                                  ledgerDirectories=(os.path.join(base, "ledgers"),),
                                  journalPreAllocSizeMB=1)
        if not os.path.exists(os.path.join(settings.journalDirectory, "current", "COOKIE")):
            format_bookie(settings)
        bookie = self._stack.enter_context(Bookie(settings))
        self.bookies[bookie_id] = bookie
        if self.transport == "zmq":
            self.servers[bookie_id] = self._stack.enter_context(BookieServer(bookie,
                                                                             LOOPBACK))
        self.faults.setdefault(bookie_id, Faults())
        return bookie

    def client(self, settings: ClientSettings = FAST) -> BookKeeper:
        loop = self._stack.enter_context(ClientLoop()) if self.transport == "zmq" else None
        wrapped = {b: FaultyBookieClient(self._reach(b, settings, loop), self.faults[b])
                   for b in self.bookies}
        bk = self._stack.enter_context(BookKeeper(self.store, wrapped, settings))
        self.clients.append(bk)
        return bk

    def _reach(self, bookie_id: str, settings: ClientSettings,
               loop: ClientLoop | None) -> BookieClient:
        if loop is None:
            return InProcessBookieClient(bookie_id, self.bookies[bookie_id])
        # Closed with its loop, which fails whatever is still outstanding.
        return ZmqBookieClient(bookie_id, self.servers[bookie_id].address, settings,
                               loop=loop)

    def holders(self, ledger_id: int, entry_id: int) -> list[str]:
        """The bookies that store the entry (asked directly, no client)."""
        held = []
        for bookie_id, bookie in self.bookies.items():
            if bookie.ledger_exists(ledger_id) and entry_id in bookie.entry_ids(ledger_id):
                held.append(bookie_id)
        return held

    def close(self) -> None:
        for faults in self.faults.values():
            faults.drop.clear()
            faults.unreachable = False
        self._stack.close()
