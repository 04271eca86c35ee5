"""``BookieNode``: a bookie serving a cluster.

A node is a :class:`~pybk.storage.Bookie` (its own, or one passed in: an embedded WAL's
bookie can be promoted without copying data), a :class:`~pybk.cluster.BookieServer` on
the ``listenAddress``, and a session on the cluster's metadata store
(``metadataServiceUri``) in which the bookie is registered under its id, with its
endpoint ``tcp://<advertised host>:<port>`` (and its CURVE public key with
``zmqCurveEnabled``: :mod:`pybk.net.curve`) as the registration's data, and on its host
(``bookieHost``, by default the advertised host), where placement finds the bookies of a
writer's host, and with its network location (``bookieNetworkLocation``, or what
``networkTopologyScriptFileName`` maps its address to: :mod:`pybk.topology`), which
rack-aware placement spreads write sets by.

Bookie id
    The id belongs to the disks, as in BookKeeper: ledgers name it for the entries the
    disks hold.  At the bookie's first start in a cluster the id is ``bookieId``, or by
    default ``<advertised host>:<port>`` (BookKeeper's default); once the cluster
    accepted the bookie's cookie under it, it is recorded in the directories' cookies
    (:func:`pybk.storage.cookie.record_bookie_id`).  Later starts use the recorded id,
    whatever port they listen on (clients find the endpoint in the registration), and
    refuse a ``bookieId`` naming another with InvalidCookie naming the recorded id.

Cookies
    Before it registers, the node checks the bookie's cookie against the cluster's copy
    at ``/ledgers/cookies/<bookie id>`` (:mod:`pybk.cluster.cookies`): the first start of an
    id writes it (create-if-absent), later starts must find the same instance id and
    directories.  Another cookie under the id (wiped and re-formatted disks, another
    bookie's disks, other directories) stops the start with InvalidCookie naming the id
    and what differs, since serving would deny entries the cluster counts on.

Registration
    At start the bookie is registered as available, or as read-only if its disks are
    full.  When its disks fill or drain (the bookie's disk checks), it is registered
    again on the other list.  :meth:`BookieNode.close` unregisters it first (so that no
    new ensemble picks it), then closes the server (which finishes the requests in
    progress), the bookie and the session.  While the connection to ZooKeeper is down
    it does not try to unregister: that would hold the close up for
    ``zkOperationTimeoutMs``, and the registration ends with the session anyway (no
    ensemble can be formed without ZooKeeper meanwhile).

Sessions
    The registration lives as long as the ZooKeeper session
    (:mod:`pybk.meta.zookeeper`).  A bookie that is not registered refuses adds (with
    BookieReadOnly; reads, fences and recovery go on): it is invisible to placement, and
    once its session is gone another process may register under its id.

    * ``SUSPENDED`` (the connection dropped): ZooKeeper keeps the session for
      ``zkTimeout`` after it last heard from the node, and a restarted ZooKeeper
      restores it, so the registration may well stand: the bookie keeps taking adds.
      Refusing them at once would stop every bookie whenever ZooKeeper restarts or
      elects a leader, and writers could not even route around them (an ensemble
      change needs ZooKeeper).  If the connection is not back within ``zkTimeout``, the
      session has expired unless ZooKeeper itself is down, and the bookie refuses adds
      from then on (Curator's rule for a long suspension).
    * ``EXPIRED``: the registration is gone; the bookie refuses adds at once, or, with
      ``shutdownOnSessionExpiry``, the node shuts down.
    * ``CONNECTED``: the store has registered the bookie again (in the same or a new
      session); adds are taken again.

Stale writers
    Before it serves, the node takes a ledger id from the cluster's generator and guards
    its bookie's unknown ledgers with it (:meth:`pybk.storage.Bookie.guard_unknown_ledgers`,
    :mod:`pybk.cluster.admission`): a plain add to a ledger the bookie does not know,
    created before that id (or one the bookie forgot), is taken
    only once the ledger's metadata says it is open with this bookie in its last
    ensemble.  So a writer whose ledger was recovered, closed or deleted meanwhile is
    refused (LedgerFenced) by a bookie that forgot the ledger or was wiped, instead of
    being told its add is durable.  The guard goes with the node's close.  At its first
    start with fresh directories the node records that id as the bookie's join floor
    (:meth:`pybk.storage.Bookie.record_join_floor`): a read of an entry it does not hold
    of an older ledger answers EntryMaybeLost, which recovery does not count as the
    entry being absent (the disks the id had before may have held it).  The floor is
    kept for good once the node registered; a start that failed before has it raised
    at the next (:meth:`pybk.storage.Bookie.confirm_join_floor`).

Autorecovery
    With ``autoRecoveryDaemonEnabled`` (the default) the node stands in the auditor
    election under its bookie id, audits the cluster while elected, and runs a
    replication worker (:mod:`pybk.autorecovery.service`); both reach its own bookie
    in-process.  Closing the node stops that first.

Metrics
    :attr:`BookieNode.metrics_registry` holds the bookie's, its server's and
    autorecovery's metrics (:mod:`pybk.http.metrics`); with ``prometheusStatsHttpPort`` set
    they are served at ``http://<prometheusStatsHttpAddress>:<port>/metrics`` until the
    node closes, and at ``/metrics`` of the HTTP admin server when that runs.

HTTP admin API
    With ``httpServerEnabled`` the node serves BookKeeper's admin endpoints and a status
    page about itself and its cluster (:mod:`pybk.http.endpoints`), stopped
    first on close.  :meth:`BookieNode.set_read_only_by_admin` is its ``state/readonly``.

Threads: none of its own besides the server's, the bookie's, autorecovery's, the
metrics endpoint's and the admin server's;
registrations run on the thread that saw the change (the bookie's housekeeping thread for
disks, the store's session thread after a reconnection), one at a time; a timer
thread runs while the connection is down, and :meth:`BookieNode.close` unregisters on a
thread of its own so that a stalled ZooKeeper cannot hold the close up.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Any, Callable, TypeVar

import zmq

from pybk.autorecovery.service import AutoRecovery
from pybk.client.transport import InProcessBookieClient
from pybk.cluster.admission import LedgerAdmission
from pybk.cluster.cookies import check_cluster_cookie, cluster_cookie
from pybk.errors import BookKeeperError, InvalidConfiguration
from pybk.http.endpoints import admin_routes
from pybk.http.metrics import MetricsServer, bookie_registry, render
from pybk.http.server import AdminHttpServer, Request, Response
from pybk.meta.address import open_metadata_store
from pybk.meta.interface import MetadataStore, SessionState
from pybk.meta.zookeeper import ZooKeeperSettings
from pybk.net import curve
from pybk.net.server import BookieServer
from pybk.settings import ServerSettings, split_host_port
from pybk.storage import Bookie
from pybk.storage.cookie import directory_cookie, record_bookie_id, resolve_bookie_id
from pybk.topology import run_mapping_script

log = logging.getLogger(__name__)

# Something the node may open itself, and then closes: a context manager.
T = TypeVar("T", bound=contextlib.AbstractContextManager[Any])

_ANY_HOST = ("0.0.0.0", "*")
#: Seconds a closing node waits for ZooKeeper to take its unregistration.  The
#: registration is ephemeral and ends with the session that closing ends next, so a
#: stalled ZooKeeper (one the session has not yet noticed is gone) must not hold the stop
#: up for the store's whole operation timeout.
UNREGISTER_WAIT_S = 2.0


class BookieNode:
    """Serves a bookie to the cluster named by ``settings.metadataServiceUri`` (or by the
    store ``metadata``, which the node then does not close).  ``bookie`` is one to serve
    (not closed with the node); by default the node opens ``settings``' own.  Starts at
    once; use as a context manager or call :meth:`close`.

    Raises MetadataUnavailable if ZooKeeper does not answer within ``zkTimeout``,
    MetadataError if the cluster is not formatted or the id is held by another live
    bookie, InvalidCookie for unformatted or foreign directories, directories that do
    not match the id's cookie in the cluster or that recorded another id than
    ``bookieId``, BookKeeperError if the listen address cannot be bound."""

    def __init__(self, settings: ServerSettings, *, bookie: Bookie | None = None,
                 metadata: MetadataStore | None = None) -> None:
        self.settings = settings
        self._lock = threading.RLock()  # registrations and the session gate, in order
        self._closing = False
        self._closed = threading.Event()
        self._registered_read_only: bool | None = None  # None: not registered
        self._session_lost = False     # EXPIRED, or SUSPENDED for zkTimeout
        self._connected = True
        self._grace: threading.Timer | None = None
        #: Why the node shut itself down (None: it did not, or not yet).
        self.shutdown_reason: str | None = None
        self._admin_read_only = False  # set_read_only_by_admin
        #: The HTTP admin server (None unless httpServerEnabled).
        self.http: AdminHttpServer | None = None
        with contextlib.ExitStack() as opened:
            self.metadata, self._owned_store = _given_or_opened(
                opened, metadata, lambda: _open_store(settings))
            self.bookie, self._owned_bookie = _given_or_opened(
                opened, bookie, lambda: Bookie(settings))
            metadata, bookie = self.metadata, self.bookie
            # Guarded before it serves: a stale writer may reach a bookie started again at
            # its address as soon as it listens.  Every ledger created before this id was
            # taken is one the bookie may have held or been meant to hold.
            self._admission = LedgerAdmission(metadata)
            opened.callback(self._admission.close)
            floor = metadata.next_ledger_id()
            # Fresh disks record where they joined (kept for good): below it, a read of
            # an entry they do not hold may be of one the disks before them had.
            bookie.record_join_floor(floor)
            bookie.guard_unknown_ledgers(self._admission, floor)
            opened.callback(bookie.guard_unknown_ledgers, None)
            self.server = opened.enter_context(_serve(bookie, settings.listenAddress))
            host = _advertised_host(settings)
            port = int(self.server.address.rpartition(":")[2])
            #: Where clients reach the bookie, as registered.
            self.endpoint = f"tcp://{host}:{port}"
            #: The host the bookie is registered on (placement's locality).
            self.host = settings.bookieHost or host
            #: The network location the bookie is registered with ("" if none: the
            #: default rack to readers).
            self.location = _network_location(settings, f"{host}:{port}")
            local = directory_cookie(bookie.settings)
            #: The bookie's id in the cluster.
            self.bookie_id = resolve_bookie_id(settings, local.bookie_id, f"{host}:{port}")
            self._admission.bookie_id = self.bookie_id
            if settings.httpServerEnabled:  # before the cluster records the bookie
                self.http = opened.enter_context(AdminHttpServer(settings, admin_routes(self)))
            check_cluster_cookie(metadata, cluster_cookie(self.bookie_id, local))
            record_bookie_id(bookie.settings, self.bookie_id)
            bookie.add_state_listener(self._on_bookie_state)
            opened.callback(bookie.remove_state_listener, self._on_bookie_state)
            metadata.add_session_listener(self._on_session)
            opened.callback(metadata.remove_session_listener, self._on_session)
            #: The process's part in autorecovery (None with autoRecoveryDaemonEnabled
            #: false): it stands for auditor and repairs (:mod:`pybk.autorecovery.service`).
            #: Started before the bookie registers, so that a registered bookie's process
            #: is wholly started (``pybk localcluster`` waits for the registrations).
            self.autorecovery: AutoRecovery | None = None
            if settings.autoRecoveryDaemonEnabled:
                in_process = {self.bookie_id: InProcessBookieClient(self.bookie_id, bookie)}
                self.autorecovery = opened.enter_context(
                    AutoRecovery(metadata, settings, self.bookie_id, in_process))
            #: The bookie's metrics (:mod:`pybk.http.metrics`), served on
            #: ``prometheusStatsHttpPort`` if set (:attr:`metrics_server`).
            self.metrics_registry = bookie_registry(bookie, self.server, self.autorecovery)
            self.metrics_server: MetricsServer | None = None
            if settings.prometheusStatsHttpPort:
                self.metrics_server = opened.enter_context(MetricsServer(
                    self.metrics_registry, settings.prometheusStatsHttpAddress,
                    settings.prometheusStatsHttpPort))
            if self.http is not None:  # on the admin port too, as BookKeeper serves them
                self.http.routes.add("/metrics", "GET", self._metrics_page)
            self._register()
            # Joined: the join floor stays (a start that failed before this point has
            # it raised at the next, as the id's former disks may have served on).
            bookie.confirm_join_floor()
            opened.pop_all()
        log.info("bookie %s serving at %s, registered in %s%s%s", self.bookie_id,
                 self.endpoint, metadata, " (read-only)" if self._registered_read_only else "",
                 f" at {self.location}" if self.location else "")

    def _metrics_page(self, _request: Request) -> Response:
        """``GET /metrics`` of the admin server: :attr:`metrics_registry`'s page."""
        body, content_type = render(self.metrics_registry)
        return Response.text(body.decode(), content_type=content_type)

    def __enter__(self) -> "BookieNode":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- registration -----------------------------------------------------------------

    def _register(self) -> None:
        """Register the bookie as its disks say, if that is not what is registered."""
        with self._lock:
            read_only = self.bookie.disks_full or self._admin_read_only
            if self._closing or read_only == self._registered_read_only:
                return
            self.metadata.register_bookie(
                self.bookie_id, read_only,
                curve.registered_endpoint(self.endpoint, self.server.public_key), self.host,
                self.location)
            self._registered_read_only = read_only
            log.info("bookie %s registered as %s", self.bookie_id,
                     "read-only" if read_only else "available")

    def _on_bookie_state(self) -> None:
        """The bookie's disks filled or drained, or the bookie closed (by itself, if the
        node is not closing: a full disk without readOnlyModeEnabled)."""
        if self._closing:
            return
        if self.bookie.is_closed:
            self._shut_down("the bookie shut down")
            return
        if not self._connected:
            return  # registered as the disks say once connected again
        try:
            self._register()
        except BookKeeperError as e:  # the next change or reconnection tries again
            log.error("bookie %s: could not register again after a disk state change: %s",
                      self.bookie_id, e)

    def set_read_only_by_admin(self, read_only: bool) -> None:
        """An operator's switch (BookKeeper's ``state/readonly``): refuse adds and
        register as read-only, or undo that (the disks and the session still decide
        too)."""
        with self._lock:
            self._admin_read_only = read_only
            if read_only:
                self.bookie.set_read_only("set read-only by an operator")
            elif not self._session_lost:
                self.bookie.set_writable()
        self._on_bookie_state()  # registers as the new state says

    # -- the session ------------------------------------------------------------------

    def _on_session(self, state: SessionState) -> None:
        """On the store's session thread: see the module docstring."""
        with self._lock:
            if self._closing:
                return
            self._connected = state is SessionState.CONNECTED
            if state is SessionState.SUSPENDED:
                if self._grace is None and not self._session_lost:
                    self._grace = threading.Timer(self.settings.zkTimeout / 1000,
                                                  self._grace_over)
                    self._grace.name = "pybk-node-session-grace"
                    self._grace.daemon = True
                    self._grace.start()
                return
            self._cancel_grace()
            if state is SessionState.EXPIRED:
                self._lose_session("its ZooKeeper session expired")
                shut_down = self.settings.shutdownOnSessionExpiry
            else:
                shut_down = False
                try:
                    self._register()  # the disks may have changed while disconnected
                except BookKeeperError as e:
                    log.error("bookie %s: registering after a reconnection failed: %s",
                              self.bookie_id, e)
                if self._session_lost:
                    self._session_lost = False
                    if not self._admin_read_only:
                        self.bookie.set_writable()
                    log.warning("bookie %s registered again: taking adds again",
                                self.bookie_id)
        if shut_down:
            self._shut_down("its ZooKeeper session expired (shutdownOnSessionExpiry)")

    def _grace_over(self) -> None:
        with self._lock:
            if self._grace is None or self._closing:
                return  # reconnected (or closing) meanwhile
            self._grace = None
            self._lose_session(f"no connection to ZooKeeper for zkTimeout="
                               f"{self.settings.zkTimeout} ms: its session has expired")

    def _lose_session(self, why: str) -> None:
        """Refuse adds until registered again.  Caller holds the lock."""
        if not self._session_lost:
            self._session_lost = True
            log.warning("bookie %s refuses adds: %s, so it is not registered", self.bookie_id,
                        why)
            self.bookie.set_read_only(f"not registered in the cluster: {why}")

    def _cancel_grace(self) -> threading.Timer | None:
        """Caller holds the lock; returns the cancelled timer (to join outside it)."""
        timer, self._grace = self._grace, None
        if timer is not None:
            timer.cancel()
        return timer

    # -- life cycle ---------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self._closed.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the node is closed (by :meth:`close`, or by itself: see
        :attr:`shutdown_reason`); False if ``timeout`` seconds passed first."""
        return self._closed.wait(timeout)

    def _shut_down(self, reason: str) -> None:
        log.error("bookie %s shutting down: %s", self.bookie_id, reason)
        self.shutdown_reason = reason
        self.close()

    def close(self) -> None:
        """Unregister, close the server (finishing the requests in progress), then the
        bookie and the metadata session if the node opened them.  Closing twice is
        harmless."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            timer = self._cancel_grace()
            # Disconnected: unregistering would wait for ZooKeeper (module docstring).
            registered = (self._registered_read_only is not None and not self._session_lost
                          and self._connected)
        if timer is not None and timer is not threading.current_thread():
            timer.join()
        self.metadata.remove_session_listener(self._on_session)
        self.bookie.remove_state_listener(self._on_bookie_state)
        with contextlib.ExitStack() as closing:  # closes every part even if one fails
            if self._owned_store:
                closing.callback(self.metadata.close)
            if self._owned_bookie:
                closing.callback(self.bookie.close)
            # After the server (whose adds in progress may wait for a check): the checks
            # left are refused, and a bookie the node was given is no longer guarded.
            closing.callback(self._admission.close)
            closing.callback(self.bookie.guard_unknown_ledgers, None)
            closing.callback(self.server.close)
            if self.http is not None:  # before the server, bookie and store it uses
                closing.callback(self.http.close)
            if registered:
                closing.callback(self._unregister)
            if self.autorecovery is not None:  # first: it reads the store and the bookie
                closing.callback(self.autorecovery.close)
            if self.metrics_server is not None:
                closing.callback(self.metrics_server.close)
        self._closed.set()
        log.info("bookie node %s closed", self.bookie_id)

    def _unregister(self) -> None:
        def unregister() -> None:
            try:
                self.metadata.unregister_bookie(self.bookie_id, self.host)
            except BookKeeperError as e:  # it ends with the session anyway
                log.warning("bookie %s: could not unregister: %s", self.bookie_id, e)

        # On a thread of its own, so that the wait is bounded; closing the session next
        # ends the call (and the registration) if ZooKeeper is stalled.
        worker = threading.Thread(target=unregister, name="pybk-unregister", daemon=True)
        worker.start()
        worker.join(UNREGISTER_WAIT_S)
        if worker.is_alive():
            log.warning("bookie %s: ZooKeeper did not take the unregistration within %.0f s; "
                        "the registration ends with the session", self.bookie_id,
                        UNREGISTER_WAIT_S)

    def __repr__(self) -> str:
        return f"BookieNode({self.bookie_id!r}, {self.endpoint!r})"


def _given_or_opened(opened: contextlib.ExitStack, given: T | None,
                     open_one: Callable[[], T]) -> tuple[T, bool]:
    """``given``, or one ``open_one`` makes (closed by ``opened`` if the start fails);
    and whether it was opened here (the node then closes it)."""
    if given is not None:
        return given, False
    return opened.enter_context(open_one()), True


def _open_store(settings: ServerSettings) -> MetadataStore:
    if not settings.metadataServiceUri:
        raise InvalidConfiguration("setting metadataServiceUri is empty: a bookie node "
                                   "needs the cluster's address, zk://host:port/ledgers")
    # A bookie changes no log: a cluster of pybk's former layout is left as it is
    return open_metadata_store(settings.metadataServiceUri,
                               ZooKeeperSettings.of(settings), move_logs=False)


def _serve(bookie: Bookie, listen_address: str) -> BookieServer:
    host, port = split_host_port(listen_address, "listenAddress")
    try:
        return BookieServer(bookie, f"tcp://{host}:{port or '*'}")
    except zmq.ZMQError as e:
        raise BookKeeperError(f"cannot listen on {listen_address}: {e}") from None


def _network_location(settings: ServerSettings, address: str) -> str:
    """``bookieNetworkLocation``, else what the mapping script maps ``address`` to
    (the default rack if it fails), else "" (none registered)."""
    if settings.bookieNetworkLocation or not settings.networkTopologyScriptFileName:
        return settings.bookieNetworkLocation
    return run_mapping_script(settings.networkTopologyScriptFileName, [address],
                              settings.networkTopologyScriptTimeoutMs / 1000)[0]


def _advertised_host(settings: ServerSettings) -> str:
    if settings.advertisedAddress:
        return settings.advertisedAddress
    host = split_host_port(settings.listenAddress, "listenAddress")[0]
    return socket.gethostname() if host in _ANY_HOST else host
