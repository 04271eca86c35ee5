"""The LMDB index on its own: a checkpoint's locations and ledger states land whole,
however many."""

from __future__ import annotations

import pytest

from pybk.storage import index as index_module
from pybk.storage.index import PUT_SLICE_ITEMS, Index, StoredLedgerState, StoredLocation

pytestmark = pytest.mark.timeout(60)


def test_a_checkpoint_commits_every_location_in_slices_and_newer_ones_replace_older(tmp_path):
    """Locations are written a slice at a time; a slice of only replaced keys (an entry
    re-added, then checkpointed again) must not end the commit early."""
    count = 2 * PUT_SLICE_ITEMS + 7
    index = Index(str(tmp_path))
    try:
        index.commit_checkpoint(Index.location_items(5, range(count), 1,
                                                     range(0, 100 * count, 100),
                                                     [10] * count), {}, (), 1)
        assert index.entry_ids(5) == list(range(count))
        index.commit_checkpoint(Index.location_items(5, range(count), 2, range(count),
                                                     [20] * count), {}, (), 2)
        assert [index.location(5, e) for e in range(count)] == \
            [StoredLocation(2, e, 20) for e in range(count)]
        assert index.last_log_id() == 2
    finally:
        index.close()


def test_a_checkpoint_stores_every_ledger_state_in_slices(tmp_path):
    """States are encoded and put a slice at a time: each of more than two slices' worth
    reads back as committed (fence, deletion, LACs, key), and a later commit replaces
    them; the deleted ones get their ``deleted`` rows."""
    count = 2 * PUT_SLICE_ITEMS + 7

    def state(ledger_id: int, lac: int) -> StoredLedgerState:
        return StoredLedgerState(b"key-%d" % ledger_id, ledger_id % 3 == 0, ledger_id % 5 == 0,
                                 lac, ledger_id if ledger_id % 2 else None)

    index = Index(str(tmp_path))
    try:
        for lac in (1, 2):
            states = {lid: state(lid, lac) for lid in range(count, 0, -1)}  # unordered
            index.commit_checkpoint(iter(()), states, (), 1)
            assert dict(index.ledger_states()) == states
        assert index.deleted_ledgers() == [lid for lid in range(1, count + 1) if lid % 5 == 0]
    finally:
        index.close()


def test_tombstones_keep_forgotten_ids_per_range_across_reopening(tmp_path, monkeypatch):
    """A forgotten id far above the generator's covers its own range of 2**20 ids, not
    every id below it; reopened, the index covers what it covered; past
    FORGOTTEN_RANGES_MAX ranges the lowest is folded into the floor; an index that kept
    only the highest forgotten id (before the ranges) covers every id below it."""
    high = 2 ** 39
    index = Index(str(tmp_path / "ranges"))
    try:
        index.forget_ledgers([5, high + 3])
        index.forget_ledgers([high])
    finally:
        index.close()
    index = Index(str(tmp_path / "ranges"))
    try:
        tombstones = index.tombstones()
        assert [tombstones.covers(i) for i in (0, 5, 6, 1000, high - 1, high, high + 3,
                                               high + 4, high + 2 ** 20)] == \
            [True, True, False, False, False, True, True, False, False]
        monkeypatch.setattr(index_module, "FORGOTTEN_RANGES_MAX", 2)
        index.forget_ledgers([2 ** 50])  # three ranges: range 0 folds into the floor
        tombstones = index.tombstones()
        assert tombstones.floor == 5 and set(tombstones.ranges.values()) == {high + 3, 2 ** 50}
        assert index.tombstones().covers(4) and not index.tombstones().covers(1000)
    finally:
        index.close()

    legacy = Index(str(tmp_path / "legacy"))
    try:
        with legacy._env.begin(write=True, db=legacy._meta) as txn:
            txn.put(index_module.FORGOTTEN_KEY, index_module.LEDGER_KEY.pack(high))
        assert legacy.tombstones().covers(1000) and not legacy.tombstones().covers(high + 1)
        legacy.forget_ledgers([high + 2 ** 21])
        assert legacy.tombstones().covers(1000) and legacy.tombstones().covers(high + 2 ** 21)
    finally:
        legacy.close()


def test_the_join_floor_is_recorded_once_and_only_for_an_index_that_held_nothing(tmp_path):
    fresh = Index(str(tmp_path / "fresh"))
    try:
        assert fresh.join_floor() == -1
        assert fresh.record_join_floor(7) == 7
        # Pending until the node joined: a start that failed has it raised, never lowered.
        assert fresh.record_join_floor(9) == 9 and fresh.record_join_floor(8) == 9
        fresh.confirm_join_floor()
        assert fresh.record_join_floor(12) == 9 and fresh.join_floor() == 9
    finally:
        fresh.close()
    served = Index(str(tmp_path / "served"))
    try:
        served.commit_checkpoint((), {3: (b"key", False, False, -1, None)}, (), 0)
        assert served.record_join_floor(7) == -1 and served.join_floor() == -1
    finally:
        served.close()
