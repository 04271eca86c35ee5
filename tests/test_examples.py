"""The examples and the demo run as a user would run them, in their own processes."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import types

import pytest
import sparkutil

import pybk

pytestmark = pytest.mark.timeout(120)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args: str, cwd: str = ROOT) -> str:
    result = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                            timeout=90, env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


#: pybk's command as an installed ``pybk`` script runs it: pybk found by the installation
#: (here: put on the path by the script itself), not through PYTHONPATH or the current
#: directory.
INSTALLED_PYBK = (f"import sys; sys.path.insert(0, {ROOT!r}); from pybk.cli import main; "
                  "sys.exit(main())")


def test_the_kv_store_replays_its_wal_and_survives_snapshots(tmp_path):
    kv = os.path.join(ROOT, "examples", "kv_store.py")
    directory = str(tmp_path / "kv")
    for command in (["set", "a", "1"], ["set", "b", "2"], ["delete", "a"], ["snapshot"],
                    ["set", "c", "3"], ["set", "b", "two"]):
        _run(kv, directory, *command)
    assert _run(kv, directory, "dump") == "b=two\nc=3\n"
    assert _run(kv, directory, "get", "a") == "(not set)\n"


def test_the_kv_store_without_arguments_prints_its_usage(tmp_path):
    kv = os.path.join(ROOT, "examples", "kv_store.py")
    directory = str(tmp_path / "kv")
    for args in ([], [directory], [directory, "set", "a"], [directory, "frob"]):
        result = subprocess.run([sys.executable, kv, *args], capture_output=True, text=True,
                                timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
        assert result.returncode == 2, result
        assert result.stderr.startswith("usage: python examples/kv_store.py DIR set KEY")
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "kv").exists()  # nothing was opened


def test_the_ledger_example_writes_and_reads_a_replicated_ledger(tmp_path):
    out = _run(os.path.join(ROOT, "examples", "ledger_api.py"), str(tmp_path / "ledgers"))
    assert "wrote entries 0..99" in out and "read back 100 entries" in out


def test_the_demo_verifies_every_record_after_a_kill(tmp_path):
    out = _run("-m", "pybk", "demo", "--seconds", "1", "--dir", str(tmp_path))
    assert "killed with SIGKILL" in out and "verified: all" in out


@pytest.mark.parametrize("shadow", ["a clone of the repository", "another pybk package"])
def test_the_demo_runs_where_a_directory_named_pybk_is(tmp_path, shadow):
    """``pybk demo`` started where ``./pybk`` is a clone of pybk (so ``python -m pybk``
    would import it as a namespace package) or another pybk: its writer child runs the
    pybk the demo runs."""
    if shadow == "a clone of the repository":
        (tmp_path / "pybk" / "pybk").mkdir(parents=True)
        (tmp_path / "pybk" / "README.md").write_text("a clone\n")
    else:
        (tmp_path / "pybk").mkdir()
        (tmp_path / "pybk" / "__init__.py").write_text("raise ImportError('wrong pybk')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [sys.executable, "-P", "-c", INSTALLED_PYBK, "demo", "--seconds", "0.5",
               "--dir", str(tmp_path / "demo")]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verified: all" in result.stdout


SPARK_ENV = sparkutil.script_env()


def _spark_example(*args: str) -> subprocess.CompletedProcess:
    """Run a Spark example (Spark in local mode), on the cluster its arguments name or a
    cluster of its own (ZooKeeper, three bookies), all stopped by the example itself."""
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=240, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, PYTHONPATH=ROOT, **SPARK_ENV))


def _run_spark_example(*args: str) -> str:
    result = _spark_example(*args)
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    return result.stdout


def _example_module(name: str) -> types.ModuleType:
    """``examples/<name>.py`` imported as a module (its ``__main__`` part not run)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}",
                                                  os.path.join(ROOT, "examples", f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(400)
def test_the_spark_etl_example_aggregates_its_own_log_and_stops_at_a_record_it_cannot_parse(
        address, spark):
    """On a cluster where the README's Spark snippet wrote its log ``events`` (three
    records that are not JSON), the example, run as a user runs it, reads only its own
    log; a record there that it cannot parse fails its job (run here on the worker's
    SparkSession: the process was the first run's point), naming the record, before it
    writes anything."""
    etl = os.path.join(ROOT, "examples", "spark_batch.py")
    with pybk.connect(address) as bk, pybk.LogWriter.open(bk, "events") as writer:
        for value in (b"first", b"second", b"third"):
            writer.append(value)
    out = _run_spark_example(etl, address)
    assert "appended 10000 events" in out and "read 10000 events; wrote 5 counts" in out
    for user in ("ada", "brian", "carol", "dennis", "edsger"):
        assert f'{{"user":"{user}","count":2000}}' in out
    example = _example_module("spark_batch")
    with pybk.connect(address) as bk:
        with pybk.LogWriter.open(bk, example.EVENTS) as writer:
            bad = writer.append(b"not an event")
        counts = list(pybk.LogReader(bk, example.COUNTS).read())
        with pytest.raises(SystemExit) as stopped:
            example.run_job(spark, address)
        assert str(stopped.value) == (
            "the log 'example-etl-events' holds records that are not JSON events with a "
            f"user, at {bad}: this example reads only what its append_events wrote; "
            "nothing was written")
        assert list(pybk.LogReader(bk, example.COUNTS).read()) == counts


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_the_spark_streaming_example_copies_a_live_log_exactly_once_and_counts_by_event_time(
        address):
    """Each run of the query is stopped while a micro-batch writes: Spark aborts that
    write, which it logs at ERROR, and the example quiets: a successful run prints no
    ERROR.  It runs on the module's cluster (the example's own throwaway cluster is
    LocalCluster's, which tests/test_cluster.py runs)."""
    result = _spark_example(os.path.join(ROOT, "examples", "spark_streaming.py"),
                            "--seconds", "4", address)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr[-5000:]
    for run in (1, 2):  # each run committed a micro-batch: the restart resumed one
        committed = re.search(rf"run {run}: stopped the query after (\d+) micro-batches, "
                              "aborting the one in flight", out)
        assert committed and int(committed.group(1)) >= 1, out
    assert "exactly once and in order" in out
    # The event-time windows the watermark closed, each count checked by the example.
    assert re.search(r"\d+ windows of a second closed by the watermark hold \d+ of", out), out
    assert [line for line in (out + result.stderr).splitlines() if " ERROR " in line] == []
