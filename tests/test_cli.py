"""The ``pybk`` command as a user meets it: its options; bad input answered with usage,
not tracebacks; an unreachable ZooKeeper; and how ``pybk bookie`` and ``pybk
localcluster`` stop on SIGTERM and Ctrl-C, also while starting and a second time.
Real processes, real ZooKeeper servers.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zkutil
from clusterutil import BookieProcess, child_env, pybk_command

from pybk import __version__
from pybk.cli.main import _parser
from pybk.testing import wait_until

pytestmark = pytest.mark.timeout(300)

#: The bounded wait for what must come at once (a few hundred ms is typical), never a
#: bound the test asserts: each test makes the wait it must not do (a session, an
#: operation's timeout) ten minutes long, or tells the two apart by what was printed.
PROMPT_S = 60.0
#: What the tests set the timeouts to that a prompt answer must not wait for, in ms.
NEVER_MS = 600_000
#: The longest a cluster or bookie may take to start.
START_S = 60.0


def run(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """``python -m pybk *args`` (no options of the tests' own)."""
    return subprocess.run([sys.executable, "-m", "pybk", *args], env=child_env(),
                          capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)


# -- options and usage --------------------------------------------------------------------

def test_version_prints_pybk_and_its_version():
    result = run("--version")
    assert (result.returncode, result.stdout) == (0, f"pybk {__version__}\n"), result


def test_log_level_goes_before_or_after_the_command_in_any_case():
    parser = _parser()
    assert parser.parse_args(["demo"]).log_level == "WARNING"
    assert parser.parse_args(["--log-level", "info", "demo"]).log_level == "INFO"
    assert parser.parse_args(["demo", "--log-level", "debug"]).log_level == "DEBUG"
    assert parser.parse_args(["--log-level", "info", "localcluster", "2", "--log-level",
                              "Error"]).log_level == "ERROR"
    for command in (["bookie"], ["demote", "wal"], ["updatecookie"],
                    ["format-cluster", "--zk", "zk://zk1/ledgers"], ["localcluster", "1"],
                    ["simpletest", "--zk", "zk://zk1/ledgers"],
                    ["clean-orphans", "events", "--zk", "zk://zk1/ledgers"]):
        assert parser.parse_args([*command, "--log-level", "debug"]).log_level == "DEBUG"


@pytest.mark.parametrize("args, message", [
    (["--log-level", "verbose", "demo"], "argument --log-level: invalid choice: 'VERBOSE'"),
    (["demo", "--log-level", "loud"], "argument --log-level: invalid choice: 'LOUD'"),
    (["localcluster", "0"], "argument N: 0 is not over 0"),
    (["localcluster", "three"], "argument N: 'three' is not a number"),
    (["demo", "--seconds", "-1"], "argument --seconds: -1 is not over 0"),
    (["simpletest", "--zk", "zk://127.0.0.1/ledgers", "--entries", "0"],
     "argument --entries: 0 is not over 0"),
    (["clean-orphans", "events", "--zk", "zk://127.0.0.1/ledgers", "--older-than", "0"],
     "argument --older-than: 0 is not over 0"),
    (["simpletest"], "no cluster given: pass --zk"),
    (["clean-orphans", "events", "--set", "zkTimeout=5000"], "no cluster given: pass --zk"),
    (["simpletest", "--zk", "zk://127.0.0.1/ledgers", "--set", "zmqCurveEnabled=true"],
     "zmqCurveSecretKeyFile"),
    (["localcluster", "1", "--set", "noSuchSetting=1"], "noSuchSetting"),
])
def test_bad_arguments_get_usage_and_status_2_not_a_traceback(args, message):
    result = run(*args)
    assert result.returncode == 2, result
    assert message in result.stderr and "usage: pybk" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


# -- an unreachable ZooKeeper -------------------------------------------------------------

def test_an_unknown_zookeeper_host_fails_at_once_in_one_line():
    # Waiting for a session would outlast run()'s bound: it fails at once or times out.
    result = run("format-cluster", "--zk", "zk://no-such-host.invalid:2181/ledgers",
                 "--set", f"zkTimeout={NEVER_MS}",
                 "--set", f"zkOperationTimeoutMs={NEVER_MS}", timeout_s=PROMPT_S)
    assert result.returncode == 1, result
    assert result.stderr.startswith("pybk format-cluster: no ZooKeeper host of "
                                    "no-such-host.invalid:2181 resolves"), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr  # no kazoo lines, no traceback


def test_a_refused_zookeeper_connection_fails_at_once_in_one_line_that_says_why():
    with socket.socket() as sock:  # a port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Waiting for a session would outlast run()'s bound: it fails at once or times out.
    result = run("bookie", "--zk", f"zk://127.0.0.1:{port}/ledgers",
                 "--set", f"zkTimeout={NEVER_MS}", timeout_s=PROMPT_S)
    assert result.returncode == 1, result
    assert (f"no ZooKeeper server listens at 127.0.0.1:{port}: the connection was refused"
            in result.stderr), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


# -- stopping pybk bookie -----------------------------------------------------------------

def wait_for_text(path: Path, text: str, process: subprocess.Popen,
                  timeout_s: float = START_S) -> str:
    """The contents of ``path`` once they hold ``text`` (while ``process`` runs)."""
    deadline = time.monotonic() + timeout_s
    while text not in (found := path.read_text(errors="replace")):
        assert process.poll() is None, f"exited with {process.returncode}:\n{found}"
        assert time.monotonic() < deadline, f"no {text!r} within {timeout_s} s:\n{found}"
        time.sleep(0.02)
    return found


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line holds ``text`` (a test's directory)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError, IndexError):
            continue
        if text in command and state not in (b"Z", b"X") and int(name) != os.getpid():
            found.append(int(name))
    return found


@pytest.fixture
def leftovers(tmp_path):
    """After the test, no process that names tmp_path is left (SIGKILL for those of a
    failed test; SIGCONT first, for stopped ones)."""
    yield
    for sig in (signal.SIGCONT, signal.SIGKILL):
        for pid in processes_mentioning(str(tmp_path)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def start_bookie(tmp_path: Path, address: str, *options: str) -> BookieProcess:
    log_path = tmp_path / "bookie.log"
    command = pybk_command(
        "bookie", "--zk", address, "--listen", "127.0.0.1:0", "--format",
        "--journal-dir", str(tmp_path / "journal"),
        "--ledger-dir", str(tmp_path / "ledgers"), "--set", "journalPreAllocSizeMB=1",
        *options)
    with open(log_path, "wb") as out:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, env=child_env())
    return BookieProcess("bookie", process, log_path, 0)


def test_sigterm_abandons_a_bookie_start_that_waits_for_zookeeper(tmp_path, leftovers):
    """Its ZooKeeper accepts the connection and never answers: the start would wait
    zkTimeout (ten minutes here).  SIGTERM ends it at once, and the exit is a clean one."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.settimeout(START_S)
        port = silent.getsockname()[1]
        bookie = start_bookie(tmp_path, f"zk://127.0.0.1:{port}/ledgers",
                              "--set", f"zkTimeout={NEVER_MS}")
        connection, _ = silent.accept()  # the bookie's start now waits for an answer
        with connection:
            bookie.process.send_signal(signal.SIGTERM)
            assert bookie.process.wait(PROMPT_S) == 0, bookie.output
    assert "pybk bookie: SIGTERM while starting: stopped" in bookie.output
    assert "Traceback" not in bookie.output


def test_a_second_sigterm_stops_a_bookie_at_once(tmp_path, own_zookeeper, leftovers):
    """A graceful stop unregisters from ZooKeeper first; with ZooKeeper paused that waits
    (zkOperationTimeoutMs, ten minutes here, bounded by the node's unregistration wait).
    The second SIGTERM does not wait for it: the exit is the second signal's, status 1."""
    address = zkutil.formatted_cluster(own_zookeeper)
    bookie = start_bookie(tmp_path, address, "--set",
                          f"zkOperationTimeoutMs={NEVER_MS}").wait_serving()
    os.killpg(own_zookeeper.pid, signal.SIGSTOP)
    bookie.process.send_signal(signal.SIGTERM)
    wait_for_text(bookie.log_path, "stopping (a second signal stops it at once)",
                  bookie.process, PROMPT_S)
    bookie.process.send_signal(signal.SIGTERM)
    assert bookie.process.wait(PROMPT_S) == 1, bookie.output
    assert "pybk bookie: a second signal (SIGTERM): exiting now" in bookie.output


# -- stopping pybk localcluster -----------------------------------------------------------

def start_localcluster(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    """``pybk localcluster *args`` with its temporary directory under tmp_path, in a
    session of its own: signalling its process group is what Ctrl-C in a terminal does."""
    out = tmp_path / "localcluster.out"
    with open(out, "wb") as stdout:
        process = subprocess.Popen(pybk_command("localcluster", *args),
                                   env=dict(child_env(), TMPDIR=str(tmp_path)),
                                   stdin=subprocess.DEVNULL, stdout=stdout,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    return process, out


def ctrl_c(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGINT)


def wait_until_gone(tmp_path: Path) -> None:
    deadline = time.monotonic() + PROMPT_S
    while left := processes_mentioning(str(tmp_path)):
        assert time.monotonic() < deadline, f"still running: {left}"
        time.sleep(0.05)


@pytest.mark.zookeeper
@pytest.mark.processes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_a_starting_localcluster_and_a_second_kills_it(tmp_path, leftovers):
    """A bookie hangs while starting (SIGSTOP): the cluster would wait for it for its
    start timeout (60 s).  Ctrl-C abandons the start and stops the cluster, which then
    waits for the hung bookie (15 s, then SIGKILL); a second Ctrl-C kills it at once."""
    cluster, out = start_localcluster(tmp_path, "2")
    deadline = time.monotonic() + START_S
    while not (hung := [pid for pid in processes_mentioning("bookie1")
                        if str(tmp_path) in Path(f"/proc/{pid}/cmdline").read_text()]):
        assert cluster.poll() is None, out.read_text()
        assert time.monotonic() < deadline, out.read_text()
        time.sleep(0.01)
    os.kill(hung[0], signal.SIGSTOP)
    time.sleep(1.0)  # the cluster waits for the hung bookie's registration
    ctrl_c(cluster)
    wait_for_text(out, "SIGINT while starting: stopping (Ctrl-C again kills it at once)",
                  cluster, PROMPT_S)
    time.sleep(0.5)
    assert cluster.poll() is None  # waiting for the hung bookie's graceful stop
    ctrl_c(cluster)
    assert cluster.wait(PROMPT_S) == 1, out.read_text()
    # Killed, not stopped after the hung bookie's 15 s grace.
    assert out.read_text().endswith("pybk localcluster: killed\n"), out.read_text()
    wait_until_gone(tmp_path)
    assert not list(tmp_path.glob("pybk-cluster-*")), "its directory was left behind"


@pytest.mark.zookeeper
@pytest.mark.processes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_every_bookie_of_a_localcluster_gracefully(tmp_path, leftovers):
    """A terminal's Ctrl-C reaches the localcluster only, which stops each bookie with
    one SIGTERM: a graceful stop, not the "second signal" one."""
    data = tmp_path / "cluster"
    cluster, out = start_localcluster(tmp_path, "2", "--dir", str(data))
    wait_for_text(out, "stops the cluster", cluster)
    # The cluster serves once its bookies are registered; a bookie process finishes its
    # start just after (a signal before that abandons the start, gracefully too).
    for number in (1, 2):
        log = data / f"bookie{number}" / "bookie.log"
        wait_until(lambda log=log: re.search(r"pybk bookie: \S+ serving at", log.read_text()),
                   f"bookie {number} started")
    ctrl_c(cluster)
    assert cluster.wait(PROMPT_S) == 0, out.read_text()
    assert "pybk localcluster: stopping (Ctrl-C again kills it at once)" in out.read_text()
    for number in (1, 2):
        log = (data / f"bookie{number}" / "bookie.log").read_text()
        assert re.search(r"pybk bookie: \S+ stopped\n", log), log[-3000:]
        assert "exiting now" not in log and "Traceback" not in log, log[-3000:]
    wait_until_gone(tmp_path)
