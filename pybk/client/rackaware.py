"""Rack- and region-aware placement: each write set spread over racks (and regions).

BookKeeper's ``RackawareEnsemblePlacementPolicy`` and
``RegionAwareEnsemblePlacementPolicy`` in spirit, on pybk's rendezvous ranking.

The rule
    A write set is Qw consecutive places of the ensemble, wrapping (entry ``e`` goes to
    the places from ``e % E`` on).  With ``minNumRacksPerWriteQuorum`` = m, every write
    set holds bookies of at least ``t = min(m, Qw)`` racks (a rack is a whole location,
    :mod:`pybk.topology`; a bookie with none is in the default rack).  Where the
    candidates cannot give that: with ``enforceMinNumRacksPerWriteQuorum`` the
    placement fails with NotEnoughBookies naming the racks and their bookies; without, it
    takes the most racks per write set it can reach (down to 1, plain rendezvous order)
    and logs a warning.

How bookies are chosen
    Candidates are ranked by their rendezvous score for the ledger
    (:func:`pybk.client.placement.score`), the process's own bookie or else the best one
    on the client's host first, as in :class:`~pybk.client.placement.RendezvousPlacement`.
    The places are filled in order by a depth-first search: each place takes the
    best-ranked unused candidate that keeps every write set through it able to reach its
    racks (the racks it holds plus its places still empty), else the next rack's best,
    and so on, backing off a place when none fits.  Only the best candidate of each rack
    is tried at a place, since two bookies of one rack are alike to the rule.  So:

    * the result is deterministic: a function of the ledger id, the candidates and their
      locations, as every client and autorecovery sees them;
    * where the rule costs nothing (enough racks mixed in the ranking), the ensemble is
      the rendezvous one, and ledgers spread over bookies as evenly;
    * a search stops after :data:`SEARCH_STEPS_MAX` candidates tried, counting as
      unreachable (it only happens for rules the racks can hardly meet).

Replacements (ensemble changes, re-replication)
    The places not replaced stay; the search fills only the replaced ones, and checks
    only the write sets through them (a write set the change does not touch is not its
    to mend).  Enforced, a replacement that cannot keep the rule fails, so the writer's
    ensemble change fails as it would for too few bookies.

Region-aware (``ensemblePlacementPolicy=regionaware``)
    Also spreads the ensemble over the regions (the first name of ``/region/rack``): each
    region gets an equal share of the places, as far as its candidates allow (shares
    water-filled, regions with better-ranked candidates first for the odd place; a
    replacement keeps the lost bookie's region where it can), and each write set spans at
    least ``min(2, Qw, regions)`` regions (BookKeeper's ``minRegionsForDurability``
    default: a region's loss leaves a copy), and its racks as above.  The region rules are
    best effort, never enforced: a placement meets as much of them as it can.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Callable, Collection, Iterable, Iterator, Mapping, Sequence

from pybk.client.placement import rank
from pybk.errors import NotEnoughBookies
from pybk.topology import DEFAULT_LOCATION, region_of

log = logging.getLogger(__name__)

#: Candidates one search tries at most before it counts its rule as unreachable.
SEARCH_STEPS_MAX = 20_000
#: Regions every write set spans where it can, under the region-aware policy.
MIN_REGIONS_PER_WRITE_QUORUM = 2

#: Bookie ids -> their locations (those it does not know are in the default rack).
Locate = Callable[[Iterable[str]], Mapping[str, str]]


class _SearchTooLong(Exception):
    pass


class RackAwarePlacement:
    """The rack-aware policy (``region_aware``: the region-aware one); see the module
    docstring.  ``locate`` gives the bookies' locations, ``local`` is this process's own
    bookie, if any."""

    def __init__(self, locate: Locate, min_racks: int = 2, enforce: bool = False,
                 local: str | None = None, region_aware: bool = False) -> None:
        if min_racks < 1:
            raise ValueError(f"min_racks must be 1 or more, not {min_racks}")
        self._locate = locate
        self.min_racks = min_racks
        self.enforce = enforce
        self.local = local
        self.region_aware = region_aware

    def new_ensemble(self, ledger_id: int, size: int, write_quorum: int,
                     candidates: Iterable[str], exclude: Sequence[str] = (),
                     same_host: Collection[str] = ()) -> list[str]:
        """The ``size`` bookies of a new ledger's ensemble, in ensemble order."""
        return self._place(ledger_id, [None] * size, write_quorum, candidates, exclude,
                           same_host)

    def replace(self, ledger_id: int, ensemble: Sequence[str], indexes: Sequence[int],
                write_quorum: int, candidates: Iterable[str], exclude: Sequence[str] = (),
                same_host: Collection[str] = ()) -> list[str]:
        """Bookies for the places ``indexes`` of ``ensemble``, in ascending place order."""
        replaced = set(indexes)
        places: list[str | None] = [None if i in replaced else bookie_id
                                    for i, bookie_id in enumerate(ensemble)]
        filled = self._place(ledger_id, places, write_quorum, candidates,
                             tuple(exclude) + tuple(ensemble), same_host)
        return [filled[i] for i in sorted(replaced)]

    # -- the search ---------------------------------------------------------------------

    def _place(self, ledger_id: int, places: list[str | None], write_quorum: int,
               candidates: Iterable[str], exclude: Sequence[str],
               same_host: Collection[str]) -> list[str]:
        """``places`` (None where empty) filled under the strictest rule reachable."""
        free = [i for i, b in enumerate(places) if b is None]
        ranked = rank(ledger_id, len(free), candidates, exclude, self.local, same_host)
        fixed = [b for b in places if b is not None]
        found = self._locate(ranked + fixed)
        locations = {b: found.get(b) or DEFAULT_LOCATION for b in ranked + fixed}
        search = _Search(places, write_quorum, ranked, locations)
        racks_wanted = min(self.min_racks, write_quorum)
        regions_wanted = min(MIN_REGIONS_PER_WRITE_QUORUM, write_quorum,
                             len(search.regions_available)) if self.region_aware else 1
        caps = search.region_shares() if self.region_aware else None
        for racks, regions, region_caps in self._attempts(racks_wanted, regions_wanted, caps):
            chosen = search.run(racks, regions, region_caps)
            if chosen is None:
                continue
            short = ([f"{racks} racks, not the {racks_wanted} wanted "
                      f"(minNumRacksPerWriteQuorum={self.min_racks})"]
                     if racks < racks_wanted else []) + \
                ([f"{regions} regions, not the {regions_wanted} wanted"]
                 if regions < regions_wanted else [])
            if short:
                log.warning("ledger %d: write sets of %d bookies span %s; bookies by rack: %s",
                            ledger_id, write_quorum, " and ".join(short), search.describe())
            return chosen
        what = (f"choose an ensemble of {len(places)}" if len(free) == len(places) else
                f"replace places {free} of the ensemble {_shown(places)}")
        raise NotEnoughBookies(
            f"ledger {ledger_id}: cannot {what} with every write set of {write_quorum} "
            f"bookies on {racks_wanted} racks (minNumRacksPerWriteQuorum={self.min_racks}, "
            f"enforceMinNumRacksPerWriteQuorum is on); bookies by rack: {search.describe()}")

    def _attempts(self, racks: int, regions: int, caps: dict[str, int] | None
                  ) -> Iterator[tuple[int, int, dict[str, int] | None]]:
        """The rules to try, strictest first: racks first (only the wanted number when
        enforced), then regions, then the regions' shares."""
        for rack_count in ([racks] if self.enforce else range(racks, 0, -1)):
            for region_count in range(regions, 0, -1):
                yield rack_count, region_count, caps
                if caps is not None:
                    yield rack_count, region_count, None


def _shown(places: Sequence[str | None]) -> list[str]:
    """An ensemble with its places to fill shown as ``?``."""
    return [b if b is not None else "?" for b in places]


class _Search:
    """Fills the empty places of ``places`` from ``ranked`` (best first) so that every
    write set through an empty place spans enough racks and regions."""

    def __init__(self, places: list[str | None], write_quorum: int, ranked: list[str],
                 locations: Mapping[str, str]) -> None:
        self.places = places
        self.ranked = ranked
        self.rack = dict(locations)
        self.region = {b: region_of(location) for b, location in locations.items()}
        size = len(places)
        self.free = [i for i, b in enumerate(places) if b is None]
        # Write sets by their first place; with Qw = E they are all one set.
        sets = dict.fromkeys(tuple(sorted((start + k) % size for k in range(write_quorum)))
                             for start in range(size))
        self.write_sets_through: dict[int, list[tuple[int, ...]]] = {
            i: [s for s in sets if i in s] for i in self.free}
        self.regions_available = {self.region[b] for b in ranked} | {
            self.region[b] for b in places if b is not None}

    def region_shares(self) -> dict[str, int]:
        """Places per region at most: equal shares of the ensemble, water-filled up to
        what each region can hold, at least what it holds already."""
        fixed = Counter(self.region[b] for b in self.places if b is not None)
        room = Counter(self.region[b] for b in self.ranked) + fixed
        best_rank: dict[str, int] = {}
        for place, bookie_id in enumerate(self.ranked):
            best_rank.setdefault(self.region[bookie_id], place)
        order = sorted(room, key=lambda r: (best_rank.get(r, -1), r))
        share = dict.fromkeys(order, 0)
        left = len(self.places)
        while left:
            growing = [r for r in order if share[r] < room[r]][:left]
            if not growing:
                break
            for region in growing:
                share[region] += 1
            left -= len(growing)
        return {r: max(share[r], fixed[r]) for r in order}

    def run(self, racks: int, regions: int, caps: dict[str, int] | None) -> list[str] | None:
        """The places filled under the rule, or None if it cannot be met (or the search
        took over SEARCH_STEPS_MAX steps)."""
        if len({self.rack[b] for b in self.ranked} | {
                self.rack[b] for b in self.places if b is not None}) < racks:
            return None
        places = list(self.places)
        used: set[str] = set()
        held = Counter(self.region[b] for b in places if b is not None)
        steps = 0

        def spread(write_set: tuple[int, ...], of: Mapping[str, str]) -> int:
            """The kinds (racks or regions) ``write_set`` can still reach."""
            filled = [places[i] for i in write_set if places[i] is not None]
            return len({of[b] for b in filled}) + len(write_set) - len(filled)  # type: ignore[index]

        def fits(place: int) -> bool:
            return all(spread(s, self.rack) >= racks and spread(s, self.region) >= regions
                       for s in self.write_sets_through[place])

        def fill(k: int) -> bool:
            nonlocal steps
            if k == len(self.free):
                return True
            place = self.free[k]
            tried: set[str] = set()
            for bookie_id in self.ranked:
                rack, region = self.rack[bookie_id], self.region[bookie_id]
                if bookie_id in used or rack in tried or (
                        caps is not None and held[region] >= caps[region]):
                    continue
                tried.add(rack)
                steps += 1
                if steps > SEARCH_STEPS_MAX:
                    raise _SearchTooLong
                places[place] = bookie_id
                used.add(bookie_id)
                held[region] += 1
                if fits(place) and fill(k + 1):
                    return True
                places[place] = None
                used.discard(bookie_id)
                held[region] -= 1
            return False

        try:
            return places if fill(0) else None  # type: ignore[return-value]
        except _SearchTooLong:
            log.info("placement search stopped after %d steps: rule counted unreachable",
                     SEARCH_STEPS_MAX)
            return None

    def describe(self) -> str:
        """The candidates (and bookies kept) by rack: ``/r/a: B1 B2; /r/b: B3``."""
        by_rack: dict[str, list[str]] = {}
        for bookie_id in sorted(self.rack):
            by_rack.setdefault(self.rack[bookie_id], []).append(bookie_id)
        return "; ".join(f"{rack}: {' '.join(ids)}" for rack, ids in sorted(by_rack.items()))
