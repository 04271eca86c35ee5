"""The admin shell as an operator meets it: each command run as a ``pybk`` process
against a live cluster (real ZooKeeper, three real bookie processes), its table and its
``--json``, and bad input (unknown bookie, missing ledger, unreachable ZooKeeper)
answered in one line with exit status 1, never a traceback.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

import zkutil
from clusterutil import child_env
from pybk.meta.underreplication import UnderreplicationManager
from pybk.meta.zookeeper import ZooKeeperMetadataStore

pytestmark = pytest.mark.timeout(180)


def pybk(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "pybk", *args], env=child_env(),
                            capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def ok(*args: str) -> str:
    result = pybk(*args)
    assert result.returncode == 0, result
    return result.stdout


def as_json(*args: str):
    return json.loads(ok(*args, "--json"))


def failed(*args: str) -> str:
    """The one line a failed command says on standard error (exit status 1)."""
    result = pybk(*args)
    assert result.returncode == 1, result
    assert result.stderr.count("\n") == 1 and not result.stdout, result
    return result.stderr


@pytest.fixture(scope="module")
def ledgers(bk):
    """Two ledgers of the module's cluster: one closed with 3 entries, one open with 1."""
    closed = bk.create_ledger(3, 2, 2)
    for i in range(3):
        closed.add_entry(b"entry %d" % i)
    closed.close()
    open_ = bk.create_ledger(2, 2, 2)
    open_.add_entry(b"open")
    yield closed.id, open_.id
    open_.close()


@pytest.fixture
def manager(address):
    """The cluster's under-replication records, seen from the test (a session of its
    own), with automatic re-replication enabled again at the end."""
    with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
        manager = UnderreplicationManager(store)
        yield manager
        manager.enable()


def test_autorecovery_disable_status_enable_change_the_cluster_flag(address, manager):
    assert ok("autorecovery", "status", "--zk", address) == "autorecovery is enabled\n"
    assert as_json("autorecovery", "disable", "--zk", address) == {"enabled": False}
    assert not manager.is_enabled()
    assert ok("autorecovery", "status", "--zk", address) == "autorecovery is disabled\n"
    assert ok("autorecovery", "disable", "--zk", address) == "autorecovery is disabled\n"
    assert ok("autorecovery", "enable", "--zk", address) == "autorecovery is enabled\n"
    assert manager.is_enabled()


def test_listunderreplicated_shows_marks_and_missing_replicas(address, manager, ledgers):
    closed, _ = ledgers
    assert as_json("listunderreplicated", "--zk", address) == []
    assert ok("listunderreplicated", "--zk", address).splitlines()[1] == "(none)"
    manager.disable()  # else the bookies' replication workers repair it at once
    manager.mark_underreplicated(closed, ["lost-bookie:3181"])
    try:
        found = as_json("listunderreplicated", "--zk", address)
        assert [(m["ledger"], m["missing"], m["claimed_by"]) for m in found] == [
            (closed, ["lost-bookie:3181"], None)]
        assert isinstance(found[0]["marked_ms"], int)
        table = ok("listunderreplicated", "--zk", address).splitlines()
        assert table[0].split()[:2] == ["LEDGER", "MISSING"]
        assert table[1].split()[:2] == [str(closed), "lost-bookie:3181"]
    finally:
        claim = manager.claim(closed)
        assert claim is not None and manager.mark_replicated(claim), claim


def test_whoisauditor_names_the_elected_bookie(address, bk):
    bookies = set(bk.ledger_manager.store.bookies())
    auditor = as_json("whoisauditor", "--zk", address)["auditor"]
    assert auditor in bookies  # the bookies run autorecovery by default
    assert ok("whoisauditor", "--zk", address) == f"auditor: {auditor}\n"


def test_lostbookierecoverydelay_shows_and_sets_and_triggeraudit_keeps_it(address, manager):
    before = manager.lost_bookie_recovery_delay()
    assert as_json("lostbookierecoverydelay", "--zk", address) == {"seconds": before,
                                                                   "set": False}
    try:
        assert ok("lostbookierecoverydelay", "7", "--zk", address) == \
            "lostBookieRecoveryDelay set to 7 s\n"
        assert manager.lost_bookie_recovery_delay() == 7
        version = manager.lost_bookie_recovery_delay_record()[1]
        triggered = as_json("triggeraudit", "--zk", address)
        assert triggered["triggered"] is True
        # the trigger rewrote the delay (the auditor watches it), with the same value
        assert manager.lost_bookie_recovery_delay_record() == (7, version + 1)
    finally:
        manager.set_lost_bookie_recovery_delay(before)


def test_listbookies_lists_the_writable_bookies_with_endpoints(address, bk):
    registered = sorted(bk.ledger_manager.store.bookies())
    found = as_json("listbookies", "--zk", address)
    assert [b["bookie"] for b in found] == registered
    assert {b["state"] for b in found} == {"rw"}
    assert all(b["endpoint"] for b in found)
    assert as_json("listbookies", "--rw", "--zk", address) == found
    assert as_json("listbookies", "--ro", "--zk", address) == []
    table = ok("listbookies", "--zk", address).splitlines()
    assert [line.split()[0] for line in table[1:]] == registered


def test_clusterinfo_reports_bookies_auditor_backlog_and_no_entry_at_risk(address, bk,
                                                                          ledgers):
    registered = sorted(bk.ledger_manager.store.bookies())
    info = as_json("clusterinfo", "--zk", address)
    assert (info["writable"], info["read_only"], info["lost"]) == (registered, [], [])
    assert info["auditor"] in registered and info["autorecovery"] is True
    assert info["underreplicated"] == 0
    # every entry has Qw = 2 replicas on live bookies: one more stopping loses none
    assert (info["fewest_live_replicas"], info["at_risk_ledgers"]) == (2, [])
    text = ok("clusterinfo", "--zk", address)
    assert f"bookies writable (3): {', '.join(registered)}" in text
    assert "no entry would lose its last replica if one more bookie stopped" in text


def test_listledgers_and_ledgermetadata_show_the_ledgers(address, bk, ledgers):
    closed, open_ = ledgers
    ids = [m["ledger"] for m in as_json("listledgers", "--zk", address)]
    assert closed in ids and open_ in ids
    meta = {m["ledger"]: m for m in as_json("listledgers", "--meta", "--zk", address)}
    assert meta[closed]["state"] == "CLOSED" and meta[closed]["last_entry_id"] == 2
    assert meta[open_]["state"] == "OPEN" and meta[open_]["ensemble_size"] == 2
    on_bookie = meta[open_]["fragments"][0]["ensemble"][0]
    expected = sorted(i for i, m in meta.items()
                      if any(on_bookie in f["ensemble"] for f in m["fragments"]))
    assert [m["ledger"] for m in as_json("listledgers", "--bookie", on_bookie,
                                         "--zk", address)] == expected
    shown = as_json("ledgermetadata", str(closed), "--zk", address)
    assert shown == meta[closed]
    assert shown["length"] == sum(len(b"entry %d" % i) for i in range(3))
    text = ok("ledgermetadata", str(closed), "--zk", address)
    assert text.startswith(f"ledger {closed}: CLOSED, E=3 Qw=2 Qa=2")
    assert "last entry 2" in text


def test_deleteledger_deletes_it_and_a_second_time_says_it_is_missing(address, bk):
    handle = bk.create_ledger(2, 2, 2)
    handle.add_entry(b"doomed")
    handle.close()
    assert ok("deleteledger", str(handle.id), "--zk", address) == \
        f"deleted ledger {handle.id}\n"
    assert handle.id not in bk.list_ledgers()
    assert "no metadata" in failed("deleteledger", str(handle.id), "--zk", address)


@pytest.mark.parametrize("args, says", [
    (["ledgermetadata", "999999"], "pybk ledgermetadata: ledger 999999 has no metadata"),
    (["listledgers", "--bookie", "nobody:1"], "pybk listledgers: bookie nobody:1 is "
                                               "unknown"),
])
def test_a_missing_ledger_or_unknown_bookie_fails_in_one_line(address, args, says):
    assert failed(*args, "--zk", address).startswith(says)


def test_an_unreachable_zookeeper_fails_in_one_line(tmp_path):
    with socket.socket() as sock:  # a port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    conf = tmp_path / "bk_server.conf"
    conf.write_text(f"metadataServiceUri=zk://127.0.0.1:{port}/ledgers\nzkTimeout=1000\n")
    for command in (["whoisauditor"], ["autorecovery", "status"], ["listbookies"]):
        says = failed(*command, "--conf", str(conf))
        assert says.startswith(f"pybk {command[0]}: ") and "within 1 s" in says, says


def test_bad_arguments_get_usage_and_status_2():
    for args, says in ((["whoisauditor"], "no cluster given"),
                       (["ledgermetadata", "x", "--zk", "zk://h/ledgers"],
                        "'x' is not a whole number"),
                       (["listbookies", "--rw", "--ro", "--zk", "zk://h/ledgers"],
                        "not allowed with argument")):
        result = pybk(*args)
        assert result.returncode == 2 and says in result.stderr, result


def test_an_entry_on_one_live_bookie_is_at_risk_and_a_closed_empty_ledger_never():
    from pybk.cluster.admin_commands import _fewest_live_replicas
    from pybk.meta.ledger_metadata import (DigestType, Fragment, LedgerMetadata,
                                           LedgerState, hash_password)

    def ledger(**closed) -> LedgerMetadata:
        return LedgerMetadata(ledger_id=1, ensemble_size=3, write_quorum_size=2,
                              ack_quorum_size=2, fragments=(Fragment(0, ("a", "b", "c")),),
                              digest_type=DigestType.CRC32C,
                              password_hash=hash_password(b""), **closed)

    # write sets (a, b), (b, c), (c, a): with c gone, entries 1 and 2 have one replica
    assert _fewest_live_replicas(ledger(), {"a", "b", "c"}) == 2
    assert _fewest_live_replicas(ledger(), {"a", "b"}) == 1
    # only entry 0 exists, on (a, b): c's loss leaves it two
    one = ledger(state=LedgerState.CLOSED, last_entry_id=0, length=1)
    assert _fewest_live_replicas(one, {"a", "b"}) == 2
    empty = ledger(state=LedgerState.CLOSED, last_entry_id=-1, length=0)
    assert _fewest_live_replicas(empty, set()) is None
