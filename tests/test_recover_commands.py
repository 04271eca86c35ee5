"""``pybk recover`` and ``pybk decommission`` as an operator runs them: ``pybk``
processes against a module's cluster of five real bookie processes on the session's
real ZooKeeper, bookies SIGKILLed for good.  The bookies run autorecovery, but with a
``lostBookieRecoveryDelay`` of an hour, so one lost bookie is repaired only by the
command under test (``recover``) or once it asks for an audit (``decommission``).

A repair is checked on the bookies themselves: every entry of the ledger is read from
every bookie of its write set in the new metadata, its digest and payload verified.
"""

from __future__ import annotations

import json

import pytest
import zkutil
from autorecoveryutil import FAST, check_replicas, entries_on, write_ledger
from clusterutil import PASSWORD, BookieProcesses, failed, ok, pybk, unused_port

from pybk import connect
from pybk.autorecovery.replicas import bookie_holds_entries
from pybk.client import BookKeeper
from pybk.meta.ledger_metadata import LedgerState
from pybk.meta.underreplication import UnderreplicationManager
from pybk.testing import wait_until

pytestmark = pytest.mark.timeout(180)

#: Workers open ledgers with the tests' password and try a failed ledger again within
#: 3.2 s; a lone lost bookie waits an hour.
BOOKIE_OPTIONS = ("--set", f"bookieRecoveryPasswd={PASSWORD.decode()}",
                  "--set", "lostBookieRecoveryDelay=3600",
                  "--set", "lockReleaseOfFailedLedgerGracePeriod=3200")
RECOVERY_PASSWORD = ("--set", f"bookieRecoveryPasswd={PASSWORD.decode()}")


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    """Five bookie processes (killed ones' sessions end within a second) and a client."""
    address = zkutil.formatted_cluster(zookeeper)
    group = BookieProcesses(tmp_path_factory.mktemp("bookies"), address)
    try:
        processes = group.start_serving(5, zk_timeout_ms=zkutil.SHORT_SESSION_TIMEOUT_MS,
                                        options=BOOKIE_OPTIONS)
        with connect(address, FAST, zk_settings=zkutil.settings()) as bk:
            yield address, processes, bk
    finally:
        group.close()


def holding(bk: BookKeeper, bookie_id: str) -> list[int]:
    """The ledgers that give ``bookie_id`` an entry."""
    return [i for i in bk.list_ledgers()
            if bookie_holds_entries(bk.ledger_manager.read(i).metadata, bookie_id)]


def kill(bk: BookKeeper, processes, bookie_id: str) -> None:
    next(p for p in processes if p.bookie_id == bookie_id).kill()
    wait_until(lambda: bookie_id not in bk.metadata.bookies(),
               f"{bookie_id} out of the registry", timeout_s=30)


@pytest.fixture(scope="module")
def lost(cluster):
    """Closed ledgers and one open ledger, then the bookie of the open ledger's ensemble
    holding entries of the most closed ones, SIGKILLed: (its id, closed ids, open id)."""
    address, processes, bk = cluster
    open_ = write_ledger(bk, 3, 2, entries=7, close=False)
    closed = [write_ledger(bk, 3, 2, entries=10).id for _ in range(6)]
    victim = max(open_.metadata.fragments[-1].ensemble,
                 key=lambda b: len(set(holding(bk, b)) & set(closed)))
    assert len(set(holding(bk, victim)) & set(closed)) >= 2
    kill(bk, processes, victim)
    return victim, closed, open_.id


def test_bad_input_fails_in_one_line(cluster, tmp_path):
    address, processes, _bk = cluster
    live = processes[0].bookie_id
    assert "is registered (writable): stop it" in failed("recover", live, "--zk", address)
    assert "is still registered" in failed("decommission", live, "--zk", address)
    for command in (["recover", "nobody:1"], ["decommission", "nobody:1"]):
        says = failed(*command, "--zk", address)
        assert says.startswith(f"pybk {command[0]}: bookie nobody:1 is unknown"), says
    says = failed("recover", "nobody:1", "--ledger", "999999", "--zk", address)
    assert says.startswith("pybk recover: ledger 999999 has no metadata"), says
    conf = tmp_path / "bk_server.conf"
    conf.write_text(f"metadataServiceUri=zk://127.0.0.1:{unused_port()}/ledgers\n"
                    "zkTimeout=1000\n")
    for command in (["recover", live], ["decommission", live]):
        says = failed(*command, "--conf", str(conf))
        assert says.startswith(f"pybk {command[0]}: ") and "was refused" in says, says
    usage = pybk("recover", ",", "--zk", address)
    assert usage.returncode == 2 and "names no bookie" in usage.stderr, usage


def test_query_and_dry_run_change_nothing(cluster, lost):
    address, processes, bk = cluster
    victim, closed, open_id = lost
    named = sorted(i for i in bk.list_ledgers()
                   if any(victim in f.ensemble
                          for f in bk.ledger_manager.read(i).metadata.fragments))
    found = json.loads(ok("recover", victim, "--query", "--json", "--zk", address))
    assert [m["ledger"] for m in found] == named
    assert all(m["bookies"] == [victim] for m in found)
    assert next(m for m in found if m["ledger"] == open_id)["state"] == "OPEN"

    versions = {i: bk.ledger_manager.read(i).version for i in bk.list_ledgers()}
    live = [p.bookie_id for p in processes if p.bookie_id != victim]
    held = {(b, i): entries_on(bk, b, bk.ledger_manager.read(i).metadata)
            for b in live for i in closed}
    plan = json.loads(ok("recover", victim, "--dry-run", "--json", "--zk", address,
                         *RECOVERY_PASSWORD))
    assert sorted(m["ledger"] for m in plan) == sorted(holding(bk, victim))
    for m in plan:
        metadata = bk.ledger_manager.read(m["ledger"]).metadata
        if m["ledger"] == open_id:  # its last fragment lost the victim: fenced first
            assert (m["action"], m["bytes_estimate"]) == ("fence, close, copy", None)
            continue
        assert m["action"] == "copy"
        ensemble = metadata.fragments[0].ensemble
        [copy] = m["copies"]
        assert copy["lost"] == victim and copy["replacement"] not in ensemble
        assert copy["entries"] == [e for e in range(10) if victim in metadata.write_set(e)]
        assert m["bytes_estimate"] == metadata.length * len(copy["entries"]) // 10
    assert {i: bk.ledger_manager.read(i).version for i in bk.list_ledgers()} == versions
    assert {(b, i): entries_on(bk, b, bk.ledger_manager.read(i).metadata)
            for b in live for i in closed} == held
    text = ok("recover", victim, "--dry-run", "--zk", address, *RECOVERY_PASSWORD)
    assert text.splitlines()[0].split()[:3] == ["LEDGER", "STATE", "ACTION"]


def test_recover_one_ledger_then_every_ledger_and_the_cookie(cluster, lost):
    address, _processes, bk = cluster
    victim, closed, open_id = lost
    before = holding(bk, victim)
    one = next(i for i in before if i in closed)
    versions = {i: bk.ledger_manager.read(i).version for i in before}
    done = pybk("recover", victim, "--ledger", str(one), "--json", "--zk", address,
                *RECOVERY_PASSWORD)
    assert done.returncode == 0, done
    [only] = json.loads(done.stdout)["ledgers"]
    assert (only["ledger"], only["outcome"]) == (one, "replicated") and only["entries"] > 0
    assert f"pybk recover: ledger {one} replicated" in done.stderr  # progress, not a tty
    assert holding(bk, victim) == [i for i in before if i != one]
    assert all(bk.ledger_manager.read(i).version == versions[i] for i in before if i != one)
    metadata = bk.ledger_manager.read(one).metadata
    check_replicas(bk, metadata, metadata.last_entry_id)

    done = pybk("recover", victim, "--skip-open", "--json", "--zk", address,
                *RECOVERY_PASSWORD)
    assert done.returncode == 0, done
    outcomes = {r["ledger"]: r["outcome"] for r in json.loads(done.stdout)["ledgers"]}
    assert outcomes == {i: "skipped" if i == open_id else "replicated"
                        for i in before if i != one}
    assert holding(bk, victim) == [open_id]
    assert bk.ledger_manager.read(open_id).metadata.state is LedgerState.OPEN

    done = pybk("recover", victim, "--delete-cookie", "--json", "--zk", address,
                *RECOVERY_PASSWORD)
    assert done.returncode == 0, done
    result = json.loads(done.stdout)
    assert [(r["ledger"], r["outcome"]) for r in result["ledgers"]] == \
        [(open_id, "replicated")]
    assert result["cookies_deleted"] == [victim]
    assert bk.metadata.read_cookie(victim) is None
    assert holding(bk, victim) == []
    for ledger_id in before:
        metadata = bk.ledger_manager.read(ledger_id).metadata
        assert metadata.state is LedgerState.CLOSED  # the open one was fenced and closed
        check_replicas(bk, metadata, metadata.last_entry_id)
    assert bk.ledger_manager.read(open_id).metadata.last_entry_id == 6


def test_decommission_waits_for_autorecovery_then_removes_the_cookie(cluster, lost):
    address, processes, bk = cluster
    victim, _closed, _open_id = lost
    gone = max((p.bookie_id for p in processes if p.bookie_id != victim),
               key=lambda b: len(holding(bk, b)))
    # A ledger the workers cannot open (another password than bookieRecoveryPasswd):
    # decommission waits for it in vain.
    stuck = next(handle for handle in (write_ledger(bk, 3, 2, entries=3, password=b"other")
                                       for _ in range(20))
                 if gone in handle.metadata.fragments[0].ensemble).id
    before = holding(bk, gone)
    assert stuck in before and bk.metadata.read_cookie(gone) is not None
    manager = UnderreplicationManager(bk.metadata)
    manager.disable()  # nothing is marked while it dies
    try:
        kill(bk, processes, gone)
        assert "autorecovery is disabled" in failed("decommission", gone, "--zk", address)
    finally:
        manager.enable()

    timed_out = pybk("decommission", gone, "--timeout", "5", "--zk", address)
    assert timed_out.returncode == 1 and not timed_out.stdout, timed_out
    *progress, says = timed_out.stderr.splitlines()
    assert progress and all(line.startswith("pybk decommission: ") for line in progress)
    assert any("waiting for autorecovery to re-replicate ledgers" in line
               for line in progress), progress
    assert says.startswith(f"pybk decommission: bookie {gone}: ledgers ") and \
        str(stuck) in says.split(" still hold entries")[0] and "cookie is kept" in says, says
    assert bk.metadata.read_cookie(gone) is not None
    # recover fails on it too, in one line after its answer, and says why
    refused = pybk("recover", gone, "--ledger", str(stuck), "--zk", address,
                   *RECOVERY_PASSWORD)
    assert refused.returncode == 1 and refused.stdout.split()[4:6] == [str(stuck),
                                                                       "failed"], refused
    says = refused.stderr.splitlines()[-1]
    assert says.startswith(f"pybk recover: 1 ledgers not recovered (ledger {stuck}: ") \
        and "another password" in says and says.endswith("run it again"), says

    bk.delete_ledger(stuck)
    done = pybk("decommission", gone, "--timeout", "50", "--json", "--zk", address)
    assert done.returncode == 0, done
    result = json.loads(done.stdout)
    assert (result["bookie"], result["cookie_removed"]) == (gone, True)
    assert set(result["ledgers"]) <= set(before)
    assert bk.metadata.read_cookie(gone) is None and holding(bk, gone) == []
    for ledger_id in before:
        if ledger_id != stuck:
            metadata = bk.ledger_manager.read(ledger_id).metadata
            check_replicas(bk, metadata, metadata.last_entry_id)
    assert "is unknown" in failed("decommission", gone, "--zk", address)


def test_progress_lines_say_ledgers_bytes_rate_and_time_left():
    import io

    from pybk.admin.progress import Progress

    out = io.StringIO()
    with Progress("recover", 2, 4096, out) as progress:
        progress.done(7, "replicated", 10, 2048)
        progress.done(8, "skipped")
    first, second = out.getvalue().splitlines()
    assert first.startswith("pybk recover: ledger 7 replicated (10 entries, 2.0 KiB); "
                            "1/2 ledgers, 2.0 KiB of about 4.0 KiB, "), first
    assert first.endswith(" s left") and "/s" in first, first
    assert second.startswith("pybk recover: ledger 8 skipped; 2/2 ledgers"), second


def test_progress_on_a_terminal_is_a_bar_with_ledgers_bytes_and_rate():
    import io

    from pybk.admin.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    with Progress("recover", 2, 4096, out) as progress:
        progress.done(7, "replicated", 10, 4096)
        progress.done(8, "skipped")
    last = out.getvalue().split("\r")[-1]
    assert last.startswith("recover: 100%") and "B/s" in last and "2/2 ledgers" in last, last
