"""The auditor on a real cluster: ``pybk bookie`` processes (each standing for auditor,
``autoRecoveryDaemonEnabled`` being the default) and a ``pybk autorecovery`` process on
the session's real ZooKeeper, bookies killed with SIGKILL.

What is marked is checked against the ledgers' metadata (which entries each bookie was
given: :meth:`LedgerMetadata.write_set`), so "every ledger with an entry on the lost
bookie, and only those" is exact.  Waits are bounded; no assertion depends on timing:
where "not yet" is checked, the test first waits for the auditor's own log line saying
it saw the change.
"""

from __future__ import annotations

import dataclasses
import gc
import re
import subprocess

import pytest
import zkutil
from autorecoveryutil import cluster, expected_marks, full_log, holds_entries, marks, write_ledger  # noqa: F401 (a fixture)
from clusterutil import BookieProcess, address, bookies, child_env, pybk_command  # noqa: F401

from pybk.autorecovery.auditor import Auditor
from pybk.autorecovery.service import AutoRecovery
from pybk.client import BookKeeper
from pybk.client.transport import BookieClient
from pybk.errors import BookKeeperError
from pybk.meta.ledger_metadata import DigestType, LedgerMetadata, LedgerState
from pybk.meta.ledgers import LedgerManager
from pybk.meta.underreplication import UnderreplicationManager
from pybk.meta.zookeeper import ZooKeeperMetadataStore
from pybk.settings import ServerSettings
from pybk.testing import wait_until
from pybk.testing.ledger_records import put_ledgers

pytestmark = pytest.mark.timeout(180)

#: Bookies to be killed end their ZooKeeper session soon after.
SHORT_MS = zkutil.SHORT_SESSION_TIMEOUT_MS


@pytest.fixture(autouse=True)
def no_replication_workers(monkeypatch):
    """Bookie and autorecovery processes run no replication worker here, so that the
    marks stay for the tests to see (tests/test_replication_worker.py repairs them)."""
    monkeypatch.setenv("PYBK_replicationWorkerEnabled", "false")


def replicas_left(bk: BookKeeper, lost: str, open_lac: int) -> tuple[int, int]:
    """How many acknowledged entries had a replica on ``lost``, and the fewest replicas
    any acknowledged entry has left (an open ledger's entries up to ``open_lac``)."""
    short, fewest = 0, None
    for ledger_id in bk.list_ledgers():
        metadata = bk.ledger_manager.read(ledger_id).metadata
        last = metadata.last_entry_id if metadata.state is LedgerState.CLOSED else open_lac
        for entry_id in range(last + 1):
            write_set = metadata.write_set(entry_id)
            short += lost in write_set
            left = len(write_set) - (lost in write_set)
            fewest = left if fewest is None else min(fewest, left)
    return short, fewest


def auditor_process(manager: UnderreplicationManager, processes) -> BookieProcess:
    """The process that is the auditor (waited for), by its election id."""
    by_id = {p.bookie_id: p for p in processes}
    auditor = wait_until(lambda: by_id.get(manager.auditor()), "an auditor is elected")
    wait_until(lambda: "is the auditor" in full_log(auditor), "the auditor audits")
    return auditor


def auditing_now(process: BookieProcess) -> bool:
    """Whether the process's log says it is the auditor now."""
    states = re.findall(r"auditor election: \S+ is (the|no longer the) auditor",
                        full_log(process))
    return bool(states) and states[-1] == "the"


# -- lost bookies ----------------------------------------------------------------------------

def test_a_lost_bookies_ledgers_and_only_those_are_marked(bookies, cluster):
    processes = bookies.start_serving(4, zk_timeout_ms=SHORT_MS)
    bk, manager = cluster
    for _ in range(4):
        write_ledger(bk, 2, 2, entries=3)
    write_ledger(bk, 4, 2, entries=4)                    # on every bookie
    write_ledger(bk, 3, 3, entries=2)
    write_ledger(bk, 2, 2, entries=0)                    # closed empty: holds nothing
    single = write_ledger(bk, 3, 2, entries=1)           # entry 0 on ensemble[0] and [1]
    open_ledger = write_ledger(bk, 3, 2, entries=5, close=False)
    auditor_process(manager, processes)
    # In the ensemble of `single` but given none of its entries.  (If it is the auditor,
    # its successor's bookie check finds it.)
    victim_id = single.metadata.fragments[0].ensemble[2]
    expected = expected_marks(bk, victim_id)
    assert single.id not in expected and expected, expected
    victim = next(p for p in processes if p.bookie_id == victim_id)
    victim.kill()

    found = wait_until(lambda: (m := marks(manager)) and set(m) == expected and m,
                       f"the ledgers of {victim_id} marked: {sorted(expected)}")
    assert all(replicas == (victim_id,) for replicas in found.values()), found
    assert (open_ledger.id in found) == (victim_id in open_ledger.metadata.fragments[0]
                                         .ensemble)
    # The published backlog counts those ledgers, their acknowledged entries that had a
    # replica on the lost bookie (the open ledger's up to the LAC its bookies report: 3,
    # or 4 once its writer's explicit LAC reached them) and the fewest replicas left.
    backlog = wait_until(lambda: (b := manager.backlog()) and b.ledgers == len(expected)
                         and b, "the backlog counts them")
    counts = [replicas_left(bk, victim_id, lac) for lac in (3, 4)]
    assert counts[0][0] <= backlog.entries <= counts[1][0], (backlog, counts)
    assert backlog.min_replicas == counts[0][1]
    open_ledger.close()


def test_auditor_failover_keeps_exactly_one_auditor(bookies, cluster, tmp_path, closing):
    processes = bookies.start_serving(2, zk_timeout_ms=SHORT_MS)
    _bk, manager = cluster
    # A standalone autorecovery process stands too.
    log_path = tmp_path / "autorecovery.log"
    with open(log_path, "ab") as out:
        standalone = subprocess.Popen(
            pybk_command("autorecovery", "--zk", bookies.address, "--id", "standalone",
                         "--set", f"zkTimeout={SHORT_MS}"),
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=child_env())
    other = BookieProcess("standalone", standalone, log_path, 0)
    other.bookie_id = "standalone"
    bookies.started.append(other)  # killed at the end whatever happens
    wait_until(lambda: len(manager.votes()) == 3, "three candidates vote")
    alive = processes + [other]
    for round_ in range(2):
        auditor = auditor_process(manager, alive)
        assert [p.bookie_id for p in alive if auditing_now(p)] == [auditor.bookie_id]
        auditor.kill()
        alive.remove(auditor)
        successor = wait_until(lambda: manager.auditor() in {p.bookie_id for p in alive}
                               and manager.auditor(), f"round {round_}: a successor")
        winner = next(p for p in alive if p.bookie_id == successor)
        wait_until(lambda winner=winner: auditing_now(winner), f"{successor} audits")
        assert [p.bookie_id for p in alive if auditing_now(p)] == [successor]
        assert {v.bookie_id for v in manager.votes()} == {p.bookie_id for p in alive}
    assert [v.bookie_id for v in manager.votes()] == [alive[0].bookie_id]


def test_an_auditor_whose_session_expires_stops_and_another_takes_over(address, closing):
    stores = [closing.enter_context(ZooKeeperMetadataStore(address, zkutil.settings()))
              for _ in range(2)]
    services = [closing.enter_context(AutoRecovery(store, ServerSettings(), name))
                for store, name in zip(stores, ("a", "b"))]
    manager = services[0].manager
    first = wait_until(lambda: next((s for s in services if s.is_auditor), None),
                       "an auditor")
    second = next(s for s in services if s is not first)
    assert manager.auditor() == first.candidate and not second.is_auditor
    zkutil.expire_session(first.store)
    wait_until(lambda: second.is_auditor and not first.is_auditor, "the other audits")
    # The first stands again, in its new session, behind the new auditor.
    wait_until(lambda: [v.bookie_id for v in manager.votes()]
               == [second.candidate, first.candidate], "the first votes again")
    assert second.is_auditor and not first.is_auditor


def test_an_auditor_cut_off_from_zookeeper_stops_auditing_until_it_is_back(
        own_zookeeper, closing):
    address = zkutil.formatted_cluster(own_zookeeper)
    # Sessions longer than the outage: the votes survive it.
    store = closing.enter_context(ZooKeeperMetadataStore(
        address, zkutil.settings(zkTimeout=30_000)))
    service = closing.enter_context(AutoRecovery(store, ServerSettings(), "a"))
    wait_until(lambda: service.is_auditor, "it audits")
    own_zookeeper.shutdown(graceful=False)
    # Its session may expire while it cannot tell: it stops at once, so that it never
    # audits beside an auditor elected meanwhile.
    wait_until(lambda: not service.is_auditor, "it stops auditing")
    own_zookeeper.start()
    wait_until(lambda: service.is_auditor, "it audits again, in the same session")
    assert [v.bookie_id for v in service.manager.votes()] == ["a"]


def closed_ledger_on(ledgers: LedgerManager, ensemble: list[str], entries: int) -> int:
    """A CLOSED ledger's metadata naming ``ensemble`` (Qw = E), written directly."""
    created = ledgers.create_ledger(ensemble, len(ensemble), 1, DigestType.CRC32C, b"")
    closed = dataclasses.replace(created.metadata, state=LedgerState.CLOSED,
                                 last_entry_id=entries - 1, length=0)
    ledgers.update(closed, created.version)
    return closed.ledger_id


def test_a_bookie_turning_read_only_is_not_lost(address, closing):
    store = closing.enter_context(ZooKeeperMetadataStore(address, zkutil.settings()))
    ledgers = LedgerManager(store)
    on_one = closed_ledger_on(ledgers, ["ro:1"], entries=2)
    on_two = closed_ledger_on(ledgers, ["gone:2"], entries=2)
    store.register_bookie("ro:1")
    store.register_bookie("gone:2")
    service = closing.enter_context(AutoRecovery(store, ServerSettings(), "auditor"))
    wait_until(lambda: service.is_auditor, "it audits")
    wait_until(lambda: service.manager.backlog(), "its first measurement")
    store.register_bookie("ro:1", read_only=True)  # its disks filled
    store.unregister_bookie("gone:2")
    # Registry changes are taken in order: once gone:2 is marked, the move of ro:1 to
    # the read-only list was seen, and marked nothing.
    wait_until(lambda: on_two in marks(service.manager), "the bookie that left is lost")
    assert marks(service.manager) == {on_two: ("gone:2",)}
    assert on_one not in marks(service.manager)


# -- the delay and the disable flag ------------------------------------------------------------

def kill_non_auditor(manager, processes) -> BookieProcess:
    """Kill a bookie that is not the auditor; return it once the auditor's log says it
    saw the bookie leave."""
    auditor = auditor_process(manager, processes)
    victim = next(p for p in processes if p is not auditor)
    victim.kill()
    wait_until(lambda: f"bookie {victim.bookie_id} left the registry" in full_log(auditor),
               f"the auditor sees {victim.bookie_id} leave")
    return victim


def test_nothing_is_marked_within_the_delay_and_a_bookie_back_in_time_marks_nothing(
        bookies, cluster):
    processes = bookies.start_serving(4, zk_timeout_ms=SHORT_MS)
    bk, manager = cluster
    for _ in range(4):
        write_ledger(bk, 3, 2, entries=3)
    write_ledger(bk, 4, 2, entries=4)  # on every bookie
    manager.set_lost_bookie_recovery_delay(3600)  # the cluster's value wins
    auditor_process(manager, processes)
    restarted = kill_non_auditor(manager, processes)
    assert marks(manager) == {}  # seen missing, within its delay: nothing marked
    back = bookies.start(restarted.name, zk_timeout_ms=SHORT_MS).wait_serving()
    assert back.bookie_id == restarted.bookie_id
    auditor = auditor_process(manager, processes)
    wait_until(lambda: f"bookie {back.bookie_id} is back before it was audited"
               in full_log(auditor), "the auditor sees it back")
    # With no delay now, the next lost bookie is marked at once, and the one that came
    # back in time is in no mark.
    manager.set_lost_bookie_recovery_delay(0)
    processes = [p for p in processes if p is not restarted] + [back]
    victim = kill_non_auditor(manager, [p for p in processes if p is not back])
    expected = expected_marks(bk, victim.bookie_id)
    found = wait_until(lambda: (m := marks(manager)) and set(m) == expected and m,
                       f"the ledgers of {victim.bookie_id} marked")
    assert all(replicas == (victim.bookie_id,) for replicas in found.values()), found


def test_the_disable_flag_holds_marking_until_enabled(bookies, cluster):
    processes = bookies.start_serving(3, zk_timeout_ms=SHORT_MS)
    bk, manager = cluster
    for _ in range(3):
        write_ledger(bk, 2, 2, entries=2)
    write_ledger(bk, 3, 2, entries=3)  # on every bookie
    manager.disable()
    victim = kill_non_auditor(manager, processes)
    expected = expected_marks(bk, victim.bookie_id)
    assert expected
    assert marks(manager) == {}  # lost, and seen lost, but marking is off
    manager.enable()
    wait_until(lambda: set(marks(manager)) == expected, "marked once enabled")


def test_two_bookies_lost_together_are_audited_at_once_whatever_the_delay(bookies,
                                                                          cluster):
    processes = bookies.start_serving(5, zk_timeout_ms=SHORT_MS)
    bk, manager = cluster
    for _ in range(5):
        write_ledger(bk, 3, 2, entries=3)
    write_ledger(bk, 5, 2, entries=5)  # on every bookie
    manager.set_lost_bookie_recovery_delay(3600)
    auditor = auditor_process(manager, processes)
    victims = [p for p in processes if p is not auditor][:2]
    for victim in victims:
        victim.kill()
    expected = expected_marks(bk, victims[0].bookie_id) | expected_marks(
        bk, victims[1].bookie_id)
    found = wait_until(lambda: (m := marks(manager)) and set(m) == expected and m,
                       "the ledgers of both marked")
    for ledger_id, replicas in found.items():
        metadata = bk.ledger_manager.read(ledger_id).metadata
        assert set(replicas) == {v.bookie_id for v in victims
                                 if holds_entries(metadata, v.bookie_id)}


# -- the periodic checks -------------------------------------------------------------------------

def test_bookies_that_died_while_no_auditor_ran_are_found(bookies, cluster, tmp_path):
    processes = [bookies.start(f"bookie{i}", "--set", "autoRecoveryDaemonEnabled=false",
                               zk_timeout_ms=SHORT_MS) for i in range(1, 4)]
    processes = [p.wait_serving() for p in processes]
    bk, manager = cluster
    for _ in range(3):
        write_ledger(bk, 2, 2, entries=2)
    write_ledger(bk, 3, 2, entries=3)  # on every bookie
    victim = processes[0]
    expected = expected_marks(bk, victim.bookie_id)
    assert expected
    victim.kill()
    wait_until(lambda: victim.bookie_id not in bk.metadata.bookies(), "its session ends")
    assert manager.votes() == [] and marks(manager) == {}  # nobody audits
    log_path = tmp_path / "autorecovery.log"
    with open(log_path, "ab") as out:
        process = subprocess.Popen(
            pybk_command("autorecovery", "--zk", bookies.address, "--id", "late"),
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=child_env())
    late = BookieProcess("late", process, log_path, 0)
    bookies.started.append(late)
    wait_until(lambda: set(marks(manager)) == expected, "its ledgers marked")
    assert late.terminate() == 0
    assert manager.votes() == []


def test_the_ledger_check_marks_entries_a_live_bookie_lacks(bookies, cluster):
    processes = [bookies.start(f"bookie{i}", "--set", "auditorPeriodicCheckInterval=1")
                 for i in range(1, 4)]
    processes = [p.wait_serving() for p in processes]
    bk, manager = cluster
    wiped, kept = [write_ledger(bk, 3, 3, entries=4) for _ in range(2)]
    auditor = auditor_process(manager, processes)
    wait_until(lambda: "ledger check of 2 ledgers marked 0" in full_log(auditor),
               "a ledger check finds both ledgers whole")
    # The bookie loses the ledger (as with a lost disk) while staying registered.
    bookie_id = wiped.metadata.fragments[0].ensemble[1]
    bk.bookie_client(bookie_id).delete_ledger(wiped.id).result(10)
    found = wait_until(lambda: marks(manager), "the ledger check marks it")
    assert found == {wiped.id: (bookie_id,)}
    assert bk.metadata.bookies() == sorted(p.bookie_id for p in processes)  # all live


def test_pybk_autorecovery_without_a_cluster_fails_clearly():
    done = subprocess.run(pybk_command("autorecovery"), env=child_env(), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 1
    assert "no cluster given" in done.stderr and "Traceback" not in done.stderr


def test_trigger_audit_marks_a_bookie_within_its_delay_at_once(bookies, cluster):
    processes = bookies.start_serving(3, zk_timeout_ms=SHORT_MS)
    bk, manager = cluster
    for _ in range(3):
        write_ledger(bk, 2, 2, entries=2)
    write_ledger(bk, 3, 2, entries=3)  # on every bookie
    manager.set_lost_bookie_recovery_delay(3600)
    victim = kill_non_auditor(manager, processes)
    expected = expected_marks(bk, victim.bookie_id)
    assert expected and marks(manager) == {}
    manager.trigger_audit()  # the delay written again, unchanged
    wait_until(lambda: set(marks(manager)) == expected, "marked at once")
    assert manager.lost_bookie_recovery_delay() == 3600


class _CountingMarks(UnderreplicationManager):
    """Counts, at every tenth mark, the metadata objects of ledgers ``ids`` alive in the
    process."""

    def __init__(self, store, ids: range) -> None:
        super().__init__(store)
        self.ids = ids
        self.marked = 0
        self.alive_at_marks: list[int] = []

    def mark_underreplicated(self, *args, **kwargs):
        if self.marked % 10 == 0:
            self.alive_at_marks.append(sum(isinstance(o, LedgerMetadata)
                                           and o.ledger_id in self.ids
                                           for o in gc.get_objects()))
        done = super().mark_underreplicated(*args, **kwargs)
        self.marked += 1  # after the mark is written, so a waiter sees it in the store
        return done


def test_an_audit_holds_one_ledgers_metadata_at_a_time(address, closing):
    """An audit of many ledgers reads them one by one as it marks them: at every mark
    one or two ledgers' metadata are alive, not every ledger's."""
    store = closing.enter_context(ZooKeeperMetadataStore(address, zkutil.settings()))
    ids = range(2 ** 40, 2 ** 40 + 150)  # no other test's ledgers
    put_ledgers(store, ids)  # OPEN on bookies b1, b2, which are not registered
    manager = _CountingMarks(store, ids)

    def no_bookie(bookie_id: str) -> BookieClient:
        raise BookKeeperError(f"{bookie_id} is not reachable here")

    # Its bookie check finds b1 and b2 holding entries unregistered: two lost together,
    # audited at once.
    auditor = Auditor(store, manager, ServerSettings(), no_bookie, "auditor").start()
    closing.callback(auditor.close)
    wait_until(lambda: manager.marked == len(ids), "every ledger is marked", timeout_s=120)
    assert set(marks(manager)) == set(ids)
    assert len(manager.alive_at_marks) == len(ids) // 10
    assert max(manager.alive_at_marks) <= 2, manager.alive_at_marks
