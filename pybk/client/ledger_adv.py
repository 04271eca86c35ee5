"""A ledger whose writer gives each entry's id (BookKeeper's ``LedgerHandleAdv``).

``BookKeeper.create_ledger_adv`` makes one, for an application that mirrors another
system's offsets, or writes entries from several threads that each know their ids.
Everything but the choice of ids is the writer's protocol of :mod:`pybk.client.ledger`:
the entries are the same on the wire and on the bookies, and the ledger's metadata is
that of any ledger (BookKeeper marks nothing either), so readers, recovery, fencing,
ensemble changes and closing do not know the difference.

Ids: ``add_entry(entry_id, data)`` takes any id from LAC + 1 to LAC +
``advWindowEntries`` (:class:`~pybk.settings.ClientSettings`) that is not outstanding
already, in any order.  An entry is sent to its write set at once, and acknowledged to
the caller once it *and every lower id* reached Qa bookies: the LAC moves in id order,
so a missing id holds back the acknowledgements above it (their adds stay pending, as
they would behind a slow bookie).  Refused at once, nothing sent: a negative id or one
past the window (InvalidEntryId), an id at or below the LAC or outstanding
(DuplicateEntryId).

Ensemble changes start the new fragment at LAC + 1, as for any writer; the pending adds
above it, held back or not, go to their write sets in the new ensemble.  Closing fixes
the last entry at the LAC: adds held back behind a missing id fail with LedgerClosed
(close does not wait for an id that may never come), and recovery after a crash
likewise ends the ledger before the first id it cannot find, whatever is stored above.

Length: each entry carries the bytes added before it *in the order the adds were made*
(as BookKeeper's, whose docs say the length "may not be accurate" for these ledgers);
the ledger's length is that of its last entry, exact when ids came in order.
"""

from __future__ import annotations

from concurrent.futures import Future

from pybk.client.completions import AddDone
from pybk.client.ledger import LedgerHandle, _settle
from pybk.errors import DuplicateEntryId, InvalidEntryId


class LedgerHandleAdv(LedgerHandle):
    """A writable ledger whose adds carry the caller's entry ids (module docstring).

    Reading, closing and everything else are :class:`LedgerHandle`'s."""

    _ids_in_order = False

    # The adds take an id first: a different signature from LedgerHandle's, as
    # BookKeeper's WriteAdvHandle differs from its WriteHandle.
    def add_entry(self, entry_id: int, data: bytes) -> int:  # type: ignore[override]
        """Add ``data`` as entry ``entry_id``; return the id once it and every lower id
        were acknowledged by Qa bookies (so above a missing id this waits until another
        thread adds it, or the ledger closes)."""
        return self.add_entry_async(entry_id, data).result()

    def add_entry_async(self, entry_id: int,  # type: ignore[override]
                        data: bytes) -> Future:
        """Add ``data`` as entry ``entry_id``; the future gives the id once acknowledged
        (futures complete in entry-id order)."""
        future: Future = Future()
        self.add_entry_then(entry_id, data, _settle(future))
        return future

    def add_entry_then(self, entry_id: int, data: bytes,  # type: ignore[override]
                       done: AddDone) -> None:
        """Add ``data`` as entry ``entry_id``; call ``done(entry_id, None)`` once
        acknowledged, or ``done(None, error)``, in entry-id order (as
        :meth:`LedgerHandle.add_entry_then`).  Bad ids raise at once (module docstring)."""
        if not isinstance(entry_id, int) or isinstance(entry_id, bool):
            raise TypeError(f"entry id must be an int, not {type(entry_id).__name__}")
        if entry_id < 0:
            raise InvalidEntryId(f"ledger {self.id}: entry id {entry_id} is negative")
        self._add(entry_id, data, done)

    def _next_entry_id(self, requested: int | None) -> int:
        assert requested is not None, "an adv handle's adds all carry their id"
        lac = self._lac
        if requested <= lac:
            raise DuplicateEntryId(f"ledger {self.id}: entry {requested} was added already "
                                   f"(the LAC is {lac})")
        window = self._bk.settings.advWindowEntries
        if requested > lac + window:
            raise InvalidEntryId(
                f"ledger {self.id}: entry id {requested} is more than advWindowEntries="
                f"{window} past the LAC {lac}: add the ids before it first")
        at = requested - self._base  # its slot (module docstring of ledger.py)
        if at < len(self._entries) and self._entries[at] is not None:
            raise DuplicateEntryId(f"ledger {self.id}: an add of entry {requested} is "
                                   "outstanding already")
        return requested


__all__ = ["LedgerHandleAdv"]
