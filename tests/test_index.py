"""The LMDB index on its own: a checkpoint's locations and ledger states land whole,
however many."""

from __future__ import annotations

import pytest

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
