"""The admin shell as an operator meets it: each command run as a ``pybk`` process
against a live cluster (real ZooKeeper, three real bookie processes), its table and its
``--json``, and bad input (unknown bookie, missing ledger, unreachable ZooKeeper)
answered in one line with exit status 1, never a traceback.
"""

from __future__ import annotations

import base64
import json
import socket
import time

import pytest
import zkutil
from clusterutil import BookieProcesses, failed, ok, pybk, unused_port

from pybk import WriteFlag, connect
from pybk.cli.admin import PAYLOAD_WIDTH, show_cluster, utc_time
from pybk.client.digest import DigestManager
from pybk.errors import LedgerClosed
from pybk.meta.underreplication import UnderreplicationManager
from pybk.meta.zookeeper import ZooKeeperMetadataStore
from pybk.testing import wait_until

pytestmark = pytest.mark.timeout(180)


def as_json(*args: str):
    return json.loads(ok(*args, "--json"))


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
        assert table[1].split()[:3] == [str(closed), "lost-bookie:3181",
                                        utc_time(found[0]["marked_ms"])]
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
    # people read the creation time as a UTC time; scripts get the number (JSON)
    created_ms = shown["creation_time_ms"]
    assert isinstance(created_ms, int), shown
    utc = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created_ms // 1000))
    assert f", created {utc}.{created_ms % 1000:03d}Z\n" in text, text
    assert str(created_ms) not in text


def test_a_creation_time_shows_as_iso_8601_utc_to_the_millisecond():
    assert utc_time(0) == "1970-01-01T00:00:00.000Z"
    assert utc_time(1_764_345_426_007) == "2025-11-28T15:57:06.007Z"
    # a time no calendar has (malformed metadata) is still shown, as it is
    assert utc_time(10**20) == f"{10**20} ms"


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
    conf = tmp_path / "bk_server.conf"
    conf.write_text(f"metadataServiceUri=zk://127.0.0.1:{unused_port()}/ledgers\n"
                    "zkTimeout=1000\n")
    for command in (["whoisauditor"], ["autorecovery", "status"], ["listbookies"],
                    ["bookieinfo"], ["readledger", "1"]):
        says = failed(*command, "--conf", str(conf))
        assert says.startswith(f"pybk {command[0]}: ") and "was refused" in says, says


def test_bad_arguments_get_usage_and_status_2():
    for args, says in ((["whoisauditor"], "no cluster given"),
                       (["ledgermetadata", "x", "--zk", "zk://h/ledgers"],
                        "'x' is not a whole number"),
                       (["listbookies", "--rw", "--ro", "--zk", "zk://h/ledgers"],
                        "not allowed with argument")):
        result = pybk(*args)
        assert result.returncode == 2 and says in result.stderr, result


def test_an_entry_on_one_live_bookie_is_at_risk_and_a_closed_empty_ledger_never():
    from pybk.admin.commands import _fewest_live_replicas
    from pybk.meta.ledger_metadata import (
        DigestType,
        Fragment,
        LedgerMetadata,
        LedgerState,
        hash_password,
    )

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


# -- bookieinfo -------------------------------------------------------------------------------

def test_bookieinfo_shows_each_bookie_state_and_space_and_one_that_does_not_answer(
        address, bk):
    registered = sorted(bk.ledger_manager.store.bookies())
    # a registration whose endpoint accepts connections and never speaks: a hung bookie
    # (read-only, so that no ensemble of the module's other tests picks it meanwhile)
    with socket.socket() as silent, \
            ZooKeeperMetadataStore(address, zkutil.settings()) as store:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        store.register_bookie("hung-bookie:1", read_only=True,
                              endpoint=f"tcp://127.0.0.1:{silent.getsockname()[1]}")
        info = as_json("bookieinfo", "--timeout", "1", "--zk", address)
        table = ok("bookieinfo", "--timeout", "1", "--zk", address).splitlines()
    found = {b["bookie"]: b for b in info["bookies"]}
    assert sorted(found) == sorted(registered + ["hung-bookie:1"])
    hung = found.pop("hung-bookie:1")
    assert (hung["state"], hung["free_bytes"], hung["used_percent"]) == (
        "unreachable", None, None)
    assert "did not answer a INFO within 1.0 s" in hung["error"], hung  # --timeout's
    for b in found.values():
        assert (b["state"], b["error"]) == ("writable", None), b
        assert 0 < b["free_bytes"] <= b["total_bytes"], b
        used = 100 * (b["total_bytes"] - b["free_bytes"]) / b["total_bytes"]
        assert abs(b["used_percent"] - used) < 1, b  # the disk moves between the answers
    assert info["unreachable"] == 1
    assert info["total_bytes"] == sum(b["total_bytes"] for b in found.values())
    assert table[0].split() == ["BOOKIE", "STATE", "FREE", "TOTAL", "USED", "LOCATION"]
    rows = {line.split()[0]: line.split() for line in table[1:-1]}
    assert rows.pop("hung-bookie:1") == ["hung-bookie:1", "unreachable", "-", "-", "-",
                                         "/default-region/default-rack"]  # none registered
    assert sorted(rows) == registered
    assert all(r[1] == "writable" and r[3] in ("KiB", "MiB", "GiB", "TiB")
               and r[6].endswith("%") for r in rows.values()), rows
    assert table[-1].endswith("on 3 bookies; 1 unreachable"), table


# -- readledger -------------------------------------------------------------------------------

def test_readledger_reads_a_closed_ledger_through_the_client(address, ledgers):
    closed, _ = ledgers
    read = as_json("readledger", str(closed), "--zk", address)
    assert (read["state"], read["last_readable"], read["bookie"]) == ("CLOSED", 2, None)
    assert [(e["entry"], e["status"], e["size"], base64.b64decode(e["payload_base64"]))
            for e in read["entries"]] == [(i, "ok", 7, b"entry %d" % i) for i in range(3)]
    lines = ok("readledger", str(closed), "--zk", address).splitlines()
    assert lines[0] == (f"ledger {closed}: CLOSED, last readable entry 2; 3 entries, read "
                        "through the client")
    assert lines[1].split() == ["ENTRY", "SIZE", "PAYLOAD"]
    assert [line.split(None, 2) for line in lines[2:]] == [
        [str(i), "7", f'"entry {i}"'] for i in range(3)]
    # a range past the end is cut at the last entry
    tail = as_json("readledger", str(closed), "--first", "1", "--last", "99", "--zk", address)
    assert [e["entry"] for e in tail["entries"]] == [1, 2]


def test_readledger_reads_an_open_ledger_to_its_lac_without_fencing_it(address, bk):
    handle = bk.create_ledger(2, 2, 2)
    try:
        binary = bytes(range(256)) * 2
        handle.add_entry(binary)
        handle.add_entry(b"second")
        # the idle writer sends its LAC (explicitLacInterval): wait until readers see 1
        deadline = time.monotonic() + 30
        while bk.open_ledger(handle.id, recovery=False).last_add_confirmed < 1:
            assert time.monotonic() < deadline, "the LAC did not reach 1 in 30 s"
            time.sleep(0.05)
        read = as_json("readledger", str(handle.id), "--zk", address)
        assert (read["state"], read["last_readable"]) == ("OPEN", 1)
        assert [base64.b64decode(e["payload_base64"]) for e in read["entries"]] == [
            binary, b"second"]
        lines = ok("readledger", str(handle.id), "--zk", address).splitlines()
        payload = lines[2].split()[2]
        assert payload.startswith("0x000102") and payload.endswith("...") \
            and len(payload) == PAYLOAD_WIDTH, payload
        assert lines[3].split() == ["1", "6", '"second"']
        # not fenced, not recovered: the writer goes on and the ledger stays open
        assert handle.add_entry(b"third") == 2
        assert bk.ledger_manager.read(handle.id).metadata.state.name == "OPEN"
    finally:
        handle.close()


def test_readledger_unconfirmed_reads_past_the_lac_to_what_the_bookies_hold(address, bk,
                                                                            ledgers):
    # Deferred adds never forced: stored on the bookies, the LAC readers see stays -1.
    handle = bk.create_ledger(3, 2, 2, write_flags={WriteFlag.DEFERRED_SYNC})
    try:
        for i in range(5):
            handle.add_entry(b"unforced %d" % i)
        read = as_json("readledger", str(handle.id), "--zk", address)
        assert (read["last_readable"], read["entries"], read["unconfirmed"]) == (-1, [], False)
        read = as_json("readledger", str(handle.id), "--unconfirmed", "--zk", address)
        assert (read["state"], read["last_readable"], read["unconfirmed"]) == ("OPEN", -1, True)
        assert [(e["entry"], base64.b64decode(e["payload_base64"])) for e in read["entries"]] \
            == [(i, b"unforced %d" % i) for i in range(5)]
        some = as_json("readledger", str(handle.id), "--unconfirmed", "--first", "1",
                       "--last", "2", "--zk", address)
        assert [e["entry"] for e in some["entries"]] == [1, 2]
        lines = ok("readledger", str(handle.id), "--unconfirmed", "--zk", address).splitlines()
        assert lines[0] == (f"ledger {handle.id}: OPEN, last readable entry -1; 5 entries, "
                            "read through the client, 5 past the LAC (unconfirmed)")
        assert lines[2].split(None, 2) == ["0", "10", '"unforced 0"']
        # not fenced: the writer goes on
        assert handle.add_entry(b"unforced 5") == 5
        assert bk.ledger_manager.read(handle.id).metadata.state.name == "OPEN"
        assert "--unconfirmed reads through the client" in failed(
            "readledger", str(handle.id), "--unconfirmed", "--bookie",
            handle.metadata.fragments[0].ensemble[0], "--zk", address)
    finally:
        handle.close()
    # The read stops before the first entry no bookie holds: 3 waits for 2, which never came.
    adv = bk.create_ledger_adv(3, 2, 2)
    adv.add_entry(0, b"adv 0")
    adv.add_entry(1, b"adv 1")
    held = adv.add_entry_async(3, b"adv 3")
    read = as_json("readledger", str(adv.id), "--unconfirmed", "--zk", address)
    assert [e["entry"] for e in read["entries"]] == [0, 1]
    adv.close()
    assert isinstance(held.exception(timeout=30), LedgerClosed)
    # A closed ledger: nothing past its last entry.
    closed, _ = ledgers
    read = as_json("readledger", str(closed), "--unconfirmed", "--last", "99", "--zk", address)
    assert [e["entry"] for e in read["entries"]] == [0, 1, 2]


def test_readledger_bookie_shows_one_replica_held_missing_or_with_a_bad_digest(address,
                                                                              bk):
    handle = bk.create_ledger(3, 2, 2)
    for i in range(4):
        handle.add_entry(b"replica %d" % i)
    handle.close()
    ensemble = handle.metadata.fragments[0].ensemble
    first = ensemble[0]  # write sets: e0 (0, 1), e1 (1, 2), e2 (2, 0), e3 (0, 1)
    # a garbled copy of entry 0 on the first bookie, sent over the wire as any add
    digest = DigestManager(handle.id, handle.metadata.digest_type, b"")
    good = digest.encode(0, -1, len(b"replica 0"), b"replica 0")
    bk.bookie_client(first).add(handle.id, 0, good[:-1] + b"X", bk.master_key(b"")) \
        .result(timeout=30)
    read = as_json("readledger", str(handle.id), "--bookie", first, "--zk", address)
    assert read["bookie"] == first
    assert [(e["entry"], e["status"]) for e in read["entries"]] == [
        (0, "bad digest"), (2, "ok"), (3, "ok")]
    assert base64.b64decode(read["entries"][2]["payload_base64"]) == b"replica 3"
    lines = ok("readledger", str(handle.id), "--bookie", first, "--zk", address).splitlines()
    assert lines[0].endswith(f"3 entries, bookie {first}'s copies, 1 missing or "
                             "unreadable there"), lines
    assert lines[2].split() == ["0", "-", "(bad", "digest)"]
    # the client skips the bad copy: every entry reads, from the other replica
    assert [base64.b64decode(e["payload_base64"]) for e in as_json(
        "readledger", str(handle.id), "--zk", address)["entries"]] == [
        b"replica %d" % i for i in range(4)]
    # the second bookie loses its copies (as with a wiped disk): all reported missing
    second = ensemble[1]
    bk.bookie_client(second).delete_ledger(handle.id).result(timeout=30)
    lost = as_json("readledger", str(handle.id), "--bookie", second, "--zk", address)
    assert [(e["entry"], e["status"]) for e in lost["entries"]] == [
        (0, "missing"), (1, "missing"), (3, "missing")]


def test_readledger_bad_input_fails_in_one_line(address, bk, ledgers):
    closed, open_ = ledgers
    registered = bk.ledger_manager.store.bookies()
    outsider = next(b for b in registered
                    if b not in bk.ledger_manager.read(open_).metadata.fragments[0].ensemble)
    for args, says in (
            (["999999"], "pybk readledger: ledger 999999 has no metadata"),
            ([str(closed), "--first", "2", "--last", "1"],
             "pybk readledger: --first 2 is after --last 1"),
            ([str(closed), "--bookie", "nobody:1"], "pybk readledger: bookie nobody:1 is "
                                                    "unknown"),
            ([str(open_), "--bookie", outsider], f"pybk readledger: bookie {outsider} is "
                                                 f"not in any ensemble of ledger {open_}"),
            ([str(closed), "--set", "bookieRecoveryPasswd=wrong"],
             f"pybk readledger: wrong password for ledger {closed}")):
        assert failed("readledger", *args, "--zk", address).startswith(says), args


# -- a lost bookie ----------------------------------------------------------------------------

@pytest.mark.processes
def test_clusterinfo_reports_a_killed_bookie_lost_the_backlog_and_the_ledgers_at_risk(
        zookeeper, tmp_path):
    address = zkutil.formatted_cluster(zookeeper)
    group = BookieProcesses(tmp_path, address)
    try:
        bookies = group.start_serving(3, zk_timeout_ms=zkutil.SHORT_SESSION_TIMEOUT_MS)
        with connect(address, zk_settings=zkutil.settings()) as client:
            # E=3 Qw=2: with one bookie gone two of its entries keep one replica, and no
            # bookie outside its ensemble is left to re-replicate them to
            striped = client.create_ledger(3, 2, 2)
            for i in range(3):
                striped.add_entry(b"striped %d" % i)
            striped.close()
        victim = bookies[2]
        victim.kill()
        with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
            manager = UnderreplicationManager(store)
            wait_until(lambda: victim.bookie_id not in store.bookies()
                       and (backlog := manager.backlog()) is not None
                       and backlog.ledgers == 1,
                       "the auditor measured the lost bookie's backlog")
        info = as_json("clusterinfo", "--zk", address)
        survivors = sorted(b.bookie_id for b in bookies[:2])
        assert (info["writable"], info["lost"]) == (survivors, [victim.bookie_id])
        assert info["underreplicated"] == 1
        assert {k: info["backlog"][k] for k in ("ledgers", "entries", "min_replicas")} == \
            {"ledgers": 1, "entries": 2, "min_replicas": 1}
        assert (info["fewest_live_replicas"], info["at_risk_ledgers"],
                info["unreadable_ledgers"]) == (1, [striped.id], [])
        text = ok("clusterinfo", "--zk", address)
        assert f"bookies lost (1): {victim.bookie_id}" in text
        assert "under-replicated ledgers: 1 (auditor's last measure: 1 ledgers, 2 " \
               "entries, fewest replicas 1)" in text
        assert f"one more bookie stopping would lose entries of ledgers {striped.id}" in text
        # its entries still read through the client; the lost replica cannot be read
        assert len(as_json("readledger", str(striped.id), "--zk", address)["entries"]) == 3
        assert f"cannot read bookie {victim.bookie_id}" in failed(
            "readledger", str(striped.id), "--bookie", victim.bookie_id, "--zk", address)
        assert [b["bookie"] for b in as_json("bookieinfo", "--zk", address)["bookies"]] \
            == survivors
    finally:
        group.close()


def test_clusterinfo_tells_entries_with_no_live_replica_from_those_at_risk():
    info = {"writable": ["a"], "read_only": [], "lost": ["b", "c"], "auditor": None,
            "autorecovery": True, "lost_bookie_recovery_delay_s": 0, "underreplicated": 2,
            "backlog": None, "fewest_live_replicas": 0, "at_risk_ledgers": [7],
            "unreadable_ledgers": [9]}
    lines = show_cluster(info)
    assert "one more bookie stopping would lose entries of ledgers 7" in lines
    assert lines[-1] == ("entries with no live replica (unreadable until a bookie "
                         "returns) in ledgers 9")
