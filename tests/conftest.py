"""Shared fixtures: real directories under pytest's tmp_path, real bookies, a real
ZooKeeper; everything closed or stopped after."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

import pytest
import zkutil
from clusterutil import serving_cluster
from kazoo.client import KazooClient
from sparkutil import WorkerSessions, left_as_found
from zmq.utils.garbage import GarbageCollectorThread

import pybk
from pybk.settings import ServerSettings
from pybk.storage import Bookie, format_bookie, make_entry
from pybk.testing import WAIT_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

KEY = b"master-key"


def entry(ledger_id: int, entry_id: int, body: bytes | None = None,
          lac: int | None = None) -> bytes:
    """A well-formed entry whose body tells which (ledger, entry) it is."""
    if body is None:
        body = f"ledger {ledger_id} entry {entry_id} ".encode() * 4
    return make_entry(ledger_id, entry_id, entry_id - 1 if lac is None else lac, body)


@pytest.fixture
def settings_factory(tmp_path):
    """Settings for a bookie under tmp_path; keyword arguments override."""

    def make(**overrides) -> ServerSettings:
        base = dict(
            journalDirectory=str(tmp_path / "journal"),
            ledgerDirectories=(str(tmp_path / "ledgers0"), str(tmp_path / "ledgers1")),
            journalPreAllocSizeMB=1,
        )
        base.update(overrides)
        return ServerSettings(**base)

    return make


@pytest.fixture
def bookie_factory(settings_factory):
    """Open (formatting on first use) bookies; every one still open is closed at the end."""
    opened: list[Bookie] = []

    def make(settings: ServerSettings | None = None, **kwargs) -> Bookie:
        settings = settings or settings_factory()
        if not os.path.exists(os.path.join(settings.journalDirectory, "current", "COOKIE")):
            format_bookie(settings)
        bookie = Bookie(settings, **kwargs)
        opened.append(bookie)
        return bookie

    yield make
    for bookie in opened:
        bookie.close()


@pytest.fixture
def bookie(bookie_factory):
    return bookie_factory()


@pytest.fixture(scope="session")
def zookeeper():
    """One real ZooKeeper server for the whole test session, stopped at its end."""
    with zkutil.server() as zk:
        yield zk


@pytest.fixture
def kazoo(zookeeper):
    """A plain kazoo client of the session's server, without credentials: to read what
    pybk wrote, or to try what an outsider may do."""
    client = KazooClient(hosts=zookeeper.connect_string)
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def own_zookeeper():
    """A ZooKeeper server of the test's own, which it may stop, restart or pause (SIGSTOP
    to its process group): resumed, then stopped, when the test ends."""
    with zkutil.server() as zk:
        try:
            yield zk
        finally:
            if zk.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(zk.pid, signal.SIGCONT)
@pytest.fixture
def closing(bookie_factory):
    """An ExitStack closed when the test ends (also when it fails), before its bookies:
    register servers, clients and sockets here."""
    with contextlib.ExitStack() as stack:
        yield stack


@pytest.fixture(autouse=True)
def no_threads_left_behind():
    """Every thread a test starts (bookies, servers, client loops) is stopped by its end.
    (pyzmq's one garbage collector thread for zero-copy sends lives as long as the
    process: not ours.)"""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + WAIT_S
    while (left := [t for t in threading.enumerate() if t not in before and t.is_alive()
                    and not isinstance(t, GarbageCollectorThread)]) \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not left, f"threads still running after the test: {[t.name for t in left]}"


# -- markers: what a test needs, from the fixtures it uses -----------------------------------

#: Fixtures whose tests start processes of their own (bookies, crash children) and kill
#: some: the ``processes`` marker.
PROCESS_FIXTURES = {"bookies", "children", "bookie_pool"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by what it needs (pytest.ini lists the markers): ``zookeeper`` (a
    real ZooKeeper server), ``spark`` (a SparkSession), ``java`` (either: both run on
    the JVM), ``processes`` (processes it starts and kills).  Tests that need one
    without these fixtures (a ZooKeeper server of their own, Spark in a child process)
    carry the marker themselves.  So ``pytest -m "not java"`` runs where no
    Java is installed."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        # A parametrized fixture that picks ZooKeeper or processes by its value
        # (``request.getfixturevalue``) shows it only in the parameters.
        params = {value for value in getattr(getattr(item, "callspec", None), "params",
                                             {}).values() if isinstance(value, str)}
        if names & {"zookeeper", "own_zookeeper"} or params & {"zookeeper", "processes"}:
            item.add_marker(pytest.mark.zookeeper)
        if "spark" in names:
            item.add_marker(pytest.mark.spark)
        if names & PROCESS_FIXTURES or "processes" in params:
            item.add_marker(pytest.mark.processes)
        if item.get_closest_marker("zookeeper") or item.get_closest_marker("spark"):
            item.add_marker(pytest.mark.java)
    _long_modules_first(items)


def _long_modules_first(items: list[pytest.Item]) -> None:
    """Put the modules with Spark tests first, then those with ``processes`` tests, the
    rest after (a stable sort: each module's tests, and modules of one kind, keep their
    order).  ``make test``'s workers take whole files in this order (``--dist loadfile
    --no-loadscope-reorder``): the longest start early, so that both end at about the
    same time instead of one running a Spark module alone at the end."""
    rank: dict[str, int] = {}
    for item in items:
        kind = (0 if item.get_closest_marker("spark") else
                1 if item.get_closest_marker("processes") else 2)
        module = item.nodeid.split("::")[0]
        rank[module] = min(rank.get(module, kind), kind)
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])


# -- a module's cluster of bookie processes; the worker's SparkSession (the Spark tests) ----


@pytest.fixture(scope="module")
def address(zookeeper, tmp_path_factory):
    """A cluster of three bookies (in this process) for the module: its address."""
    with serving_cluster(zookeeper, tmp_path_factory.mktemp("bookies")) as found:
        yield found


@pytest.fixture(scope="session")
def spark_sessions(tmp_path_factory):
    """The worker's SparkSession, shared by its Spark modules (tests/sparkutil.py), stopped
    when the worker ends; its scratch space is under the worker's tmp_path."""
    sessions = WorkerSessions(tmp_path_factory.mktemp("spark-local"))
    try:
        yield sessions
    finally:
        sessions.close()


@pytest.fixture(scope="module")
def spark_conf() -> dict[str, str]:
    """The master and Spark conf the module's tests need (keyword arguments of
    :meth:`sparkutil.WorkerSessions.get`); a module that needs others overrides it."""
    return {"master": "local[2]"}


@pytest.fixture(scope="module")
def spark(spark_sessions, spark_conf):
    """The worker's SparkSession with the module's ``spark_conf`` (``local[2]``)."""
    return spark_sessions.get(**spark_conf)


@pytest.fixture(autouse=True)
def spark_left_as_found(request):
    """A test that uses the shared SparkSession leaves it as it found it (its conf, no
    streaming query, temporary view or job group: sparkutil.left_as_found).  Defined after
    no_threads_left_behind, so torn down before it: the queries it stops are stopped
    before that looks for threads."""
    if "spark" not in request.fixturenames:
        yield
        return
    with left_as_found(request.getfixturevalue("spark")):
        yield


@pytest.fixture(scope="module")
def bk(address):
    """A client of the module's cluster."""
    with pybk.connect(address) as client:
        yield client
