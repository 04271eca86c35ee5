"""pybk's Spark workers run the interpreter that registered the data source or started
executor bookies, whatever ``python3`` PATH finds (a venv used without activating it),
and a workers' interpreter that cannot import pybk is refused on the driver, before any
task runs, saying what to set (:mod:`pybk.spark.workers`).  Real Spark in local mode, a
real ZooKeeper and bookie processes."""

from __future__ import annotations

import os
import subprocess
import sys
import venv

import pytest
import sparkutil
import zkutil
from clusterutil import ROOT

import pybk.spark
from pybk.errors import InvalidConfiguration
from pybk.meta import paths
from pybk.meta.zookeeper import ZooKeeperMetadataStore
from pybk.spark import executor_bookies

pytestmark = pytest.mark.timeout(300)

#: A user's script: a batch write and read with the data source, then a bookie hosted by
#: the executor; the interpreter and environment are the test's to choose.
SCRIPT = """
import sys

from pyspark.sql import SparkSession

import pybk.spark
from pybk.spark import executor_bookies

address = sys.argv[1]
spark = SparkSession.builder.master("local[2]").getOrCreate()
try:
    pybk.spark.register(spark)
    values = spark.createDataFrame([(b"one",), (b"two",)], "value binary")
    (values.write.format("pybk").option("metadataServiceUri", address)
     .option("log", "workers-python").mode("append").save())
    log = (spark.read.format("pybk").option("metadataServiceUri", address)
           .option("log", "workers-python").load())
    print("read", sorted(row.value for row in log.collect()))
    with executor_bookies(spark, address, count=1) as hosted:
        print("hosted", [bookie.started for bookie in hosted.bookies])
finally:
    spark.stop()
"""


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A ``python3`` that cannot import pybk: a venv of this Python's base interpreter
    without pybk or any of its dependencies."""
    directory = tmp_path_factory.mktemp("bare-venv")
    venv.create(directory, with_pip=False)
    return str(directory / "bin" / "python3")


@pytest.mark.spark
def test_a_script_run_with_the_venv_python_not_activated_runs_pybk_in_its_workers(
        address, bare_python):
    """PATH's ``python3`` cannot import pybk and ``PYSPARK_PYTHON`` is not set, as for
    ``.venv/bin/python job.py`` without activating the venv: the data source's workers
    and the bookie holder run this interpreter."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env.update({key: value for key, value in sparkutil.script_env().items()
                if key != "PYSPARK_PYTHON"})
    env.update(PATH=os.path.dirname(bare_python) + os.pathsep + env.get("PATH", ""),
               PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", SCRIPT, address], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=240,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    assert "read [b'one', b'two']" in result.stdout
    assert "hosted [True]" in result.stdout


@pytest.mark.spark
def test_workers_that_cannot_import_pybk_are_refused_before_any_task_runs(
        spark, address, bare_python, monkeypatch):
    """A session whose workers run an interpreter without pybk (``PYSPARK_PYTHON`` set
    to it when the SparkContext was made, which is all PySpark reads it for): registering
    the data source and starting executor bookies fail at once, saying what to set."""
    monkeypatch.setattr(spark.sparkContext, "pythonExec", bare_python)
    message = (f"Spark's Python workers run '{bare_python}' \\(PYSPARK_PYTHON\\), and "
               "'import pybk, pyarrow' fails: ModuleNotFoundError: No module named .*: set "
               f"PYSPARK_PYTHON to an interpreter with pybk \\(this one is {sys.executable}"
               "\\) before the SparkSession is built, or install pybk there")
    with pytest.raises(InvalidConfiguration, match=message):
        pybk.spark.register(spark)
    with pytest.raises(InvalidConfiguration, match=message):
        with executor_bookies(spark, address, count=1):
            pass
    with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
        leases = store.children(paths.SPARK_BOOKIES) if store.exists(
            paths.SPARK_BOOKIES) else []
    application = spark.sparkContext.applicationId
    assert not [lease for lease in leases if lease.startswith(application)]  # none taken
