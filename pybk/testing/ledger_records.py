"""Ledger metadata records written straight into a metadata store, in batches: many
ledgers (thousands, or 100,000 for a benchmark) without bookies or entries, for tests and
benchmarks of what reads ledger metadata (listings, audits, promotion)."""

from __future__ import annotations

from typing import Iterable, Sequence

from pybk.meta.interface import MetadataStore, batches
from pybk.meta.ledger_metadata import DigestType, Fragment, LedgerMetadata, hash_password

#: The ensemble of the ledgers made here (bookie ids that need not exist).
ENSEMBLE = ("b1", "b2")


def ledger_record(ledger_id: int, ensemble: Sequence[str] = ENSEMBLE) -> LedgerMetadata:
    """An OPEN ledger's metadata on ``ensemble`` (E = Qw = Qa), no password."""
    return LedgerMetadata(ledger_id=ledger_id, ensemble_size=len(ensemble),
                          write_quorum_size=len(ensemble), ack_quorum_size=len(ensemble),
                          fragments=(Fragment(0, tuple(ensemble)),),
                          digest_type=DigestType.CRC32C, password_hash=hash_password(b""))


def put_ledgers(store: MetadataStore, ids: Iterable[int]) -> int:
    """Create the records of ledgers ``ids`` where ``store.layout`` puts them, a
    :meth:`~pybk.meta.interface.MetadataStore.create_many` per batch; how many."""
    records = ((store.layout.ledger_path(i), ledger_record(i).to_bytes()) for i in ids)
    count = 0
    for batch in batches(records):
        store.create_many(batch)
        count += len(batch)
    return count
