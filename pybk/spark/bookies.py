"""Bookies hosted by the executors of a Spark application.

::

    from pybk.spark import executor_bookies

    with executor_bookies(spark, "zk://zk1:2181/ledgers") as hosted:
        print(hosted.bookies)        # HostedBookie(bookie_id, endpoint, host, ...) each
        ...                          # jobs whose tasks write to pybk logs
    # every bookie it started is stopped and unregistered here

How it runs (Ray on Spark's design, which solved the same problem for Ray nodes)
    :func:`executor_bookies` submits one Spark job of ``count`` tasks, in a job group of
    its own, from a driver thread.  Each task is a *holder*: it runs in a Python worker
    on an executor, starts a bookie there as a process of its own
    (``python -m pybk bookie``, fork and exec; not inside the worker, which PySpark forks,
    signals with its process group and reaps when idle), waits until it serves, reports
    it, and then holds its task slot for as long as the bookie should run, watching it.
    The driver returns from ``__enter__`` once every task has reported.  On exit it ends
    its lease (below); each holder then stops its bookie gracefully (SIGTERM: the bookie
    unregisters and finishes what is in progress; SIGKILL after ``stop_grace_s``) and
    ends, which ends the job.  Holders that do not end within ``stop_timeout_s`` are
    stopped by cancelling the job group (PySpark kills their workers, and their bookies
    follow through their lifelines).  ``__exit__`` returns once the bookies it started
    are unregistered (or ``stop_timeout_s`` passed, with a warning).

A bookie never outlives the application
    Three mechanisms, each covering what the others cannot:

    * The lease: ``/ledgers/spark-bookies/<lease>/driver``, an ephemeral record of the
      driver's ZooKeeper session.  Holders look at it every :data:`WATCH_INTERVAL_S`
      and stop their bookie when it is gone: when the context manager exits, and when the
      driver process dies, once its session expires (``session_timeout_ms``), even if
      the executors live on (a client-mode driver on another machine).
    * The lifeline (:mod:`pybk.cluster.lifeline`): each bookie watches a pipe whose write
      end only its holder's worker holds, and stops as on SIGTERM when it breaks: the
      task was killed (job cancelled, executor lost, the driver's death ending the
      executors), or the worker died.  On Linux the kernel also sends the bookie SIGTERM
      when the worker dies (``PR_SET_PDEATHSIG``; the task runs on the worker's main
      thread, which lives as long as the worker).
    * The watchdog: the holder checks its bookie every :data:`WATCH_INTERVAL_S`; a bookie
      that exits by itself fails the task, so Spark retries it (a new attempt starts the
      bookie again on the same directory, with its data) up to ``spark.task.maxFailures``
      and then fails the job, which :attr:`ExecutorBookies.failure` reports.

    Each bookie runs in a session of its own, so PySpark's SIGHUP to the worker daemon's
    process group (when the daemon exits) does not reach it: its lifeline decides.

One bookie per directory, found when running
    A holder takes an exclusive lock on ``<directory>/HOLDER`` for as long as it holds
    the bookie, and writes ``<directory>/bookie.json`` (id, endpoint, host, pid) once it
    serves.  A second holder on the same host and directory (a second
    :func:`executor_bookies` in this or another application, two tasks landing on one
    executor) finds the lock taken, waits for ``bookie.json`` naming a registered bookie,
    and reports that bookie as found (``started`` false) instead of failing; it holds its
    slot until its own lease ends but never stops a bookie it did not start.  A holder
    whose worker died released the lock with it (the kernel drops ``flock`` locks of dead
    processes), so the next start does not wait for a stale owner; if the previous
    bookie is still closing, the new one retries until the directory is free.

Where data goes
    ``directory`` names the bookie's directory on every host (absolute; created if
    missing): one bookie per host, whose data and bookie id survive the application, so
    the next application's bookie on that host comes back with them.  Without it, the
    directory is ``pybk-bookie`` in the first of the executor's local directories
    (``SPARK_LOCAL_DIRS`` as Spark gives it to Python workers: the block manager's
    directories of that executor): one bookie per executor, whose data lives and dies
    with the executor (Spark deletes those directories when the executor stops), like
    shuffle files.  Normally the bookie stops first; an executor that dies first (with
    its driver, say) may delete the directory under its running bookie, which then
    stops within its lifeline's grace (``ORPHAN_GRACE_S``).  Inside it: ``journal/``,
    ``ledgers/``, ``bookie.log`` (the bookie's output), ``HOLDER`` and ``bookie.json``.

Host and placement
    A holder names its host with :func:`~pybk.spark.holder.executor_host`
    (``SPARK_LOCAL_HOSTNAME``, else ``SPARK_LOCAL_IP``, else the machine's name: what
    Spark itself goes by), and starts its bookie advertising that host and registered
    on it (``advertisedAddress``, ``bookieHost``).  A writer in a task of the same host
    that sets ``ClientSettings.clientHost`` to
    :func:`~pybk.spark.holder.executor_host` (the ``pybk`` data source does) gets that
    bookie first in its new ensembles (:mod:`pybk.client.placement`): a
    Python data source cannot ask Spark for locality (its partitions have no preferred
    locations), so co-location works through placement instead of through scheduling.

On a real cluster
    * Slots: each holder holds one task slot (``spark.task.cpus`` cores of its executor)
      for as long as the bookies run, so choose ``count`` below the application's slots
      (:func:`executor_bookies` refuses ``count`` above ``sc.defaultParallelism``, and
      warns when it would take every slot: no other task could run).  Spark places tasks
      where slots are free; it does not promise one per executor or host: with
      ``directory`` given, holders that land on one host share its bookie (the second
      finds the first); without, each executor gets its own.  Submit it first, while
      executors are idle, for the widest spread.  Holders are not barrier tasks: a barrier
      stage waits for every slot at once and hangs when they are short.
    * ``count`` defaults to the executors registered when it is called (1 in local
      mode); with dynamic allocation, that may be few at start: pass ``count``, and set
      ``spark.dynamicAllocation.minExecutors`` to at least it so executors holding
      bookies are never idle-released (a held slot keeps an executor busy anyway, so
      dynamic allocation never removes one with a bookie; new executors get none).
    * Standalone: executors on each worker host; give ``directory`` on a local disk
      present on every host for one durable bookie per host.  The bookie runs with the
      executor's user and environment (the same Python, which needs pybk).
    * YARN: the executors' local directories are the NodeManager's per-application
      directories, deleted when the application ends: without ``directory``, bookies
      are scratch storage for the application's life.  The bookie's process is a child
      of the container's process tree and counts against the container's memory
      (``spark.executor.memoryOverhead`` / ``spark.executor.pyspark.memory`` must leave
      room for it; pybk's bookie needs tens of MB plus its write cache).
    * Kubernetes: one executor per pod, so per-executor and per-host are the same;
      ``directory`` on a hostPath or persistent volume keeps the data across
      applications.  The pod's IP is its host (``SPARK_LOCAL_IP`` is set to it), which
      other pods reach directly.
    * Interfaces: each bookie listens on its executor's host (the address it registers
      and the other hosts reach it by: ``SPARK_LOCAL_IP`` or the host's name), never on
      every interface unless ``listen_host="0.0.0.0"`` says so.  Between hosts the
      bookies' traffic crosses the network: turn on CURVE (``settings``, below).
    * Ports: each bookie listens on ``listen_host:port``; ``port`` 0 (the default) takes
      any free port, which is registered, so clients find it; a firewall between hosts
      needs a fixed ``port`` (then one bookie per host: give ``directory``).  Clients
      and bookies also need ZooKeeper's port.

Records in ZooKeeper (under the cluster's root; :mod:`pybk.meta.paths`)::

    /ledgers/spark-bookies/<lease>/driver       ephemeral, the driver's session: the lease
    /ledgers/spark-bookies/<lease>/task-<N>     ephemeral, holder N's session: its report,
                                                HostedBookie as JSON

The lease's own record is removed by the driver on exit; one left by a killed driver is
empty once its holders are gone, and the next :func:`executor_bookies` on the cluster
removes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import re
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from pybk.errors import BookKeeperError, InvalidConfiguration, MetadataError, NoNode
from pybk.meta import paths
from pybk.meta.address import is_zookeeper_address, open_metadata_store
from pybk.meta.interface import ANY_VERSION, MetadataStore
from pybk.settings import ServerSettings
from pybk.spark import workers
from pybk.spark.holder import POLL_S, HolderConfig, HostedBookie, hold

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: A pybk error raised in a holder task, as Spark's error text quotes it.
_HOLDER_ERROR = re.compile(r"pybk\.errors\.\w+: (.)")
#: How Python starts a traceback, which Spark's error text quotes from the worker.
_TRACEBACK = "Traceback (most recent call last):"



class ExecutorBookies:
    """What :func:`executor_bookies` yields: the bookies its holders reported."""

    def __init__(self, address: str, lease: str, job: "_HolderJob") -> None:
        #: The cluster's metadata address.
        self.address = address
        #: This start's lease (a name under ``/ledgers/spark-bookies``).
        self.lease = lease
        #: One per holder task, in task order (several may name one bookie).
        self.bookies: list[HostedBookie] = []
        self._job = job

    @property
    def bookie_ids(self) -> list[str]:
        """The distinct bookie ids, sorted."""
        return sorted({b.bookie_id for b in self.bookies})

    @property
    def failure(self) -> BaseException | None:
        """Why the holders' job failed (a bookie kept exiting), or None (it runs, or it
        ended as asked)."""
        return self._job.failure

    def __repr__(self) -> str:
        return f"ExecutorBookies({self.address!r}, {self.bookies!r})"


@contextlib.contextmanager
def executor_bookies(spark: "SparkSession", address: str, *, count: int | None = None,
                     directory: str | None = None, listen_host: str | None = None,
                     port: int = 0, bookie_args: Sequence[str] = (),
                     settings: Mapping[str, Any] | None = None,
                     session_timeout_ms: int = 10_000, start_timeout_s: float = 120.0,
                     stop_timeout_s: float = 60.0, stop_grace_s: float = 15.0
                     ) -> Iterator[ExecutorBookies]:
    """Run ``count`` bookie holders on the executors of ``spark``'s application for the
    cluster at ``address`` (``zk://...``, formatted); see the module docstring.  Yields
    once every holder reported its bookie (started, or found running), registered and
    serving; stops the bookies it started on exit.

    ``directory``: the bookie directory on every host (absolute), or None for one in
    each executor's local directories.  ``listen_host``/``port``: where bookies listen
    (port 0: any free one); ``listen_host`` None (the default) is each executor's own
    host (:func:`~pybk.spark.holder.executor_host`, the address the bookie registers),
    so a bookie is reachable by the other hosts on that one interface only; give
    ``"0.0.0.0"`` to listen on every interface (and see CURVE in the README).
    ``bookie_args``: more ``pybk bookie`` options (``--set KEY=VALUE``).
    ``settings``: ServerSettings names and values for every bookie and for the
    ZooKeeper clients of the driver and the holders, which use their
    ``zkEnableSecurity``, ``zkDigestAuthFile`` and ``zkWorldReadable``: how a secured
    cluster's credentials are given (CURVE: ``zmqCurveEnabled``,
    ``zmqCurveSecretKeyFile``, ``zmqCurveAllowedClientKeysDirectory``).  Their files are
    paths on every executor host (the driver reads ``zkDigestAuthFile`` too).
    ``session_timeout_ms``: the driver's ZooKeeper session, whose end
    after a driver's death stops the bookies.

    The holders run :func:`pybk.spark.workers.worker_python` (in local mode without
    ``PYSPARK_PYTHON``, this interpreter).

    Raises InvalidConfiguration for bad arguments or a workers' interpreter that cannot
    import pybk (before any task runs),
    MetadataUnavailable / MetadataError if the cluster cannot be reached or is not
    formatted, BookKeeperError if the holders fail or do not all report within
    ``start_timeout_s`` (then everything started is stopped)."""
    sc = spark.sparkContext
    count = _check_arguments(sc, address, count, directory, listen_host, port)
    python = workers.worker_python(sc)
    from pybk.meta.zookeeper import ZooKeeperSettings
    named = {key: str(value).lower() if isinstance(value, bool) else str(value)
             for key, value in (settings or {}).items()}
    zookeeper = ZooKeeperSettings.of(ServerSettings.from_mapping(named))  # checks them
    with open_metadata_store(address, dataclasses.replace(
            zookeeper, zkTimeout=session_timeout_ms)) as store:
        _remove_abandoned_leases(store)
        lease = f"{sc.applicationId}-{uuid.uuid4().hex[:12]}"
        lease_path = paths.join(paths.SPARK_BOOKIES, lease)
        driver_path = paths.join(lease_path, "driver")
        store.create(driver_path, sc.applicationId.encode("utf-8"), ephemeral=True)
        setting_args = tuple(arg for key, value in named.items()
                             for arg in ("--set", f"{key}={value}"))
        config = HolderConfig(address, lease, directory, listen_host, port,
                               tuple(bookie_args) + setting_args, start_timeout_s,
                               stop_grace_s, zookeeper)
        job = _HolderJob(spark, config, count, python)
        hosted = ExecutorBookies(address, lease, job)
        try:
            job.start()
            hosted.bookies = _wait_for_reports(store, lease_path, count, job,
                                               start_timeout_s)
            log.info("%d Spark executor bookie holders reported: %s", count, hosted.bookies)
            yield hosted
        finally:
            _stop(store, driver_path, lease_path, job, hosted, stop_timeout_s)


def _check_arguments(sc: "SparkContext", address: str, count: int | None,
                     directory: str | None, listen_host: str | None, port: int) -> int:
    """The number of holders to run, once the arguments are checked."""
    if not is_zookeeper_address(address):
        raise InvalidConfiguration(f"executor bookies join a cluster: {address!r} is not "
                                   "a zk://host:port[,host:port...]/ledgers address")
    slots = sc.defaultParallelism
    if count is None:
        count = _executor_count(sc)
    if not isinstance(count, int) or not 1 <= count <= slots:
        raise InvalidConfiguration(f"count={count!r}: each bookie holder holds a task slot "
                                   f"and the application has {slots}; give 1 to {slots}")
    if count == slots:
        log.warning("%d bookie holders take every task slot of the application: no other "
                    "task can run while they do", count)
    if directory is not None and not os.path.isabs(directory):
        raise InvalidConfiguration(f"directory={directory!r}: give an absolute path, the "
                                   "same on every host")
    if not 0 <= port < 65536:
        raise InvalidConfiguration(f"port={port!r}: 0 (any free port) to 65535")
    if listen_host is not None and (not listen_host or any(
            c.isspace() or c in "/[]" for c in listen_host)):
        raise InvalidConfiguration(f"listen_host={listen_host!r} is not a host name or "
                                   "address")
    return count


def _executor_count(sc: "SparkContext") -> int:
    """Executors registered now (the driver is one of the block managers listed, except
    in local mode, where it is the only executor)."""
    managers = sc._jsc.sc().getExecutorMemoryStatus().size()
    master = sc.master
    assert master is not None  # a running context has one
    return 1 if master.startswith("local[") or master == "local" else max(1, managers - 1)


def _remove_abandoned_leases(store: MetadataStore) -> None:
    """Remove the records of leases that have no driver and no holder left (a killed
    driver's).  A live lease is never empty: its driver record is created with it."""
    try:
        leases = store.children(paths.SPARK_BOOKIES)
    except NoNode:
        return
    for name in leases:
        with contextlib.suppress(NoNode, MetadataError):  # not empty (alive): kept
            store.delete(paths.join(paths.SPARK_BOOKIES, name), ANY_VERSION)


def _wait_for_reports(store: MetadataStore, lease_path: str, count: int,
                      job: "_HolderJob", timeout_s: float) -> list[HostedBookie]:
    deadline = time.monotonic() + timeout_s
    while True:
        names = [n for n in store.children(lease_path) if n.startswith("task-")]
        if len(names) >= count:
            reports = []
            for name in sorted(names, key=lambda n: int(n.partition("-")[2])):
                with contextlib.suppress(NoNode):  # its holder ended meanwhile: failure
                    reports.append(HostedBookie.from_json(
                        store.get(paths.join(lease_path, name))[0]))
            if len(reports) >= count:
                return reports
        if job.failure is not None:
            raise BookKeeperError(f"the bookie holders' Spark job failed: "
                                  f"{_cause(job.failure)}") from job.failure
        if not job.running:
            raise BookKeeperError("the bookie holders' Spark job ended before every holder "
                                  "reported (its lease ended?)")
        if time.monotonic() > deadline:
            raise BookKeeperError(
                f"{len(names)} of {count} bookie holders reported within {timeout_s:.0f} s: "
                "the application may have fewer free task slots than holders, or bookies "
                "failed to start (see bookie.log in their directories and the executors' "
                "logs)")
        time.sleep(POLL_S)


def _stop(store: MetadataStore, driver_path: str, lease_path: str, job: "_HolderJob",
          hosted: ExecutorBookies, timeout_s: float) -> None:
    """End the lease, let the holders stop their bookies, cancel those that do not end,
    and wait for the started bookies' registrations to go."""
    deadline = time.monotonic() + timeout_s
    try:
        store.delete(driver_path, ANY_VERSION)
    except NoNode:
        pass
    except MetadataError as e:  # the holders cannot see the lease end: cancel them
        log.warning("could not end the bookie holders' lease %s (%s): cancelling their "
                    "job", driver_path, e)
        job.cancel()
    if not job.join(max(0.0, deadline - time.monotonic())):
        log.warning("bookie holders did not end within %.0f s of their lease: cancelling "
                    "their job", timeout_s)
        job.cancel()
        job.join(max(10.0, deadline - time.monotonic()))
    started = {b.bookie_id for b in hosted.bookies if b.started}
    try:
        while left := started & set(store.bookies()):
            if time.monotonic() > deadline:
                log.warning("executor bookies %s still registered %.0f s after their lease "
                            "ended (their sessions end after zkTimeout)", sorted(left),
                            timeout_s)
                break
            time.sleep(POLL_S)
        with contextlib.suppress(NoNode, MetadataError):  # a holder's report still there
            store.delete(lease_path, ANY_VERSION)
    except MetadataError as e:
        log.warning("could not check that the executor bookies unregistered: %s", e)
    if job.running:
        log.error("the bookie holders' Spark job is still running after it was cancelled")


def _cause(error: BaseException) -> str:
    """What went wrong in a holder, out of the Spark error that carries it: a holder's
    own error, with the bookie's output, is the part from pybk's exception on; another
    Python error (the worker could not import pybk, say) is the line after the last
    traceback quoted; else the first line."""
    text = str(error)
    found = _HOLDER_ERROR.search(text)
    if found is not None:
        return text[found.start(1):].split("\n\tat ")[0].strip()
    if _TRACEBACK in text:
        for line in text.rpartition(_TRACEBACK)[2].splitlines():
            if line.strip() and not line[0].isspace():
                return line.strip()
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


class _HolderJob:
    """The Spark job of holder tasks, run from a driver thread in a job group of its
    own (cancelling the group kills the tasks)."""

    def __init__(self, spark: "SparkSession", config: HolderConfig, count: int,
                 python: str) -> None:
        self._sc = sc = spark.sparkContext
        self._count = count
        self._holders = sc.parallelize(range(count), count).mapPartitionsWithIndex(
            functools.partial(hold, config))
        with workers.running(sc, python):
            self._holders.id()  # makes its Java side: the holders run ``python``
        self.group = f"pybk-bookies-{config.lease}"
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pybk-spark-bookies",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        sc = self._sc
        try:
            sc.setJobGroup(self.group, f"pybk bookies ({self._count} holders)",
                           interruptOnCancel=True)
            self._holders.collect()
        except BaseException as e:  # noqa: BLE001 - reported through .failure
            self.failure = e
        finally:
            _release_jvm_connection(sc)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout_s: float) -> bool:
        """Wait until the job ended; False if ``timeout_s`` passed first."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def cancel(self) -> None:
        self._sc.cancelJobGroup(self.group)


def _release_jvm_connection(sc: "SparkContext") -> None:
    """Close this thread's connection to the JVM now.  PySpark's pinned-thread mode
    gives each Python thread one, closed by a thread-local finalizer as the thread ends;
    that finalizer logs from a thread ``threading`` has already forgotten, which leaves a
    phantom ``Dummy`` thread behind in ``threading.enumerate()``."""
    client = getattr(getattr(sc, "_gateway", None), "_gateway_client", None)
    connection = getattr(client, "thread_connection", None)
    if connection is not None:
        connection.__dict__.clear()  # runs the finalizer here, on the living thread
