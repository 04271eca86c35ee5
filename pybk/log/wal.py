"""The embedded WAL: ``pybk.open(path)``, one log on a bookie inside this process.

A WAL directory holds everything it needs, so it can be copied, backed up or opened by
another process (one at a time; a lock file refuses a second opener; any number of
processes may read it meanwhile: :mod:`pybk.log.readonly`)::

    <path>/bookie/journal/    the bookie's journal (group commit, fdatasync)
    <path>/bookie/ledgers/    its entry logs and LMDB index
    <path>/metadata/          the embedded metadata store: ledger and log metadata

The WAL is the log ``"wal"`` with one bookie: E = Qw = Qa = 1.  Opening it fences and
recovers the previous writer's last segments (after a crash too) and starts a new one,
so every record whose append returned is readable after a restart, in position order.

Deferred sync (``pybk.open(path, deferredSync=True)``, for applications that sync in
their own rhythm): an append returns once its record is written to the journal, before
fdatasync; :meth:`WAL.sync` forces.  After kill -9 every appended record is still there
(the page cache survives the process); after a power cut or a kernel crash, every record
appended before the last :meth:`WAL.sync` that returned is, later ones may be missing
(never garbled: replay stops at a torn tail).  Readers see records up to the last sync.
The bookie's checkpoint (every ``flushInterval``) syncs the journal too, so unsynced
records are durable after at most about that long even without a sync.

Life cycle: after :meth:`WAL.close` every call raises LogClosed.  A WAL dropped without
``close()`` (``del wal``) is closed when it is garbage collected, with a ResourceWarning,
and so releases its directory.  One process opens a directory once at a time: a second
open names the WAL object still holding it.

Promotion to a cluster member, and demotion back: :mod:`pybk.log.promotion`.
:func:`open_storage` opens a WAL directory's ledgers without its log writer (for tools
and Spark jobs over a WAL whose application is not running).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import threading
import time
import warnings
import weakref
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, TypeVar

from pybk.client import BookKeeper
from pybk.client.transport import InProcessBookieClient
from pybk.errors import BookKeeperError, DirectoryLocked, InvalidConfiguration, LogClosed, NoSuchLog
from pybk.log import promotion, timeindex, walinfo
from pybk.log.position import Position
from pybk.log.reader import LogReader
from pybk.log.record import PositionedValue, Record
from pybk.log.writer import LogWriter, entry_bytes_needed
from pybk.meta.embedded import EmbeddedMetadataStore
from pybk.settings import (
    WAL_LOG_DEFAULTS,
    WAL_SERVER_DEFAULTS,
    ClientSettings,
    LogSettings,
    ServerSettings,
    sort_settings,
)
from pybk.storage import Bookie
from pybk.storage.cookie import format_directories

if TYPE_CHECKING:  # imported only when a WAL serves metrics or joins a cluster
    from prometheus_client import CollectorRegistry

    from pybk.cluster.node import BookieNode

log = logging.getLogger(__name__)

LOG_NAME = "wal"
_DERIVED = {"journalDirectory", "ledgerDirectories"}
_LOCK_POLL_S = 0.1
_Opened = TypeVar("_Opened")


def open(path: str | os.PathLike[str], cluster: str | None = None,  # noqa: A001
         ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2,
         metrics_registry: CollectorRegistry | None = None, **settings: Any) -> "WAL":
    """Open (creating it if new) the embedded WAL in directory ``path``.

    ``settings`` are any of :class:`~pybk.settings.ServerSettings` (the bookie),
    :class:`~pybk.settings.ClientSettings` and :class:`~pybk.settings.LogSettings`, by
    name; an unknown name or a bad value raises InvalidConfiguration.

    With ``cluster`` (``zk://host:port[,...]/ledgers``) the WAL is a cluster member: its
    bookie registers and serves peers (``listenAddress``), new segments are replicated
    on ``ensemble`` bookies with the given quorums, and what it wrote before stays
    readable where it is (:mod:`pybk.log.promotion`).  The WAL's own writes and reads
    reach its bookie in-process, as before; only the other bookies are reached over
    ZeroMQ.  The first such open promotes the directory, all or nothing: if it raises
    (NotEnoughBookies when the cluster has fewer than ``ensemble`` writable bookies with
    this one), the directory is still an embedded WAL.  Once promoted, it opens only
    with ``cluster``, until :func:`demote`.

    With ``metrics_registry`` (a prometheus_client registry) the WAL reports there its
    client's metrics (:mod:`pybk.client.metrics`) and its bookie's (:mod:`pybk.http.metrics`),
    until it is closed; one WAL per registry.
    """
    return WAL(path, cluster, ensemble, write_quorum, ack_quorum, metrics_registry,
               **settings)


def demote(path: str | os.PathLike[str], **settings: Any) -> promotion.Demotion:
    """Make the promoted WAL in ``path``, whose cluster is gone for good, an embedded
    WAL again; return what was kept (:class:`~pybk.log.promotion.Demotion`).

    It keeps every record written before the promotion that the cluster did not
    truncate; records written while the directory was a member are not in the demoted
    WAL (see :mod:`pybk.log.promotion`).  The cluster is not contacted.  ``settings``
    are the bookie's, as for :func:`open`.  Raises InvalidConfiguration if ``path``
    holds no WAL or one that is not promoted."""
    path = os.path.abspath(os.fspath(path))
    server, _client, _log = _split_settings(path, settings)
    if not os.path.isdir(os.path.join(path, "bookie")):
        raise InvalidConfiguration(f"{path} holds no pybk WAL: nothing to demote")
    _check_unclaimed(path)
    with Bookie(server) as bookie, \
            EmbeddedMetadataStore(os.path.join(path, "metadata")) as store:
        return promotion.demote(store, bookie.ledger_exists, LOG_NAME, path)


class WAL:
    """An embedded write-ahead log.  Thread-safe; close it (or use ``with``)."""

    def __init__(self, path: str | os.PathLike[str], cluster: str | None = None,
                 ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2,
                 metrics_registry: CollectorRegistry | None = None,
                 **settings: Any) -> None:
        self.path = os.path.abspath(os.fspath(path))
        server, client, log_settings = _split_settings(self.path, settings,
                                                       clustered=cluster is not None)
        if cluster is not None:
            log_settings = dataclasses.replace(
                log_settings, ensembleSize=ensemble, writeQuorumSize=write_quorum,
                ackQuorumSize=ack_quorum)
        _prepare_directory(self.path, server)
        self._node: BookieNode | None = None  # once joined to a cluster
        self._closed = False  # what every call checks (cheaper than the finalizer's alive)
        # Everything the WAL holds open, closed in reverse order by close() or when the
        # WAL is garbage collected (the finalizer must not refer to the WAL itself).
        resources = ExitStack()
        try:
            resources.callback(_claim(self.path, self))
            self.bookie = Bookie(server)
            resources.callback(self.bookie.close)
            self._store = EmbeddedMetadataStore(os.path.join(self.path, "metadata"))
            resources.callback(self._store.close)
            self.bookie_id = f"bookie-{self.bookie.instance_id}"
            if metrics_registry is not None:
                from pybk.http.metrics import BookieCollector  # prometheus_client, when wanted
                collector = BookieCollector(self.bookie)
                metrics_registry.register(collector)
                resources.callback(metrics_registry.unregister, collector)
            if cluster is None:
                self.log_name = LOG_NAME
                self._bk = _embedded_client(self.path, self._store, self.bookie, client,
                                            metrics_registry)
                resources.callback(self._bk.close)
                self._writer = LogWriter.open(self._bk, self.log_name, log_settings)
            else:
                self.log_name = f"wal-{self.bookie.instance_id}"
                self._bk, self._writer = self._clustered(cluster, server, client,
                                                         log_settings, resources,
                                                         metrics_registry)
            resources.callback(self._writer.close)
        except BaseException:
            resources.close()
            raise
        self._resources = resources
        self._finalizer = weakref.finalize(self, _close_dropped, self.path, resources)

    def _clustered(self, address: str, server: ServerSettings, client: ClientSettings,
                   log_settings: LogSettings, resources: ExitStack,
                   metrics_registry: CollectorRegistry | None
                   ) -> tuple[BookKeeper, LogWriter]:
        """Join the cluster, promoting the directory first if it is not yet a member
        (all or nothing: see :mod:`pybk.log.promotion`)."""
        from pybk.cluster.node import BookieNode
        from pybk.meta.zookeeper import ZooKeeperSettings
        from pybk.net.connect import connect  # the cluster layer, only when wanted
        # The WAL writes to its own bookie in-process; peers reach it through the node,
        # which registers on this client's session (with the server's ZooKeeper
        # credentials: zkEnableSecurity).
        bk = connect(address, client, zk_settings=ZooKeeperSettings.of(server),
                     local_bookies={self.bookie_id: self.bookie},
                     metrics_registry=metrics_registry)
        resources.callback(bk.close)
        promoting = promotion.promoted_to(self._store) != address
        with ExitStack() as undo:  # what a failed promotion takes back, in reverse order
            if promoting:
                promotion.check(self._store, bk.metadata, address, self.log_name,
                                log_settings.ensembleSize, self.bookie_id)
                undo.callback(promotion.copy(self._store, bk.metadata, address, LOG_NAME,
                                             self.log_name).undo)
            node = self._node = BookieNode(server.replace(bookieId=self.bookie_id,
                                                          metadataServiceUri=address),
                                           bookie=self.bookie, metadata=bk.metadata)
            undo.callback(node.close)
            writer = LogWriter.open(bk, self.log_name, log_settings)
            undo.callback(_abandon, bk, writer)
            if promoting:
                promotion.commit(self._store, address)
            undo.pop_all()
        resources.callback(node.close)
        return bk, writer

    # -- the log ------------------------------------------------------------------

    def append(self, data: bytes, *, key: bytes | None = None, timestamp: int | None = None,
               headers: Iterable[tuple[str, bytes]] | None = None) -> Position:
        """Append a record; return its position once it is durable (fdatasync'd), or,
        with the setting ``deferredSync=True``, once it is written to the journal (it
        survives this process dying, and a power cut only after a later :meth:`sync`).

        The record's value is ``data``; ``key`` (bytes, None for none), ``timestamp``
        (milliseconds since the epoch; None: the wall-clock time of this call) and
        ``headers`` (``(str, bytes)`` pairs) are kept with it and read back by
        :meth:`records` (their limits: :mod:`pybk.log.batch`).

        A callback of an append's future may call it (it runs on pybk's callback thread,
        which no append waits for)."""
        self._check_open()
        if self.bookie.is_completing_thread():
            raise BookKeeperError("a blocking append from an append's callback would wait "
                                  "for itself; use append_async")
        with self.bookie.leading():  # a lone append is synced on this thread
            future = self._writer.append_async(data, key=key, timestamp=timestamp,
                                               headers=headers)
        return future.result()

    def append_async(self, data: bytes, *, key: bytes | None = None,
                     timestamp: int | None = None,
                     headers: Iterable[tuple[str, bytes]] | None = None) -> Future:
        """Append a record (its fields as :meth:`append` takes them); the future gives
        its position once it is durable (written, with ``deferredSync``: see
        :meth:`append`).  Many
        appends in flight share fsyncs and entries.  The future's done-callbacks run on
        pybk's callback thread, in position order, never on the bookie's journal thread
        (:mod:`pybk.log.futures`)."""
        if self._closed:
            self._check_open()
        return self._writer.append_async(data, key=key, timestamp=timestamp,
                                         headers=headers)

    def read(self, start: Position | str | None = None) -> Iterator[PositionedValue]:
        """``(position, data)`` of every record from ``start`` (the first record when
        None; a Position or its text ``"segment:entry:slot"``) to the last one
        acknowledged, in order.  A start past the end of the WAL raises ValueError (see
        :mod:`pybk.log.reader`)."""
        return self.reader(start).read()

    def records(self, start: Position | str | None = None) -> Iterator[Record]:
        """What :meth:`read` gives, as :class:`~pybk.log.record.Record` values: with
        each record's key, timestamp and headers."""
        return self.reader(start).records()

    def reader(self, start: Position | str | None = None) -> LogReader:
        """A reader from ``start`` that can also tail the WAL (see LogReader)."""
        self._check_open()
        return LogReader(self._bk, self.log_name, start, writer=self._writer)

    def position_at(self, timestamp: int) -> Position:
        """The position of the first record whose timestamp is at least ``timestamp``
        (milliseconds since the epoch), or where the next record will go if none is:
        give it to :meth:`records` or :meth:`reader` to read from a time.  A bounded
        number of reads whatever the WAL's length, exact whatever the order of the
        records' timestamps (:mod:`pybk.log.timeindex`)."""
        self._check_open()
        return timeindex.position_at(self._bk, self.log_name, timestamp, writer=self._writer)

    def truncate(self, before: Position | str) -> None:
        """Drop the records before ``before`` (a Position or its text).  Whole segments
        before it are deleted and their space is reclaimed by the bookie's garbage
        collection."""
        self._check_open()
        self._writer.truncate(before)

    def sync(self) -> None:
        """Return once every record appended so far is durable.  With
        ``deferredSync=True`` this is what makes appends durable (one fdatasync for all
        of them), and what readers wait for: they see records up to the last sync."""
        self._check_open()
        self._writer.sync()

    # -- what it holds ------------------------------------------------------------

    @property
    def first_position(self) -> Position | None:
        """The position of the first record (the oldest one truncation left), or None
        if the WAL holds none."""
        self._check_open()
        return walinfo.first_position(self._bk, self.log_name, self._writer)

    @property
    def last_position(self) -> Position | None:
        """The position of the last record acknowledged, or None if the WAL holds
        none."""
        self._check_open()
        return walinfo.last_position(self._bk, self.log_name, self._writer)

    @property
    def space_used(self) -> int:
        """Bytes the WAL's directory takes on disk (:func:`walinfo.space_used_bytes`)."""
        return walinfo.space_used_bytes(self.path)

    def stats(self) -> walinfo.WALStats:
        """The WAL's figures since it was opened (:class:`walinfo.WALStats`)."""
        journal = self.bookie.journal_stats
        appends, appended_bytes = self._writer.append_counts()
        return walinfo.WALStats(self.first_position, self.last_position, self.space_used,
                                appends=appends, appended_bytes=appended_bytes,
                                syncs=journal.sync.count,
                                journal_bytes_written=journal.bytes_written)

    # -- life cycle ---------------------------------------------------------------

    def close(self) -> None:
        """Finish in-flight appends and release everything (the directory's lock too).
        Closing again does nothing."""
        self._closed = True
        if self._finalizer.detach() is not None:
            self._resources.close()

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed(f"the WAL at {self.path} is closed: open it again "
                            "(pybk.open) to go on")

    def __enter__(self) -> "WAL":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def open_storage(path: str | os.PathLike[str], create: bool = False,
                 lock_timeout: float = 0.0, **settings: Any) -> Iterator[BookKeeper]:
    """The ledger client of the WAL directory ``path``, without a log writer: its bookie
    and metadata store opened in this process (the journal replayed), closed on exit.

    Readers of the WAL's log (:class:`LogReader`) and tools that add ledgers to it use
    it; nothing fences or recovers the WAL's log.  The directory is held for the whole
    block: another process opening it meanwhile is refused, and this one waits up to
    ``lock_timeout`` seconds for one that holds it, then raises DirectoryLocked naming
    the lock.  A missing directory is created (as by :func:`open`) only if ``create``;
    otherwise it raises NoSuchLog.  ``settings``: as :func:`open` takes them."""
    path = os.path.abspath(os.fspath(path))
    if not create and not os.path.isdir(os.path.join(path, "bookie")):
        raise NoSuchLog(f"{path} holds no pybk WAL")
    server, client, _ = _split_settings(path, settings)
    _prepare_directory(path, server)
    _check_unclaimed(path)
    with ExitStack() as resources:
        bookie = resources.enter_context(_wait_for_lock(path, lock_timeout,
                                                        lambda: Bookie(server)))
        store = resources.enter_context(_wait_for_lock(
            path, lock_timeout,
            lambda: EmbeddedMetadataStore(os.path.join(path, "metadata"))))
        bk = resources.enter_context(_embedded_client(path, store, bookie, client))
        yield bk


def _wait_for_lock(path: str, timeout: float, opener: Callable[[], _Opened]) -> _Opened:
    """``opener()``, tried again while the directory is locked, for up to ``timeout``
    seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return opener()
        except DirectoryLocked as e:
            if time.monotonic() >= deadline:
                raise DirectoryLocked(
                    f"the WAL directory {path} is open in another process ({e}); a WAL "
                    "directory is used by one process at a time: close the application "
                    "that has it open, or reach its log through the cluster it is a "
                    "member of") from None
        time.sleep(_LOCK_POLL_S)


def _embedded_client(path: str, store: EmbeddedMetadataStore, bookie: Bookie,
                     client: ClientSettings,
                     metrics_registry: CollectorRegistry | None = None) -> BookKeeper:
    """The ledger client of an embedded (not promoted) WAL directory over its own
    bookie, in-process."""
    _check_embedded(path, store)
    bookie_id = f"bookie-{bookie.instance_id}"
    return BookKeeper(store, {bookie_id: InProcessBookieClient(bookie_id, bookie)}, client,
                      local_bookie=bookie_id, metrics_registry=metrics_registry)


def _check_embedded(path: str, store: EmbeddedMetadataStore) -> None:
    """Refuse a WAL directory promoted to a cluster, saying what to do."""
    cluster = promotion.promoted_to(store)
    if cluster is not None:
        raise InvalidConfiguration(
            f"{path} was promoted to the cluster {cluster}: open it with "
            f"cluster=; if that cluster is gone for good, `pybk demote {path}` "
            "(pybk.demote) makes it an embedded WAL again")
    unfinished = promotion.promoting_to(store)
    if unfinished is not None:
        log.info("%s: a promotion to %s did not finish; the directory is still an "
                 "embedded WAL", path, unfinished)


def _abandon(bk: BookKeeper, writer: LogWriter) -> None:
    """Close the log writer a failed promotion opened and delete the ledger it made."""
    try:
        writer.close()
        bk.delete_ledger(writer.metadata.tail[-1].ledger_id)
    except BookKeeperError as e:  # an orphan ledger in the cluster harms nothing
        log.warning("a failed promotion could not delete its new ledger: %s", e)


# -- one open WAL per directory and process ------------------------------------------

_claims: dict[str, weakref.ref] = {}  # real path -> the WAL that has it open
_claims_lock = threading.Lock()


def _check_unclaimed(path: str) -> None:
    """Refuse a directory that a WAL of this process has open, saying what to do.

    A WAL dropped without close() but caught in a reference cycle is only freed by the
    cycle collector: run it once before refusing."""
    key = os.path.realpath(path)
    for attempt in range(2):
        with _claims_lock:
            holder = _claims.get(key)
            wal = holder() if holder is not None else None
        if wal is None:
            return
        del wal
        if attempt == 0:
            gc.collect()
    raise DirectoryLocked(
        f"{path} is locked: a WAL object of this process still has it open.  Close it "
        "first (wal.close(), or open it with `with pybk.open(...) as wal`); one dropped "
        "without close() is released when it is garbage collected, so look for other "
        "references to it (in a notebook: Out[], _ and variables of earlier cells)")


def _open_here(path: str) -> bool:
    """Whether a WAL of this process has ``path`` open."""
    with _claims_lock:
        holder = _claims.get(os.path.realpath(path))
        return holder is not None and holder() is not None


def _claim(path: str, wal: WAL) -> Callable[[], None]:
    """Register ``wal`` as this process's one opener of ``path``; return the release."""
    _check_unclaimed(path)
    key = os.path.realpath(path)
    holder = weakref.ref(wal)
    with _claims_lock:
        _claims[key] = holder

    def release() -> None:
        with _claims_lock:
            if _claims.get(key) is holder:
                del _claims[key]

    return release


def _close_dropped(path: str, resources: ExitStack) -> None:
    """Close a WAL that was garbage collected (or left at exit) without close()."""
    warnings.warn(f"the WAL at {path} was not closed: closing it now that it is garbage "
                  "(use `with pybk.open(...) as wal:` or call wal.close())",
                  ResourceWarning, stacklevel=2)
    if threading.current_thread().name.startswith("pybk-"):
        # Dropped on one of pybk's own threads (in a completion callback): closing
        # waits for those threads, so it must happen on another.
        threading.Thread(target=_close_logging, args=(path, resources),
                         name="pybk-wal-close").start()
    else:
        _close_logging(path, resources)


def _close_logging(path: str, resources: ExitStack) -> None:
    try:
        resources.close()
    except Exception:  # nobody to raise it to: the WAL is gone
        log.exception("closing the dropped WAL at %s failed", path)


def _split_settings(path: str, values: dict[str, Any], clustered: bool = False
                    ) -> tuple[ServerSettings, ClientSettings, LogSettings]:
    """Sort ``values`` by the settings class they belong to, and build the three, from
    the WAL's defaults (:data:`~pybk.settings.WAL_SERVER_DEFAULTS`, 1/1/1 quorums)."""
    for name in values:
        if name in _DERIVED:
            raise InvalidConfiguration(f"setting {name}: a WAL keeps its directories under "
                                       f"its path ({path}); it cannot be set")
    server_values, client_values, log_values = sort_settings(
        values, (ServerSettings, ClientSettings, LogSettings))
    log_settings = LogSettings.from_mapping(log_values, defaults=WAL_LOG_DEFAULTS)
    largest_entry = entry_bytes_needed(log_settings)
    if "maxEntrySizeBytes" not in values and largest_entry > ServerSettings.maxEntrySizeBytes:
        # Larger records need larger entries, in the client and the bookie alike.
        server_values["maxEntrySizeBytes"] = client_values["maxEntrySizeBytes"] = largest_entry
    server = ServerSettings.from_mapping({
        "journalDirectory": os.path.join(path, "bookie", "journal"),
        "ledgerDirectories": (os.path.join(path, "bookie", "ledgers"),),
        **server_values}, defaults=WAL_SERVER_DEFAULTS)
    client = ClientSettings.from_mapping(client_values)
    if not clustered and (log_settings.ensembleSize, log_settings.writeQuorumSize,
                          log_settings.ackQuorumSize) != (1, 1, 1):
        raise InvalidConfiguration("an embedded WAL has one bookie: ensembleSize, "
                                   "writeQuorumSize and ackQuorumSize must be 1 (a "
                                   "cluster member takes ensemble=, write_quorum=, "
                                   "ack_quorum=)")
    if largest_entry > server.maxEntrySizeBytes:
        raise InvalidConfiguration(
            f"setting maxEntrySizeBytes={server.maxEntrySizeBytes} is too small: batches "
            f"(batchMaxBytes={log_settings.batchMaxBytes}) and records "
            f"(recordMaxBytes={log_settings.recordMaxBytes}) need entries of up to "
            f"{largest_entry} bytes; leave maxEntrySizeBytes out to have it follow them")
    return server, client, log_settings


def _prepare_directory(path: str, server: ServerSettings) -> None:
    """Create and format a new WAL directory; refuse one that holds something else."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise InvalidConfiguration(f"{path} is not a directory")
    if os.path.isdir(os.path.join(path, "bookie")):
        return
    if os.path.isdir(path) and os.listdir(path):
        raise InvalidConfiguration(f"{path} is not empty and holds no pybk WAL: refusing to "
                                   "create one among other files")
    os.makedirs(path, exist_ok=True)
    # Cookies not bound to paths: the directory may be copied, moved, reached by a symlink.
    format_directories(server, bind_paths=False)
    log.info("created a new WAL in %s", path)
