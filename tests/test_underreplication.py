"""Under-replication metadata (pybk.meta.underreplication), tested once for every store.

The ``stores`` and ``store`` fixtures are the metadata contract's (test_meta_contract):
the embedded store, and the ZooKeeper store on the session's real ZooKeeper server.
"""

from __future__ import annotations

import queue
import threading

import pytest
from test_meta_contract import WAIT_S, run_threads, store, stores  # noqa: F401

from pybk.errors import InvalidLedgerId, MalformedMetadata, MetadataError, NoNode
from pybk.meta import textformat
from pybk.meta.underreplication import (
    BACKLOG,
    DISABLE,
    ELECTION,
    LAYOUT,
    LOST_BOOKIE_RECOVERY_DELAY,
    Backlog,
    UnderreplicationManager,
    lock_path,
    mark_path,
)
from pybk.testing import wait_until

pytestmark = pytest.mark.timeout(60)


# -- formats (no store) -------------------------------------------------------------------

def test_mark_and_lock_paths_are_bookkeepers():
    assert mark_path(7) == \
        "/ledgers/underreplication/ledgers/0000/0000/0000/0007/urL0000000007"
    assert mark_path(0x7AFEBEEF0000FEED) == ("/ledgers/underreplication/ledgers/7afe/beef/"
                                            f"0000/feed/urL{0x7AFEBEEF0000FEED}")
    assert lock_path(12) == "/ledgers/underreplication/locks/urL0000000012"
    for bad in (-1, 2 ** 63, "7", True):
        with pytest.raises(InvalidLedgerId):
            mark_path(bad)


def test_text_format_round_trips_and_reads_bookkeepers_text():
    data = textformat.encode([("replica", 'odd "host"\\:1'), ("replica", "b:2"),
                              ("ctime", 1700000000000)])
    assert data == (b'replica: "odd \\"host\\"\\\\:1"\nreplica: "b:2"\n'
                    b"ctime: 1700000000000\n")
    assert textformat.decode(data, {"replica": str, "ctime": int}, ["replica"]) == \
        {"replica": ['odd "host"\\:1', "b:2"], "ctime": [1700000000000]}
    # As BookKeeper's TextFormat prints a non-ASCII id: UTF-8 bytes in octal escapes.
    assert textformat.decode(b'bookieId: "h\\303\\251:3181"\n', {"bookieId": str}) == \
        {"bookieId": ["h\u00e9:3181"]}
    for bad in (b"replica 'x'\n", b'other: "x"\n', b"replica: 5\n", b'ctime: "5"\n',
                b"ctime: 1\nctime: 2\n", b"\xff"):
        with pytest.raises(MalformedMetadata):
            textformat.decode(bad, {"replica": str, "ctime": int}, ["replica"])


def test_backlog_round_trips_and_refuses_damage():
    backlog = Backlog("b1:3181", 1700000000000, ledgers=2, entries=30, min_replicas=1)
    assert Backlog.from_bytes(backlog.to_bytes()) == backlog
    assert Backlog.from_bytes(Backlog("a", 1, 0, 0, None).to_bytes()).min_replicas is None
    with pytest.raises(MalformedMetadata):
        Backlog.from_bytes(backlog.to_bytes()[:-1])


# -- on every store -------------------------------------------------------------------------

def test_the_layout_is_written_once_and_another_is_refused(store):
    UnderreplicationManager(store)
    assert store.get(LAYOUT) == (b'type: "BASIC"\nversion: 1\n', 0)
    UnderreplicationManager(store)  # a second manager finds it
    store.set(LAYOUT, b'type: "OTHER"\nversion: 1\n', 0)
    with pytest.raises(MalformedMetadata, match="BASIC:1"):
        UnderreplicationManager(store)


def test_marks_hold_the_missing_replicas_and_merge(store):
    manager = UnderreplicationManager(store)
    assert manager.get(5) is None
    first = manager.mark_underreplicated(5, ["b1:3181"])
    assert first.replicas == ("b1:3181",) and first.ctime_ms is not None
    data, _version = store.get(mark_path(5))
    assert data.startswith(b'replica: "b1:3181"\nctime: ')
    merged = manager.mark_underreplicated(5, ["b2:3181", "b1:3181"])
    assert merged.replicas == ("b1:3181", "b2:3181") and merged.version == first.version + 1
    assert manager.mark_underreplicated(5, ["b2:3181"]) == merged  # nothing new: unchanged
    untimed = manager.mark_underreplicated(9, ["b3:3181"], with_time=False)
    assert untimed.ctime_ms is None and b"ctime" not in store.get(mark_path(9))[0]
    assert manager.get(5) == merged
    with pytest.raises(MetadataError):
        manager.mark_underreplicated(6, [])


def test_marks_are_announced_to_their_watchers(store):
    manager = UnderreplicationManager(store)
    heard = threading.Semaphore(0)
    watch = manager.watch_marks(heard.release)
    manager.mark_underreplicated(2, ["b1:3181"])
    assert heard.acquire(timeout=WAIT_S)
    watch.cancel()
    # A fresh watch, which hears nothing of the above: marks under existing levels
    # change no child of the watched record, so only the announcement is heard.
    heard = threading.Semaphore(0)
    watch = manager.watch_marks(heard.release)
    manager.mark_underreplicated(3, ["b1:3181"], announce=False)  # a batch...
    manager.mark_underreplicated(4, ["b1:3181"], announce=False)
    manager.announce_marks()  # ...announced once
    assert heard.acquire(timeout=WAIT_S)
    assert manager.get(3) is not None and manager.get(4) is not None
    watch.cancel()


def test_concurrent_marks_lose_no_replica(stores):
    managers = [UnderreplicationManager(stores.open()) for _ in range(1 if
                                                                       stores.single_session
                                                                       else 4)]

    def mark(i: int) -> None:
        managers[i % len(managers)].mark_underreplicated(3, [f"b{i}:3181"])

    run_threads(8, mark)
    assert sorted(managers[0].get(3).replicas) == sorted(f"b{i}:3181" for i in range(8))


def test_marks_are_listed_by_ledger_id_and_filtered(store):
    manager = UnderreplicationManager(store)
    ids = [2 ** 40 + 1, 3, 70_000, 1]
    for ledger_id in ids:
        manager.mark_underreplicated(ledger_id, ["b1:3181" if ledger_id % 2 else "b2:3181"])
    manager.mark_underreplicated(70_000, ["b1:3181"])
    assert list(manager.ledger_ids()) == sorted(ids)
    assert sorted(manager.ledger_ids(shuffle_last=True)) == sorted(ids)
    with_b1 = manager.underreplicated(lambda replicas: "b1:3181" in replicas)
    assert [mark.ledger_id for mark in with_b1] == sorted(ids)
    only_b2 = manager.underreplicated(lambda replicas: replicas == ("b2:3181",))
    assert list(only_b2) == []


def test_of_workers_racing_for_a_ledger_exactly_one_claims_it(stores):
    sessions = 1 if stores.single_session else 4
    managers = [UnderreplicationManager(stores.open(), owner=f"worker{i}")
                for i in range(sessions)]
    managers[0].mark_underreplicated(11, ["b1:3181"])
    barrier = threading.Barrier(8)
    claims: queue.Queue = queue.Queue()

    def claim(i: int) -> None:
        barrier.wait(WAIT_S)
        found = managers[i % sessions].claim_next()
        if found is not None:
            claims.put((i % sessions, found))

    run_threads(8, claim, barrier)
    assert claims.qsize() == 1
    holder, won = claims.get()
    assert won.ledger_id == 11 and won.mark.replicas == ("b1:3181",)
    assert managers[0].claimed() == {11: f"worker{holder}"}
    assert managers[0].claim(11) is None and managers[0].claim_next() is None
    managers[holder].release(won)
    assert managers[0].claimed() == {}
    assert managers[0].claim(11) is not None


def test_a_claim_ends_with_its_session(stores):
    store = stores.open()
    UnderreplicationManager(store).mark_underreplicated(4, ["b1:3181"])
    assert UnderreplicationManager(store, "w").claim(4) is not None
    store.close()
    manager = UnderreplicationManager(stores.open())
    assert manager.claimed() == {} and manager.get(4) is not None  # still marked
    assert manager.claim_next().ledger_id == 4


def test_clearing_a_mark_is_versioned_and_tidies_its_levels(store):
    manager = UnderreplicationManager(store)
    manager.mark_underreplicated(0x10002, ["b1:3181"])
    manager.mark_underreplicated(0x10003, ["b1:3181"])
    claim = manager.claim(0x10002)
    manager.mark_underreplicated(0x10002, ["b2:3181"])  # another bookie lost meanwhile
    assert manager.mark_replicated(claim) is False  # stays marked, for another repair
    assert manager.get(0x10002).replicas == ("b1:3181", "b2:3181")
    assert manager.claimed() == {}  # released all the same
    for ledger_id in (0x10002, 0x10003):
        assert manager.mark_replicated(manager.claim(ledger_id)) is True
    assert list(manager.ledger_ids()) == []
    assert store.children("/ledgers/underreplication/ledgers") == []  # no empty levels
    assert manager.claim(0x10002) is None


def test_the_enable_flag_is_watched(store):
    manager = UnderreplicationManager(store)
    heard: queue.Queue = queue.Queue()
    watch = manager.watch_enabled(heard.put)
    assert manager.is_enabled()
    manager.disable()
    manager.disable()  # harmless
    assert store.exists(DISABLE) and not manager.is_enabled()
    assert heard.get(timeout=WAIT_S) is False
    manager.enable()
    assert heard.get(timeout=WAIT_S) is True
    manager.enable()
    assert manager.is_enabled()
    watch.cancel()


def test_the_recovery_delay_is_the_clusters_once_written(store):
    manager = UnderreplicationManager(store)
    assert manager.lost_bookie_recovery_delay(default=7) == 7
    changed = threading.Event()
    watch = manager.watch_lost_bookie_recovery_delay(changed.set)
    manager.initialize_lost_bookie_recovery_delay(30)
    assert changed.wait(WAIT_S)
    manager.initialize_lost_bookie_recovery_delay(5)  # the first one stays
    assert manager.lost_bookie_recovery_delay(default=7) == 30
    manager.set_lost_bookie_recovery_delay(0)
    assert store.get(LOST_BOOKIE_RECOVERY_DELAY)[0] == b"0"
    assert manager.lost_bookie_recovery_delay(default=7) == 0
    with pytest.raises(MetadataError):
        manager.set_lost_bookie_recovery_delay(-1)
    seconds, version = manager.lost_bookie_recovery_delay_record()
    manager.trigger_audit()  # written again as it is: a new version, the same value
    assert manager.lost_bookie_recovery_delay_record() == (seconds, version + 1)
    store.set(LOST_BOOKIE_RECOVERY_DELAY, b"soon", -1)
    with pytest.raises(MalformedMetadata):
        manager.lost_bookie_recovery_delay()
    watch.cancel()


def test_the_lowest_live_vote_is_the_auditor(stores):
    first_store = stores.open()
    first = UnderreplicationManager(first_store)
    assert first.auditor() is None and first.votes() == []
    mine = first.vote("b1:3181")
    assert store_data(first_store, mine.path) == b'bookieId: "b1:3181"\n'
    if stores.single_session:
        other = first
    else:
        other = UnderreplicationManager(stores.open())
    theirs = other.vote("b2:3181")
    assert theirs.number > mine.number
    assert [v.bookie_id for v in first.votes()] == ["b1:3181", "b2:3181"]
    assert first.auditor() == "b1:3181"
    first.record_auditor("b1:3181")
    assert store_data(first_store, ELECTION) == b'bookieId: "b1:3181"\n'
    if stores.single_session:
        first.withdraw(mine)
    else:
        first_store.close()  # the auditor's session ends: its vote goes with it
    wait_until(lambda: other.auditor() == "b2:3181", "b2 is the auditor", WAIT_S)
    other.withdraw(theirs)
    other.withdraw(theirs)  # harmless
    assert other.auditor() is None


def test_the_backlog_is_published_and_read(store):
    manager = UnderreplicationManager(store)
    assert manager.backlog() is None
    manager.publish_backlog(Backlog("b1:3181", 1, ledgers=3, entries=40, min_replicas=1))
    latest = Backlog("b1:3181", 2, ledgers=0, entries=0, min_replicas=None)
    manager.publish_backlog(latest)
    assert manager.backlog() == latest
    store.delete(BACKLOG, -1)
    with pytest.raises(NoNode):
        store.get(BACKLOG)
    assert manager.backlog() is None


def store_data(store, path: str) -> bytes:
    return store.get(path)[0]
