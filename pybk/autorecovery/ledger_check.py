"""The auditor's ledger check: do the live bookies of a ledger hold what they should?

For every span with a known end (:mod:`pybk.autorecovery.replicas`: every fragment of a
CLOSED ledger, all but the last of an open one) and every bookie of its ensemble that is
registered, the check reads the first and the last entry of the span that the bookie
should hold, and ``percentage`` percent of the others, picked at random (BookKeeper's
``LedgerChecker`` with ``auditorLedgerVerificationPercentage``).  A bookie that answers
NoSuchEntry or NoSuchLedger lacks entries it was given: it lost a disk, or it was
re-formatted and came back under its old id.  Other failures (a timeout, a bookie that
went away meanwhile) prove nothing and are left to the next check or to the registry
watch.  Reads do not fence and carry no digest check: the question is only whether the
bookie has the entry.
"""

from __future__ import annotations

import logging
import random
from concurrent.futures import Future
from typing import Callable, Collection

from pybk.autorecovery.replicas import first_held, holds, spans
from pybk.client.transport import BookieClient
from pybk.errors import BookKeeperError, NoSuchEntry, NoSuchLedger
from pybk.meta.ledger_metadata import LedgerMetadata

log = logging.getLogger(__name__)

#: Entries sampled from one span of one bookie at most, whatever the percentage.
SAMPLE_MAX = 1_000


def bookies_lacking_entries(metadata: LedgerMetadata, registered: Collection[str],
                            client_for: Callable[[str], BookieClient], percentage: int,
                            timeout_s: float) -> set[str]:
    """The registered bookies of the ledger that lack an entry they should hold (see
    the module docstring).  Waits at most ``timeout_s`` for each read."""
    return {bookie_id for _first, bookie_id in fragments_lacking_entries(
        metadata, registered, client_for, percentage, timeout_s)}


def fragments_lacking_entries(metadata: LedgerMetadata, registered: Collection[str],
                              client_for: Callable[[str], BookieClient], percentage: int,
                              timeout_s: float) -> set[tuple[int, str]]:
    """Where the registered bookies of the ledger lack entries they should hold:
    ``(first entry id of the fragment, bookie id)`` pairs."""
    reads: list[tuple[int, str, int, Future]] = []
    for span in spans(metadata):
        if span.last is None:
            continue  # an open ledger's last fragment: its end is not known
        for index, bookie_id in enumerate(span.ensemble):
            if bookie_id not in registered:
                continue
            first = first_held(metadata, index, span)
            if first is None:
                continue
            last = first_held(metadata, index, span, backwards=True)
            assert last is not None  # the span holds an entry of this bookie: first
            wanted = {first, last} | _sample(metadata, index, first, last, percentage)
            client = client_for(bookie_id)
            for entry_id in sorted(wanted):
                reads.append((span.first, bookie_id, entry_id,
                              client.read(metadata.ledger_id, entry_id)))
    lacking = set()
    for span_first, bookie_id, entry_id, read in reads:
        try:
            read.result(timeout_s)
        except (NoSuchEntry, NoSuchLedger):
            log.warning("ledger check: bookie %s lacks entry %d of ledger %d", bookie_id,
                        entry_id, metadata.ledger_id)
            lacking.add((span_first, bookie_id))
        except (BookKeeperError, TimeoutError) as e:
            log.info("ledger check: reading entry %d of ledger %d from %s failed (%s); "
                     "not counted", entry_id, metadata.ledger_id, bookie_id, e)
    return lacking


def _sample(metadata: LedgerMetadata, index: int, first: int, last: int,
            percentage: int) -> set[int]:
    """About ``percentage`` percent of the entries in ``first .. last`` that the bookie
    at ``index`` holds (at most SAMPLE_MAX)."""
    if percentage <= 0 or last <= first:
        return set()
    held_share = metadata.write_quorum_size / metadata.ensemble_size
    count = min(SAMPLE_MAX, int((last - first + 1) * held_share * percentage / 100))
    picked = set()
    for _ in range(count):
        entry_id = random.randint(first, last)
        while not holds(metadata, index, entry_id):  # the next one it holds (<= E on)
            entry_id += 1
        if entry_id <= last:
            picked.add(entry_id)
    return picked
