"""A real ZooKeeper for tests: servers with fast settings, store settings, fresh roots.

One server serves the whole test session (the ``zookeeper`` fixture of conftest.py);
each test takes a root of its own (:func:`fresh_root`), so tests never see each other's
records.  Tests that restart or break ZooKeeper start a server of their own.
"""

from __future__ import annotations

import uuid

import jvm_archives
from kazoo.client import KazooClient
from sparkutil import JVM_OPTIONS

from pybk.meta.embedded import EmbeddedMetadataStore
from pybk.meta.interface import MetadataStore
from pybk.meta.zookeeper import ZooKeeperMetadataStore, ZooKeeperSettings, format_cluster
from pybk.testing.zookeeper_server import ZooKeeperServer

#: ZooKeeper's tick: sessions may time out after 2 ticks, so tests can expire them fast.
TICK_MS = 200
#: Session timeout of the stores tests open: short enough to wait for, long enough
#: that a busy CI machine does not expire a session by accident.
SESSION_TIMEOUT_MS = 4_000
#: Session timeout of processes that tests kill, so their sessions end soon after.
SHORT_SESSION_TIMEOUT_MS = 1_000


def server(**options) -> ZooKeeperServer:
    """A (not yet started) throwaway server with test settings.  Its JVM takes the
    options of the tests' Spark JVMs (:data:`sparkutil.JVM_OPTIONS`: the client compiler
    only), which halves the CPU a server takes to start, and maps its classes from the
    ZooKeeper class archive once ``make test`` made it (tests/jvm_archives.py): tests
    start dozens.  ``options`` are more keyword arguments of ZooKeeperServer (its
    ``host``, ``command_prefix``)."""
    return ZooKeeperServer(force_sync=False, tick_time_ms=TICK_MS, start_timeout_s=60.0,
                           jvm_options=[*JVM_OPTIONS.split(),
                                        *jvm_archives.options("zookeeper")], **options)


def settings(**overrides: int) -> ZooKeeperSettings:
    values = dict(zkTimeout=SESSION_TIMEOUT_MS, zkOperationTimeoutMs=20_000,
                  zkRetryBackoffStartMs=50, zkRetryBackoffMaxMs=500)
    values.update(overrides)
    return ZooKeeperSettings(**values)


def fresh_root() -> str:
    """A ledgers root no other test uses: ``/pybk-test-<random>/ledgers``."""
    return f"/pybk-test-{uuid.uuid4().hex[:12]}/ledgers"


def formatted_cluster(zookeeper: ZooKeeperServer) -> str:
    """The address of a freshly formatted cluster of its own on ``zookeeper``."""
    address = zookeeper.address(fresh_root())
    format_cluster(address, settings=settings())
    return address


def store_of_kind(request, directory) -> MetadataStore:
    """A new metadata store of the kind ``request.param`` names, for fixtures parametrized
    over both: ``"embedded"`` in ``directory``, or ``"zookeeper"`` in a fresh root of the
    worker's server (the ``zookeeper`` fixture); the caller closes it."""
    if request.param == "embedded":
        return EmbeddedMetadataStore(str(directory))
    zookeeper = request.getfixturevalue("zookeeper")
    return ZooKeeperMetadataStore(formatted_cluster(zookeeper), settings())


def expire_session(store: ZooKeeperMetadataStore) -> None:
    """End ``store``'s ZooKeeper session from outside, as ZooKeeper does when a session
    times out: a second client joins the session (same id and password) and closes it.
    (kazoo's own test tooling does the same.)"""
    client_id = store._conn.client.client_id  # the password is nowhere else
    intruder = KazooClient(hosts=store.address.connect_string, client_id=client_id)
    intruder.start(timeout=10)
    intruder.stop()
    intruder.close()
