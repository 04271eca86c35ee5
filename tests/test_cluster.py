"""Bookie processes (``pybk bookie``) on a real ZooKeeper, reached by cluster clients over
ZeroMQ, broken for real: SIGKILL of a bookie and of a writer, a ZooKeeper restart under a
writer, ZooKeeper gone for longer than a session; and the commands around them
(``pybk bookie``, ``format-cluster``, ``localcluster``, ``simpletest``)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zkutil
from clusterutil import (  # noqa: F401
    PASSWORD,
    TESTS,
    BookieProcess,
    BookieProcesses,
    Writer,
    address,
    bookies,
    child_env,
    failed,
    ok,
    payload,
    pybk_command,
)
from conftest import KEY, entry

import pybk
from pybk.client import BookKeeper
from pybk.cluster.lifeline import Lifeline, death_signal_preexec
from pybk.cluster.node import BookieNode
from pybk.errors import BookieReadOnly
from pybk.meta.ledger_metadata import LedgerState
from pybk.meta.zookeeper import ZooKeeperMetadataStore
from pybk.settings import ClientSettings, ServerSettings
from pybk.storage import format_bookie
from pybk.testing import WAIT_S, returns_in_time, wait_until

pytestmark = pytest.mark.timeout(120)

FAST = ClientSettings(addEntryTimeout=2.0, readTimeout=1.0, explicitLacInterval=20)
COMMAND_TIMEOUT_S = 60


def client(closing, address: str) -> BookKeeper:
    return closing.enter_context(pybk.connect(address, FAST,
                                                    zk_settings=zkutil.settings()))


def observer(closing, address: str) -> ZooKeeperMetadataStore:
    return closing.enter_context(ZooKeeperMetadataStore(address, zkutil.settings()))


def run_pybk(*args: str, timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(pybk_command(*args), env=child_env(), capture_output=True,
                          text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)


def check_ledger(bk: BookKeeper, ledger_id: int, entries: int) -> None:
    reader = bk.open_ledger(ledger_id, password=PASSWORD, recovery=False)
    assert reader.metadata.last_entry_id == entries - 1
    assert [e.data for e in reader.read_entries(0, entries - 1)] == \
        [payload(i) for i in range(entries)]


# -- pybk bookie ------------------------------------------------------------------------

def test_pybk_bookie_serves_until_sigterm_exits_0_unregistered_and_restarts(
        bookies, closing, address):
    bookie = bookies.start("b1", "--bookie-id", "b1").wait_serving()
    registry = observer(closing, address)
    assert registry.bookie_endpoint("b1") == bookie.endpoint
    bk = client(closing, address)
    with bk.create_ledger(1, 1, 1, password=PASSWORD) as lh:
        for i in range(10):
            lh.add_entry(payload(i))
    assert bookie.terminate() == 0, bookie.output
    assert "pybk bookie: b1 stopped" in bookie.output
    assert registry.bookies() == []
    again = bookies.start("b1", "--bookie-id", "b1").wait_serving()  # same disks, same id
    assert "formatted" not in again.output
    check_ledger(bk, lh.id, 10)
    assert again.terminate() == 0, again.output


def test_pybk_bookie_refuses_to_start_with_a_clear_error(tmp_path, zookeeper):
    with socket.socket() as sock:  # a port with nothing listening
        sock.bind(("127.0.0.1", 0))
        dead = f"zk://127.0.0.1:{sock.getsockname()[1]}/ledgers"
    unformatted = zookeeper.address(zkutil.fresh_root())
    dirs = ["--journal-dir", str(tmp_path / "journal"), "--ledger-dir", str(tmp_path / "l")]
    result = run_pybk("bookie", "--zk", dead, "--set", "zkTimeout=1000", "--format", *dirs)
    assert result.returncode == 1 and "was refused" in result.stderr, result.stderr
    result = run_pybk("bookie", "--zk", unformatted, *dirs, "--format")
    assert result.returncode == 1, result.stderr
    assert f"pybk format-cluster --zk {unformatted}" in result.stderr
    assert run_pybk("format-cluster", "--zk", unformatted, "--layout", "flat").returncode == 0
    fresh = ["--journal-dir", str(tmp_path / "j2"), "--ledger-dir", str(tmp_path / "l2")]
    result = run_pybk("bookie", "--zk", unformatted, *fresh)  # no --format, no cookies
    assert result.returncode == 1 and "pybk bookie --format" in result.stderr, result.stderr
    result = run_pybk("bookie", "--set", "noSuchSetting=1")
    assert result.returncode == 2 and "noSuchSetting" in result.stderr, result.stderr


def test_pybk_bookie_on_new_disks_under_a_known_id_exits_1_naming_the_cookie(bookies,
                                                                               address):
    first = bookies.start("b1", "--bookie-id", "b1").wait_serving()
    assert first.terminate() == 0, first.output
    other = bookies.start("b1-new-disks", "--bookie-id", "b1")  # --format: a new instance
    assert other.process.wait(COMMAND_TIMEOUT_S) == 1, other.output
    assert "formatted" in other.output
    assert "pybk bookie: bookie b1 refuses to start: its cookie /ledgers/cookies/b1" in \
        other.output and "instance id" in other.output, other.output
    again = bookies.start("b1", "--bookie-id", "b1").wait_serving()  # its own disks: fine
    assert again.terminate() == 0, again.output


# -- SIGKILL ------------------------------------------------------------------------------

def test_kill_minus_nine_of_a_bookie_while_writing_loses_nothing(bookies, closing, address):
    started = {b.bookie_id: b for b in bookies.start_serving(4)}
    bk = client(closing, address)
    lh = bk.create_ledger(3, 2, 2, password=PASSWORD)
    writer = Writer(lh)
    writer.wait_for(100)
    victim = lh.metadata.fragments[0].ensemble[1]
    started[victim].kill()
    writer.wait_for(200)  # on the new ensemble
    acked = writer.stop()
    assert acked == list(range(len(acked)))
    fragments = bk.ledger_manager.read(lh.id).metadata.fragments
    assert len(fragments) == 2, fragments
    assert victim in fragments[0].ensemble and victim not in fragments[1].ensemble
    assert 100 <= fragments[1].first_entry_id <= len(acked) - 200
    lh.close()
    check_ledger(client(closing, address), lh.id, len(acked))


def test_kill_minus_nine_of_the_writer_then_recovery_keeps_every_acknowledged_entry(
        tmp_path, bookies, closing, address):
    bookies.start_serving(3)
    acks = tmp_path / "acks"
    writer = subprocess.Popen([sys.executable, os.path.join(TESTS, "cluster_writer.py"),
                               "--zk", address, "--acks", str(acks)], env=child_env(),
                              stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while _lines(acks) < 300:
            assert writer.poll() is None, writer.stderr.read().decode(errors="replace")
            assert time.monotonic() < deadline, f"{_lines(acks)} acks in 60 s"
            time.sleep(0.01)
        writer.send_signal(signal.SIGKILL)
        writer.wait(30)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(30)
        writer.stderr.close()
    assert writer.returncode == -signal.SIGKILL
    lines = acks.read_bytes().split(b"\n")[:-1]  # a line without its newline never finished
    ledger_id = int(lines[0].split()[1])
    acked = [int(line) for line in lines[1:]]
    recovered = client(closing, address).open_ledger(ledger_id, password=PASSWORD,
                                                     recovery=True)
    last = recovered.metadata.last_entry_id
    assert recovered.metadata.state is LedgerState.CLOSED
    assert last >= max(acked)
    assert [e.data for e in recovered.read_entries(0, last)] == \
        [payload(i) for i in range(last + 1)]


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


# -- ZooKeeper goes away -----------------------------------------------------------------------


def test_a_zookeeper_restart_does_not_stop_writes(tmp_path, closing, own_zookeeper):
    address = zkutil.formatted_cluster(own_zookeeper)
    group = BookieProcesses(tmp_path, address)
    closing.callback(group.close)
    # Sessions longer than the restart: the bookies stay registered and take adds.
    group.start_serving(4, zk_timeout_ms=15_000)
    bk = client(closing, address)
    lh = bk.create_ledger(3, 2, 2, password=PASSWORD)
    writer = Writer(lh)
    writer.wait_for(100)
    own_zookeeper.shutdown(graceful=False)
    writer.wait_for(300)  # with ZooKeeper down: the data path does not need it
    writer.pause()  # a busy CPU slows ZooKeeper's start several times over
    own_zookeeper.start()
    writer.resume()
    writer.wait_for(100)
    acked = writer.stop()
    assert acked == list(range(len(acked)))
    lh.close()  # a metadata update, through the client's reconnected session
    assert len(lh.metadata.fragments) == 1  # no bookie failed an add
    check_ledger(bk, lh.id, len(acked))


def test_a_node_cut_off_from_zookeeper_for_a_session_timeout_refuses_adds(
        tmp_path, closing, own_zookeeper):
    address = zkutil.formatted_cluster(own_zookeeper)
    settings = ServerSettings(journalDirectory=str(tmp_path / "journal"),
                              ledgerDirectories=(str(tmp_path / "ledgers"),),
                              journalPreAllocSizeMB=1, metadataServiceUri=address,
                              listenAddress="127.0.0.1:0", zkTimeout=2000)
    format_bookie(settings)
    node = closing.enter_context(BookieNode(settings))
    own_zookeeper.shutdown(graceful=False)
    lost = time.monotonic()
    node.bookie.add_entry(1, 0, entry(1, 0), KEY)  # the session may live: adds go on
    while not node.bookie.is_read_only:
        assert time.monotonic() - lost < 120, "the node kept taking adds"
        time.sleep(0.02)
    assert time.monotonic() - lost >= 1.9  # not before zkTimeout
    with pytest.raises(BookieReadOnly, match="not registered in the cluster.*2000 ms"):
        node.bookie.add_entry(1, 1, entry(1, 1), KEY)
    own_zookeeper.start()
    deadline = time.monotonic() + 30
    while node.bookie.is_read_only:
        assert time.monotonic() < deadline, "the node did not take adds again"
        time.sleep(0.02)
    node.bookie.add_entry(1, 1, entry(1, 1), KEY)
    assert observer(closing, address).bookie_endpoint(node.bookie_id) == node.endpoint


def test_a_node_closes_promptly_while_zookeeper_is_down(tmp_path, closing, own_zookeeper):
    address = zkutil.formatted_cluster(own_zookeeper)
    settings = ServerSettings(journalDirectory=str(tmp_path / "journal"),
                              ledgerDirectories=(str(tmp_path / "ledgers"),),
                              journalPreAllocSizeMB=1, metadataServiceUri=address,
                              listenAddress="127.0.0.1:0", zkTimeout=zkutil.SESSION_TIMEOUT_MS,
                              zkOperationTimeoutMs=600_000)
    format_bookie(settings)
    node = BookieNode(settings)
    closing.callback(node.close)
    own_zookeeper.shutdown(graceful=False)
    deadline = time.monotonic() + WAIT_S
    while node._connected:  # the node heard that the connection is down
        assert time.monotonic() < deadline, "the node did not notice ZooKeeper was gone"
        time.sleep(0.02)
    # zkOperationTimeoutMs is ten minutes here: the close does not wait for it
    returns_in_time(node.close, "the close, unregistering while ZooKeeper is down")
    own_zookeeper.start()
    registry = observer(closing, address)
    deadline = time.monotonic() + 30
    while registry.bookies():  # the registration ended with the session
        assert time.monotonic() < deadline, registry.bookies()
        time.sleep(0.1)


# -- pybk localcluster and pybk simpletest -------------------------------------------------

def start_localcluster(bookies: int, out: Path, *options: str) -> subprocess.Popen:
    """``pybk localcluster N [OPTIONS]`` with its output in ``out``, in a session of its
    own (so that cleanup can reach every process it started)."""
    with open(out, "wb") as stdout:
        return subprocess.Popen(pybk_command("localcluster", str(bookies), *options),
                                env=child_env(),
                                stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=subprocess.STDOUT, start_new_session=True)


def wait_until_serving(cluster: subprocess.Popen, out: Path) -> str:
    """The cluster's output once it says it serves (within 90 s, while it runs)."""
    deadline = time.monotonic() + 90
    while "stops the cluster" not in out.read_text():
        assert cluster.poll() is None, out.read_text()
        assert time.monotonic() < deadline, out.read_text()
        time.sleep(0.05)
    return out.read_text()


@pytest.mark.zookeeper
@pytest.mark.processes
def test_localcluster_serves_simpletest_and_the_admin_shell_and_stops_everything_on_sigterm(
        tmp_path):
    out = tmp_path / "localcluster.out"
    cluster = start_localcluster(3, out)
    try:
        text = wait_until_serving(cluster, out)
        address = re.search(r"ZooKeeper at (\S+)", text).group(1)
        data = re.search(r"data in (\S+)", text).group(1)
        assert len(re.findall(r"bookie 127\.0\.0\.1:\d+ at tcp://127\.0\.0\.1:\d+", text)) == 3
        result = run_pybk("simpletest", "--zk", address, "--entries", "300")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "wrote 300 entries" in result.stdout and "every entry matched" in result.stdout
        check_admin_shell(address)
        cluster.send_signal(signal.SIGTERM)
        assert cluster.wait(60) == 0, out.read_text()
    finally:
        stop_localcluster(cluster)
    with pytest.raises(ProcessLookupError):
        os.killpg(cluster.pid, 0)  # no bookie of its group is left
    port = int(address.split(":")[2].split("/")[0])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert not os.path.exists(data)
    assert "pybk localcluster: stopped" in out.read_text()


def stop_localcluster(cluster: subprocess.Popen) -> None:
    """SIGTERM it if it still runs (which stops ZooKeeper too, where SIGKILL would not);
    SIGKILL its process group if it does not stop within 60 s."""
    if cluster.poll() is None:
        cluster.send_signal(signal.SIGTERM)
        try:
            cluster.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.wait(30)


@pytest.mark.zookeeper
@pytest.mark.processes
def test_a_secured_localcluster_serves_clients_with_its_credentials_only(tmp_path):
    """``pybk localcluster --curve --zk-auth`` makes its keys and ZooKeeper credentials
    and a client.conf: simpletest and the admin shell work with it; without the
    credentials, with a bad key file or wrong ZooKeeper credentials, each command fails
    at once with one line saying why."""
    out, data = tmp_path / "localcluster.out", tmp_path / "cluster"
    cluster = start_localcluster(2, out, "--curve", "--zk-auth", "--dir", str(data))
    try:
        text = wait_until_serving(cluster, out)
        address = re.search(r"ZooKeeper at (\S+)", text).group(1)
        conf = str(data / "client.conf")
        assert f"pybk simpletest --conf {conf}" in text
        assert "zmqCurveEnabled=true" in (data / "client.conf").read_text()
        assert (data / "zk-auth").stat().st_mode & 0o077 == 0
        said = ok("simpletest", "--conf", conf, "--ensemble", "2", "--write-quorum", "2",
                  "--ack-quorum", "2", "--entries", "200")
        assert "wrote 200 entries" in said and "every entry matched" in said
        bookies = json.loads(ok("listbookies", "--conf", conf, "--json"))
        assert len(bookies) == 2 and all("#curve=" in b["endpoint"] for b in bookies)
        ok("lostbookierecoverydelay", "--conf", conf, "7")  # a change: ZooKeeper's ACLs
        assert json.loads(ok("lostbookierecoverydelay", "--conf", conf, "--json"))["seconds"] == 7
        (tmp_path / "wrong").write_text("pybk:not-the-password\n")
        for options, reason in [
                (("--zk", address), "NoAuth"),
                (("--conf", conf, "--set", "zkEnableSecurity=false"), "NoAuth"),
                (("--conf", conf, "--set", f"zkDigestAuthFile={tmp_path / 'wrong'}"),
                 "NoAuth"),
                (("--conf", conf, "--set", f"zmqCurveSecretKeyFile={tmp_path / 'none'}"),
                 "zmqCurveSecretKeyFile"),
                (("--conf", conf, "--set",
                  f"zmqCurveSecretKeyFile={data / 'keys' / 'allowed' / 'client.key'}"),
                 "no secret key")]:
            said = failed("simpletest", *options, "--ensemble", "2", "--write-quorum", "2",
                          "--ack-quorum", "2")
            assert said.startswith("pybk simpletest: ") and reason in said, said
        assert "NoAuth" in failed("lostbookierecoverydelay", "--zk", address, "9")
        # The other cluster commands take --conf too.
        assert "no log is named" in failed("clean-orphans", "some-log", "--conf", conf)
        assert ok("consumers", "list", "--log", "some-log", "--zk", address, "--conf",
                  conf) == ""
        cluster.send_signal(signal.SIGTERM)
        assert cluster.wait(60) == 0, out.read_text()
    finally:
        stop_localcluster(cluster)


def admin(address: str, *args: str):
    """An admin shell command's JSON answer about the cluster at ``address``."""
    result = run_pybk(*args, "--zk", address, "--json")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result
    return json.loads(result.stdout)


def check_admin_shell(address: str) -> None:
    """The admin shell's commands answer about a ``pybk localcluster`` as it is: three
    writable bookies, an auditor, one ledger of three entries, nothing under-replicated."""
    with pybk.connect(address) as bk:
        ledger = bk.create_ledger(3, 2, 2)
        for i in range(3):
            ledger.add_entry(b"entry %d" % i)
        ledger.close()
    bookies = admin(address, "listbookies")
    assert [b["state"] for b in bookies] == ["rw"] * 3, bookies
    info = admin(address, "bookieinfo")["bookies"]
    assert sorted(b["bookie"] for b in info) == sorted(b["bookie"] for b in bookies)
    assert all(b["state"] == "writable" and 0 < b["free_bytes"] <= b["total_bytes"]
               for b in info), info
    cluster = admin(address, "clusterinfo")
    assert len(cluster["writable"]) == 3 and not cluster["lost"], cluster
    wait_until(lambda: admin(address, "whoisauditor")["auditor"], "the bookies elect an auditor")
    assert admin(address, "autorecovery", "status") == {"enabled": True}
    assert admin(address, "listunderreplicated") == []
    assert [m["ledger"] for m in admin(address, "listledgers")] == [ledger.id]
    assert admin(address, "ledgermetadata", str(ledger.id))["state"] == "CLOSED"
    entries = admin(address, "readledger", str(ledger.id))["entries"]
    assert [base64.b64decode(e["payload_base64"]) for e in entries] == \
        [b"entry %d" % i for i in range(3)]
    assert admin(address, "deleteledger", str(ledger.id)) == {"deleted": ledger.id}


# -- children die with their parent --------------------------------------------------------

def _stat(pid: int) -> tuple[int, str, int] | None:
    """``(parent pid, state, start time)`` of a process, from /proc (None if gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2:].split()  # the name in parentheses may hold spaces
    return int(fields[1]), fields[0], int(fields[19])


def descendants(pid: int) -> dict[int, int]:
    """Every process below ``pid``: pid -> start time (which tells a reused pid apart).
    Scans /proc (``/proc/<pid>/task/*/children`` needs a kernel option not always set)."""
    parents: dict[int, int] = {}
    starts: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) is not None:
            parents[int(name)], starts[int(name)] = stat[0], stat[2]
    found: dict[int, int] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in found:
                found[child] = starts[child]
                frontier.append(child)
    return found


def alive(pid: int, start: int) -> bool:
    """Whether the process ``pid`` that started at ``start`` still runs (a zombie that
    nobody reaped yet does not: it has exited)."""
    stat = _stat(pid)
    return stat is not None and stat[2] == start and stat[1] not in ("Z", "X")


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return ""


@pytest.mark.zookeeper
@pytest.mark.processes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_children_of_a_killed_localcluster_die_with_it(tmp_path):
    out = tmp_path / "localcluster.out"
    children: dict[int, int] = {}
    data = None
    cluster = start_localcluster(2, out)
    try:
        text = wait_until_serving(cluster, out)
        data = re.search(r"data in (\S+)", text).group(1)
        port = int(re.search(r"ZooKeeper at zk://127\.0\.0\.1:(\d+)/", text).group(1))
        children = descendants(cluster.pid)
        commands = [command_line(pid) for pid in children]
        assert len(children) == 3, commands  # ZooKeeper and two bookies
        assert sum("ZooKeeperServerMain" in c for c in commands) == 1, commands
        assert sum(" bookie " in c and "--lifeline-fd" in c for c in commands) == 2, commands
        cluster.send_signal(signal.SIGKILL)  # no chance to stop anything itself
        assert cluster.wait(30) == -signal.SIGKILL
        killed = time.monotonic()
        while left := [pid for pid, start in children.items() if alive(pid, start)]:
            assert time.monotonic() - killed < 120, \
                f"still running 120 s after their parent died: {left}"
            time.sleep(0.1)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        for number in (1, 2):  # each bookie heard of it through its lifeline
            log = Path(data, f"bookie{number}", "bookie.log").read_text()
            assert "the parent process is gone" in log, log[-3000:]
    finally:
        if cluster.poll() is None:
            cluster.kill()
            cluster.wait(30)
        for pid, start in children.items():  # survivors of a failed test
            if alive(pid, start):
                os.kill(pid, signal.SIGKILL)
        if data is not None:  # nobody is left to delete the cluster's directory
            shutil.rmtree(data, ignore_errors=True)


def test_a_bookie_stops_gracefully_when_its_lifeline_breaks(tmp_path, address, closing):
    lifeline = Lifeline()
    closing.callback(lifeline.close)
    log_path = tmp_path / "bookie.log"
    command = pybk_command(
        "bookie", "--zk", address, "--listen", "127.0.0.1:0", "--format", "--bookie-id", "b1",
        "--journal-dir", str(tmp_path / "journal"), "--ledger-dir", str(tmp_path / "ledgers"),
        "--set", f"zkTimeout={zkutil.SESSION_TIMEOUT_MS}", "--set", "journalPreAllocSizeMB=1",
        "--lifeline-fd", str(lifeline.child_fd))
    with open(log_path, "wb") as out:
        # No death signal here: the lifeline alone must stop it.
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, env=child_env(),
                                   pass_fds=(lifeline.child_fd,))
    try:
        bookie = BookieProcess("b1", process, log_path, 0).wait_serving()
        registry = observer(closing, address)
        assert registry.bookies() == ["b1"]
        time.sleep(0.5)
        assert process.poll() is None  # an open lifeline: it serves on
        lifeline.close()
        assert process.wait(30) == 0, bookie.output  # a graceful stop, as on SIGTERM
        assert "the parent process is gone" in bookie.output
        assert "pybk bookie: b1 stopped" in bookie.output
        assert registry.bookies() == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)


def test_pybk_bookie_refuses_a_lifeline_fd_that_is_not_open(tmp_path, address):
    result = run_pybk("bookie", "--zk", address, "--listen", "127.0.0.1:0", "--format",
                      "--journal-dir", str(tmp_path / "j"), "--ledger-dir", str(tmp_path / "l"),
                      "--lifeline-fd", "987")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "--lifeline-fd 987 is not an open file descriptor" in result.stderr


def test_a_death_signal_is_only_asked_for_from_the_main_thread():
    on_main = death_signal_preexec(signal.SIGTERM)
    if sys.platform.startswith("linux"):
        assert callable(on_main)
    else:
        assert on_main is None
    elsewhere = []
    thread = threading.Thread(target=lambda: elsewhere.append(death_signal_preexec()))
    thread.start()
    thread.join(10)
    assert elsewhere == [None]  # the signal would follow that thread, not the process
