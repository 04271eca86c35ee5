"""Which entries each bookie of a ledger holds (pybk.autorecovery.replicas), checked against
:meth:`LedgerMetadata.write_set` entry by entry."""

from __future__ import annotations

import itertools

import pytest

from pybk.autorecovery.replicas import Span, bookie_holds_entries, coverage, first_held, spans
from pybk.meta.ledger_metadata import (
    DigestType,
    Fragment,
    LedgerMetadata,
    LedgerState,
    hash_password,
)


def ledger(e: int, qw: int, fragments, last: int | None = None) -> LedgerMetadata:
    closed = last is not None
    return LedgerMetadata(
        ledger_id=1, ensemble_size=e, write_quorum_size=qw, ack_quorum_size=1,
        fragments=tuple(Fragment(first, tuple(ensemble)) for first, ensemble in fragments),
        digest_type=DigestType.CRC32C, password_hash=hash_password(b""),
        state=LedgerState.CLOSED if closed else LedgerState.OPEN,
        last_entry_id=last, length=0 if closed else None)


def test_spans_end_where_the_next_fragment_starts():
    metadata = ledger(3, 2, [(0, "abc"), (5, "abd")], last=9)
    assert spans(metadata) == [Span(0, 4, tuple("abc")), Span(5, 9, tuple("abd"))]
    open_one = ledger(3, 2, [(0, "abc"), (5, "abd")])
    assert spans(open_one)[-1].last is None
    assert spans(open_one, last_entry_id=7)[-1].last == 7


@pytest.mark.parametrize("e,qw", [(3, 2), (3, 3), (4, 2), (5, 3), (1, 1)])
def test_what_a_bookie_holds_agrees_with_the_write_sets(e, qw):
    bookies = "abcdefg"[:e]
    for entries in range(0, 2 * e + 2):
        metadata = ledger(e, qw, [(0, bookies)], last=entries - 1)
        span = spans(metadata)[0]
        for index, bookie in enumerate(bookies):
            held = [x for x in range(entries) if bookie in metadata.write_set(x)]
            assert first_held(metadata, index, span) == (held[0] if held else None)
            if held:
                assert first_held(metadata, index, span, backwards=True) == held[-1]
            assert bookie_holds_entries(metadata, bookie) == bool(held)


def test_a_bookie_given_no_entry_of_a_short_fragment_holds_nothing():
    metadata = ledger(3, 2, [(0, "abc")], last=0)  # entry 0 on a and b only
    assert not bookie_holds_entries(metadata, "c")
    assert not bookie_holds_entries(ledger(3, 2, [(0, "abc")], last=-1), "a")  # empty
    assert bookie_holds_entries(ledger(3, 2, [(0, "abc")]), "c")  # open: may come


@pytest.mark.parametrize("e,qw", [(3, 2), (3, 3), (5, 2)])
def test_coverage_counts_entries_short_of_a_replica(e, qw):
    bookies = "abcde"[:e]
    metadata = ledger(e, qw, [(0, bookies), (7, "vwxyz"[:e])], last=20)
    for lost_count in range(3):
        for missing in itertools.combinations(bookies + "vwxyz"[:e], lost_count):
            live = [qw - len(set(missing) & set(metadata.write_set(x))) for x in range(21)]
            found = coverage(metadata, missing)
            assert found.entries == 21
            assert found.short_entries == sum(1 for n in live if n < qw)
            assert found.min_replicas == min(live)
    assert coverage(ledger(e, qw, [(0, bookies)], last=-1), bookies[:1]).min_replicas is None
