"""Where a ledger's entries go: ensembles and replacements by rendezvous hashing.

Every candidate bookie gets a score for the ledger, the 64-bit MurmurHash3 (mmh3) of
``"<ledger id>/<bookie id>"``; a ledger's ensemble is the highest-scoring writable
bookies, and a replacement is the best-scoring one not in the ensemble.  So placement
is deterministic (every client picks the same bookies for a ledger from the same
candidates), spreads ledgers evenly, and when a bookie joins or leaves only the ledgers
that rank it high are affected.

Locality decides only the first place, and only among candidates (writable, not
excluded):

1. A client running in a process that hosts a bookie (``local``) puts that bookie first:
   its writes to itself cost no network.
2. Otherwise a client that knows its host (``ClientSettings.clientHost``) puts the
   best-scoring bookie registered on that host first (``same_host``; bookies register
   their host, :meth:`pybk.meta.interface.MetadataStore.bookies_on_host`): a Spark task
   writes its first copy to its own machine's bookie (:mod:`pybk.spark.bookies`).
   Only one: the other places stay with rendezvous order, so that a ledger's copies are
   not all on one machine because it hosts several bookies.
3. Otherwise, and for every other place, rendezvous order.

Read-only bookies are never candidates: the caller passes only writable ones.

Policies (``ClientSettings.ensemblePlacementPolicy``): this rendezvous placement, the
default, which knows nothing of racks; and the rack- and region-aware ones of
:mod:`pybk.client.rackaware`, which rank candidates by the same scores.  Every policy
answers the two questions of :class:`PlacementPolicy`: a new ledger's ensemble, and the
replacements of some places of an ensemble.
"""

from __future__ import annotations

from typing import Collection, Iterable, Protocol, Sequence

import mmh3

from pybk.errors import NotEnoughBookies


def score(ledger_id: int, bookie_id: str) -> int:
    """The bookie's rendezvous score for the ledger (higher ranks first)."""
    return mmh3.hash64(f"{ledger_id}/{bookie_id}".encode(), signed=False)[0]


def rank(ledger_id: int, count: int, candidates: Iterable[str], exclude: Sequence[str],
         local: str | None, same_host: Collection[str]) -> list[str]:
    """Every candidate outside ``exclude``, best first for ``ledger_id``: by score, with
    ``local`` or else the best of ``same_host`` first (see the module docstring).
    NotEnoughBookies if there are fewer than ``count``."""
    excluded = set(exclude)
    eligible = sorted({b for b in candidates if b not in excluded},
                      key=lambda b: (-score(ledger_id, b), b))
    if len(eligible) < count:
        raise NotEnoughBookies(f"ledger {ledger_id} needs {count} writable bookies "
                               f"besides {sorted(excluded)}; there are "
                               f"{len(eligible)}: {sorted(eligible)}")
    first = next((b for b in eligible if b == local), None) or \
        next((b for b in eligible if b in same_host), None)
    if first is not None:
        eligible.remove(first)
        eligible.insert(0, first)
    return eligible


class PlacementPolicy(Protocol):
    """Chooses bookies for ledgers.  ``candidates`` are the writable bookies, ``exclude``
    those not to choose, ``same_host`` the bookies on the client's host; too few
    candidates (or, for a policy that enforces a rule, none satisfying it) raise
    NotEnoughBookies."""

    def new_ensemble(self, ledger_id: int, size: int, write_quorum: int,
                     candidates: Iterable[str], exclude: Sequence[str] = (),
                     same_host: Collection[str] = ()) -> list[str]:
        """The ``size`` bookies of a new ledger's ensemble, in ensemble order."""

    def replace(self, ledger_id: int, ensemble: Sequence[str], indexes: Sequence[int],
                write_quorum: int, candidates: Iterable[str], exclude: Sequence[str] = (),
                same_host: Collection[str] = ()) -> list[str]:
        """Bookies for the places ``indexes`` (ascending) of ``ensemble``, in that order,
        none of them already in ``ensemble``; the other places stay."""


class RendezvousPlacement:
    """Chooses bookies for ledgers; ``local`` is this process's own bookie, if any."""

    def __init__(self, local: str | None = None) -> None:
        self.local = local

    def choose(self, ledger_id: int, count: int, candidates: Iterable[str],
               exclude: Sequence[str] = (), same_host: Collection[str] = ()) -> list[str]:
        """``count`` bookies for ``ledger_id`` among ``candidates`` outside ``exclude``,
        best first (``same_host``: the bookies on the client's host; see the module
        docstring); NotEnoughBookies if there are fewer."""
        return rank(ledger_id, count, candidates, exclude, self.local, same_host)[:count]

    def new_ensemble(self, ledger_id: int, size: int, write_quorum: int,
                     candidates: Iterable[str], exclude: Sequence[str] = (),
                     same_host: Collection[str] = ()) -> list[str]:
        """:meth:`choose` of ``size`` (write sets play no part)."""
        return self.choose(ledger_id, size, candidates, exclude, same_host)

    def replace(self, ledger_id: int, ensemble: Sequence[str], indexes: Sequence[int],
                write_quorum: int, candidates: Iterable[str], exclude: Sequence[str] = (),
                same_host: Collection[str] = ()) -> list[str]:
        """:meth:`choose` of one bookie per place outside the ensemble (the places play
        no part)."""
        return self.choose(ledger_id, len(indexes), candidates,
                           tuple(exclude) + tuple(ensemble), same_host)
