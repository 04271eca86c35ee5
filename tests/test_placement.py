"""Rendezvous placement: deterministic, balanced, local first, stable under change."""

from __future__ import annotations

from collections import Counter

import pytest

from pybk.client.placement import RendezvousPlacement
from pybk.errors import NotEnoughBookies

BOOKIES = [f"bookie-{i}:3181" for i in range(5)]


def test_ensembles_are_deterministic_and_balanced():
    placement = RendezvousPlacement()
    first = [placement.choose(ledger, 3, BOOKIES) for ledger in range(1000)]
    again = [RendezvousPlacement().choose(ledger, 3, reversed(BOOKIES)) for ledger in range(1000)]
    assert first == again
    load = Counter(b for ensemble in first for b in ensemble)
    assert all(abs(count - 600) < 90 for count in load.values()), load  # 3/5 of 1000 each
    assert len({tuple(e) for e in first}) > 5  # not one fixed ensemble


def test_local_bookie_first_and_exclusions():
    placement = RendezvousPlacement(local=BOOKIES[4])
    for ledger in range(50):
        assert placement.choose(ledger, 3, BOOKIES)[0] == BOOKIES[4]
        replacement = placement.choose(ledger, 1, BOOKIES, exclude=[BOOKIES[4], BOOKIES[0]])
        assert replacement[0] not in (BOOKIES[4], BOOKIES[0])
    assert BOOKIES[4] not in RendezvousPlacement(local=BOOKIES[4]).choose(
        7, 2, BOOKIES[:4])  # not a candidate (e.g. read-only): not chosen
    with pytest.raises(NotEnoughBookies, match="needs 3"):
        placement.choose(1, 3, BOOKIES[:3], exclude=[BOOKIES[0]])


def test_a_bookie_of_the_writer_host_comes_first():
    placement = RendezvousPlacement()
    same_host = {BOOKIES[1], BOOKIES[3]}
    for ledger in range(200):
        plain = placement.choose(ledger, 3, BOOKIES)
        chosen = placement.choose(ledger, 3, BOOKIES, same_host=same_host)
        best_local = min(same_host, key=plain_rank(ledger))
        assert chosen[0] == best_local  # one of the host's bookies: the best-scoring one
        rest = [b for b in placement.choose(ledger, 5, BOOKIES) if b != best_local]
        assert chosen[1:] == rest[:2]  # the other places keep rendezvous order
        if best_local in plain:
            assert sorted(chosen) == sorted(plain)  # same bookies, local one first
    # Not a candidate (read-only) or excluded: plain rendezvous placement.
    assert placement.choose(5, 3, BOOKIES[2:], same_host={BOOKIES[1]}) == \
        placement.choose(5, 3, BOOKIES[2:])
    assert placement.choose(5, 3, BOOKIES, exclude=[BOOKIES[1]], same_host={BOOKIES[1]}) \
        == placement.choose(5, 3, BOOKIES, exclude=[BOOKIES[1]])
    # The process's own bookie wins over the host's others.
    assert RendezvousPlacement(local=BOOKIES[0]).choose(
        5, 3, BOOKIES, same_host={BOOKIES[1]})[0] == BOOKIES[0]


def plain_rank(ledger: int):
    """A sort key giving rendezvous order for ``ledger``."""
    order = RendezvousPlacement().choose(ledger, len(BOOKIES), BOOKIES)
    return order.index


def test_a_new_bookie_moves_only_the_ledgers_that_rank_it_high():
    placement = RendezvousPlacement()
    before = {ledger: placement.choose(ledger, 3, BOOKIES) for ledger in range(1000)}
    after = {ledger: placement.choose(ledger, 3, BOOKIES + ["bookie-new:3181"])
             for ledger in range(1000)}
    changed = [ledger for ledger in before if before[ledger] != after[ledger]]
    assert all("bookie-new:3181" in after[ledger] for ledger in changed)
    assert len(changed) < 800  # about 3/6 of the ledgers, not all of them


def test_rendezvous_ensembles_and_replacements_ignore_write_sets():
    placement = RendezvousPlacement()
    for ledger in range(50):
        ensemble = placement.new_ensemble(ledger, 3, 2, BOOKIES)
        assert ensemble == placement.choose(ledger, 3, BOOKIES)
        replacements = placement.replace(ledger, ensemble, [0, 2], 2, BOOKIES)
        assert replacements == placement.choose(ledger, 2, BOOKIES, exclude=ensemble)
