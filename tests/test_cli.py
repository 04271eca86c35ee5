"""The ``pybk`` command as a user meets it: its options; bad input answered with usage,
not tracebacks; an unreachable ZooKeeper.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from clusterutil import child_env
from pybk import __version__
from pybk.cli import _parser

pytestmark = pytest.mark.timeout(120)

#: The longest a command may take where it must be prompt (a few hundred ms is typical;
#: the bound allows for a busy machine).  Without the fixes these waits were 10-60 s.
PROMPT_S = 10.0


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
                    ["simpletest", "--zk", "zk://zk1/ledgers"]):
        assert parser.parse_args([*command, "--log-level", "debug"]).log_level == "DEBUG"


@pytest.mark.parametrize("args, message", [
    (["--log-level", "verbose", "demo"], "argument --log-level: invalid choice: 'VERBOSE'"),
    (["demo", "--log-level", "loud"], "argument --log-level: invalid choice: 'LOUD'"),
    (["localcluster", "0"], "argument N: 0 is not over 0"),
    (["localcluster", "three"], "argument N: 'three' is not a number"),
    (["demo", "--seconds", "-1"], "argument --seconds: -1 is not over 0"),
    (["simpletest", "--zk", "zk://127.0.0.1/ledgers", "--entries", "0"],
     "argument --entries: 0 is not over 0"),
])
def test_bad_arguments_get_usage_and_status_2_not_a_traceback(args, message):
    result = run(*args)
    assert result.returncode == 2, result
    assert message in result.stderr and "usage: pybk" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


# -- an unreachable ZooKeeper -------------------------------------------------------------

def test_an_unknown_zookeeper_host_fails_at_once_in_one_line():
    started = time.monotonic()
    result = run("format-cluster", "--zk", "zk://no-such-host.invalid:2181/ledgers")
    assert time.monotonic() - started < PROMPT_S
    assert result.returncode == 1, result
    assert result.stderr.startswith("pybk format-cluster: no ZooKeeper host of "
                                    "no-such-host.invalid:2181 resolves"), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr  # no kazoo lines, no traceback


def test_an_unreachable_zookeeper_fails_in_one_line_that_says_why():
    with socket.socket() as sock:  # a port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = run("bookie", "--zk", f"zk://127.0.0.1:{port}/ledgers",
                 "--set", "zkTimeout=1000")
    assert result.returncode == 1, result
    assert "accepted a session within 1 s" in result.stderr, result.stderr
    assert "Connection refused" in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
