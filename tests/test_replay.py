"""Replay of a journal whose records are interleaved across ledgers: replay works on a
batch's ADD records at once (a step per ledger, the records written to entry logs as they
were read), so what it does per record must still hold: a deleted ledger's records are
dropped from among the others', a ledger's LAC is the highest its records carry (not the
last), and everything survives a second start."""

from __future__ import annotations

import os

import pytest
from conftest import KEY, entry

from pybk.errors import NoSuchLedger
from pybk.storage import journal_codec as codec

pytestmark = pytest.mark.timeout(60)

LIVE, DELETED = 1, 2


def crafted_records() -> list[tuple[int, bytes]]:
    """Both ledgers' adds interleaved, ledger DELETED deleted half-way (its later records
    interleaved with LIVE's too), and LIVE's LACs not in order (a recovery's re-add
    carries a lower one than the add before it)."""
    records = [(codec.MASTER_KEY, codec.LEDGER_ID.pack(LIVE) + KEY),
               (codec.MASTER_KEY, codec.LEDGER_ID.pack(DELETED) + KEY)]
    for e in range(3):
        records += [(codec.ADD, entry(LIVE, e)), (codec.ADD, entry(DELETED, e))]
    records.append((codec.DELETE, codec.LEDGER_ID.pack(DELETED)))
    for e in range(3, 6):
        records += [(codec.ADD, entry(LIVE, e, lac=9 if e == 4 else e - 1)),
                    (codec.ADD, entry(DELETED, e))]
    return records


def test_interleaved_records_of_a_deleted_ledger_and_lacs_out_of_order(bookie_factory,
                                                                        settings_factory):
    settings = settings_factory()
    bookie_factory(settings).close()  # formatted, with a LastLogMark
    current = os.path.join(settings.journalDirectory, "current")
    journal_id = max(codec.list_journal_ids(current)) + 1  # after the mark: replayed
    with open(os.path.join(current, codec.journal_file_name(journal_id)), "wb") as f:
        f.write(codec.file_header(journal_id))
        for rtype, payload in crafted_records():
            f.write(codec.record_header(rtype, payload) + payload)
    for _start in range(2):  # the replay, then a start after its checkpoint
        bookie = bookie_factory(settings)
        assert [bookie.read_entry(LIVE, e) for e in range(6)] == \
            [entry(LIVE, e, lac=9 if e == 4 else e - 1) for e in range(6)]
        assert bookie.read_lac(LIVE) == 9
        assert not bookie.ledger_exists(DELETED)
        with pytest.raises(NoSuchLedger):
            bookie.read_entry(DELETED, 4)
        bookie.close()
