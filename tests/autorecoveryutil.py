"""Helpers of the autorecovery tests (the auditor's and the replication workers'):
a client and an under-replication manager on the test's cluster (the ``cluster``
fixture), a process's whole log, ledgers written for them, what the marks and the
ledgers' metadata say, and what the bookies hold (read from each one)."""

from __future__ import annotations

from typing import Collection

import pytest
import zkutil
from clusterutil import PASSWORD, BookieProcess, payload

import pybk
from pybk.autorecovery.replicas import bookie_holds_entries
from pybk.client import BookKeeper
from pybk.client.digest import DigestManager
from pybk.errors import NoSuchEntry, NoSuchLedger
from pybk.meta.ledger_metadata import LedgerMetadata, LedgerState
from pybk.meta.underreplication import UnderreplicationManager
from pybk.meta.zookeeper import ZooKeeperMetadataStore
from pybk.settings import ClientSettings

#: Clients that replace a silent bookie and give up on a read quickly.
FAST = ClientSettings(addEntryTimeout=2.0, readTimeout=1.0)


@pytest.fixture
def cluster(closing, address):
    """A client of the test's cluster and an under-replication manager on it."""
    bk = closing.enter_context(pybk.connect(address, FAST,
                                                  zk_settings=zkutil.settings()))
    store = closing.enter_context(ZooKeeperMetadataStore(address, zkutil.settings()))
    return bk, UnderreplicationManager(store)


def full_log(process: BookieProcess) -> str:
    with open(process.log_path, "rb") as f:
        return f.read().decode(errors="replace")


def write_ledger(bk: BookKeeper, e: int, qw: int, entries: int, close: bool = True,
                 password: bytes = PASSWORD):
    lh = bk.create_ledger(e, qw, min(qw, 2), password=password)
    for entry_id in range(entries):
        lh.add_entry(payload(entry_id))
    if close:
        lh.close()
    return lh


def holds_entries(metadata: LedgerMetadata, bookie_id: str) -> bool:
    """Whether the ledger gave ``bookie_id`` an entry (an open ledger's last fragment
    may give it any later one)."""
    if metadata.state is not LedgerState.CLOSED:
        if bookie_id in metadata.fragments[-1].ensemble:
            return True
        last = metadata.fragments[-1].first_entry_id - 1
    else:
        last = metadata.last_entry_id
    return any(bookie_id in metadata.write_set(e) for e in range(last + 1))


def expected_marks(bk: BookKeeper, bookie_id: str) -> set[int]:
    return {ledger_id for ledger_id in bk.list_ledgers()
            if holds_entries(bk.ledger_manager.read(ledger_id).metadata, bookie_id)}


def marks(manager: UnderreplicationManager) -> dict[int, tuple[str, ...]]:
    return {mark.ledger_id: mark.replicas for mark in manager.underreplicated()}


def repaired(bk: BookKeeper, manager: UnderreplicationManager, lost: str) -> bool:
    """Whether no ledger is marked and none gives ``lost`` an entry any more."""
    return not marks(manager) and not any(
        bookie_holds_entries(bk.ledger_manager.read(ledger_id).metadata, lost)
        for ledger_id in bk.list_ledgers())


def check_replicas(bk: BookKeeper, metadata: LedgerMetadata, last: int,
                   on: Collection[str] | None = None) -> None:
    """Every entry up to ``last`` is on every bookie of its write set (of those among
    ``on``, if given), as written."""
    digest = DigestManager(metadata.ledger_id, metadata.digest_type, PASSWORD)
    for entry_id in range(last + 1):
        for bookie_id in metadata.write_set(entry_id):
            if on is not None and bookie_id not in on:
                continue
            data = bk.bookie_client(bookie_id).read(metadata.ledger_id, entry_id).result(10)
            assert digest.decode(entry_id, data).data == payload(entry_id), \
                (metadata.ledger_id, entry_id, bookie_id)


def entries_on(bk: BookKeeper, bookie_id: str, metadata: LedgerMetadata) -> dict[int, int]:
    """The entries of the closed ledger that ``bookie_id`` holds, with their sizes."""
    held = {}
    for entry_id in range(metadata.last_entry_id + 1):
        try:
            held[entry_id] = len(bk.bookie_client(bookie_id).read(
                metadata.ledger_id, entry_id).result(10))
        except (NoSuchEntry, NoSuchLedger):
            pass
    return held
