"""A small in-process cluster for client tests: real bookies, a real embedded metadata
store, and fault hooks between the client and each bookie."""

from __future__ import annotations

import os

from pybk.client import BookKeeper
from pybk.client.transport import Faults, FaultyBookieClient, InProcessBookieClient
from pybk.meta.embedded import EmbeddedMetadataStore
from pybk.settings import ClientSettings, ServerSettings
from pybk.storage import Bookie, format_bookie

FAST = ClientSettings(addEntryTimeout=2.0, readTimeout=1.0, explicitLacInterval=20)


class Cluster:
    """``n`` bookies named B1..Bn under ``root``; every client made here shares the faults."""

    def __init__(self, root: str, n: int) -> None:
        self.root = root
        self.bookies: dict[str, Bookie] = {}
        self.faults: dict[str, Faults] = {}
        self.clients: list[BookKeeper] = []
        for i in range(1, n + 1):
            self.start_bookie(f"B{i}")
        self.store = EmbeddedMetadataStore(os.path.join(root, "meta"))

    def start_bookie(self, bookie_id: str) -> Bookie:
        base = os.path.join(self.root, bookie_id)
        settings = ServerSettings(journalDirectory=os.path.join(base, "journal"),
                                  ledgerDirectories=(os.path.join(base, "ledgers"),),
                                  journalPreAllocSizeMB=1)
        if not os.path.exists(os.path.join(settings.journalDirectory, "current", "COOKIE")):
            format_bookie(settings)
        self.bookies[bookie_id] = Bookie(settings)
        self.faults.setdefault(bookie_id, Faults())
        return self.bookies[bookie_id]

    def client(self, settings: ClientSettings = FAST) -> BookKeeper:
        wrapped = {b: FaultyBookieClient(InProcessBookieClient(b, bookie), self.faults[b])
                   for b, bookie in self.bookies.items()}
        bk = BookKeeper(self.store, wrapped, settings)
        self.clients.append(bk)
        return bk

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
        for bk in self.clients:
            bk.close()
        for bookie in self.bookies.values():
            bookie.close()
        self.store.close()
