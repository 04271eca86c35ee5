"""Torn tails: a journal or entry log whose end was cut, garbled or zeroed by a crash.

The crash states are images of a running bookie's directories (copied while it is open,
after its adds were acknowledged), damaged on purpose, then put back in place and started.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
from crashutil import expected_entry, files, restore_image, take_image

from pybk.errors import NoSuchEntry, NoSuchLedger, Unauthorized
from pybk.storage import Bookie, format_bookie, make_entry
from pybk.storage import journal_codec as codec
from pybk.storage.entries import ENTRY_HEADER

LEDGERS = (7, 8)
HOUR_MS = 3_600_000  # no timed checkpoint during a test


def add_entries(bookie: Bookie, entry_ids: range) -> None:
    """Add entries to both ledgers, interleaved, every third one asynchronously."""
    futures = []
    for entry_id in entry_ids:
        for ledger_id in LEDGERS:
            data = expected_entry(ledger_id, entry_id)
            if entry_id % 3 == 0:
                futures.append(bookie.add_entry_async(ledger_id, entry_id, data, b"key"))
            else:
                bookie.add_entry(ledger_id, entry_id, data, b"key")
    for future in futures:
        future.result(timeout=30)


def assert_entries(bookie: Bookie, entry_ids: range) -> None:
    for entry_id in entry_ids:
        for ledger_id in LEDGERS:
            assert bookie.read_entry(ledger_id, entry_id) == \
                expected_entry(ledger_id, entry_id), f"entry {ledger_id}/{entry_id}"


@pytest.fixture
def journal_image(tmp_path, settings_factory):
    """Settings and an image where 2 x 40 acknowledged entries exist only in the journal."""
    settings = settings_factory(flushInterval=HOUR_MS)
    format_bookie(settings)
    with Bookie(settings) as bookie:
        add_entries(bookie, range(40))
        image = take_image(settings, tmp_path / "image")
    return settings, image


# Each damage takes the journal file and the start and end of the target record (an ADD
# record in the second half), changes the file, and returns the first damaged offset.
def cut_in_header(f, start, end, rng):
    f.truncate(start + 5)
    return start


def cut_in_payload(f, start, end, rng):
    f.truncate((start + codec.RECORD.size + end) // 2)
    return start


def cut_at_boundary(f, start, end, rng):
    f.truncate(start)
    return start


def cut_after_last_record(f, start, end, rng):
    """Nothing lost: only the preallocated zeros after the last record go."""
    last_end = list(codec.scan_journal(f.name))[-1][2]
    f.truncate(last_end)
    return last_end


def garble_header(f, start, end, rng):
    f.seek(start)
    f.write(rng.randbytes(codec.RECORD.size))
    return start


def garble_payload(f, start, end, rng):
    f.seek(start + codec.RECORD.size + ENTRY_HEADER.size // 2)
    f.write(rng.randbytes(8))
    return start


def zero_tail(f, start, end, rng):
    f.seek(0, 2)
    size = f.tell()
    f.seek((start + end) // 2)
    f.write(bytes(size - f.tell()))
    return start


def zero_hole(f, start, end, rng):
    """Zeros in the middle of the records, valid records after them (a lost page)."""
    f.seek(start)
    f.write(bytes((end - start) // 2))
    return start


DAMAGES = [cut_in_header, cut_in_payload, cut_at_boundary, cut_after_last_record,
           garble_header, garble_payload, zero_tail, zero_hole]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage", DAMAGES, ids=lambda d: d.__name__)
def test_torn_journal_tail_loses_only_what_follows_the_damage(journal_image, tmp_path, damage):
    """After a journal tail is cut (in a record header, in a payload, at a boundary, after
    the last record), garbled or zeroed, the bookie starts; every entry whose record lies
    wholly before the damage reads back exactly, every later one raises NoSuchEntry.  The
    bookie then takes the lost entries again, and they survive another crash."""
    settings, image = journal_image
    restore_image(image, settings)
    assert not files(settings, ".log"), "the entries should be in the journal only"
    [journal] = files(settings, ".txn")
    records = list(codec.scan_journal(journal))
    adds = [(ENTRY_HEADER.unpack_from(payload)[:2], end)
            for rtype, payload, end, _crc in records if rtype == codec.ADD]
    assert len(adds) == 80
    starts = {end: previous for previous, (_t, _p, end, _c) in
              zip([codec.HEADER_SIZE] + [r[2] for r in records], records)}
    target_end = adds[55][1]  # entry 27 of the second ledger
    with open(journal, "r+b") as f:
        damaged_at = damage(f, starts[target_end], target_end, random.Random(7))

    survived = {ids for ids, end in adds if end <= damaged_at}
    with Bookie(settings) as bookie:
        for (ledger_id, entry_id), _end in adds:
            if (ledger_id, entry_id) in survived:
                assert bookie.read_entry(ledger_id, entry_id) == \
                    expected_entry(ledger_id, entry_id)
            else:
                with pytest.raises(NoSuchEntry):
                    bookie.read_entry(ledger_id, entry_id)
        for ledger_id in LEDGERS:
            last = bookie.last_entry_id(ledger_id)
            for entry_id in range(last + 1, 40):
                bookie.add_entry(ledger_id, entry_id, expected_entry(ledger_id, entry_id),
                                 b"key")
        assert_entries(bookie, range(40))
        second_crash = take_image(settings, tmp_path / "second-crash")
    restore_image(second_crash, settings)
    with Bookie(settings) as bookie:
        assert_entries(bookie, range(40))


@pytest.mark.timeout(120)
def test_a_torn_first_add_never_leaves_an_entry_without_its_key(tmp_path, settings_factory):
    """A new ledger's first add journals its master key record and the ADD record in one
    write, key first.  Whatever a crash tore of that write (cut at every byte, or the
    key record garbled or zeroed with the ADD record intact), the restarted bookie holds
    nothing of the ledger, or its key alone, or its key and the entry: never the entry
    without its key (a ledger its writer could no longer add to)."""
    settings = settings_factory(flushInterval=HOUR_MS)
    format_bookie(settings)
    ledger_id, key, first = 9, b"key", make_entry(9, 0, -1, b"first entry")
    with Bookie(settings) as bookie:
        bookie.add_entry(ledger_id, 0, first, key)
        image = take_image(settings, tmp_path / "image")
    [journal] = files(settings, ".txn")
    records = list(codec.scan_journal(journal))
    (key_type, key_payload, key_end, _), (add_type, add_payload, add_end, _) = records[-2:]
    assert (key_type, key_payload, add_type, add_payload) == \
        (codec.MASTER_KEY, codec.LEDGER_ID.pack(ledger_id) + key, codec.ADD, first)
    key_start = key_end - codec.RECORD.size - len(key_payload)

    def damaged(offset: int, garbage: bytes | None = None) -> str:
        """What the bookie holds of the ledger once the journal was cut at ``offset`` (or,
        with ``garbage``, once that was written there)."""
        restore_image(image, settings)
        with open(journal, "r+b") as f:
            if garbage is None:
                f.truncate(offset)
            else:
                f.seek(offset)
                f.write(garbage)
        with Bookie(settings) as bookie:
            try:
                held = "entry" if bookie.read_entry(ledger_id, 0) == first else "wrong"
            except NoSuchLedger:
                return "nothing"
            except NoSuchEntry:
                held = "key"
            with pytest.raises(Unauthorized):  # the key is the ledger's, not an empty one
                bookie.add_entry(ledger_id, 1, make_entry(ledger_id, 1, 0, b"x"), b"other")
            bookie.add_entry(ledger_id, 1, make_entry(ledger_id, 1, 0, b"x"), key)
            return held

    for cut in range(key_start, add_end + 1):
        expected = "nothing" if cut < key_end else "key" if cut < add_end else "entry"
        assert damaged(cut) == expected, f"cut at {cut}"
    for garbage in (b"\xff", bytes(len(key_payload))):  # garbled, or a lost page
        assert damaged(key_end - len(key_payload), garbage) == "nothing", \
            f"key record's payload overwritten with {garbage[:1]!r}"


ENTRY_LOG_DAMAGES = ["garbage_appended", "unindexed_records", "torn_unindexed_record",
                     "garbled_unindexed_records", "zeroed_unindexed_records"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage", ENTRY_LOG_DAMAGES)
def test_entry_log_tail_beyond_the_index_is_ignored(tmp_path, settings_factory, damage):
    """A crash leaves the newest entry log unsealed, holding after the records the index
    points at either garbage or records that were never indexed (whole, torn, garbled or
    zeroed: the crash came between the entry log's sync and the index commit, or during
    the append).  The bookie starts, every entry reads back exactly (the journal replays
    what the index lacks), and again after the log was sealed and the bookie restarted."""
    settings = settings_factory(flushInterval=HOUR_MS)
    format_bookie(settings)
    with Bookie(settings) as bookie:
        add_entries(bookie, range(20))
        bookie.checkpoint()              # entries 0..19: entry log and index
        add_entries(bookie, range(20, 40))  # entries 20..39: journal only
        image = take_image(settings, tmp_path / "image")
        bookie.checkpoint()              # entries 20..39 appended to the same log
        [log_path] = files(settings, ".log")
        grown = Path(log_path).read_bytes()
    restore_image(image, settings)
    indexed = Path(log_path).read_bytes()
    assert struct.unpack_from(">Q", indexed, 24) == (0,), "the log should be unsealed"
    assert grown.startswith(indexed) and len(grown) > len(indexed)
    rng = random.Random(damage)
    tail = bytearray(grown[len(indexed):])
    if damage == "garbage_appended":
        tail = rng.randbytes(5000)
    elif damage == "torn_unindexed_record":
        tail = tail[:len(tail) // 2]
    elif damage == "garbled_unindexed_records":
        tail[len(tail) // 3:len(tail) // 3 + 64] = rng.randbytes(64)
    elif damage == "zeroed_unindexed_records":
        tail[len(tail) // 3:] = bytes(len(tail) - len(tail) // 3)
    Path(log_path).write_bytes(indexed + tail)
    for _start in range(2):
        with Bookie(settings) as bookie:
            assert_entries(bookie, range(40))
