"""Rack- and region-aware placement as a pure policy: the rule met wherever the racks
allow (checked against an exhaustive search on many random clusters), deterministic,
rendezvous order where the rule costs nothing, enforced or best effort; network
locations and the mapping script."""

from __future__ import annotations

import itertools
import logging
import os
import random
import stat
from collections import Counter

import pytest

from pybk.client.placement import RendezvousPlacement
from pybk.client.rackaware import RackAwarePlacement
from pybk.errors import InvalidConfiguration, NotEnoughBookies
from pybk.settings import ClientSettings, ServerSettings
from pybk.topology import DEFAULT_LOCATION, check_location, region_of, run_mapping_script

pytestmark = pytest.mark.timeout(120)


def policy(locations: dict[str, str], **options) -> RackAwarePlacement:
    return RackAwarePlacement(lambda ids: locations, **options)


def write_sets(size: int, write_quorum: int) -> list[list[int]]:
    return [[(start + k) % size for k in range(write_quorum)] for start in range(size)]


def racks_spanned(ensemble, write_quorum: int, locations: dict[str, str],
                  through: set[int] | None = None) -> int:
    """The fewest racks a write set spans (only write sets through ``through``)."""
    return min(len({locations.get(ensemble[i], DEFAULT_LOCATION) for i in s})
               for s in write_sets(len(ensemble), write_quorum)
               if through is None or through.intersection(s))


def best_possible(places, write_quorum: int, room: Counter, wanted: int) -> int:
    """Exhaustively: the most racks (up to ``wanted``) every write set through an empty
    place of ``places`` (racks, None where empty) can span, with ``room[rack]`` bookies
    left per rack."""
    free = [i for i, rack in enumerate(places) if rack is None]
    best = 0
    for racks in itertools.product(sorted(room), repeat=len(free)):
        if any(racks.count(r) > room[r] for r in set(racks)):
            continue
        filled = list(places)
        for i, rack in zip(free, racks):
            filled[i] = rack
        spread = min(len({filled[i] for i in s}) for s in write_sets(len(places), write_quorum)
                     if set(free).intersection(s))
        best = max(best, min(spread, wanted))
        if best == wanted:
            break
    return best


def random_cluster(rng: random.Random) -> dict[str, str]:
    locations = {}
    for rack in range(rng.randint(1, 4)):
        for i in range(rng.randint(0, 3)):
            locations[f"b{rack}-{i}"] = f"/region{rack % 2}/rack{rack}"
    return locations


# -- the rule -------------------------------------------------------------------------------

def test_every_write_set_spans_the_racks_wanted_where_the_cluster_allows():
    rng = random.Random(20)
    checked = 0
    while checked < 400:
        locations = random_cluster(rng)
        size = rng.randint(1, 6)
        if len(locations) < size:
            continue
        write_quorum, min_racks = rng.randint(1, size), rng.randint(1, 4)
        ledger_id = rng.randrange(10_000)
        chosen = policy(locations, min_racks=min_racks).new_ensemble(
            ledger_id, size, write_quorum, locations)
        assert len(set(chosen)) == size and set(chosen) <= set(locations)
        wanted = min(min_racks, write_quorum)
        possible = best_possible([None] * size, write_quorum,
                                 Counter(locations.values()), wanted)
        assert min(racks_spanned(chosen, write_quorum, locations), wanted) == possible, \
            (locations, size, write_quorum, min_racks, chosen)
        # Region-aware: regions never cost racks (they are tried within each rack rule).
        by_region = policy(locations, min_racks=min_racks, region_aware=True).new_ensemble(
            ledger_id, size, write_quorum, locations)
        assert min(racks_spanned(by_region, write_quorum, locations), wanted) == possible
        # Deterministic: any order of candidates, any instance.
        shuffled = list(locations)
        rng.shuffle(shuffled)
        assert policy(locations, min_racks=min_racks).new_ensemble(
            ledger_id, size, write_quorum, shuffled) == chosen
        # Enforced: the same ensemble where the rule can be met, else NotEnoughBookies.
        enforced = policy(locations, min_racks=min_racks, enforce=True)
        if possible == wanted:
            assert enforced.new_ensemble(ledger_id, size, write_quorum, locations) == chosen
        else:
            with pytest.raises(NotEnoughBookies, match="enforceMinNumRacksPerWriteQuorum"):
                enforced.new_ensemble(ledger_id, size, write_quorum, locations)
        checked += 1


def test_replacements_keep_the_write_sets_through_them_across_racks():
    rng = random.Random(7)
    checked = 0
    while checked < 300:
        locations = random_cluster(rng)
        size = rng.randint(2, 6)
        if len(locations) < size + 1:
            continue
        write_quorum, min_racks = rng.randint(1, size), rng.randint(1, 3)
        ledger_id = rng.randrange(10_000)
        placement = policy(locations, min_racks=min_racks)
        ensemble = placement.new_ensemble(ledger_id, size, write_quorum, locations)
        spare = len(locations) - size
        indexes = sorted(rng.sample(range(size), rng.randint(1, min(spare, size, 3))))
        replacements = placement.replace(ledger_id, ensemble, indexes, write_quorum, locations)
        assert len(replacements) == len(indexes)
        assert not set(replacements) & set(ensemble) and len(set(replacements)) == len(indexes)
        changed = list(ensemble)
        for index, bookie_id in zip(indexes, replacements):
            changed[index] = bookie_id
        wanted = min(min_racks, write_quorum)
        room = Counter(locations[b] for b in locations if b not in ensemble)
        possible = best_possible([None if i in indexes else locations[b]
                                  for i, b in enumerate(ensemble)], write_quorum, room, wanted)
        assert min(racks_spanned(changed, write_quorum, locations, set(indexes)),
                   wanted) == possible, (locations, ensemble, indexes, changed)
        checked += 1


def test_a_lost_bookie_is_replaced_by_its_rack_mate_when_only_that_keeps_the_racks():
    locations = {"a1": "/r/a", "a2": "/r/a", "b1": "/r/b", "c1": "/r/c", "c2": "/r/c"}
    placement = policy(locations, min_racks=3, enforce=True)
    for ledger_id in range(30):
        ensemble = placement.new_ensemble(ledger_id, 3, 3, locations)
        assert sorted(locations[b] for b in ensemble) == ["/r/a", "/r/b", "/r/c"]
        for index, lost in enumerate(ensemble):
            mates = [b for b in locations if locations[b] == locations[lost] and b != lost]
            if mates:
                assert placement.replace(ledger_id, ensemble, [index], 3, locations,
                                         exclude=[lost]) == mates
            else:  # b1, alone in its rack: enforced, no replacement keeps three racks
                with pytest.raises(NotEnoughBookies, match="by rack: /r/a: a1 a2; /r/c: c1 c2"):
                    placement.replace(ledger_id, ensemble, [index], 3, locations,
                                      exclude=[lost])


def test_best_effort_spans_fewer_racks_with_a_warning(caplog):
    locations = {"a1": "/r/a", "a2": "/r/a", "a3": "/r/a", "b1": "/r/b"}
    with caplog.at_level(logging.WARNING, logger="pybk.client.rackaware"):
        chosen = policy(locations, min_racks=3).new_ensemble(9, 3, 3, locations)
    assert "b1" in chosen  # two racks, the most there are
    assert "span 2 racks, not the 3 wanted" in caplog.text
    assert "/r/a: a1 a2 a3; /r/b: b1" in caplog.text
    with pytest.raises(NotEnoughBookies, match=r"cannot choose an ensemble of 3 .* on 3 racks"):
        policy(locations, min_racks=3, enforce=True).new_ensemble(9, 3, 3, locations)


def test_too_few_bookies_is_not_enough_bookies_whatever_the_racks():
    locations = {"a1": "/r/a", "b1": "/r/b"}
    with pytest.raises(NotEnoughBookies, match="needs 3 writable bookies"):
        policy(locations).new_ensemble(1, 3, 2, locations)


# -- ranking ----------------------------------------------------------------------------------

def test_rendezvous_order_where_the_rule_costs_nothing():
    bookies = [f"bookie-{i}:3181" for i in range(8)]
    own_racks = {b: f"/r/rack{i}" for i, b in enumerate(bookies)}
    one_rack = {b: "/r/rack0" for b in bookies}
    rendezvous = RendezvousPlacement()
    for ledger_id in range(200):
        expected = rendezvous.choose(ledger_id, 5, bookies)
        assert policy(own_racks).new_ensemble(ledger_id, 5, 3, bookies) == expected
        assert policy({}).new_ensemble(ledger_id, 5, 3, bookies) == expected  # none known
        assert policy(one_rack, min_racks=1).new_ensemble(ledger_id, 5, 3, bookies) == expected


def test_ledgers_spread_evenly_over_the_bookies_of_balanced_racks():
    locations = {f"b{i}": f"/r/rack{i % 3}" for i in range(9)}
    placement = policy(locations, min_racks=3)
    load: Counter = Counter()
    for ledger_id in range(900):
        ensemble = placement.new_ensemble(ledger_id, 3, 3, locations)
        assert racks_spanned(ensemble, 3, locations) == 3
        load.update(ensemble)
    assert all(abs(count - 300) < 60 for count in load.values()), load


def test_the_local_bookie_and_the_hosts_come_first_where_the_rule_allows():
    locations = {"a1": "/r/a", "a2": "/r/a", "b1": "/r/b", "b2": "/r/b"}
    for ledger_id in range(50):
        ensemble = policy(locations, local="a2").new_ensemble(ledger_id, 4, 2, locations)
        assert ensemble[0] == "a2" and racks_spanned(ensemble, 2, locations) == 2
        ensemble = policy(locations).new_ensemble(ledger_id, 3, 2, locations,
                                                  same_host={"b2"})
        assert ensemble[0] == "b2"


# -- regions ---------------------------------------------------------------------------------

def test_region_aware_spreads_the_ensemble_and_each_write_set_over_regions():
    locations = {"e1": "/east/a", "e2": "/east/a", "e3": "/east/b", "e4": "/east/b",
                 "e5": "/east/c", "w1": "/west/a", "w2": "/west/b", "w3": "/west/c"}
    placement = policy(locations, region_aware=True)
    for ledger_id in range(100):
        ensemble = placement.new_ensemble(ledger_id, 4, 2, locations)
        regions = [region_of(locations[b]) for b in ensemble]
        assert Counter(regions) == {"/east": 2, "/west": 2}, ensemble
        assert all(len({regions[i] for i in s}) == 2 for s in write_sets(4, 2)), ensemble
        assert racks_spanned(ensemble, 2, locations) == 2
        # More places than the west holds: the east takes the rest.
        wide = placement.new_ensemble(ledger_id, 8, 3, locations)
        assert Counter(region_of(locations[b]) for b in wide) == {"/east": 5, "/west": 3}
        # A lost bookie's region gets the replacement where it can.
        index = next(i for i, b in enumerate(ensemble) if b.startswith("w"))
        replacement = placement.replace(ledger_id, ensemble, [index], 2, locations)
        assert replacement[0].startswith("w") and replacement[0] not in ensemble


def test_region_aware_with_one_region_is_rack_aware():
    locations = {f"b{i}": f"/only/rack{i % 2}" for i in range(6)}
    for ledger_id in range(50):
        assert policy(locations, region_aware=True).new_ensemble(ledger_id, 4, 2, locations) \
            == policy(locations).new_ensemble(ledger_id, 4, 2, locations)


# -- locations, the mapping script, settings ----------------------------------------------------

def test_locations_are_region_and_rack():
    assert check_location("/east/r1") == "/east/r1" and region_of("/east/r1") == "/east"
    assert region_of("/r1") == "/default-region"
    assert region_of(DEFAULT_LOCATION) == "/default-region"
    for bad in ("", "r1", "/", "/a/b/c", "//r1", "/a b/r1", "/east/"):
        with pytest.raises(ValueError, match="not a network location"):
            check_location(bad)


def script(tmp_path, body: str) -> str:
    path = tmp_path / "topology.sh"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_the_mapping_script_maps_each_address_to_a_location(tmp_path):
    mapper = script(tmp_path, 'for a in "$@"; do echo "/dc1/rack-${a##*:}"; done')
    assert run_mapping_script(mapper, ["10.0.0.1:3181", "10.0.0.2:3182"], 5) == \
        ["/dc1/rack-3181", "/dc1/rack-3182"]


@pytest.mark.parametrize("body, why", [
    ("exit 3", "exited with status 3"),
    ("echo /dc1/r1", "printed 1 locations for 2 addresses"),
    ("echo rack1; echo rack2", "not a network location"),
    ("exec sleep 30", "did not finish within 0.5 s"),
])
def test_a_failing_mapping_script_puts_the_bookies_in_the_default_rack(tmp_path, caplog,
                                                                       body, why):
    with caplog.at_level(logging.WARNING, logger="pybk.topology"):
        assert run_mapping_script(script(tmp_path, body), ["h1:1", "h2:2"], 0.5) == \
            [DEFAULT_LOCATION] * 2
    assert why in caplog.text and DEFAULT_LOCATION in caplog.text


def test_a_missing_mapping_script_puts_the_bookie_in_the_default_rack(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="pybk.topology"):
        assert run_mapping_script(os.path.join(tmp_path, "absent"), ["h:1"], 1) == \
            [DEFAULT_LOCATION]
    assert "could not run" in caplog.text


def test_placement_settings_are_checked():
    assert ClientSettings().ensemblePlacementPolicy == "rendezvous"
    assert ClientSettings.from_mapping({"enforceMinNumRacksPerWriteQuorum": "true"}) \
        .enforceMinNumRacksPerWriteQuorum
    with pytest.raises(InvalidConfiguration, match="rendezvous or rackaware or regionaware"):
        ClientSettings(ensemblePlacementPolicy="rack")
    with pytest.raises(InvalidConfiguration, match="minNumRacksPerWriteQuorum"):
        ClientSettings(minNumRacksPerWriteQuorum=0)
    with pytest.raises(InvalidConfiguration, match="bookieNetworkLocation"):
        ServerSettings(bookieNetworkLocation="rack1")
    with pytest.raises(InvalidConfiguration, match="networkTopologyScriptTimeoutMs"):
        ServerSettings(networkTopologyScriptTimeoutMs=0)


def test_a_rule_large_clusters_cannot_meet_is_found_out_quickly():
    # 40 bookies, 2 racks, an odd ensemble of write sets of 2: no alternation closes the
    # ring; and 30 of 34 bookies on one rack cannot give 20 places racks 3 by 3.
    two_racks = {f"b{i}": f"/r/rack{i % 2}" for i in range(40)}
    crowded = {**{f"b{i}": f"/r/rack{i % 3}" for i in range(4)},
               **{f"c{i}": "/r/full" for i in range(30)}}
    # Quickly by construction: a search takes at most SEARCH_STEPS_MAX steps per attempt
    # (pybk.client.rackaware), so these end however loaded the machine is.
    for locations, size, write_quorum in ((two_racks, 15, 2), (crowded, 20, 3)):
        with pytest.raises(NotEnoughBookies):
            policy(locations, min_racks=write_quorum, enforce=True).new_ensemble(
                1, size, write_quorum, locations)
        chosen = policy(locations, min_racks=write_quorum).new_ensemble(
            1, size, write_quorum, locations)
        assert len(set(chosen)) == size
