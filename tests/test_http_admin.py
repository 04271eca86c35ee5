"""The HTTP admin API and the status page as an operator meets them: real HTTP (urllib and
raw sockets) against real ``pybk bookie`` processes (``--set httpServerEnabled=true``) in
a real cluster (real ZooKeeper, three bookies): each endpoint's JSON, the admin token,
bad input answered in JSON with a proper status, the bounds, and the page's content.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

import pytest
import zkutil
from clusterutil import BookieProcess, BookieProcesses, child_env, pybk, unused_port

from pybk import connect
from pybk.http.endpoints import LEDGER_PAGE
from pybk.http.server import AdminHttpServer, Response, Routes
from pybk.meta import LedgerManager
from pybk.meta.underreplication import UnderreplicationManager
from pybk.meta.zookeeper import ZooKeeperMetadataStore
from pybk.settings import ServerSettings
from pybk.testing import wait_until
from pybk.testing.ledger_records import ENSEMBLE, put_ledgers

pytestmark = pytest.mark.timeout(180)

TOKEN = "s3cret-token"
#: Seconds any one request of these tests may take.
REQUEST_TIMEOUT_S = 60.0


@dataclass
class HttpBookie:
    """A bookie process and the base URL of its admin server."""

    process: BookieProcess
    url: str

    @property
    def bookie_id(self) -> str:
        return self.process.bookie_id


def start_http_bookie(group: BookieProcesses, name: str, *settings: str,
                      zk_timeout_ms: int = zkutil.SESSION_TIMEOUT_MS) -> HttpBookie:
    port = unused_port()
    options: list[str] = ["--set", "httpServerEnabled=true", "--set",
                          f"httpServerPort={port}"]
    for setting in settings:
        options += ["--set", setting]
    return HttpBookie(group.start(name, *options, zk_timeout_ms=zk_timeout_ms),
                      f"http://127.0.0.1:{port}")


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    """Three bookie processes serving HTTP: ``with_token`` and ``third`` with the admin
    token, ``no_token`` without one; yields ``(address, {name: HttpBookie})``."""
    address = zkutil.formatted_cluster(zookeeper)
    group = BookieProcesses(tmp_path_factory.mktemp("http-bookies"), address)
    try:
        bookies = {"with_token": start_http_bookie(group, "with_token",
                                                   f"httpServerAdminToken={TOKEN}"),
                   "no_token": start_http_bookie(group, "no_token"),
                   "third": start_http_bookie(group, "third",
                                              f"httpServerAdminToken={TOKEN}")}
        for bookie in bookies.values():
            bookie.process.wait_serving()
            assert f"; HTTP admin API at {bookie.url}" in bookie.process.output
        yield address, bookies
    finally:
        group.close()


@pytest.fixture(scope="module")
def address(cluster):
    return cluster[0]


@pytest.fixture(scope="module")
def admin(cluster) -> HttpBookie:
    return cluster[1]["with_token"]


@pytest.fixture(scope="module")
def ledgers(address):
    """Two ledgers: one closed with 3 text entries, one open with 1."""
    with connect(address) as bk:
        closed = bk.create_ledger(3, 2, 2, password=b"")
        for i in range(3):
            closed.add_entry(b"entry %d" % i)
        closed.close()
        open_ = bk.create_ledger(2, 2, 2, password=b"")
        open_.add_entry(b"open")
        yield closed.id, open_.id
        open_.close()


@pytest.fixture
def manager(address):
    """The cluster's under-replication records, from a session of the test's own;
    autorecovery is enabled again at the end."""
    with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
        manager = UnderreplicationManager(store)
        yield manager
        manager.enable()


def call(url: str, method: str = "GET", body: object = None, token: str | None = None,
         raw_body: bytes | None = None) -> tuple[int, dict, bytes]:
    """``(status, headers, body)`` of one request; never raises for an HTTP status."""
    data = raw_body if raw_body is not None else \
        None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, dict(e.headers), e.read()


def get_json(url: str, **kwargs) -> object:
    status, headers, body = call(url, **kwargs)
    assert status == 200, (url, status, body)
    assert headers["Content-Type"] == "application/json", headers
    return json.loads(body)


def error(url: str, status: int, **kwargs) -> str:
    """The message of a JSON error answer with ``status``."""
    got, headers, body = call(url, **kwargs)
    assert got == status, (url, got, body)
    assert headers["Content-Type"] == "application/json", headers
    assert b"Traceback" not in body
    return json.loads(body)["message"]


# -- this bookie --------------------------------------------------------------------------------

def test_heartbeat_and_is_ready_answer_ok(admin):
    for path in ("/heartbeat", "/api/v1/bookie/is_ready"):
        status, headers, body = call(admin.url + path)
        assert (status, body) == (200, b"OK\n")
        assert headers["Content-Type"].startswith("text/plain")


def test_bookie_info_state_and_config(admin):
    info = get_json(admin.url + "/api/v1/bookie/info")
    assert 0 < info["freeSpace"] <= info["totalSpace"]
    assert info["bookieId"] == admin.bookie_id and info["readOnly"] is False
    assert set(info["requests"]) >= {"add", "read", "info"}
    assert get_json(admin.url + "/api/v1/bookie/state") == {
        "running": True, "readOnly": False, "shuttingDown": False,
        "availableForHighPriorityWrites": True}
    config = get_json(admin.url + "/api/v1/config/server_config")
    assert config["httpServerEnabled"] is True and config["zkTimeout"] == \
        zkutil.SESSION_TIMEOUT_MS
    assert config["httpServerAdminToken"] == "******"  # never the token itself
    assert TOKEN not in json.dumps(config)
    status, headers, body = call(admin.url + "/metrics")  # as on prometheusStatsHttpPort
    assert status == 200 and headers["Content-Type"].startswith("text/plain"), headers
    assert b"bookkeeper_server_ADD_ENTRY_REQUEST" in body and b"bookie_SERVER_STATUS" in body


def test_request_counters_count_the_bookies_requests(admin, address, ledgers):
    before = get_json(admin.url + "/api/v1/bookie/info")["requests"]
    get_json(admin.url + "/api/v1/pybk/bookie_info")  # asks every bookie for INFO
    after = get_json(admin.url + "/api/v1/bookie/info")["requests"]
    assert after["info"] == before["info"] + 1


def test_last_log_mark_and_disk_files(admin):
    mark = get_json(admin.url + "/api/v1/bookie/last_log_mark")
    [(key, value)] = mark.items()
    assert key.startswith("LastLogMark: Journal Id - ") and key.endswith(".txn)")
    assert value.startswith("Pos - ") and int(value.split(" - ")[1]) >= 0
    files = get_json(admin.url + "/api/v1/bookie/list_disk_file")
    assert set(files) == {"journal files", "entrylog files", "index files"}
    assert files["journal files"].split("\t")[0].endswith(".txn")
    assert "data.mdb" in files["index files"].split("\t")
    assert get_json(admin.url + "/api/v1/bookie/list_disk_file?file_type=journal") == {
        "journal files": files["journal files"]}
    assert "file_type must be one of" in error(
        admin.url + "/api/v1/bookie/list_disk_file?file_type=nope", 400)


def test_gc_put_runs_a_major_compaction(admin):
    url = admin.url + "/api/v1/bookie"
    assert get_json(url + "/gc") == {"is_in_force_gc": "false"}
    [before] = get_json(url + "/gc_details")
    assert set(before) == {"forceCompacting", "majorCompacting", "minorCompacting",
                           "lastMajorCompactionTime", "lastMinorCompactionTime",
                           "majorCompactionCounter", "minorCompactionCounter"}
    assert get_json(url + "/gc", method="PUT", token=TOKEN) in (
        {"is_in_force_gc": "true"}, {"is_in_force_gc": "false"})  # it may be done already
    done = wait_until(lambda: (d := get_json(url + "/gc_details")[0])["majorCompactionCounter"]
                      > before["majorCompactionCounter"] and d, "the forced compaction ran")
    assert done["lastMajorCompactionTime"] >= before["lastMajorCompactionTime"] > -1
    assert get_json(url + "/gc") == {"is_in_force_gc": "false"}


def test_compaction_suspended_is_skipped_even_when_forced_until_resumed(admin):
    url = admin.url + "/api/v1/bookie/gc"
    neither = {"isMajorGcSuspended": "false", "isMinorGcSuspended": "false"}
    assert get_json(url + "/suspend_compaction") == neither
    assert get_json(url + "/suspend_compaction", method="PUT", token=TOKEN,
                    body={"suspendMajor": "true"}) == {**neither, "isMajorGcSuspended": "true"}
    try:
        [before] = get_json(admin.url + "/api/v1/bookie/gc_details")
        get_json(url, method="PUT", token=TOKEN)  # a forced GC: its major compaction skipped
        wait_until(lambda: get_json(url) == {"is_in_force_gc": "false"}, "the GC pass ran")
        [after] = get_json(admin.url + "/api/v1/bookie/gc_details")
        assert after["majorCompactionCounter"] == before["majorCompactionCounter"]
        assert get_json(url + "/suspend_compaction", method="PUT", token=TOKEN,
                        body={"suspendMinor": True}) == {"isMajorGcSuspended": "true",
                                                        "isMinorGcSuspended": "true"}
        assert "suspendMajor must be true or false" in error(
            url + "/suspend_compaction", 400, method="PUT", token=TOKEN,
            body={"suspendMajor": "yes"})
        assert get_json(url + "/resume_compaction", method="PUT", token=TOKEN,
                        body={"resumeMinor": "true"}) == {"isMajorGcSuspended": "true",
                                                         "isMinorGcSuspended": "false"}
    finally:
        get_json(url + "/resume_compaction", method="PUT", token=TOKEN,
                 body={"resumeMajor": "true", "resumeMinor": "true"})
    assert get_json(url + "/suspend_compaction") == neither
    get_json(url, method="PUT", token=TOKEN)  # resumed: the forced GC compacts again
    wait_until(lambda: get_json(admin.url + "/api/v1/bookie/gc_details")[0]
               ["majorCompactionCounter"] > before["majorCompactionCounter"],
               "the forced major compaction ran")


def compaction_command(*args: str, token: str | None = None) -> subprocess.CompletedProcess:
    """``pybk compaction ARGS``, with the admin token in its environment if given."""
    env = child_env()
    env.pop("PYBK_httpServerAdminToken", None)
    if token is not None:
        env["PYBK_httpServerAdminToken"] = token
    return subprocess.run([sys.executable, "-m", "pybk", "compaction", *args], env=env,
                          capture_output=True, text=True, timeout=REQUEST_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


def test_the_compaction_command_suspends_and_resumes_through_the_admin_api(admin):
    url = ["--url", admin.url]
    assert compaction_command("status", *url).stdout == \
        "major compaction runs, minor compaction runs\n"
    refused = compaction_command("suspend", *url)  # no token
    assert refused.returncode == 1 and "403" in refused.stderr, refused
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    try:
        done = compaction_command("suspend", "--major", *url, token=TOKEN)
        assert done.stdout == "major compaction suspended, minor compaction runs\n", done
        assert get_json(admin.url + "/api/v1/bookie/gc/suspend_compaction") == {
            "isMajorGcSuspended": "true", "isMinorGcSuspended": "false"}
        assert json.loads(compaction_command("status", "--json", *url).stdout) == {
            "isMajorGcSuspended": "true", "isMinorGcSuspended": "false"}
    finally:
        resumed = compaction_command("resume", *url, token=TOKEN)
    assert resumed.stdout == "major compaction runs, minor compaction runs\n", resumed
    gone = compaction_command("status", "--url", f"http://127.0.0.1:{unused_port()}")
    assert gone.returncode == 1 and "cannot reach" in gone.stderr, gone


def test_read_only_switch_refuses_adds_and_registers_read_only(cluster, address):
    third = cluster[1]["third"]
    url = third.url + "/api/v1/bookie/state/readonly"
    assert get_json(url) == {"readOnly": False}
    try:
        assert get_json(url, method="PUT", body={"readOnly": True}, token=TOKEN) == {
            "readOnly": True}
        assert get_json(third.url + "/api/v1/bookie/state")["readOnly"] is True
        wait_until(lambda: third.bookie_id in get_json(
            third.url + "/api/v1/bookie/list_bookies?type=ro"), "registered read-only")
        assert third.bookie_id not in get_json(
            third.url + "/api/v1/bookie/list_bookies?type=rw")
        assert 'the body must be {"readOnly"' in error(url, 400, method="PUT",
                                                       body={"readOnly": "yes"}, token=TOKEN)
    finally:
        assert get_json(url, method="PUT", body={"readOnly": False}, token=TOKEN) == {
            "readOnly": False}
    wait_until(lambda: third.bookie_id in get_json(
        third.url + "/api/v1/bookie/list_bookies?type=rw"), "registered writable again")


def test_sanity_writes_and_reads_a_ledger(admin, address):
    with connect(address) as bk:
        before = set(bk.ledger_manager.ledger_ids())
        assert get_json(admin.url + "/api/v1/bookie/sanity") == {"passed": True,
                                                                 "readOnly": False}
        assert set(bk.ledger_manager.ledger_ids()) == before  # its ledger is deleted


# -- the cluster's bookies ----------------------------------------------------------------------

def test_list_bookies_and_their_info(cluster, admin):
    ids = sorted(b.bookie_id for b in cluster[1].values())
    url = admin.url + "/api/v1/bookie"
    assert get_json(url + "/list_bookies?type=rw") == dict.fromkeys(ids)
    assert get_json(url + "/list_bookies?type=rw&print_hostnames=true") == dict.fromkeys(
        ids, "127.0.0.1")
    assert get_json(url + "/list_bookies?type=ro") == {}
    assert "type must be rw or ro" in error(url + "/list_bookies?type=all", 400)
    info = get_json(url + "/list_bookie_info")
    assert sorted(info) == sorted(ids + ["ClusterInfo: "])
    assert all(v.startswith(": {Free: ") for k, v in info.items() if k in ids)
    assert info["ClusterInfo: "].startswith("{Free: ")
    detail = get_json(admin.url + "/api/v1/pybk/bookie_info")
    assert [b["bookie"] for b in detail["bookies"]] == ids
    assert {b["state"] for b in detail["bookies"]} == {"writable"}


def test_cluster_info(cluster, admin):
    info = get_json(admin.url + "/api/v1/bookie/cluster_info")
    assert {k: v for k, v in info.items() if k not in ("pybk", "auditorId")} == {
        "auditorElected": True, "clusterUnderReplicated": False,
        "ledgerReplicationEnabled": True, "totalBookiesCount": 3,
        "writableBookiesCount": 3, "readonlyBookiesCount": 0,
        "unavailableBookiesCount": 0}
    assert info["auditorId"] in {b.bookie_id for b in cluster[1].values()}
    assert info["pybk"]["auditor"] == info["auditorId"]
    assert info["pybk"]["underreplicated"] == 0


# -- ledgers ------------------------------------------------------------------------------------

def test_ledger_list_and_metadata(admin, ledgers):
    closed, open_ = ledgers
    url = admin.url + "/api/v1/ledger"
    listed = get_json(url + "/list")
    assert listed == {str(closed): None, str(open_): None}
    with_meta = get_json(url + "/list?print_metadata=true")
    assert with_meta[str(closed)]["state"] == "CLOSED"
    assert with_meta[str(closed)]["last_entry_id"] == 2
    assert with_meta[str(open_)]["state"] == "OPEN"
    assert get_json(url + "/list?page=1") == listed
    assert get_json(url + "/list?page=2") == {}
    assert "page must be in [1," in error(url + "/list?page=0", 400)
    metadata = get_json(url + f"/metadata?ledger_id={closed}")
    assert metadata == {str(closed): with_meta[str(closed)]}
    assert metadata[str(closed)]["ensemble_size"] == 3


def test_ledger_list_pages_through_more_ledgers_than_a_page(admin, address, ledgers):
    """Pages of LEDGER_PAGE ledgers, with and without metadata: ascending from one page to
    the next, none listed twice, all of them listed, and an empty page after the last."""
    ids = [10 ** 9 + 7 * i for i in range(2 * LEDGER_PAGE + 50)]
    url = admin.url + "/api/v1/ledger/list"
    with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
        put_ledgers(store, ids)
        try:
            everything = [int(i) for i in get_json(url)]
            assert set(ids) | set(ledgers) <= set(everything)
            for params in ("", "&print_metadata=true"):
                pages = [[int(i) for i in get_json(f"{url}?page={n}{params}")]
                         for n in range(1, len(everything) // LEDGER_PAGE + 2)]
                assert [len(page) for page in pages] == \
                    [LEDGER_PAGE] * (len(everything) // LEDGER_PAGE) + \
                    [len(everything) % LEDGER_PAGE]
                listed = [i for page in pages for i in sorted(page)]
                assert listed == sorted(everything)  # ascending from page to page
                assert get_json(f"{url}?page={len(pages) + 1}{params}") == {}
            last_page = get_json(f"{url}?page={len(pages)}&print_metadata=true")
            assert last_page[str(ids[-1])]["fragments"] == [
                {"first_entry": 0, "ensemble": list(ENSEMBLE)}]
        finally:
            for i in ids:
                LedgerManager(store).delete(i)


def test_ledger_read_needs_the_token_and_answers_the_entries(admin, ledgers):
    closed, open_ = ledgers
    url = admin.url + f"/api/v1/ledger/read?ledger_id={closed}"
    assert "admin token" in error(url, 403)
    assert get_json(url, token=TOKEN) == {"0": "entry 0", "1": "entry 1", "2": "entry 2"}
    assert get_json(url + "&start_entry_id=1&end_entry_id=1", token=TOKEN) == {
        "1": "entry 1"}
    assert get_json(admin.url + f"/api/v1/ledger/read?ledger_id={open_}",
                    token=TOKEN) in ({}, {"0": "open"})  # up to its LAC
    assert "before start_entry_id" in error(url + "&start_entry_id=2&end_entry_id=1",
                                            400, token=TOKEN)


def test_ledger_delete(admin, address):
    with connect(address) as bk:
        handle = bk.create_ledger(2, 2, 2, password=b"")
        handle.add_entry(b"doomed")
        handle.close()
    url = admin.url + f"/api/v1/ledger/delete?ledger_id={handle.id}"
    assert "admin token" in error(url, 403, method="DELETE")
    assert get_json(url, method="DELETE", token=TOKEN) == {"deleted": handle.id}
    assert f"{handle.id}" in error(
        admin.url + f"/api/v1/ledger/metadata?ledger_id={handle.id}", 404)
    assert error(url, 404, method="DELETE", token=TOKEN)


# -- autorecovery -------------------------------------------------------------------------------

def test_autorecovery_status_switch(admin, manager):
    url = admin.url + "/api/v1/autorecovery/status"
    assert get_json(url) == {"enabled": True}
    assert get_json(url + "?enabled=false", method="PUT", token=TOKEN) == {"enabled": False}
    assert not manager.is_enabled()
    assert get_json(url) == {"enabled": False}
    assert "enabled=true or enabled=false" in error(url, 400, method="PUT", token=TOKEN)
    assert get_json(url + "?enabled=true", method="PUT", token=TOKEN) == {"enabled": True}
    assert manager.is_enabled()


def test_under_replicated_ledgers_auditor_and_audit(admin, manager, ledgers, cluster):
    closed, _ = ledgers
    url = admin.url + "/api/v1/autorecovery"
    assert error(url + "/list_under_replicated_ledger", 404) == \
        "No under replicated ledgers found"
    manager.disable()  # else the bookies' replication workers repair it at once
    manager.mark_underreplicated(closed, ["lost-bookie:3181"])
    try:
        assert get_json(url + "/list_under_replicated_ledger") == [closed]
        assert get_json(url + "/list_under_replicated_ledger?printmissingreplica=true") == {
            str(closed): ["lost-bookie:3181"]}
        assert get_json(url + "/list_under_replicated_ledger?missingreplica=lost-bookie:3181"
                        ) == [closed]
        assert error(url + "/list_under_replicated_ledger?excludingmissingreplica="
                     "lost-bookie:3181", 404)
        assert get_json(admin.url + "/api/v1/bookie/cluster_info")[
            "clusterUnderReplicated"] is True
    finally:
        manager.enable()
        # A worker finds nothing of the ledger on that bookie and drops the mark.
        wait_until(lambda: manager.get(closed) is None, "the mark is dropped",
                   timeout_s=60)
    auditor = get_json(url + "/who_is_auditor")["Auditor"]
    assert auditor in {b.bookie_id for b in cluster[1].values()}
    assert get_json(url + "/trigger_audit", method="PUT", token=TOKEN) == {
        "message": "Success trigger audit by admin", "triggered": True, "auditor": auditor}


def test_lost_bookie_recovery_delay(admin, manager):
    url = admin.url + "/api/v1/autorecovery/lost_bookie_recovery_delay"
    start = manager.lost_bookie_recovery_delay()
    assert get_json(url) == {"message": f"lostBookieRecoveryDelay value: {start}",
                             "delay_seconds": start}
    try:
        assert get_json(url, method="PUT", body={"delay_seconds": 42}, token=TOKEN) == {
            "message": "Successfully update lostBookieRecoveryDelay to 42",
            "delay_seconds": 42}
        assert manager.lost_bookie_recovery_delay() == 42
        for bad in ({"delay_seconds": -1}, {"delay_seconds": "x"}, {}):
            assert "delay_seconds" in error(url, 400, method="PUT", body=bad, token=TOKEN)
    finally:
        manager.set_lost_bookie_recovery_delay(start)


def test_decommission_and_recover_refuse_bad_bookies(admin, cluster):
    url = admin.url + "/api/v1/autorecovery"
    live = cluster[1]["no_token"].bookie_id
    assert "is unknown" in error(url + "/decommission", 404, method="PUT",
                                 body={"bookie_src": "nobody:1"}, token=TOKEN)
    assert "still registered" in error(url + "/decommission", 500, method="PUT",
                                       body={"bookie_src": live}, token=TOKEN)
    assert "bookie_src" in error(url + "/decommission", 400, method="PUT", body={},
                                 token=TOKEN)
    assert "timeout_s" in error(url + "/decommission", 400, method="PUT",
                                body={"bookie_src": live, "timeout_s": -1}, token=TOKEN)
    assert "is unknown" in error(url + "/bookie", 404, method="PUT",
                                 body={"bookie_src": ["nobody:1"]}, token=TOKEN)
    assert "is registered" in error(url + "/bookie", 500, method="PUT",
                                    body={"bookie_src": [live]}, token=TOKEN)
    assert "bookie_src" in error(url + "/bookie", 400, method="PUT",
                                 body={"bookie_src": []}, token=TOKEN)


def test_recover_then_decommission_killed_bookies(zookeeper, tmp_path):
    """Five bookies; a ledger on three.  With autorecovery disabled, one of them is
    killed and recovered through ``autorecovery/bookie``; with autorecovery enabled
    again, another is killed and decommissioned through ``autorecovery/decommission``."""
    address = zkutil.formatted_cluster(zookeeper)
    group = BookieProcesses(tmp_path, address)
    try:
        admin = start_http_bookie(group, "admin", f"httpServerAdminToken={TOKEN}")
        others = [group.start(f"b{i}", zk_timeout_ms=zkutil.SHORT_SESSION_TIMEOUT_MS)
                  for i in range(1, 5)]
        admin.process.wait_serving()
        by_id = {b.wait_serving().bookie_id: b for b in others}
        with connect(address) as bk:
            handle = bk.create_ledger(3, 3, 2, password=b"")
            for i in range(20):
                handle.add_entry(b"entry %d" % i)
            handle.close()
        url = admin.url + "/api/v1/autorecovery"
        metadata = admin.url + f"/api/v1/ledger/metadata?ledger_id={handle.id}"

        def ensemble() -> list[str]:
            return get_json(metadata)[str(handle.id)]["fragments"][-1]["ensemble"]

        def killed() -> str:
            victim = next(b for b in ensemble() if b in by_id)
            by_id.pop(victim).kill()
            wait_until(lambda: victim not in get_json(
                admin.url + "/api/v1/bookie/list_bookies"), "its registration ends")
            return victim

        assert get_json(url + "/status?enabled=false", method="PUT", token=TOKEN) == {
            "enabled": False}
        first = killed()
        recovered = get_json(url + "/bookie", method="PUT", token=TOKEN,
                             body={"bookie_src": [first], "delete_cookie": True})
        assert [(r["ledger"], r["outcome"], r["entries"]) for r in recovered["ledgers"]] \
            == [(handle.id, "replicated", 20)], recovered
        assert recovered["cookies_deleted"] == [first]
        assert first not in ensemble()

        assert get_json(url + "/status?enabled=true", method="PUT", token=TOKEN) == {
            "enabled": True}
        second = killed()
        done = get_json(url + "/decommission", method="PUT", token=TOKEN,
                        body={"bookie_src": second, "timeout_s": 60})
        assert done["bookie"] == second and done["cookie_removed"] is True
        assert second not in ensemble()
    finally:
        group.close()


# -- the admin token ----------------------------------------------------------------------------

#: Every privileged endpoint, with a request that would change something (or read data).
PRIVILEGED = [
    ("PUT", "/api/v1/bookie/gc", None),
    ("PUT", "/api/v1/bookie/gc/suspend_compaction", {"suspendMajor": "true"}),
    ("PUT", "/api/v1/bookie/gc/resume_compaction", {"resumeMajor": "true"}),
    ("PUT", "/api/v1/bookie/state/readonly", {"readOnly": True}),
    ("DELETE", "/api/v1/ledger/delete?ledger_id=1", None),
    ("GET", "/api/v1/ledger/read?ledger_id=1", None),
    ("PUT", "/api/v1/autorecovery/status?enabled=false", None),
    ("PUT", "/api/v1/autorecovery/trigger_audit", None),
    ("PUT", "/api/v1/autorecovery/lost_bookie_recovery_delay", {"delay_seconds": 7}),
    ("PUT", "/api/v1/autorecovery/decommission", {"bookie_src": "nobody:1"}),
    ("PUT", "/api/v1/autorecovery/bookie", {"bookie_src": ["nobody:1"]}),
]


@pytest.mark.parametrize("method,path,body", PRIVILEGED,
                         ids=[f"{m} {p.split('?')[0]}" for m, p, _ in PRIVILEGED])
def test_privileged_endpoints_refused_without_the_right_token(cluster, manager, method,
                                                              path, body):
    bookies = cluster[1]
    with_token, no_token = bookies["with_token"], bookies["no_token"]
    assert "needs the admin token" in error(with_token.url + path, 403, method=method,
                                            body=body)
    assert "needs the admin token" in error(with_token.url + path, 403, method=method,
                                            body=body, token="wrong")
    # A bookie with no token configured refuses them even with one.
    assert "disabled until httpServerAdminToken is set" in error(
        no_token.url + path, 403, method=method, body=body, token=TOKEN)
    # Nothing changed.
    assert manager.is_enabled()
    assert manager.lost_bookie_recovery_delay() != 7
    for bookie in bookies.values():
        assert get_json(bookie.url + "/api/v1/bookie/state")["readOnly"] is False
        assert get_json(bookie.url + "/api/v1/bookie/gc/suspend_compaction") == {
            "isMajorGcSuspended": "false", "isMinorGcSuspended": "false"}


# -- bad input and bounds -----------------------------------------------------------------------

def test_bad_requests_get_json_errors(admin):
    url = admin.url
    assert "no such endpoint" in error(url + "/api/v1/nope", 404)
    status, headers, body = call(url + "/api/v1/bookie/info", method="POST", raw_body=b"")
    assert status == 405 and headers["Allow"] == "GET"
    assert "POST is not allowed" in json.loads(body)["message"]
    assert "ledger_id=N" in error(url + "/api/v1/ledger/metadata", 400)
    assert "must be an integer" in error(url + "/api/v1/ledger/metadata?ledger_id=x", 400)
    assert "123456789" in error(url + "/api/v1/ledger/metadata?ledger_id=123456789", 404)
    assert "must be true or false" in error(url + "/api/v1/ledger/list?print_metadata=yes",
                                            400)
    assert "not JSON" in error(url + "/api/v1/autorecovery/lost_bookie_recovery_delay", 400,
                               method="PUT", raw_body=b"{nope", token=TOKEN)
    assert "httpServerMaxRequestBytes" in error(
        url + "/api/v1/autorecovery/lost_bookie_recovery_delay", 413, method="PUT",
        raw_body=b" " * (64 * 1024 + 1), token=TOKEN)


#: Numbers no endpoint takes: negative, past a Java long, far past it, not numbers, empty,
#: and forms Python's int() would take but no client means.
BAD_NUMBERS = ["-1", str(2 ** 63), str(10 ** 30), "9" * 5000, "abc", "", "1e3", "0x10",
               "1_000", " 7"]


def test_numbers_out_of_range_are_a_400_on_every_endpoint_never_a_5xx(admin, ledgers):
    url = admin.url + "/api/v1"
    closed, _open = ledgers
    for bad in BAD_NUMBERS:
        value = urllib.parse.quote(bad)
        for path, method in [("/ledger/metadata", "GET"), ("/ledger/read", "GET"),
                             ("/ledger/delete", "DELETE")]:
            assert "ledger_id must be" in error(f"{url}{path}?ledger_id={value}", 400,
                                                method=method, token=TOKEN), (path, bad)
        for name in ("start_entry_id", "end_entry_id"):
            if (name, bad) == ("end_entry_id", "-1"):
                continue  # "to the end", below
            assert f"{name} must be" in error(
                f"{url}/ledger/read?ledger_id={closed}&{name}={value}", 400, token=TOKEN)
        assert "page must be" in error(f"{url}/ledger/list?page={value}", 400)
    assert "page must be in [1," in error(f"{url}/ledger/list?page=0", 400)
    assert "end_entry_id must be in [-1," in error(
        f"{url}/ledger/read?ledger_id={closed}&end_entry_id=-2", 400, token=TOKEN)
    for seconds in (-1, 2 ** 31, 10 ** 30, 1.5, "5", None, True):
        assert "delay_seconds" in error(url + "/autorecovery/lost_bookie_recovery_delay", 400,
                                        method="PUT", token=TOKEN,
                                        body={"delay_seconds": seconds}), seconds
    for timeout_s in (-1, 0, 10 ** 30, "5", None):
        assert "timeout_s" in error(url + "/autorecovery/decommission", 400, method="PUT",
                                    token=TOKEN, body={"bookie_src": "b", "timeout_s": timeout_s})
    # In range: what the ids name is looked up (a ledger there is none of is a 404).
    assert str(2 ** 63 - 1) in error(f"{url}/ledger/metadata?ledger_id={2 ** 63 - 1}", 404)
    assert list(get_json(f"{url}/ledger/read?ledger_id={closed}&end_entry_id=-1",
                         token=TOKEN)) == ["0", "1", "2"]
    status, _headers, body = call(admin.url + "/heartbeat")
    assert (status, body) == (200, b"OK\n")  # the node serves on


def test_an_idle_connection_is_dropped_and_too_many_are_refused(tmp_path, cluster,
                                                                   bookies_group):
    """A bookie of the test's own with 2 request slots and a 3 s socket timeout (the
    window in which two idle connections hold both slots: wide against a stalled test,
    short beside the 60 s these sockets would wait on their own)."""
    bookie = start_http_bookie(bookies_group, "bounded", "httpServerMaxConcurrentRequests=2",
                               "httpServerSocketTimeoutMs=3000")
    bookie.process.wait_serving()
    host, port = bookie.url.removeprefix("http://").split(":")
    idle = [socket.create_connection((host, int(port)), timeout=60) for _ in range(2)]
    try:
        # Refused once the server has accepted both, each holding a slot while it sends
        # nothing (until httpServerSocketTimeoutMs).
        status, headers, body = wait_until(
            lambda: (answer := call(bookie.url + "/heartbeat"))[0] == 503 and answer,
            "a request refused while both slots are held", interval_s=0.01)
        assert headers["Retry-After"] == "1"
        assert "httpServerMaxConcurrentRequests" in json.loads(body)["message"]
        for sock in idle:  # the server gives up on them after httpServerSocketTimeoutMs
            assert sock.recv(1024) == b""  # (not the 60 s of this socket's own timeout)
    finally:
        for sock in idle:
            sock.close()
    wait_until(lambda: call(bookie.url + "/heartbeat")[0] == 200, "a slot is free again")
    assert bookie.process.terminate() == 0  # the server stops with the bookie
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=2).close()


@pytest.fixture
def bookies_group(tmp_path, address):
    group = BookieProcesses(tmp_path, address)
    yield group
    group.close()


def test_zookeeper_unreachable_is_503_in_bounded_time(own_zookeeper, tmp_path):
    """ZooKeeper down: the endpoints that need it answer 503 once the store gives up
    (the bookie's zkOperationTimeoutMs, here 2 s); those about the bookie itself still
    answer."""
    group = BookieProcesses(tmp_path, zkutil.formatted_cluster(own_zookeeper))
    try:
        bookie = start_http_bookie(group, "alone", "zkOperationTimeoutMs=2000")
        bookie.process.wait_serving()
        own_zookeeper.shutdown()
        assert call(bookie.url + "/heartbeat")[0] == 200
        assert get_json(bookie.url + "/api/v1/bookie/state")["running"] is True
        assert "metadata is unavailable" in error(  # after its zkOperationTimeoutMs
            bookie.url + "/api/v1/autorecovery/who_is_auditor", 503)
    finally:
        group.close()


# -- the status page ----------------------------------------------------------------------------

def test_status_page_shows_the_cluster(admin, cluster, ledgers):
    status, headers, body = call(admin.url + "/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    page = body.decode()
    assert "<title>pybk cluster status</title>" in page
    for section in ('id="bookies"', 'id="cluster"', 'id="underreplicated"',
                    'id="ledgers"'):
        assert section in page
    assert "http://" not in page and "https://" not in page  # no external assets
    assert "<script src" not in page and "<link" not in page
    # The JSON endpoints it fetches: every one answers, and between them they carry
    # what the page shows (the bookies' ids and states, the ledgers, the auditor).
    fetched = ["/api/v1/bookie/info", "/api/v1/pybk/bookie_info",
               "/api/v1/bookie/cluster_info",
               "/api/v1/autorecovery/list_under_replicated_ledger?printmissingreplica=true",
               "/api/v1/ledger/list?print_metadata=true&page=1"]
    for path in fetched:
        assert f'"{path}"' in page
    answers = {path: call(admin.url + path) for path in fetched}
    assert all(status in (200, 404) for status, _, _ in answers.values())
    bookies = json.loads(answers["/api/v1/pybk/bookie_info"][2])
    assert {b["bookie"] for b in bookies["bookies"]} == {
        b.bookie_id for b in cluster[1].values()}
    listed = json.loads(answers["/api/v1/ledger/list?print_metadata=true&page=1"][2])
    assert {str(ledger) for ledger in ledgers} <= set(listed)
    assert json.loads(answers["/api/v1/bookie/cluster_info"][2])["auditorElected"]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js to run the page's "
                                                            "script")
def test_status_page_script_draws_the_cluster(admin, cluster, ledgers):
    """The page's own script, run by Node.js against the bookie with a stand-in DOM,
    fetches the endpoints and writes every bookie, the ledgers and the auditor."""
    run = subprocess.run(["node", os.path.join(os.path.dirname(__file__),
                                               "status_page_run.mjs"), admin.url],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    drawn = json.loads(run.stdout)
    assert drawn["error"] == "" and drawn["self"] == admin.bookie_id
    for bookie in cluster[1].values():
        assert f"<td>{bookie.bookie_id}" in drawn["bookie-rows"]
    assert drawn["bookie-rows"].count('class="ok">writable') == 3
    auditor = get_json(admin.url + "/api/v1/autorecovery/who_is_auditor")["Auditor"]
    assert f"<dt>auditor</dt><dd>{auditor}</dd>" in drawn["cluster-facts"]
    for ledger in ledgers:
        assert f"<tr><td>{ledger}</td>" in drawn["ledger-rows"]
    assert "none" in drawn["underreplicated-rows"]


# -- the route table (in process) ---------------------------------------------------------------

def test_routes_added_while_serving_are_served(tmp_path):
    """Other parts of pybk (metrics) add routes to a running server's table."""
    settings = ServerSettings(journalDirectory=str(tmp_path / "j"),
                              ledgerDirectories=(str(tmp_path / "l"),),
                              httpServerPort=0, httpServerAdminToken=TOKEN)
    routes = Routes()
    with AdminHttpServer(settings, routes) as server:
        assert error(server.url + "/metrics", 404)
        server.routes.add("/metrics", "GET",
                          lambda _r: Response.text("pybk_up 1\n", content_type="text/plain"))
        status, _, body = call(server.url + "/metrics")
        assert (status, body) == (200, b"pybk_up 1\n")
        with pytest.raises(ValueError, match="routed already"):
            routes.add("/metrics", "GET", lambda _r: {})
        routes.add("/boom", "GET", lambda _r: 1 / 0)
        assert "internal error (ZeroDivisionError)" in error(server.url + "/boom", 500)
        routes.add("/secret", "POST", lambda r: {"got": r.json()}, privileged=True)
        assert get_json(server.url + "/secret", method="POST", body={"a": 1},
                        token=TOKEN) == {"got": {"a": 1}}


# -- a bookie that cannot serve HTTP --------------------------------------------------------

def test_bookie_with_bad_http_settings_fails_in_one_line(admin, address, tmp_path):
    """A taken port: ``pybk bookie`` exits 1 with one line, and the cluster records
    nothing of it (the port is bound before the bookie's cookie).  A bad setting is a
    usage error (status 2), as every bad setting of ``pybk``."""
    taken = admin.url.rsplit(":", 1)[1]
    lost = get_json(admin.url + "/api/v1/bookie/cluster_info")["pybk"]["lost"]
    for setting, status, reason in [
            (f"httpServerPort={taken}", 1,
             f"pybk bookie: the HTTP admin server cannot listen on 127.0.0.1:{taken}"),
            ("httpServerPort=70000", 2, "pybk: error: setting httpServerPort=70000"),
            ("httpServerMaxConcurrentRequests=0", 2,
             "pybk: error: setting httpServerMaxConcurrentRequests=0")]:
        base = tmp_path / setting.split("=")[0]
        result = pybk("bookie", "--zk", address, "--listen", "127.0.0.1:0", "--format",
                      "--journal-dir", str(base / "journal"), "--ledger-dir",
                      str(base / "ledgers"), "--set", "httpServerEnabled=true",
                      "--set", setting)
        assert result.returncode == status, result
        assert result.stderr.splitlines()[-1].startswith(reason), result.stderr
    assert get_json(admin.url + "/api/v1/bookie/cluster_info")["pybk"]["lost"] == lost


def test_a_body_cut_short_is_refused_after_the_socket_timeout(tmp_path):
    settings = ServerSettings(journalDirectory=str(tmp_path / "j"),
                              ledgerDirectories=(str(tmp_path / "l"),), httpServerPort=0,
                              httpServerSocketTimeoutMs=500)
    routes = Routes()
    routes.add("/echo", "POST", lambda r: {"bytes": len(r.body)})
    with AdminHttpServer(settings, routes) as server:
        host, port = server.url.removeprefix("http://").split(":")
        # The server's socket timeout ends it, not this socket's own (60 s).
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(b"POST /echo HTTP/1.0\r\nContent-Length: 100\r\n\r\n{")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 400 ")
        assert "of its 100 bytes" in json.loads(body)["message"]
        assert get_json(server.url + "/echo", method="POST", raw_body=b"12345") == {
            "bytes": 5}
