"""Autorecovery in one process: stand for auditor, and audit while elected.

:class:`AutoRecovery` is what a bookie process runs when ``autoRecoveryDaemonEnabled``
is true (:class:`~pybk.cluster.node.BookieNode`), and all that ``pybk autorecovery`` (a
process of its own, BookKeeper's ``AutoRecoveryMain``) runs: an
:class:`~pybk.autorecovery.election.AuditorElection` and, while it is elected, an
:class:`~pybk.autorecovery.auditor.Auditor`.  The auditor reaches bookies through a
:class:`~pybk.net.directory.BookieDirectory` on a :class:`~pybk.net.client.
ClientLoop` made when it is elected and closed when it is deposed, so a process that
only stands costs one thread and a vote.

With ``replicationWorkerEnabled`` (the default) it also runs a
:class:`~pybk.autorecovery.worker.ReplicationWorker` for as long as it is open,
elected or not: every autorecovery process repairs what the auditor marks.  The worker
has a ledger client of its own (a :class:`~pybk.net.connect.ClusterBookKeeper` on
this process's store, reaching the local bookies in-process).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Mapping

from pybk.autorecovery.auditor import CLOSE_WAIT_S, Auditor
from pybk.autorecovery.election import AuditorElection
from pybk.autorecovery.worker import ReplicationWorker
from pybk.client.transport import BookieClient
from pybk.meta.interface import MetadataStore
from pybk.meta.underreplication import Backlog, UnderreplicationManager
from pybk.net import curve
from pybk.net.client import ClientLoop
from pybk.net.connect import ClusterBookKeeper
from pybk.net.directory import BookieDirectory
from pybk.settings import ClientSettings, ServerSettings, placement_settings_of

log = logging.getLogger(__name__)


class AutoRecovery:
    """Autorecovery of the cluster in ``store`` on behalf of ``candidate`` (this
    process's name in the election: a bookie's id).  ``local`` are clients of bookies
    this process hosts, reached without the network.  Starts at once; :meth:`close`
    stops it (not the store)."""

    def __init__(self, store: MetadataStore, settings: ServerSettings, candidate: str,
                 local: Mapping[str, BookieClient] | None = None) -> None:
        self.store = store
        self.settings = settings
        self.candidate = candidate
        self._local = dict(local or {})
        self.manager = UnderreplicationManager(store, owner=candidate)
        self._lock = threading.Lock()
        self._auditor: Auditor | None = None
        self._closed = False
        self._parts: list = []  # the auditor's directory and loop, to close after it
        #: The replication worker (None with replicationWorkerEnabled false).
        self.worker: ReplicationWorker | None = None
        self._worker_client: ClusterBookKeeper | None = None
        if settings.replicationWorkerEnabled:
            self._start_worker()
        self._election = AuditorElection(self.manager, candidate, self._elected,
                                         self._deposed)

    def _start_worker(self) -> None:
        loop = ClientLoop()
        client_settings = self._client_settings()
        directory = BookieDirectory(self.store, loop, client_settings, local=self._local)
        self._worker_client = ClusterBookKeeper(self.store, loop, directory, client_settings,
                                                own_store=False)
        self.worker = ReplicationWorker(self.store, self.manager, self.settings,
                                        self._worker_client).start()

    def _client_settings(self) -> ClientSettings:
        """How this process reaches other bookies: as a client, with CURVE and its own
        key pair when the bookies serve CURVE (they must allow its public key), placing
        replacements as the settings say."""
        return ClientSettings(maxEntrySizeBytes=self.settings.maxEntrySizeBytes,
                              **curve.client_settings_of(self.settings),
                              **placement_settings_of(self.settings))

    @property
    def is_auditor(self) -> bool:
        """Whether this process audits the cluster now."""
        return self._auditor is not None

    @property
    def backlog(self) -> Backlog | None:
        """The backlog this process last measured as auditor (None unless it audits
        now and has measured once), read without a metadata call."""
        auditor = self._auditor
        return auditor.last_backlog if auditor is not None else None

    def _elected(self) -> None:
        with self._lock:
            if self._closed:
                return
            loop = ClientLoop()
            directory = BookieDirectory(self.store, loop, self._client_settings(),
                                        local=self._local)
            self._parts = [directory, loop]
            self._auditor = Auditor(self.store, self.manager, self.settings, directory,
                                    self.candidate).start()

    def _deposed(self, wait_s: float = CLOSE_WAIT_S) -> None:
        with self._lock:
            auditor, self._auditor = self._auditor, None
            parts, self._parts = self._parts, []
        if auditor is not None:
            auditor.close(wait_s)
        for part in parts:
            part.close()

    def close(self) -> None:
        """Stop auditing (if elected) and repairing, and withdraw from the election, in at
        most :data:`~pybk.autorecovery.auditor.CLOSE_WAIT_S` while ZooKeeper is down (what
        still waits on it then ends when the store is closed)."""
        deadline = time.monotonic() + CLOSE_WAIT_S
        with self._lock:
            self._closed = True
            if self._auditor is not None:
                self._auditor.stop()  # the threads stop together, not one after the other
            if self.worker is not None:
                self.worker.stop()
        self._election.close(CLOSE_WAIT_S)
        self._deposed(max(0.0, deadline - time.monotonic()))
        if self.worker is not None:
            self.worker.close(max(0.0, deadline - time.monotonic()))
        if self._worker_client is not None:
            self._worker_client.close()

    def __enter__(self) -> "AutoRecovery":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
