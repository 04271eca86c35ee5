"""Deferred sync: BookKeeper's ``WriteFlag.DEFERRED_SYNC`` and the force that ends it.

A ledger created with ``write_flags={WriteFlag.DEFERRED_SYNC}`` has its adds acknowledged
by each bookie once written to its journal (page cache), before fdatasync: an
acknowledged add survives its bookies' processes dying, not a power cut or a kernel
crash.  :meth:`pybk.client.LedgerHandle.force` makes them durable: it sends FORCE_LEDGER
to the bookies of the write sets of the entries acknowledged so far, and completes once,
for every one of those write sets, Qa of its bookies answered that they synced their
journal (every add a bookie answered before the force is covered: a client's requests
reach a bookie in order, and the bookie's force waits for a journal marker queued behind
them).  The entry it covered up to becomes the *durable LAC* (BookKeeper's
``lastAddForced``).

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


class ForceOp:
    """One force: FORCE_LEDGER to the bookies of ``write_sets``, complete once each write
    set has ``ack_quorum`` bookies that answered OK, failed once one cannot get there.

    ``on_done(None)`` or ``on_done(error)`` is called once, on the thread of the answer
    that decided it.
    """

    def __init__(self, write_sets: Sequence[tuple[str, ...]], ack_quorum: int,
                 on_done: Callable[[BaseException | None], None]) -> None:
        self._write_sets = list(set(write_sets))
        self._ack_quorum = ack_quorum
        self._on_done = on_done
        self._lock = threading.Lock()
        self._ok: set[str] = set()
        self._failed: set[str] = set()
        self._decided = False

    @property
    def bookies(self) -> set[str]:
        """The bookies to send FORCE_LEDGER to."""
        return {bookie for write_set in self._write_sets for bookie in write_set}

    def answer(self, bookie_id: str, future: Future) -> None:
        """Take a bookie's answer (its FORCE_LEDGER future, done)."""
        error = future.exception()
        with self._lock:
            if self._decided:
                return
            (self._failed if error is not None else self._ok).add(bookie_id)
            qa = self._ack_quorum
            if any(len(ws) - sum(b in self._failed for b in ws) < qa
                   for ws in self._write_sets):
                outcome: BaseException | None = BookKeeperError(
                    f"force failed: bookie {bookie_id}: {error}" + (
                        " (a bookie of a pybk version without deferred sync)"
                        if isinstance(error, MalformedMessage) else ""))
            elif all(sum(b in self._ok for b in ws) >= qa for ws in self._write_sets):
                outcome = None
            else:
                return
            self._decided = True
        self._on_done(outcome)


__all__ = ["ForceOp", "WriteFlag"]
