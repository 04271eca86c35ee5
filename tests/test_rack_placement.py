"""Rack-aware placement in the ledger protocol, over every transport (bookies in-process,
over ZeroMQ, with CURVE, and ``pybk bookie`` processes registering their locations):
new ensembles spread write sets over racks, ensemble changes keep them spread, and a
rule the bookies cannot meet fails when enforced and is relaxed with a warning when not.
Also bookie processes registering a location from a setting or a mapping script, and
the admin shell showing it."""

from __future__ import annotations

import json
import logging
import stat
import threading

import pytest
import zkutil
from clientutil import FAST, PROCESSES, TRANSPORTS, BookiePool, clusters
from clusterutil import BookieProcesses, ok

from pybk.autorecovery.rereplication import LedgerRepair, Outcome
from pybk.errors import NotEnoughBookies
from pybk.settings import ServerSettings
from pybk.topology import DEFAULT_LOCATION

pytestmark = pytest.mark.timeout(120)
PASSWORD = b"secret"

#: B1..B6 on three racks in two regions: B1..B4 hold every rack, B2 and B3 alone in theirs.
LOCATIONS = {"B1": "/east/r1", "B2": "/east/r2", "B3": "/west/r3",
             "B4": "/east/r1", "B5": "/east/r2", "B6": "/west/r3"}


def rack_aware(min_racks: int, enforce: bool, policy: str = "rackaware"):
    return FAST.replace(ensemblePlacementPolicy=policy, minNumRacksPerWriteQuorum=min_racks,
                        enforceMinNumRacksPerWriteQuorum=enforce)


@pytest.fixture(scope="module")
def bookie_pool(tmp_path_factory, zookeeper):
    pool = BookiePool(tmp_path_factory.mktemp("pool"), zookeeper, 6, LOCATIONS)
    yield pool
    pool.close()


@pytest.fixture(params=(*TRANSPORTS, PROCESSES))
def cluster_of(tmp_path, request):
    pool = request.getfixturevalue("bookie_pool") if request.param == PROCESSES else None
    with clusters(tmp_path, request.param, pool) as make:
        def located(n: int):
            cluster = make(n)
            cluster.register_locations(LOCATIONS)
            return cluster
        yield located


def racks(ensemble) -> list[str]:
    return sorted(LOCATIONS[b] for b in ensemble)


def payload(i: int) -> bytes:
    return b"entry %d" % i


def test_write_sets_span_racks_and_an_ensemble_change_keeps_them(cluster_of):
    cluster = cluster_of(6)
    bk = cluster.client(rack_aware(3, enforce=True))
    ledgers = [bk.create_ledger(3, 3, 2, password=PASSWORD) for _ in range(6)]
    for lh in ledgers:
        assert racks(lh.metadata.fragments[0].ensemble) == ["/east/r1", "/east/r2",
                                                            "/west/r3"]
    lh = ledgers[0]
    for i in range(5):
        lh.add_entry(payload(i))
    lost = lh.metadata.fragments[0].ensemble[1]
    rack_mate = next(b for b in LOCATIONS if LOCATIONS[b] == LOCATIONS[lost] and b != lost)
    cluster.faults[lost].unreachable = True
    assert [lh.add_entry(payload(i)) for i in range(5, 10)] == list(range(5, 10))
    fragments = bk.ledger_manager.read(lh.id).metadata.fragments
    assert [f.first_entry_id for f in fragments] == [0, 5]
    assert fragments[1].ensemble == tuple(rack_mate if b == lost else b
                                          for b in fragments[0].ensemble)
    lh.close()
    cluster.faults[lost].unreachable = False
    reader = cluster.client().open_ledger(lh.id, password=PASSWORD)
    assert [e.data for e in reader.read_entries(0, 9)] == [payload(i) for i in range(10)]


def test_an_enforced_rule_the_racks_cannot_meet_fails_creation_and_ensemble_change(
        cluster_of):
    cluster = cluster_of(4)  # r1: B1 B4, r2: B2, r3: B3
    bk = cluster.client(rack_aware(3, enforce=True))
    with pytest.raises(NotEnoughBookies, match=r"on 3 racks .*/east/r1: B1 B4; "
                                               r"/east/r2: B2; /west/r3: B3"):
        bk.create_ledger(4, 3, 2, password=PASSWORD)  # four places, a ring of three racks
    lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
    assert racks(lh.metadata.fragments[0].ensemble) == ["/east/r1", "/east/r2", "/west/r3"]
    lh.add_entry(payload(0))
    cluster.faults["B2"].unreachable = True  # alone on its rack: nothing can stand in
    with pytest.raises(NotEnoughBookies, match="cannot replace"):
        lh.add_entry(payload(1))
    assert bk.ledger_manager.read(lh.id).metadata.fragments[-1].ensemble == \
        lh.metadata.fragments[0].ensemble


def test_an_unenforced_rule_spans_fewer_racks_with_a_warning(cluster_of, caplog):
    cluster = cluster_of(4)
    bk = cluster.client(rack_aware(3, enforce=False))
    with caplog.at_level(logging.WARNING, logger="pybk.client.rackaware"):
        wide = bk.create_ledger(4, 3, 2, password=PASSWORD)
        assert len(set(racks(wide.metadata.fragments[0].ensemble))) == 3
        lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
        lh.add_entry(payload(0))
        assert "span 2 racks, not the 3 wanted" in caplog.text  # the ring of four
        caplog.clear()
        cluster.faults["B2"].unreachable = True
        assert lh.add_entry(payload(1)) == 1
    changed = bk.ledger_manager.read(lh.id).metadata.fragments[-1].ensemble
    assert "B2" not in changed and racks(changed) == ["/east/r1", "/east/r1", "/west/r3"]
    assert "span 2 racks, not the 3 wanted" in caplog.text


def test_region_aware_spreads_ensembles_and_write_sets_over_regions(cluster_of):
    cluster = cluster_of(6)
    bk = cluster.client(rack_aware(2, enforce=False, policy="regionaware"))
    for _ in range(6):
        ensemble = bk.create_ledger(4, 2, 2, password=PASSWORD).metadata.fragments[0].ensemble
        regions = [LOCATIONS[b].split("/")[1] for b in ensemble]
        assert sorted(regions) == ["east", "east", "west", "west"]
        assert all(regions[i] != regions[(i + 1) % 4] for i in range(4)), ensemble


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_re_replication_puts_a_lost_copy_on_the_lost_bookies_rack(tmp_path, transport):
    with clusters(tmp_path, transport) as make:
        cluster = make(6)
        cluster.register_locations(LOCATIONS)
        bk = cluster.client(rack_aware(3, enforce=True))
        lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
        for i in range(4):
            lh.add_entry(payload(i))
        lh.close()
        ensemble = lh.metadata.fragments[0].ensemble
        lost = ensemble[2]
        rack_mate = next(b for b in LOCATIONS if LOCATIONS[b] == LOCATIONS[lost] and b != lost)
        cluster.store.unregister_bookie(lost)  # gone for good
        repair = LedgerRepair(bk, ServerSettings(bookieRecoveryPasswd=PASSWORD.decode()),
                              threading.Event())
        result = repair.run(lh.id, (lost,), writer_grace_over=True)
        assert (result.outcome, result.entries) == (Outcome.REPLICATED, 4)
        repaired = bk.ledger_manager.read(lh.id).metadata.fragments[0].ensemble
        assert repaired == (*ensemble[:2], rack_mate)
        assert all(cluster.stored_entry(rack_mate, lh.id, i) for i in range(4))


# -- bookie processes --------------------------------------------------------------------------

def test_a_killed_bookie_process_is_replaced_by_its_rack_mate(tmp_path, zookeeper):
    (tmp_path / "pool").mkdir()
    pool = BookiePool(tmp_path / "pool", zookeeper, 4, LOCATIONS)
    try:
        with clusters(tmp_path, PROCESSES, pool) as make:
            cluster = make(4)
            bk = cluster.client(rack_aware(3, enforce=True))
            lh = next(lh for lh in (bk.create_ledger(3, 3, 2, password=PASSWORD)
                                    for _ in range(20))
                      if {"B1", "B4"} & set(lh.metadata.fragments[0].ensemble) == {"B1"})
            lh.add_entry(payload(0))
            pool.kill("B1")
            assert lh.add_entry(payload(1)) == 1
            fragments = bk.ledger_manager.read(lh.id).metadata.fragments
            assert "B4" in fragments[-1].ensemble and "B1" not in fragments[-1].ensemble
            assert [e.data for e in lh.read_entries(0, 1)] == [payload(0), payload(1)]
    finally:
        pool.close()


def test_listbookies_and_bookieinfo_show_the_registered_locations(bookie_pool):
    listed = json.loads(ok("listbookies", "--zk", bookie_pool.address, "--json"))
    assert {b["bookie"]: b["location"] for b in listed} == LOCATIONS
    table = ok("listbookies", "--zk", bookie_pool.address).splitlines()
    assert table[0].split() == ["BOOKIE", "STATE", "ENDPOINT", "LOCATION"]
    assert {line.split()[0]: line.split()[-1] for line in table[1:]} == LOCATIONS
    info = json.loads(ok("bookieinfo", "--zk", bookie_pool.address, "--json"))
    assert {b["bookie"]: b["location"] for b in info["bookies"]} == LOCATIONS


def test_bookies_register_what_the_mapping_script_says_or_the_default_rack(tmp_path,
                                                                          zookeeper):
    address = zkutil.formatted_cluster(zookeeper)
    mapper = tmp_path / "topology.sh"
    mapper.write_text('#!/bin/sh\n[ -n "${1##*:}" ] && echo /dc2/rack-a\n')
    broken = tmp_path / "broken.sh"
    broken.write_text("#!/bin/sh\nexit 1\n")
    for script in (mapper, broken):
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    processes = BookieProcesses(tmp_path, address)
    try:
        mapped, failing, plain = [
            processes.start(name, "--bookie-id", name, *options) for name, options in (
                ("mapped", ("--set", f"networkTopologyScriptFileName={mapper}")),
                ("failing", ("--set", f"networkTopologyScriptFileName={broken}")),
                ("plain", ()))]
        for bookie in (mapped, failing, plain):
            bookie.wait_serving()
        listed = json.loads(ok("listbookies", "--zk", address, "--json"))
        assert {b["bookie"]: b["location"] for b in listed} == {
            "mapped": "/dc2/rack-a", "failing": DEFAULT_LOCATION, "plain": DEFAULT_LOCATION}
        assert "exited with status 1" in failing.output
    finally:
        processes.close()
