"""Deferred sync: BookKeeper's ``WriteFlag.DEFERRED_SYNC`` and the force that ends it.

A ledger created with ``write_flags={WriteFlag.DEFERRED_SYNC}`` has its adds acknowledged
by each bookie once written to its journal (page cache), before fdatasync: an
acknowledged add survives its bookies' processes dying, not a power cut or a kernel
crash.  :meth:`pybk.client.LedgerHandle.force` makes them durable: it sends FORCE_LEDGER
for the entries acknowledged since the last force to the bookies of their write sets,
each of which answers once a journal marker queued behind everything it had received (a
client's requests reach a bookie in order) is synced, with how many of those entries it
holds.  The entry it covered up to becomes the *durable LAC* (BookKeeper's
``lastAddForced``).

Which answers count.  A force covers entry *e* once Qa bookies of *e*'s write set each

* acknowledged *e*'s add to this writer: per bookie, the writer keeps the highest entry
  up to which the bookie acknowledged every add of its write sets (:class:`AckWatermarks`),
  so a bookie that refused an add (read-only, failing) or never got it counts for
  nothing from there on, even though it syncs its journal and answers the force OK; and
* answered this force OK, holding every entry of the range forced that its write sets
  give it: a bookie that restarted after a power cut lost the unsynced adds it had
  acknowledged (and may have taken later ones since), so it holds fewer than it should
  and counts for none of the range.

A bookie counts for an entry only together with every earlier entry of its write sets (a
watermark, not a set of entries), which is how the force decides per range: for each
write set, the highest entry of the range it stores needs Qa such bookies.

The rules, as BookKeeper's:

* the LAC the writer piggybacks on entries and sends as explicit LAC is the durable LAC,
  so a reader never reads an entry that is not durable on Qa bookies;
* a DEFERRED_SYNC ledger never changes its ensemble: a bookie failing an add closes the
  ledger at the durable LAC (entries past it were never promised);
* close forces first, and closes at the durable LAC.
"""

from __future__ import annotations

import enum
import threading
from concurrent.futures import Future
from typing import Callable, Sequence

from pybk.errors import BookKeeperError, MalformedMessage


class WriteFlag(enum.Enum):
    """Flags a ledger is created with (BookKeeper's ``WriteFlag``)."""

    #: Adds acknowledged once written, durable after :meth:`LedgerHandle.force`.
    DEFERRED_SYNC = "DEFERRED_SYNC"


class AckWatermarks:
    """Per bookie, the highest entry id up to which it acknowledged every add of the
    write sets it is in (``start``: none yet), for the entries of one ensemble.

    ``in_write_set(bookie_id, entry_id)`` says whether the bookie stores the entry.  An
    acknowledgement past a missing one waits above the watermark until the missing one
    comes (adds of caller-given ids are answered in any order); one that never comes (a
    refused add) holds the watermark below it for good.  Not thread-safe: the caller
    holds its lock around :meth:`acked`; :meth:`through` is one dictionary read.
    """

    def __init__(self, start: int, in_write_set: Callable[[str, int], bool],
                 ensemble_size: int) -> None:
        self._start = start
        self._in_write_set = in_write_set
        self._ensemble_size = ensemble_size
        self._through: dict[str, int] = {}
        self._ahead: dict[str, set[int]] = {}  # acknowledged past a missing one

    def through(self, bookie_id: str) -> int:
        """The bookie's watermark."""
        return self._through.get(bookie_id, self._start)

    def acked(self, bookie_id: str, entry_id: int) -> None:
        """The bookie acknowledged the add of ``entry_id`` (again, or late: harmless)."""
        through = self._through.get(bookie_id, self._start)
        if entry_id <= through:
            return
        following = self._following(bookie_id, through)
        if entry_id != following:  # out of order, or past a refused add
            self._ahead.setdefault(bookie_id, set()).add(entry_id)
            return
        ahead = self._ahead.get(bookie_id)
        while True:
            through = following
            following = self._following(bookie_id, through)
            if not ahead or following not in ahead:
                break
            ahead.discard(following)
        self._through[bookie_id] = through

    def _following(self, bookie_id: str, entry_id: int) -> int:
        """The first entry after ``entry_id`` that the bookie stores (one of the next E)."""
        for following in range(entry_id + 1, entry_id + 1 + self._ensemble_size):
            if self._in_write_set(bookie_id, following):
                return following
        raise AssertionError(f"bookie {bookie_id} is in no write set")


def entries_stored(write_sets: Sequence[tuple[str, ...]], first: int,
                   last: int) -> dict[str, int]:
    """Per bookie, how many of the entries ``first..last`` it stores, ``write_sets[i]``
    being the write set of the entries ``e`` with ``e % len(write_sets) == i``."""
    size = len(write_sets)
    stored: dict[str, int] = {}
    for i, write_set in enumerate(write_sets):
        count = (last - i) // size - (first - 1 - i) // size  # e in first..last, e % E == i
        for bookie_id in write_set:
            stored[bookie_id] = stored.get(bookie_id, 0) + count
    return stored


class ForceOp:
    """One force of a range of entries: FORCE_LEDGER to the bookies of ``entries``
    (``(entry id, write set)``, the highest entry of the range in each write set),
    complete once each entry has ``ack_quorum`` bookies of its write set that answered OK
    holding all the entries of the range they store (``stored[bookie_id]`` of them) and
    whose watermark (``acked_through(bookie_id)``) reaches it, failed once one cannot get
    there.

    ``on_done(None)`` or ``on_done(error)`` is called once, on the thread of the answer
    that decided it.
    """

    def __init__(self, entries: Sequence[tuple[int, tuple[str, ...]]],
                 stored: dict[str, int], ack_quorum: int,
                 acked_through: Callable[[str], int],
                 on_done: Callable[[BaseException | None], None]) -> None:
        self._entries = list(entries)
        self._stored = stored
        self._ack_quorum = ack_quorum
        self._acked_through = acked_through
        self._on_done = on_done
        self._lock = threading.Lock()
        # Per bookie that answered, the highest entry it counts for (-1: none).
        self._reach: dict[str, int] = {}
        self._decided = False

    @property
    def bookies(self) -> set[str]:
        """The bookies to send FORCE_LEDGER to."""
        return {bookie for _, write_set in self._entries for bookie in write_set}

    def answer(self, bookie_id: str, future: Future) -> None:
        """Take a bookie's answer (its FORCE_LEDGER future, done: how many entries of the
        range the bookie holds, durable now)."""
        error = future.exception()
        held = None if error is not None else future.result()
        # Read after the answer came: the bookie answered its adds before the force.
        reach = self._acked_through(bookie_id) if held == self._stored[bookie_id] else -1
        with self._lock:
            if self._decided:
                return
            self._reach[bookie_id] = reach
            qa, answered = self._ack_quorum, self._reach
            if any(sum(answered.get(b, entry_id) >= entry_id for b in write_set) < qa
                   for entry_id, write_set in self._entries):
                outcome: BaseException | None = BookKeeperError(
                    f"force failed: bookie {bookie_id}: " + (
                        f"{error}" + (" (a bookie of a pybk version without deferred sync, "
                                      "or one that does not say what it holds)"
                                      if isinstance(error, MalformedMessage) else "")
                        if error is not None else
                        f"it holds {held} of the {self._stored[bookie_id]} entries forced "
                        "that it stores, and acknowledged the adds of its write sets up to "
                        f"{self._acked_through(bookie_id)}"))
            elif all(sum(answered.get(b, -1) >= entry_id for b in write_set) >= qa
                     for entry_id, write_set in self._entries):
                outcome = None
            else:
                return
            self._decided = True
        self._on_done(outcome)


__all__ = ["AckWatermarks", "ForceOp", "WriteFlag", "entries_stored"]
