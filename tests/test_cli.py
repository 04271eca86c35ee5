"""The ``pybk`` command as a user meets it: its options, and bad input answered with
usage, not tracebacks.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from clusterutil import child_env
from pybk import __version__
from pybk.cli import _parser

pytestmark = pytest.mark.timeout(120)


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
