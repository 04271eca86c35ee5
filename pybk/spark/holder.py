"""The executor side of :func:`pybk.spark.bookies.executor_bookies`: a holder task
starts (or finds) the bookie of its host or executor as a process of its own, reports it
under the lease, and holds its task slot while watching the bookie and the lease (the
design, the directory's files and the records are in :mod:`pybk.spark.bookies`).

Everything here runs in a Python worker on an executor, from :func:`hold`; the driver
side pickles a :class:`HolderConfig` (plain values) to it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import socket
import subprocess
import time
from typing import TYPE_CHECKING, Iterator

from pybk.cluster import child
from pybk.cluster.lifeline import Lifeline, death_signal_preexec
from pybk.errors import (
    BookieUnavailable,
    BookKeeperError,
    InvalidConfiguration,
    MetadataUnavailable,
    NodeExists,
    NoNode,
)
from pybk.fileio import lock_file, write_file_atomically
from pybk.meta import paths
from pybk.meta.address import open_metadata_store
from pybk.meta.interface import ANY_VERSION, MetadataStore
from pybk.net.curve import split_registered

if TYPE_CHECKING:
    from pybk.meta.zookeeper import ZooKeeperSettings

log = logging.getLogger(__name__)

#: The bookie directory's name in an executor's local directory (without ``directory``).
DIRECTORY_NAME = "pybk-bookie"
#: How often a holder looks at its lease and its bookie, in seconds.
WATCH_INTERVAL_S = 0.5
#: How often the driver looks for reports and unregistrations, in seconds.
POLL_S = 0.1
LOG_TAIL_BYTES = 4000
#: ``pybk bookie``'s line once it serves (:func:`pybk.cli.cluster.run_bookie`).
_SERVING = re.compile(r"pybk bookie: (\S+) serving at (\S+),")
#: What ``pybk bookie`` says when another bookie still holds the directory.
_LOCKED = "is locked: another bookie"

@dataclasses.dataclass(frozen=True)
class HostedBookie:
    """A bookie a holder task reported.  ``started``: the holder started it (it stops it
    at the end); false: it found it running, started by another holder on that
    directory (of this or another application), which decides when it stops."""

    bookie_id: str
    endpoint: str
    host: str
    directory: str
    pid: int
    started: bool

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> "HostedBookie":
        return cls(**json.loads(data))


@dataclasses.dataclass(frozen=True)
class HolderConfig:
    """What a holder task needs: plain values only, pickled to the executors."""

    address: str
    lease: str
    directory: str | None
    #: Where the bookie listens; None: the executor's host (:func:`executor_host`).
    listen_host: str | None
    port: int
    bookie_args: tuple[str, ...]
    start_timeout_s: float
    stop_grace_s: float
    #: The holders' ZooKeeper settings: a secured cluster's credentials (a file on the
    #: executor's host).
    zookeeper: "ZooKeeperSettings | None" = None


def executor_host() -> str:
    """The name of the host this process runs on, as Spark names it:
    ``SPARK_LOCAL_HOSTNAME``, else ``SPARK_LOCAL_IP``, else the machine's name.  The same
    on the driver and in every task of one host, which is what placement compares."""
    return (os.environ.get("SPARK_LOCAL_HOSTNAME") or os.environ.get("SPARK_LOCAL_IP")
            or socket.gethostname())


def hold(config: HolderConfig, index: int, rows: Iterator[object]) -> Iterator[str]:
    """Holder task ``index``: start or find the bookie, report it, hold until the
    lease ends.  Yields nothing."""
    host = executor_host()
    directory = config.directory or os.path.join(_local_directory(), DIRECTORY_NAME)
    os.makedirs(directory, exist_ok=True)
    lease_path = paths.join(paths.SPARK_BOOKIES, config.lease)
    driver_path = paths.join(lease_path, "driver")
    with contextlib.ExitStack() as held:
        store = held.enter_context(open_metadata_store(config.address, config.zookeeper))
        if not store.exists(driver_path):
            return iter(())  # the lease ended before this task ran: nothing to hold
        holder_fd, found = _hold_or_find(store, directory, config.start_timeout_s)
        if found is not None:
            process, bookie = None, found
        else:
            assert holder_fd is not None  # found nothing: holds the directory itself
            held.callback(os.close, holder_fd)
            lifeline = held.enter_context(Lifeline())
            process, bookie = _start_bookie(config, directory, host, lifeline)
            held.callback(_stop_bookie, process, directory, config.stop_grace_s)
        _report(store, paths.join(lease_path, f"task-{index}"), bookie)
        _watch(store, driver_path, bookie, process)
    return iter(())


def _report(store: MetadataStore, path: str, bookie: HostedBookie) -> None:
    """Create the holder's report; one a killed earlier attempt of the task left (its
    session not expired yet) is replaced."""
    try:
        store.create(path, bookie.to_json(), ephemeral=True)
    except NodeExists:
        with contextlib.suppress(NoNode):
            store.delete(path, ANY_VERSION)
        store.create(path, bookie.to_json(), ephemeral=True)


def _local_directory() -> str:
    """The first of this executor's local directories (given to Python workers)."""
    local = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
    if not local:
        raise InvalidConfiguration("SPARK_LOCAL_DIRS is not set in this Spark task: give "
                                   "executor_bookies a directory")
    return local[0]


def _start_bookie(config: HolderConfig, directory: str, host: str,
                  lifeline: Lifeline) -> tuple[subprocess.Popen, HostedBookie]:
    """Start the bookie of ``directory`` and wait until it serves; retry while a previous
    bookie of the directory is still closing."""
    info = os.path.join(directory, "bookie.json")
    with contextlib.suppress(FileNotFoundError):
        os.remove(info)  # a previous holder's; this one names the new bookie
    command = child.command(
        "--log-level", "INFO", "bookie", "--zk", config.address,
        "--listen", f"{config.listen_host or host}:{config.port}", "--format",
        "--journal-dir", os.path.join(directory, "journal"),
        "--ledger-dir", os.path.join(directory, "ledgers"),
        "--set", f"advertisedAddress={host}", "--set", f"bookieHost={host}",
        "--lifeline-fd", str(lifeline.child_fd), *config.bookie_args)
    log_path = os.path.join(directory, "bookie.log")
    deadline = time.monotonic() + config.start_timeout_s
    while True:
        with open(log_path, "ab") as out:
            start = out.tell()
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, env=child.environment(),
                                       pass_fds=(lifeline.child_fd,), start_new_session=True,
                                       preexec_fn=death_signal_preexec(signal.SIGTERM))
        try:
            serving = _wait_serving(process, log_path, start, deadline)
        except BaseException:
            _stop_bookie(process, directory, config.stop_grace_s)
            raise
        if serving is not None:
            bookie = HostedBookie(serving[0], serving[1], host, directory, process.pid, True)
            write_file_atomically(info, bookie.to_json())
            return process, bookie
        output = _read_from(log_path, start)
        if _LOCKED not in output or time.monotonic() > deadline:
            raise BookKeeperError(f"the bookie in {directory} exited with status "
                                  f"{process.returncode} while starting; its output ends:\n"
                                  f"{output[-LOG_TAIL_BYTES:]}")
        time.sleep(WATCH_INTERVAL_S)  # the previous bookie is still closing


def _wait_serving(process: subprocess.Popen, log_path: str, start: int,
                  deadline: float) -> tuple[str, str] | None:
    """(id, endpoint) once the bookie says it serves; None if it exited first."""
    while not (found := _SERVING.search(_read_from(log_path, start))):
        if process.poll() is not None:
            return None
        if time.monotonic() > deadline:
            raise BookKeeperError(f"the bookie in {os.path.dirname(log_path)} did not serve "
                                  "in time; its output ends:\n"
                                  f"{_read_from(log_path, start)[-LOG_TAIL_BYTES:]}")
        time.sleep(POLL_S)
    return found.group(1), found.group(2)


def _read_from(path: str, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", "replace")


def _hold_or_find(store: MetadataStore, directory: str, timeout_s: float
                  ) -> tuple[int, None] | tuple[None, HostedBookie]:
    """Take the directory's HOLDER lock (its descriptor, None), or find the bookie that
    the holder of the lock runs there (None, the bookie): once it serves and is
    registered with the endpoint its ``bookie.json`` names.  A holder that is stopping
    its bookie lets the lock go soon: it is tried again meanwhile."""
    info = os.path.join(directory, "bookie.json")
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(BlockingIOError):
            return lock_file(os.path.join(directory, "HOLDER")), None
        with contextlib.suppress(FileNotFoundError, ValueError, TypeError, BookieUnavailable):
            with open(info, "rb") as f:
                bookie = HostedBookie.from_json(f.read())
            registered = split_registered(store.bookie_endpoint(bookie.bookie_id))[0]
            if _alive(bookie.pid) and registered == bookie.endpoint:
                return None, dataclasses.replace(bookie, started=False)
        if time.monotonic() > deadline:
            raise BookKeeperError(f"{directory} is held by another bookie holder, but no "
                                  f"serving bookie was named in {info} within "
                                  f"{timeout_s:.0f} s")
        time.sleep(WATCH_INTERVAL_S)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def _watch(store: MetadataStore, driver_path: str, bookie: HostedBookie,
           process: subprocess.Popen | None) -> None:
    """Hold until the lease ends; raise if the bookie this holder started exits."""
    while True:
        if process is not None and process.poll() is not None:
            output = _read_from(os.path.join(bookie.directory, "bookie.log"), 0)
            raise BookKeeperError(f"bookie {bookie.bookie_id} exited with status "
                                  f"{process.returncode}; its output ends:\n"
                                  f"{output[-LOG_TAIL_BYTES:]}")
        if process is None and not _alive(bookie.pid):
            return  # the bookie found running was stopped by its own holder
        try:
            if not store.exists(driver_path):
                return
        except MetadataUnavailable as e:  # the lifeline still covers the driver's death
            log.warning("cannot read the lease %s: %s", driver_path, e)
        time.sleep(WATCH_INTERVAL_S)


def _stop_bookie(process: subprocess.Popen, directory: str, grace_s: float) -> None:
    """SIGTERM (a graceful close: it unregisters), SIGKILL after ``grace_s``."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            log.warning("bookie pid %d ignored SIGTERM for %.0f s; killing it", process.pid,
                        grace_s)
            process.kill()
            process.wait()
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, "bookie.json"))
