"""Replay of a journal whose records are interleaved across ledgers: a deleted ledger's
records are dropped from among the others', a new ledger's key among the adds changes
nothing for the others, a ledger's LAC is the highest its records carry (not the last),
and everything survives a second start."""

from __future__ import annotations

import os

import pytest
from conftest import KEY, entry

from pybk.errors import NoSuchLedger
from pybk.storage import journal_codec as codec

pytestmark = pytest.mark.timeout(60)

LIVE, DELETED, NEW = 1, 2, 3


def lac_of(ledger_id: int, entry_id: int) -> int:
    """LIVE's entry 4 carries a higher LAC than entry 5 (a recovery's re-add after it)."""
    return 9 if (ledger_id, entry_id) == (LIVE, 4) else entry_id - 1


def crafted_records(delete: bool) -> list[tuple[int, bytes]]:
    """Three ledgers' adds interleaved, a new ledger's key among them (so the adds do not
    lie back to back), ledger DELETED deleted half-way if ``delete`` (its later records
    interleaved with the others' too), and LIVE's LACs not in order."""
    records = [(codec.MASTER_KEY, codec.LEDGER_ID.pack(ledger_id) + KEY)
               for ledger_id in (LIVE, DELETED)]
    for e in range(6):
        if e == 2:
            records.append((codec.MASTER_KEY, codec.LEDGER_ID.pack(NEW) + KEY))
        if e == 3 and delete:
            records.append((codec.DELETE, codec.LEDGER_ID.pack(DELETED)))
        records += [(codec.ADD, entry(ledger_id, e, lac=lac_of(ledger_id, e)))
                    for ledger_id in (LIVE, DELETED, NEW) if ledger_id != NEW or e >= 2]
    return records


@pytest.mark.parametrize("delete", [False, True], ids=["no-delete", "delete"])
def test_interleaved_records_of_a_deleted_ledger_and_lacs_out_of_order(bookie_factory,
                                                                        settings_factory,
                                                                        delete):
    settings = settings_factory()
    bookie_factory(settings).close()  # formatted, with a LastLogMark
    current = os.path.join(settings.journalDirectory, "current")
    journal_id = max(codec.list_journal_ids(current)) + 1  # after the mark: replayed
    with open(os.path.join(current, codec.journal_file_name(journal_id)), "wb") as f:
        f.write(codec.file_header(journal_id))
        for rtype, payload in crafted_records(delete):
            f.write(codec.record_header(rtype, payload) + payload)
    live = (LIVE, NEW) if delete else (LIVE, DELETED, NEW)
    for _start in range(2):  # the replay, then a start after its checkpoint
        bookie = bookie_factory(settings)
        for ledger_id in live:
            ids = range(2 if ledger_id == NEW else 0, 6)
            assert [bookie.read_entry(ledger_id, e) for e in ids] == \
                [entry(ledger_id, e, lac=lac_of(ledger_id, e)) for e in ids]
        assert bookie.read_lac(LIVE) == 9
        if delete:
            assert not bookie.ledger_exists(DELETED)
            with pytest.raises(NoSuchLedger):
                bookie.read_entry(DELETED, 4)
        bookie.close()
