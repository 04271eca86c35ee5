"""The examples and the demo run as a user would run them, in their own processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args: str, cwd: str = ROOT) -> str:
    result = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                            timeout=90, env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_kv_store_replays_its_wal_and_survives_snapshots(tmp_path):
    kv = os.path.join(ROOT, "examples", "kv_store.py")
    directory = str(tmp_path / "kv")
    for command in (["set", "a", "1"], ["set", "b", "2"], ["delete", "a"], ["snapshot"],
                    ["set", "c", "3"], ["set", "b", "two"]):
        _run(kv, directory, *command)
    assert _run(kv, directory, "dump") == "b=two\nc=3\n"
    assert _run(kv, directory, "get", "a") == "(not set)\n"


def test_the_ledger_example_writes_and_reads_a_replicated_ledger(tmp_path):
    out = _run(os.path.join(ROOT, "examples", "ledger_api.py"), str(tmp_path / "ledgers"))
    assert "wrote entries 0..99" in out and "read back 100 entries" in out


def test_the_demo_verifies_every_record_after_a_kill(tmp_path):
    out = _run("-m", "pybk", "demo", "--seconds", "1", "--dir", str(tmp_path))
    assert "killed with SIGKILL" in out and "verified: all" in out
