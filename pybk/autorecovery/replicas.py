"""Which entries of a ledger each bookie holds, from its metadata alone.

Entry ``e`` of a fragment lives on its write set: the ``Qw`` bookies of the fragment's
ensemble from index ``e % E`` on, wrapping (:meth:`LedgerMetadata.write_set`).  So the
bookie at ensemble index ``i`` holds exactly the entries with ``(i - e) mod E < Qw``.
When ``Qw < E`` a bookie holds only some of a fragment's entries, and a fragment shorter
than ``E`` entries may give a bookie of its ensemble none at all: such a bookie's loss
costs that ledger nothing.

A fragment's entries end where the next fragment starts; the last fragment's end at the
ledger's last entry when it is CLOSED, and is unknown (``None``) while it is OPEN or
IN_RECOVERY, unless the caller knows the last entry (a LAC it read).
"""

from __future__ import annotations

from typing import Iterable, Iterator, NamedTuple

from pybk.meta.ledger_metadata import LedgerMetadata, LedgerState


class Span(NamedTuple):
    """Entries ``first`` .. ``last`` (inclusive; ``last`` None: no known end) on
    ``ensemble``.  ``last < first`` when the span holds no entry."""

    first: int
    last: int | None
    ensemble: tuple[str, ...]


def spans(metadata: LedgerMetadata, last_entry_id: int | None = None) -> list[Span]:
    """The ledger's fragments as spans.  ``last_entry_id`` ends the last one when the
    metadata does not (an open ledger's LAC); a CLOSED ledger's own last entry wins."""
    if metadata.state is LedgerState.CLOSED:
        last_entry_id = metadata.last_entry_id
    fragments = metadata.fragments
    found = []
    for index, fragment in enumerate(fragments):
        last = (fragments[index + 1].first_entry_id - 1 if index + 1 < len(fragments)
                else last_entry_id)
        found.append(Span(fragment.first_entry_id, last, fragment.ensemble))
    return found


def holds(metadata: LedgerMetadata, index: int, entry_id: int) -> bool:
    """Whether the bookie at ensemble ``index`` holds ``entry_id`` of its fragment."""
    return (index - entry_id) % metadata.ensemble_size < metadata.write_quorum_size


def first_held(metadata: LedgerMetadata, index: int, span: Span,
               backwards: bool = False) -> int | None:
    """The first (``backwards``: the last; then the span needs an end) entry of ``span``
    that the bookie at ``index`` holds, or None if it holds none there."""
    if span.last is not None and span.last < span.first:
        return None
    steps = range(metadata.ensemble_size)
    if backwards:
        assert span.last is not None, "the last entry of a span without an end"
        candidates: Iterable[int] = (span.last - step for step in steps)
    else:
        candidates = (span.first + step for step in steps)
    for entry_id in candidates:
        if span.first <= entry_id and (span.last is None or entry_id <= span.last) \
                and holds(metadata, index, entry_id):
            return entry_id
    return None


def bookie_holds_entries(metadata: LedgerMetadata, bookie_id: str,
                         last_entry_id: int | None = None) -> bool:
    """Whether ``bookie_id`` holds (or, in a span without an end, may come to hold) any
    entry of the ledger."""
    for span in spans(metadata, last_entry_id):
        if bookie_id in span.ensemble and \
                first_held(metadata, span.ensemble.index(bookie_id), span) is not None:
            return True
    return False


class Coverage(NamedTuple):
    """How the entries of a ledger are replicated, given the bookies that are missing."""

    entries: int                #: entries counted (those of spans with an end)
    short_entries: int          #: of those, entries with a replica on a missing bookie
    min_replicas: int | None    #: the fewest live replicas of any entry (None: no entry)


def coverage(metadata: LedgerMetadata, missing: Iterable[str],
             last_entry_id: int | None = None) -> Coverage:
    """Count the ledger's entries, those lacking a replica (on a bookie of ``missing``),
    and the fewest live replicas any has.  Spans without an end count nothing."""
    missing = set(missing)
    e, qw = metadata.ensemble_size, metadata.write_quorum_size
    entries = short = 0
    fewest: int | None = None
    for span in spans(metadata, last_entry_id):
        if span.last is None or span.last < span.first:
            continue
        for start, write_set in enumerate(_write_sets(span.ensemble, e, qw)):
            count = _count_congruent(span.first, span.last, start, e)
            if not count:
                continue
            lost = len(missing.intersection(write_set))
            entries += count
            if lost:
                short += count
            fewest = qw - lost if fewest is None else min(fewest, qw - lost)
    return Coverage(entries, short, fewest)


def _write_sets(ensemble: tuple[str, ...], e: int, qw: int) -> Iterator[tuple[str, ...]]:
    for start in range(e):
        yield tuple(ensemble[(start + i) % e] for i in range(qw))


def _count_congruent(first: int, last: int, residue: int, modulus: int) -> int:
    """How many ids in ``first .. last`` are ``residue`` modulo ``modulus``."""
    return (last - residue) // modulus - (first - 1 - residue) // modulus
