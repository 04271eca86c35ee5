"""Ledger layouts (pybk.meta.layout): BookKeeper's paths for ledger ids, listing ledgers
among other records, and the LAYOUT record's text.  On the embedded store (no server)."""

from __future__ import annotations

import pytest

from pybk.errors import InvalidLedgerId, MalformedMetadata
from pybk.meta import DigestType, EmbeddedMetadataStore, LedgerManager, paths
from pybk.meta import layout as layouts
from pybk.meta.layout import FLAT, HIERARCHICAL

pytestmark = pytest.mark.timeout(60)

LONG_FROM = 2 ** 31 - 1  # BookKeeper's Integer.MAX_VALUE: the long form from here on


@pytest.mark.parametrize("ledger_id, flat, hierarchical", [
    (0, "/ledgers/L0000000000", "/ledgers/00/0000/L0000"),
    (1, "/ledgers/L0000000001", "/ledgers/00/0000/L0001"),
    (1234567890, "/ledgers/L1234567890", "/ledgers/12/3456/L7890"),
    (LONG_FROM - 1, "/ledgers/L2147483646", "/ledgers/21/4748/L3646"),
    (LONG_FROM, "/ledgers/L2147483647", "/ledgers/000/0000/0021/4748/L3647"),
    (2 ** 63 - 1, "/ledgers/L9223372036854775807", "/ledgers/922/3372/0368/5477/L5807"),
])
def test_ledger_paths_are_bookkeepers(ledger_id, flat, hierarchical):
    assert FLAT.ledger_path(ledger_id) == flat
    assert HIERARCHICAL.ledger_path(ledger_id) == hierarchical


@pytest.mark.parametrize("bad", [-1, 2 ** 63, 1.0, True, "1"])
def test_invalid_ledger_ids_are_refused(bad):
    for layout in (FLAT, HIERARCHICAL):
        with pytest.raises(InvalidLedgerId, match="ledger id"):  # the caller's, a 4xx
            layout.ledger_path(bad)


@pytest.mark.parametrize("layout", [FLAT, HIERARCHICAL], ids=lambda layout: layout.name)
def test_listing_finds_every_ledger_and_nothing_else(tmp_path, layout):
    ids = [0, 1, 9999, 10_000, 123_456_789, LONG_FROM - 1, LONG_FROM, 2 ** 40 + 7]
    with EmbeddedMetadataStore(tmp_path / "meta") as store:
        assert sorted(layout.ledger_ids(store)) == []
        for ledger_id in ids:
            store.create(layout.ledger_path(ledger_id), b"")
        for other in (paths.AVAILABLE + "/b1:3181", paths.IDGEN + "/ID-0000000001",
                      paths.LAYOUT, paths.INSTANCE_ID, paths.COOKIES + "/b1:3181",
                      "/ledgers/L12", "/ledgers/00/abcd/L0001", "/ledgers/01/0000/0001",
                      "/ledgers/00/0000/L00012", "/ledgers/Lx000000000"):
            store.create(other, b"")
        assert sorted(layout.ledger_ids(store)) == ids


def test_the_ledger_manager_follows_the_store_layout(tmp_path):
    with EmbeddedMetadataStore(tmp_path / "meta") as store:
        assert store.layout is FLAT  # the embedded store's default
        store.layout = HIERARCHICAL
        manager = LedgerManager(store)
        created = manager.create_ledger(["b1", "b2"], 2, 2, DigestType.CRC32C, b"")
        assert store.exists(HIERARCHICAL.ledger_path(created.metadata.ledger_id))
        assert manager.ledger_ids() == [created.metadata.ledger_id]


def test_layout_record_is_bookkeepers_text():
    assert layouts.encode(HIERARCHICAL) == (
        b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1")
    assert layouts.encode(FLAT) == b"2\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:1"
    for layout in (FLAT, HIERARCHICAL):
        assert layouts.decode(layouts.encode(layout)) is layout
        assert layouts.layout_named(layout.name) is layout


@pytest.mark.parametrize("data, error", [
    (b"", "layout format 2"),
    (b"3\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:1", "layout format 2"),
    (b"2", "layout format 2"),
    (b"2\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:2", "does not implement"),
    (b"2\norg.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory:1",
     "does not implement"),
])
def test_unknown_layout_records_are_refused(data, error):
    with pytest.raises(MalformedMetadata, match=error):
        layouts.decode(data)
