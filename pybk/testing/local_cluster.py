"""``LocalCluster``: a throwaway cluster on loopback, for trying pybk out and for tests.

One ZooKeeper server (:class:`~pybk.testing.zookeeper_server.ZooKeeperServer`) and
``bookies`` bookie processes, each a ``python -m pybk bookie`` (:mod:`pybk.cluster.child`) on a
free loopback port with the default id (``127.0.0.1:<port>``).  Everything lives in one
directory (a fresh temporary one unless given)::

    zookeeper/            the ZooKeeper server's directory
    bookie<N>/journal/    bookie N's journal
    bookie<N>/ledgers/    bookie N's entry logs and index
    bookie<N>/bookie.log  bookie N's output
    client.conf           a client's settings: the address (and credentials, if secured)

Secured (``curve``, ``zk_auth``, or the security settings among ``settings``): every
bookie serves CURVE and/or the cluster is formatted with ZooKeeper digest ACLs; the
keys and the ZooKeeper credentials are made in the directory unless the settings name
them, and ``client.conf`` names those of a client (:mod:`pybk.testing.local_security`).

:meth:`LocalCluster.start` returns once every bookie is registered (or raises with the
log of the one that failed); :meth:`LocalCluster.stop` ends each bookie with SIGTERM (a
graceful close), SIGKILL after :data:`STOP_GRACE_S` (or at once), reaps it, stops
ZooKeeper and deletes a temporary directory.  Never a production deployment.

Each bookie, like ZooKeeper, runs in a session of its own, so that only this process
decides when and how they stop: a Ctrl-C in a terminal signals the terminal's foreground
process group, which would otherwise give every bookie a SIGINT besides the SIGTERM
this process sends (two signals, which a bookie takes as "stop at once").

If the process running the cluster dies without stopping it (SIGKILL, the OOM killer),
its children die too (:mod:`pybk.cluster.lifeline`): each bookie watches a lifeline pipe
(``pybk bookie --lifeline-fd``) whose write end only this process holds, and stops as on
SIGTERM when the pipe reads end-of-file, exiting at once if that takes over
:data:`~pybk.cli.cluster.ORPHAN_GRACE_S`; on Linux the kernel also sends each bookie
SIGTERM, and ZooKeeper SIGKILL, when this process dies (``PR_SET_PDEATHSIG``; only for
children started from the main thread, since the signal follows the thread that started
the child).  What is left then is the cluster's directory, which nobody deletes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import time
from typing import Sequence

from pybk.cluster import child
from pybk.cluster.lifeline import Lifeline, death_signal_preexec
from pybk.errors import BookKeeperError, InvalidConfiguration
from pybk.meta.zookeeper import ZooKeeperMetadataStore, ZooKeeperSettings, format_cluster
from pybk.settings import ServerSettings
from pybk.testing.local_security import credentials, write_client_conf
from pybk.testing.processes import TempDirectoryProcesses
from pybk.testing.zookeeper_server import ZooKeeperServer

log = logging.getLogger(__name__)

#: How long a bookie may take to close after SIGTERM before it is killed.
STOP_GRACE_S = 15.0
#: Pause between looks at the registry while bookies start.
_POLL_S = 0.05
_LOG_TAIL_BYTES = 4000


class LocalCluster(TempDirectoryProcesses):
    """A context manager: starts on enter, stops on exit (also if the start fails).
    ``bookie_args`` are passed to every ``pybk bookie`` (e.g. ``--conf`` and ``--set``
    options); ``settings`` are what they make of them, for the cluster's own ZooKeeper
    clients and its credentials.  ``curve`` and ``zk_auth`` secure the cluster (see the
    module docstring)."""

    def __init__(self, bookies: int = 3, directory: str | os.PathLike | None = None, *,
                 bookie_args: Sequence[str] = (), start_timeout_s: float = 60.0,
                 settings: ServerSettings | None = None, curve: bool = False,
                 zk_auth: bool = False) -> None:
        if bookies < 1:
            raise InvalidConfiguration(f"a cluster has at least one bookie, not {bookies}")
        super().__init__(directory, "pybk-cluster-")
        self.size = bookies
        self.bookie_args = tuple(bookie_args)
        self.settings = settings or ServerSettings()
        self._secure = (curve, zk_auth)
        #: The settings file of a client (its address and credentials), once started.
        self.client_conf = ""
        self.start_timeout_s = start_timeout_s
        self.zookeeper = ZooKeeperServer(os.path.join(self.directory, "zookeeper"),
                                         force_sync=False)
        self.processes: list[subprocess.Popen] = []
        self._lifeline: Lifeline | None = None
        #: Bookie id -> endpoint, once started.
        self.endpoints: dict[str, str] = {}

    @property
    def address(self) -> str:
        """The cluster's metadata address, ``zk://127.0.0.1:<port>/ledgers``."""
        return self.zookeeper.address()

    def start(self) -> "LocalCluster":
        secured = credentials(self.directory, self.settings, *self._secure)
        self.bookie_args += tuple(arg for key, value in secured.server.items()
                                  for arg in ("--set", f"{key}={value}"))
        self.settings = ServerSettings.from_mapping({**dataclasses.asdict(self.settings),
                                                     **secured.server})
        self.zookeeper.start()
        format_cluster(self.address, settings=self.zookeeper_settings)
        self.client_conf = write_client_conf(self.directory, self.address, secured.client)
        self._lifeline = Lifeline()
        for number in range(1, self.size + 1):
            self.processes.append(self._spawn(number))
        self.endpoints = self._wait_for_registrations()
        return self

    @property
    def zookeeper_settings(self) -> ZooKeeperSettings:
        """How this cluster's clients reach its ZooKeeper (credentials included)."""
        return ZooKeeperSettings.of(self.settings)

    def _spawn(self, number: int) -> subprocess.Popen:
        base = os.path.join(self.directory, f"bookie{number}")
        os.makedirs(base, exist_ok=True)
        assert self._lifeline is not None
        lifeline_fd = self._lifeline.child_fd
        command = child.command("--log-level", "INFO", "bookie",
                                "--zk", self.address, "--listen", "127.0.0.1:0", "--format",
                                "--journal-dir", os.path.join(base, "journal"),
                                "--ledger-dir", os.path.join(base, "ledgers"),
                                "--lifeline-fd", str(lifeline_fd), *self.bookie_args)
        with open(os.path.join(base, "bookie.log"), "ab") as out:
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=child.environment(),
                                    pass_fds=(lifeline_fd,), start_new_session=True,
                                    preexec_fn=death_signal_preexec(signal.SIGTERM))

    def _wait_for_registrations(self) -> dict[str, str]:
        deadline = time.monotonic() + self.start_timeout_s
        with ZooKeeperMetadataStore(self.address, self.zookeeper_settings) as store:
            while len(registered := store.bookies()) < self.size:
                for number, process in enumerate(self.processes, 1):
                    if process.poll() is not None:
                        raise BookKeeperError(f"bookie {number} exited with status "
                                              f"{process.returncode} while starting; its "
                                              f"log ends:\n{self.log_tail(number)}")
                if time.monotonic() > deadline:
                    raise BookKeeperError(f"{len(registered)} of {self.size} bookies "
                                          f"registered within {self.start_timeout_s:.0f} s")
                time.sleep(_POLL_S)
            return {bookie_id: store.bookie_endpoint(bookie_id) for bookie_id in registered}

    def log_tail(self, number: int) -> str:
        """The end of bookie ``number``'s output (1-based)."""
        path = os.path.join(self.directory, f"bookie{number}", "bookie.log")
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - _LOG_TAIL_BYTES))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every bookie (SIGTERM, then SIGKILL after ``grace_s``; at once if it is
        0), then ZooKeeper; remove a temporary directory.  Harmless when called twice."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
        deadline = time.monotonic() + grace_s
        for process in self.processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                if grace_s > 0:
                    log.warning("bookie pid %d ignored SIGTERM for %.0f s; killing it",
                                process.pid, grace_s)
                process.kill()
                process.wait()
        self.processes = []
        if self._lifeline is not None:
            self._lifeline.close()
            self._lifeline = None
        self.zookeeper.shutdown(graceful=grace_s > 0)
        self.zookeeper.stop()
        self._remove_directory()
