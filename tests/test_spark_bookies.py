"""Bookies hosted by Spark executors (real Spark, real ZooKeeper, real bookie processes):
they start, register on their host, take writes, come first in the ensembles of
ledgers written on their host (by a client in a task, and by the pybk data source's
writers), are found (not started twice) by a second start on the same directory, and
are gone after the context manager exits, also when the driver is killed with SIGKILL
(in local mode and in local-cluster mode, whose executors are processes of their own)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import sparkutil
import zkutil
from clusterutil import TESTS, address, bookies, listening_sockets  # noqa: F401
from securityutil import secured_cluster_of_bookies

import pybk
from pybk.errors import BookKeeperError, InvalidConfiguration
from pybk.log.metadata import live_segments, read_log
from pybk.meta import paths
from pybk.meta.zookeeper import ZooKeeperMetadataStore
from pybk.settings import ClientSettings
from pybk.spark.bookies import HostedBookie, executor_bookies
from pybk.spark.connect import connect
from pybk.spark.holder import executor_host
from pybk.spark.options import WRITE, parse

#: Bound on a bookie's exit and unregistration once its holder or driver is gone
#: (graceful close, or the lifeline's ORPHAN_GRACE_S, or a session timeout).
GONE_WITHIN_S = 60.0
PASSWORD = b"spark-bookies"


@pytest.fixture(scope="module")
def spark(spark):
    """The worker's SparkSession (tests/conftest.py), which pickles this module's
    functions by value while the module runs: its workers cannot import it (tests/ is not
    on their path)."""
    from pyspark import cloudpickle
    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    yield spark
    cloudpickle.unregister_pickle_by_value(module)


@pytest.fixture
def store(address):
    with ZooKeeperMetadataStore(address, zkutil.settings()) as opened:
        yield opened


def hosted_by(spark, address, **options):
    """executor_bookies with a short driver session; the bookies listen on the
    executor's host, loopback here (``SPARK_LOCAL_IP``, :mod:`sparkutil`)."""
    return executor_bookies(spark, address, session_timeout_ms=zkutil.SESSION_TIMEOUT_MS,
                            **options)


def write_ledgers(address: str, count: int, _partition: object) -> list[tuple[list[str], bool]]:
    """In a Spark task: ``count`` ledgers (E=2, Qw=Qa=2) written and read back by a
    client that knows its host; each ledger's ensemble, and whether it read back."""
    settings = ClientSettings(clientHost=executor_host())
    made = []
    with pybk.connect(address, settings) as bk:
        for number in range(count):
            handle = bk.create_ledger(ensemble=2, write_quorum=2, ack_quorum=2,
                                      password=PASSWORD)
            entries = [b"ledger %d entry %d" % (number, i) for i in range(10)]
            for data in entries:
                handle.add_entry(data)
            ensemble = list(handle.metadata.ensemble_at(0))
            handle.close()
            reader = bk.open_ledger(handle.id, password=PASSWORD)
            read = [e.data for e in reader.read_entries(0, reader.last_add_confirmed)]
            reader.close()
            made.append((ensemble, read == entries))
    return made


def log_ensembles(address: str, log_name: str) -> list[tuple[str, ...]]:
    """The first ensemble of each ledger of the log."""
    with pybk.connect(address) as bk:
        head = read_log(bk.metadata, log_name).metadata
        return [bk.ledger_manager.read(segment.ledger_id).metadata.ensemble_at(0)
                for segment in live_segments(bk.metadata, head)]


def wait_gone(store, bookies: list[HostedBookie], timeout_s: float = GONE_WITHIN_S):
    """Wait until the bookies' processes exited and their registrations (on the lists
    and on their hosts) are gone."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [b for b in bookies if not process_gone(b.pid)
                or b.bookie_id in store.bookies()
                or b.bookie_id in store.bookies_on_host(b.host)]
        if not left:
            return
        assert time.monotonic() < deadline, f"still running or registered: {left}"
        time.sleep(0.1)


def process_gone(pid: int) -> bool:
    """The process exited (a zombie not reaped yet counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_bookies_start_register_take_writes_first_on_their_host_and_stop(
        spark, address, bookies, store):
    for number in (1, 2):  # bookies of two other hosts
        bookies.start(f"other{number}", "--set", f"bookieHost=other-host-{number}")
    for other in bookies.started:
        other.wait_serving()
    abandoned = paths.join(paths.SPARK_BOOKIES, "app-killed-earlier")
    store.create(paths.join(abandoned, "driver"), b"")
    store.delete(paths.join(abandoned, "driver"), 0)  # as its session's end does
    with hosted_by(spark, address, count=1) as hosted:
        assert not store.exists(abandoned)  # removed by the next start
        [bookie] = hosted.bookies
        assert bookie.started and bookie.host == "127.0.0.1"  # SPARK_LOCAL_IP
        assert bookie.bookie_id in store.bookies(read_only=False)
        assert store.bookies_on_host("127.0.0.1") == [bookie.bookie_id]
        assert store.bookie_endpoint(bookie.bookie_id) == bookie.endpoint
        assert not process_gone(bookie.pid)
        # It listens on its executor's host only, the address it registered.
        port = int(bookie.endpoint.rpartition(":")[2])
        assert listening_sockets(bookie.pid) == {("127.0.0.1", port)}
        # Data under the executor's local directory (Spark's, under spark.local.dir).
        local_dir = spark.sparkContext.getConf().get("spark.local.dir")
        assert bookie.directory.startswith(local_dir)
        assert os.path.isdir(os.path.join(bookie.directory, "journal", "current"))
        # A task on the bookie's host writes: the bookie is first in every ensemble.
        made = spark.sparkContext.parallelize([0], 1).mapPartitions(
            functools.partial(write_ledgers, address, 6)).collect()
        assert len(made) == 6
        for ensemble, read_back in made:
            assert ensemble[0] == bookie.bookie_id, made
            assert read_back
        # So do the pybk data source's writers: every ledger of the log starts on it.
        rows = spark.createDataFrame([(b"row %d" % i,) for i in range(400)], "value binary")
        rows.repartition(4).write.format("pybk").option("metadataServiceUri", address) \
            .option("log", "on-the-host").option("ensembleSize", "2") \
            .option("writeQuorumSize", "2").option("ackQuorumSize", "2") \
            .mode("append").save()
        ensembles = log_ensembles(address, "on-the-host")
        assert len(ensembles) >= 4  # a ledger per writing task at least
        assert all(e[0] == bookie.bookie_id for e in ensembles), ensembles
        lease = hosted.lease
    wait_gone(store, [bookie])
    assert lease not in store.children(paths.SPARK_BOOKIES)
    assert len(store.bookies()) == 2  # the other hosts' bookies are untouched


def test_the_data_source_clients_name_their_host(spark, address):
    """The pybk data source's clients (built here on the driver, in Spark's environment,
    as its tasks build them) know their host, so that their ledgers start on its
    bookie, unless the options name another."""
    with connect(parse({"metadataServiceUri": address, "log": "x"}, WRITE)) as bk:
        assert bk.settings.clientHost == executor_host() == "127.0.0.1"
    named = {"metadataServiceUri": address, "log": "x", "clientHost": "rack-7-host-2"}
    with connect(parse(named, WRITE)) as bk:
        assert bk.settings.clientHost == "rack-7-host-2"


def test_a_second_start_finds_the_running_bookie(spark, address, store):
    with hosted_by(spark, address, count=1) as first:
        [bookie] = first.bookies
        with hosted_by(spark, address, count=1) as second:
            [found] = second.bookies
            assert not found.started
            assert (found.bookie_id, found.endpoint, found.pid, found.directory) == \
                (bookie.bookie_id, bookie.endpoint, bookie.pid, bookie.directory)
        # The second start ended; the bookie it found runs on and takes writes.
        assert store.bookies(read_only=False) == [bookie.bookie_id]
        assert not process_gone(bookie.pid)
        with pybk.connect(address) as bk:
            handle = bk.create_ledger(ensemble=1, write_quorum=1, ack_quorum=1,
                                      password=PASSWORD)
            handle.add_entry(b"still serving")
            handle.close()
            assert handle.metadata.ensemble_at(0) == (bookie.bookie_id,)
    wait_gone(store, [bookie])


def test_a_bookie_that_cannot_start_fails_the_start_with_its_output(
        spark, address, store):
    with pytest.raises(BookKeeperError, match="(?s)exited with status 2 while starting.*"
                                              "noSuchSetting"):
        with hosted_by(spark, address, count=1, bookie_args=("--set", "noSuchSetting=1")):
            pass
    assert store.bookies() == []
    assert store.children(paths.SPARK_BOOKIES) == []  # the lease is gone


def test_a_holder_failing_in_python_fails_the_start_naming_the_error(spark, address, store):
    """Not a pybk error (a directory that cannot be made, an interpreter that cannot
    import pybk): the exception's line from the traceback Spark quotes, not Spark's
    first line."""
    with pytest.raises(BookKeeperError, match=r"the bookie holders' Spark job failed: "
                                              r"FileNotFoundError: \[Errno 2\] No such file "
                                              r"or directory: '/proc/pybk-bookie'$"):
        with hosted_by(spark, address, count=1, directory="/proc/pybk-bookie"):
            pass
    assert store.bookies() == []


def test_a_bookie_that_dies_fails_its_holder(spark, address, store):
    with hosted_by(spark, address, count=1,
                   bookie_args=("--set", "zkTimeout=2000")) as hosted:
        [bookie] = hosted.bookies
        os.kill(bookie.pid, signal.SIGKILL)
        deadline = time.monotonic() + GONE_WITHIN_S
        while hosted.failure is None:
            assert time.monotonic() < deadline, "the holder did not notice its bookie die"
            time.sleep(0.1)
        assert "exited with status -9" in str(hosted.failure)
    wait_gone(store, [bookie])


def test_bad_arguments_are_refused_before_any_task_runs(spark, address, store):
    slots = spark.sparkContext.defaultParallelism
    for options, message in [({"count": 0}, "count=0"), ({"count": slots + 1}, "slot"),
                             ({"directory": "relative/dir"}, "absolute"),
                             ({"port": 70000}, "port=70000")]:
        with pytest.raises(InvalidConfiguration, match=message):
            with hosted_by(spark, address, **options):
                pass
    with pytest.raises(InvalidConfiguration, match="zk://"):
        with executor_bookies(spark, "/not/a/cluster"):
            pass
    assert store.bookies() == []
    assert not store.exists(paths.SPARK_BOOKIES)  # no lease was taken


@pytest.mark.parametrize("master, count", [("local[2]", 1), ("local-cluster[2,1,1024]", 2)])
def test_bookies_stop_when_the_driver_is_killed(master, count, address, tmp_path,
                                                store):
    """The driver (a child process) is SIGKILLed while its bookies serve: the bookies
    exit and their registrations disappear (lifelines, then the driver's lease)."""
    driver, out_path = start_driver(address, master, count, tmp_path)
    bookies: list[HostedBookie] = []
    try:
        bookies = read_bookies(driver, out_path)
        assert len({b.bookie_id for b in bookies}) == count
        assert all(b.started for b in bookies)
        assert set(store.bookies(read_only=False)) == {b.bookie_id for b in bookies}
        driver.kill()
        driver.wait(30)
        wait_gone(store, bookies)
    finally:
        with_everything_killed(driver, bookies)


@pytest.mark.processes
def test_executor_bookies_of_a_secured_cluster_serve_over_curve(zookeeper, tmp_path):
    """Given a secured cluster's credentials as settings, the driver and the holders
    reach its ZooKeeper (ACLs) and the bookie serves CURVE: a client with the allowed
    key writes to it, and it is gone once the driver is killed."""
    with secured_cluster_of_bookies(zookeeper, tmp_path, 0) as secured, \
            ZooKeeperMetadataStore(secured.address, secured.zk_settings) as store:
        keys, zk = secured.keys, secured.zk_settings
        driver, out_path = start_driver(
            secured.address, "local[2]", 1, tmp_path, "zmqCurveEnabled=true",
            f"zmqCurveSecretKeyFile={keys.bookie_secret}",
            f"zmqCurveAllowedClientKeysDirectory={keys.allowed}", "zkEnableSecurity=true",
            f"zkDigestAuthFile={zk.zkDigestAuthFile}")
        bookies: list[HostedBookie] = []
        try:
            bookies = read_bookies(driver, out_path)
            [bookie] = bookies
            assert store.bookie_endpoint(bookie.bookie_id) == \
                f"{bookie.endpoint}#curve={keys.bookie_public.decode()}"
            with pybk.connect(secured.address, keys.client(ClientSettings()),
                              zk_settings=zk) as bk:
                handle = bk.create_ledger(ensemble=1, write_quorum=1, ack_quorum=1,
                                          password=PASSWORD)
                handle.add_entry(b"over CURVE")
                handle.close()
                assert handle.metadata.ensemble_at(0) == (bookie.bookie_id,)
                reader = bk.open_ledger(handle.id, password=PASSWORD)
                assert reader.read_entry(0).data == b"over CURVE"
            driver.kill()
            driver.wait(30)
            wait_gone(store, bookies)
        finally:
            with_everything_killed(driver, bookies)


def start_driver(address: str, master: str, count: int, tmp_path, *settings: str
                 ) -> tuple[subprocess.Popen, object]:
    """spark_bookies_driver.py in a session of its own (its JVMs join it: all killed at
    the end), with its output in ``driver.out``."""
    out_path = tmp_path / "driver.out"
    with open(out_path, "wb") as out:
        driver = subprocess.Popen(
            [sys.executable, os.path.join(TESTS, "spark_bookies_driver.py"), address,
             master, str(count), str(tmp_path / "spark-local"), *settings],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env=dict(os.environ, **sparkutil.spark_env()), cwd=TESTS,
            start_new_session=True)
    return driver, out_path


def read_bookies(driver: subprocess.Popen, out_path, timeout_s: float = 180.0
                 ) -> list[HostedBookie]:
    """The bookies the driver prints, once it has."""
    deadline = time.monotonic() + timeout_s
    while True:
        for line in out_path.read_text(errors="replace").splitlines():
            if line.startswith("[{"):
                return [HostedBookie(**fields) for fields in json.loads(line)]
        assert driver.poll() is None, \
            f"the driver exited with {driver.returncode}:\n{out_path.read_text()[-6000:]}"
        assert time.monotonic() < deadline, \
            f"no bookies within {timeout_s} s:\n{out_path.read_text()[-6000:]}"
        time.sleep(0.2)


def with_everything_killed(driver: subprocess.Popen, bookies: list[HostedBookie]) -> None:
    """Kill what the test started and may have left: the driver's session (its JVMs and
    Python workers) and the bookies (sessions of their own)."""
    if driver.poll() is None:
        driver.kill()
    driver.wait(30)
    try:
        os.killpg(driver.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for bookie in bookies:
        if not process_gone(bookie.pid):
            os.kill(bookie.pid, signal.SIGKILL)
