"""The ZooKeeper metadata store: the contract of :mod:`pybk.meta.interface` on a ZooKeeper
cluster, through kazoo, with BookKeeper's layout.

Addresses and the root
    ``zk://host:port[,host:port...]/root`` (:mod:`pybk.meta.zkaddress`); the root is
    BookKeeper's ``zkLedgersRootPath``, ``/ledgers`` by default.  Everything the store
    writes lives under the root: the contract's ``/ledgers`` is the root itself, and
    every other contract path lives under the root's node ``pybk`` (the *namespace
    node*, :mod:`pybk.meta.migrate`):

    ===================  =============================  =================================
    contract path        root ``/ledgers``              root ``/bk/cluster1``
    ===================  =============================  =================================
    ``/ledgers/LAYOUT``  ``/ledgers/LAYOUT``            ``/bk/cluster1/LAYOUT``
    ``/logs/orders``     ``/ledgers/pybk/logs/orders``  ``/bk/cluster1/pybk/logs/orders``
    ``/``                ``/ledgers/pybk``              ``/bk/cluster1/pybk``
    ===================  =============================  =================================

    So ledgers, bookies, cookies and under-replication keep BookKeeper's own paths, and
    clusters sharing one ZooKeeper (``/ra`` and ``/rb``, or ``/ledgers`` beside
    ``/bk/cluster1``) share nothing.  The namespace node's name cannot be a ledger's
    (the layouts' names are digits or ``L`` and digits, :mod:`pybk.meta.layout`); it
    and ``pybk-migration`` are reserved: the contract paths ``/ledgers/pybk...`` and
    ``/ledgers/pybk-migration...`` are refused and ``/ledgers`` does not list them.
    ``children("/")`` lists ``ledgers`` and the namespace node's children.

    pybk before this layout kept the contract's ``/logs`` under the root's *parent*,
    where clusters with the same parent shared it.  Opening such a cluster moves its
    logs under its root once (:mod:`pybk.meta.migrate`: crash-safe, logged as a
    warning; what the former pybk still running could write there is then refused),
    or refuses when other clusters of that layout share the parent, since it cannot
    tell whose a log is (:func:`migrate_logs`, ``pybk migrate-logs``, settles it).  A
    store opened with ``move_logs=False`` (by callers that change no log: the admin
    commands, bookies, ``pybk consumers list``) leaves such a cluster as it is, reads
    its logs where they are and refuses to change them.

Formatting and the layout
    :func:`format_cluster` writes, in one ZooKeeper transaction, the root with
    ``available/``, ``available/readonly/``, ``cookies/``, ``idgen/``, ``pybk``,
    ``INSTANCEID`` (a UUID) and ``LAYOUT`` (the ledger layout in BookKeeper's text form,
    :mod:`pybk.meta.layout`; hierarchical by default, as in BookKeeper).  Opening a
    store reads LAYOUT: an unformatted root, an unknown layout, or a layout other than
    the one the caller asked for stops the open with :class:`~pybk.errors.MetadataError`.
    The root's ``pybk`` (the namespace node, data ``1``) is made in the same transaction.

Ledger ids
    BookKeeper's ZooKeeper id generator: each id is the sequence number of a
    persistent-sequential node ``/ledgers/idgen/ID-<10 digits>``, deleted again at once
    (without waiting).  ZooKeeper's sequence counter (the parent's child version) only
    grows, so ids are unique and increasing across sessions and clients (a request whose
    answer was lost skips one).  It is a signed 32-bit counter: after 2^31 ids,
    :meth:`~ZooKeeperMetadataStore.next_ledger_id` raises MetadataError.

Connection loss and retries
    Every call retries through connection loss and session expiry (kazoo's
    :class:`~kazoo.retry.KazooRetry`, backing off from ``zkRetryBackoffStartMs`` to
    ``zkRetryBackoffMaxMs``) until ``zkOperationTimeoutMs`` has passed, then raises
    :class:`~pybk.errors.MetadataUnavailable`; so clients ride out a ZooKeeper restart.
    A request lost with its connection may have taken effect; a retry that then finds
    the effect (NodeExists with our data, BadVersion at the next version with our data,
    NoNode for our delete) reports success.  Opening waits at most ``zkTimeout`` for a
    session, then raises MetadataUnavailable; it raises it at once where no host name
    resolves, and after a few refused attempts where nothing listens at the address
    (:func:`pybk.meta.zkclient.connect`).

Sessions, ephemeral records and the bookie registry
    The store holds one ZooKeeper session of ``zkTimeout`` ms.  If ZooKeeper expires it
    (the process stalled, or was cut off, for longer than that), kazoo opens a new one:
    the old session's ephemeral records are gone, and the store creates its bookie
    registrations again (those made by :meth:`~ZooKeeperMetadataStore.register_bookie`;
    other ephemeral records stay gone).  A registration found held by another session
    (another process with the same bookie id, or this bookie's previous life) is waited
    on for up to ``zkTimeout``, as BookKeeper does, then refused.

    :meth:`~ZooKeeperMetadataStore.add_session_listener` tells the owner, on the store's
    session thread, in order:

    * ``SUSPENDED``: the connection is lost; the session may still live (ZooKeeper keeps
      it for ``zkTimeout`` after it last heard from the store, and a restarted ZooKeeper
      restores it).  A bookie node keeps taking writes for as long as its session may
      live (:mod:`pybk.cluster.node`).
    * ``EXPIRED``: the session ended; its ephemeral records, registrations included, are
      gone.  A bookie node refuses writes.
    * ``CONNECTED``: connected again, and every registration of this store exists (same
      session, or re-created in a new one), with its endpoint.  A bookie node takes
      writes again.

Watches
    Persistent ZooKeeper watches (:mod:`pybk.meta.zkclient`): ZooKeeper reports every
    change in commit order, the callbacks run on the store's notifier thread as
    :mod:`pybk.meta.watches` describes, and events of one transaction on one path (a
    create that made the watched ancestor and its child) make one call, since
    ZooKeeper 3.9 sends each event's zxid (older servers may make two).  While the
    connection is down no event arrives; once connected again the store re-sets its
    watches and calls every watch once, since changes may have been missed.

Security
    With ``zkEnableSecurity`` (:class:`ZooKeeperSettings`) the store authenticates with
    ZooKeeper's digest scheme and creates every node (ancestors and ephemeral
    registrations included) with an ACL that lets only its user change it, readable by
    everyone unless ``zkWorldReadable`` is false.  A store without the credentials gets
    MetadataError (``NoAuthError``) for a change.  Nodes made before keep their ACL.

Threads
    kazoo's three (connection and two callback threads), the notifier thread (from the
    first watch) and the session thread.  Any thread may call any method.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import uuid
from typing import Any, Callable, Iterator, Sequence

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    KazooException,
    NoAuthError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
)

from pybk.errors import BadVersion, MetadataError, NodeExists, NoNode
from pybk.meta import layout as layouts
from pybk.meta import migrate, paths, zkclient
from pybk.meta.interface import (
    ANY_VERSION,
    MetadataStore,
    SessionListener,
    SessionState,
    check_batch,
    check_data,
    check_version,
    sequential_prefix,
)
from pybk.meta.watches import Notifier, Watch, WatchCallback
from pybk.meta.zkaddress import ZooKeeperAddress, parse_zookeeper_address

# The store's settings, known to its users as pybk.meta.zookeeper.ZooKeeperSettings, are
# defined with the connection they tune.
from pybk.meta.zkconnection import Connection, NodeExistsAt, ZooKeeperSettings

log = logging.getLogger(__name__)

_LEDGERS_NAME = paths.split(paths.LEDGERS)[1]
_IDGEN_PREFIX = "ID-"
# The root's children that are no records of /ledgers (pybk.meta.migrate).
_RESERVED_NAMES = frozenset((migrate.NAMESPACE_NAME, migrate.LOCK_NAME))
# How often a registration held by another session is looked at while waiting for it.
_REGISTRATION_POLL_S = 0.1
# How long close() waits for a session listener that is still running.
_CLOSE_WAIT_S = 30.0


class _Namespace:
    """Maps the contract's paths to ZooKeeper's for one root (see the module docstring);
    ``former``: the paths outside ``/ledgers`` of pybk's former layout, under the root's
    parent, read only (a store that moves no logs, on a cluster of that layout)."""

    def __init__(self, root: str, former: bool = False) -> None:
        self.root = root
        self.former = former
        parent = paths.split(root)[0]
        self.base = ((parent if parent != paths.ROOT else "") if former
                     else migrate.namespace_path(root))

    def zk(self, path: str) -> str:
        if path == paths.ROOT:
            return self.base or paths.ROOT
        first, _sep, rest = path[1:].partition("/")
        if first != _LEDGERS_NAME:
            return self.base + path
        if rest.partition("/")[0] in _RESERVED_NAMES:
            raise MetadataError(f"{path} is not a path of this store: in ZooKeeper it "
                                f"would be under {self.root}/{rest.partition('/')[0]}, "
                                "where the store keeps the records outside /ledgers")
        return paths.join(self.root, rest) if rest else self.root

    def zk_change(self, path: str) -> str:
        """:meth:`zk` of a record to be changed: MetadataError for one outside
        ``/ledgers`` in the former layout (it stays as it is until a store that moves
        the logs opens the cluster)."""
        zk = self.zk(path)
        if self.former and path.partition("/")[2].partition("/")[0] != _LEDGERS_NAME:
            raise MetadataError(
                f"cannot change {path}: the cluster at {self.root} is in pybk's former "
                f"layout (its logs at {zk}), and this store was opened to read only "
                "(move_logs=False), leaving them there; a store that writes logs moves "
                "them under the root first (stop every pybk process of the former layout "
                "before)")
        return zk

    def children(self, path: str, names: list[str]) -> list[str]:
        """The contract's names for the children of ``path``, given those of its node in
        ZooKeeper: under ``/``, ``ledgers`` (the root) too; under ``/ledgers``, not the
        namespace node and the migration lock."""
        if path == paths.ROOT:
            return sorted({*names, _LEDGERS_NAME})
        if path == paths.LEDGERS:
            return sorted(name for name in names if name not in _RESERVED_NAMES)
        return sorted(names)


def _refused(address: ZooKeeperAddress, what: str) -> MetadataError:
    """ZooKeeper's NoAuth (an ACL refused this client), saying what to set."""
    return MetadataError(f"{address}: {what}: ZooKeeper refused it (NoAuth): this client "
                         "lacks the cluster's credentials (set zkEnableSecurity=true and "
                         "zkDigestAuthFile to a file holding the cluster's user:password)")


def _check_layout(conn: Connection, namespace: _Namespace,
                  expected: layouts.LedgerLayout | None) -> tuple[layouts.LedgerLayout, str]:
    """The cluster's layout and instance id; MetadataError if it is not formatted, or
    formatted with another layout than ``expected``, or not readable without credentials
    (``zkWorldReadable=false``)."""
    try:
        found = conn.read(namespace.zk(paths.LAYOUT))
    except NoAuthError:
        raise _refused(conn.address, f"read {namespace.zk(paths.LAYOUT)}") from None
    if found is None:
        raise MetadataError(f"{conn.address}: no cluster is formatted at {namespace.root} "
                            f"(it has no LAYOUT): format it first (pybk format-cluster "
                            f"--zk {conn.address}, or pybk.meta.zookeeper.format_cluster())")
    try:
        layout = layouts.decode(found[0])
    except MetadataError as e:
        raise type(e)(f"{conn.address}: {e}") from None
    if expected is not None and layout is not expected:
        raise MetadataError(f"{conn.address}: the cluster at {namespace.root} was formatted "
                            f"with the {layout.name} ledger layout, not {expected.name}")
    instance = conn.read(namespace.zk(paths.INSTANCE_ID))
    return layout, instance[0].decode("utf-8", "replace") if instance else ""


class ZooKeeperMetadataStore(MetadataStore):
    """The metadata store of the cluster at a ``zk://`` address; see the module docstring.

    ``layout`` (a name), if given, is the ledger layout the caller expects: a cluster
    formatted with another is refused.

    ``move_logs``: opening a cluster of pybk's former layout moves its logs under the
    root (:mod:`pybk.meta.migrate`).  False for a caller that changes no log (the admin
    commands, bookies, a listing): the cluster is left as it is and its logs are read
    where they are; a change outside ``/ledgers`` then raises MetadataError.  A store
    opened so before another process moves the logs finds the moved records
    (MalformedMetadata, naming magic b"PBKM"): open it again."""

    def __init__(self, address: str | ZooKeeperAddress,
                 settings: ZooKeeperSettings | None = None,
                 layout: str | None = None, move_logs: bool = True) -> None:
        self.address = (address if isinstance(address, ZooKeeperAddress)
                        else parse_zookeeper_address(address))
        self.settings = settings or ZooKeeperSettings()
        expected = layouts.layout_named(layout) if layout is not None else None
        self._ns = _Namespace(self.address.root)
        self._closed = False
        # Reentrant: a watch that fails to be set is cancelled under it (see watch()).
        self._watch_lock = threading.RLock()
        self._close_lock = threading.Lock()
        self._watched: dict[str, str] = {}  # ZooKeeper path -> contract path
        self._last_zxid: dict[str, int] = {}  # ZooKeeper path -> zxid of its last event
        self._notifier = Notifier(f"pybk-meta-watch zk {self.address.root}",
                                  on_unwatched=self._unwatched)
        self._registry_lock = threading.RLock()
        #: Bookie id -> (read only, endpoint, host), registered again in a new session.
        self._registrations: dict[str, tuple[bool, str, str, str]] = {}
        self._listeners: list[SessionListener] = []
        self._session_events: queue.SimpleQueue[KazooState | None] = queue.SimpleQueue()
        self._conn = Connection(self.address, self.settings, self._on_event)
        try:
            self.layout, self.instance_id = _check_layout(self._conn, self._ns, expected)
            if move_logs:
                with _migration_errors(self.address):
                    migrate.ensure_namespace(self._conn, self.address.root)
            elif not migrate.in_current_layout(self._conn, self.address.root):
                self._ns = _Namespace(self.address.root, former=True)
                log.info("%s: the cluster is in pybk's former layout: its logs are read at "
                         "%s, where they stay (this store moves nothing)", self.address,
                         self._ns.zk(paths.join(paths.ROOT, migrate.FORMER_LOGS_NAME)))
        except BaseException:
            self._conn.close()
            raise
        self._session_id = self._conn.session_id
        self.session_state = SessionState.CONNECTED
        self._session_thread = threading.Thread(target=self._run_session_events,
                                                name=f"pybk-zk-session {self.address.root}",
                                                daemon=True)
        self._session_thread.start()
        self._conn.client.add_listener(self._session_events.put)

    # -- the calling discipline ------------------------------------------------------

    def _run(self, what: str, path: str, operation: Callable[[KazooClient, bool], Any]) -> Any:
        """Run a retried operation on ``path``, in pybk's exceptions."""
        if self._closed:
            raise MetadataError(f"the metadata store {self.address} is closed")
        try:
            return self._conn.call(f"{what} {path}", operation)
        except NoNodeError:
            raise NoNode(f"no record at {path}") from None
        except NodeExistsError:
            raise NodeExists(f"a record exists at {path} already") from None
        except BadVersionError:
            raise BadVersion(f"{path} is not at the expected version: it changed since it "
                             "was read") from None
        except NotEmptyError:
            raise MetadataError(f"cannot delete {path}: it has children; delete them "
                                "first") from None
        except NoChildrenForEphemeralsError:
            raise MetadataError(f"cannot create {path}: its parent is ephemeral, and "
                                "ephemeral records have no children") from None
        except ConnectionClosedError:
            raise MetadataError(f"the metadata store {self.address} is closed") from None
        except NoAuthError:
            raise _refused(self.address, f"{what} {path}") from None
        except KazooException as e:
            raise MetadataError(f"{self.address}: {what} {path} failed: {e!r}") from e

    # -- records -------------------------------------------------------------------------

    def create(self, path: str, data: bytes, ephemeral: bool = False) -> int:
        paths.check_path(path)
        data = check_data(data)
        zk = self._ns.zk_change(path)

        def op(client: KazooClient, retrying: bool) -> int:
            try:
                try:
                    self._conn.wait(client.create_async(zk, data, ephemeral=ephemeral))
                except NoNodeError:  # an ancestor is missing: make them in one step
                    self._conn.create_with_ancestors(client, [(zk, data)], ephemeral)
            except NodeExistsError:
                if retrying and self._created_by_us(client, zk, data, ephemeral):
                    return 0  # an earlier attempt took effect; its answer was lost
                raise
            return 0

        return self._run("create", path, op)

    def create_many(self, records: Sequence[tuple[str, bytes]]) -> None:
        batch = check_batch(records)
        if not batch:
            return
        nodes = [(self._ns.zk_change(path), data) for path, data in batch]

        def op(client: KazooClient, retrying: bool) -> None:
            try:
                self._conn.create_with_ancestors(client, nodes)  # one multi: all or none
            except NodeExistsAt as e:
                if retrying and all(self._created_by_us(client, zk, data, False)
                                    for zk, data in nodes):
                    return  # an earlier attempt took effect; its answer was lost
                raise NodeExists(f"a record exists at {batch[e.index][0]} already (or "
                                 "is given twice): none of the batch was created") from None

        self._run("create", f"{len(batch)} records from {batch[0][0]}", op)

    def create_sequential(self, prefix: str, data: bytes, ephemeral: bool = False) -> str:
        parent, name_prefix = sequential_prefix(prefix)
        data = check_data(data)
        zk_parent = self._ns.zk_change(parent)
        zk_prefix = paths.join(zk_parent, name_prefix)

        def op(client: KazooClient, retrying: bool) -> str:
            if retrying and ephemeral:
                mine = self._sequential_of_ours(client, zk_parent, name_prefix, data)
                if mine is not None:
                    return mine  # an earlier attempt took effect; its answer was lost
            # (A persistent one whose answer was lost stays behind, like a lost ledger id.)
            return self._conn.wait(client.create_async(
                zk_prefix, data, ephemeral=ephemeral, sequence=True, makepath=True))

        created = self._run("create", prefix, op)
        return paths.join(parent, paths.split(created)[1])

    def _sequential_of_ours(self, client: KazooClient, zk_parent: str, name_prefix: str,
                            data: bytes) -> str | None:
        """The ZooKeeper path of an ephemeral sequential record under ``zk_parent`` that
        this session made with ``data``, if there is one."""
        try:
            names = self._conn.wait(client.get_children_async(zk_parent))
        except NoNodeError:
            return None
        for name in names:
            if not name.startswith(name_prefix):
                continue
            try:
                found, stat = self._conn.wait(client.get_async(paths.join(zk_parent, name)))
            except NoNodeError:
                continue
            if found == data and stat.ephemeralOwner == self._conn.session_id:
                return paths.join(zk_parent, name)
        return None

    def _created_by_us(self, client: KazooClient, zk: str, data: bytes,
                       ephemeral: bool) -> bool:
        try:
            found, stat = self._conn.wait(client.get_async(zk))
        except NoNodeError:
            return False
        owner = self._conn.session_id if ephemeral else 0
        return found == data and stat.version == 0 and stat.ephemeralOwner == owner

    def get(self, path: str) -> tuple[bytes, int]:
        paths.check_path(path)
        zk = self._ns.zk(path)

        def op(client: KazooClient, _retrying: bool) -> tuple[bytes, int]:
            data, stat = self._conn.wait(client.get_async(zk))
            return data or b"", stat.version  # None: a node made without data

        return self._run("read", path, op)

    def get_latest(self, path: str) -> tuple[bytes, int]:
        paths.check_path(path)
        zk = self._ns.zk(path)

        def op(client: KazooClient, _retrying: bool) -> tuple[bytes, int]:
            # The server this session reads from catches up with the leader first.
            self._conn.wait(client.sync_async(zk))
            data, stat = self._conn.wait(client.get_async(zk))
            return data or b"", stat.version

        return self._run("read", path, op)

    def set(self, path: str, data: bytes, expected_version: int) -> int:
        paths.check_path(path)
        data = check_data(data)
        check_version(expected_version)
        zk = self._ns.zk_change(path)

        def op(client: KazooClient, retrying: bool) -> int:
            try:
                return self._conn.wait(client.set_async(zk, data, expected_version)).version
            except BadVersionError:
                return self._set_earlier(client, zk, data, expected_version, retrying)

        return self._run("set", path, op)

    def set_and_delete(self, path: str, data: bytes, expected_version: int,
                       delete_path: str) -> int:
        paths.check_path(path)
        paths.check_path(delete_path)
        data = check_data(data)
        check_version(expected_version)
        zk, zk_delete = self._ns.zk_change(path), self._ns.zk_change(delete_path)

        def op(client: KazooClient, retrying: bool) -> int:
            txn = client.transaction()
            txn.set_data(zk, data, expected_version)
            txn.delete(zk_delete, ANY_VERSION)
            results = self._conn.wait(txn.commit_async())
            failure = next((r for r in results if isinstance(r, Exception)
                            and not isinstance(r, RolledBackError)), None)
            if failure is None:
                return results[0].version
            if isinstance(failure, NoNodeError) and not isinstance(results[0], NoNodeError):
                # Nothing to delete (any more): the set alone.
                try:
                    return self._conn.wait(client.set_async(zk, data, expected_version)).version
                except BadVersionError:
                    return self._set_earlier(client, zk, data, expected_version, retrying)
            if isinstance(failure, BadVersionError) \
                    and self._conn.wait(client.exists_async(zk_delete)) is None:
                return self._set_earlier(client, zk, data, expected_version, retrying)
            raise failure

        return self._run("set", path, op)

    def _set_earlier(self, client: KazooClient, zk: str, data: bytes, expected_version: int,
                     retrying: bool) -> int:
        """After BadVersion for a set of ``zk`` to ``data``: its new version if an earlier
        attempt of this retried call took effect (its answer was lost); else raises the
        BadVersionError again."""
        if retrying and expected_version != ANY_VERSION:
            found, stat = self._conn.wait(client.get_async(zk))
            if stat.version == expected_version + 1 and found == data:
                return stat.version
        raise BadVersionError()

    def delete(self, path: str, expected_version: int) -> None:
        paths.check_path(path)
        check_version(expected_version)
        zk = self._ns.zk_change(path)

        def op(client: KazooClient, retrying: bool) -> None:
            try:
                self._conn.wait(client.delete_async(zk, expected_version))
            except NoNodeError:
                if not retrying:
                    raise  # else an earlier attempt deleted it; its answer was lost

        self._run("delete", path, op)

    def children(self, path: str) -> list[str]:
        paths.check_path(path, root_ok=True)
        zk = self._ns.zk(path)

        def op(client: KazooClient, _retrying: bool) -> list[str]:
            try:
                names = self._conn.wait(client.get_children_async(zk))
            except NoNodeError:
                if path == paths.ROOT:
                    names = []  # the root always exists, even before ZooKeeper's node
                else:
                    raise
            return self._ns.children(path, names)

        return self._run("list", path, op)

    def exists(self, path: str) -> bool:
        paths.check_path(path, root_ok=True)
        if path == paths.ROOT:
            if self._closed:
                raise MetadataError(f"the metadata store {self.address} is closed")
            return True
        zk = self._ns.zk(path)
        return self._run("look up", path, lambda client, _retrying: self._conn.wait(
            client.exists_async(zk)) is not None)

    # -- watches -------------------------------------------------------------------------

    def watch(self, path: str, callback: WatchCallback) -> Watch:
        paths.check_path(path, root_ok=True)
        if not callable(callback):
            raise MetadataError(f"watch callback {callback!r} is not callable")
        zk = self._ns.zk(path)
        with self._watch_lock:
            if self._closed:
                raise MetadataError(f"the metadata store {self.address} is closed")
            # Subscribed before ZooKeeper's watch is set, so no event after it is missed.
            watch = self._notifier.add(path, callback)
            if zk not in self._watched:
                self._watched[zk] = path
                try:
                    self._run("watch", path, lambda client, _retrying: self._conn.wait(
                        zkclient.add_persistent_watch(client, zk)))
                except BaseException:
                    watch.cancel()
                    raise
            return watch

    def _unwatched(self, path: str) -> None:
        """The last watch on ``path`` was cancelled: drop ZooKeeper's watch too."""
        zk = self._ns.zk(path)
        with self._watch_lock:
            if self._notifier.watching(path) or self._watched.pop(zk, None) is None:
                return
            self._last_zxid.pop(zk, None)
            if not self._closed:
                # Not waited for: a cancel must not block on a lost connection (whose
                # watches ZooKeeper drops anyway).  Requests go out in order, so a new
                # watch on the path, sent later, is set after this removal.
                zkclient.remove_watches(self._conn.client, zk).rawlink(_log_failure)

    def _on_event(self, zxid: int, zk_path: str) -> None:
        """A watch notification, on kazoo's connection thread: queue the calls."""
        path = self._watched.get(zk_path)
        if path is None:
            return
        if zxid > 0:
            if self._last_zxid.get(zk_path) == zxid:
                return  # another event of the same transaction on this path
            self._last_zxid[zk_path] = zxid
        self._notifier.publish([path])

    def _rewatch(self) -> None:
        """Set every watch again on a new connection, then call each once: ZooKeeper
        dropped them with the old connection, and changes may have been missed."""
        with self._watch_lock:
            watched = dict(self._watched)
            pending = [zkclient.add_persistent_watch(self._conn.client, zk) for zk in watched]
            for async_result in pending:
                self._conn.wait(async_result)
            self._notifier.publish(watched.values())

    # -- ledger ids ------------------------------------------------------------------------

    def next_ledger_id(self) -> int:
        prefix = paths.join(self._ns.zk(paths.IDGEN), _IDGEN_PREFIX)

        def op(client: KazooClient, _retrying: bool) -> int:
            # A lost answer leaves an ID node behind and skips its id: harmless.
            created = self._conn.wait(client.create_async(prefix, b"", sequence=True,
                                                          makepath=True))
            client.delete_async(created)  # not waited for: nothing depends on it
            return int(created[len(prefix):])

        ledger_id = self._run("take a ledger id from", paths.IDGEN, op)
        if ledger_id < 0:
            raise MetadataError(f"{self.address}: ZooKeeper's sequence counter of "
                                f"{self.address.root}/idgen wrapped around: no ledger ids "
                                "are left in this id generator")
        return ledger_id

    # -- the bookie registry ----------------------------------------------------------

    def register_bookie(self, bookie_id: str, read_only: bool = False,
                        endpoint: str = "", host: str = "", location: str = "") -> None:
        with self._registry_lock:
            super().register_bookie(bookie_id, read_only, endpoint, host, location)
            self._registrations[bookie_id] = (read_only, endpoint, host, location)

    def unregister_bookie(self, bookie_id: str, host: str = "") -> None:
        with self._registry_lock:
            super().unregister_bookie(bookie_id, host)
            self._registrations.pop(bookie_id, None)

    def _create_registration(self, path: str, data: bytes) -> None:
        """Create the registration, or wait (up to twice zkTimeout) for one that another
        session holds to go away: it may be this bookie's previous life, whose session
        has not expired yet.  Twice, because the server expires a dead session on its
        next tick after the session's own timeout, which may be longer than ours."""
        zk = self._ns.zk(path)
        deadline = time.monotonic() + 2 * self.settings.zkTimeout / 1000
        while True:
            try:
                self.create(path, data, ephemeral=True)
                return
            except NodeExists:
                pass
            found = self._conn.read(zk)
            if found is None:
                continue  # it went away just now
            owner = found[1].ephemeralOwner
            if owner == self._conn.session_id:
                if found[0] != data:  # registered by this session with another endpoint
                    self.set(path, data, found[1].version)
                return
            if time.monotonic() > deadline:
                raise MetadataError(
                    f"{path} is held by ZooKeeper session {owner:#x}, not this store's: "
                    "another process registered this bookie id (a session of a process "
                    "that died ends after its own timeout; this one waited "
                    f"2 x zkTimeout={self.settings.zkTimeout} ms)")
            time.sleep(_REGISTRATION_POLL_S)

    # -- sessions ------------------------------------------------------------------------

    def add_session_listener(self, listener: SessionListener) -> None:
        """Call ``listener(SessionState)`` on the store's session thread at every session
        change (see the module docstring).  It must not block for long."""
        self._listeners.append(listener)

    def remove_session_listener(self, listener: SessionListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    @property
    def session_id(self) -> int | None:
        """The current ZooKeeper session's id (None while there is none)."""
        return self._conn.session_id

    def _run_session_events(self) -> None:
        """The session thread: turns kazoo's state changes into re-registration, re-set
        watches and listener calls (kazoo reports them on its connection thread, where
        no ZooKeeper call may wait)."""
        while True:
            state = self._session_events.get()
            if state is None or self._closed:
                return
            # One line per change, in place of kazoo's warnings (pybk.meta.zkclient)
            if state == KazooState.SUSPENDED:
                log.warning("%s: lost the connection to ZooKeeper; reconnecting (the "
                            "session outlives it by up to zkTimeout=%d ms)", self.address,
                            self.settings.zkTimeout)
                self._tell(SessionState.SUSPENDED)
            elif state == KazooState.LOST:
                log.warning("%s: the ZooKeeper session expired", self.address)
                self._tell(SessionState.EXPIRED)
            elif self._reconnected():
                if self.session_state is not SessionState.CONNECTED:
                    log.info("%s: connected to ZooKeeper again", self.address)
                self._tell(SessionState.CONNECTED)

    def _reconnected(self) -> bool:
        """After a (re)connection: restore registrations (in a new session) and watches.
        False if that failed; the next reconnection tries again."""
        session_id = self._conn.session_id
        try:
            if session_id != self._session_id:
                log.warning("%s: ZooKeeper session %#x expired; now in session %#x, "
                            "registering again", self.address, self._session_id, session_id)
                with self._registry_lock:
                    for bookie_id, (read_only, endpoint, host, location) in \
                            self._registrations.items():
                        super().register_bookie(bookie_id, read_only, endpoint, host,
                                                location)
                self._session_id = session_id
            self._rewatch()
        except Exception:
            if not self._closed:
                log.exception("%s: restoring registrations and watches after a reconnection "
                              "failed", self.address)
            return False
        return True

    def _tell(self, state: SessionState) -> None:
        self.session_state = state
        for listener in list(self._listeners):
            try:
                listener(state)
            except Exception:
                log.exception("session listener %r failed on %s", listener, state.value)

    # -- life cycle --------------------------------------------------------------------------

    def close(self) -> None:
        # Not under the watch lock: a watch being set holds it for as long as ZooKeeper
        # does not answer (up to zkOperationTimeoutMs), and closing the connection below
        # is what ends that wait.  A watch set after this fails on the closed store.
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._session_events.put(None)
        # Closed first, so that ZooKeeper calls the session thread may be waiting on fail
        # at once.  Ends the session: ZooKeeper deletes its ephemeral records.
        self._conn.close()
        if self._session_thread is not threading.current_thread():
            self._session_thread.join(_CLOSE_WAIT_S)
        self._notifier.close()

    def __repr__(self) -> str:
        return f"ZooKeeperMetadataStore({str(self.address)!r})"


def _log_failure(async_result: Any) -> None:
    try:
        async_result.get_nowait()
    except KazooException as e:  # NoWatcherError after a reconnection, for one
        log.debug("removing a ZooKeeper watch: %r", e)


@contextlib.contextmanager
def _migration_errors(address: ZooKeeperAddress) -> Iterator[None]:
    """kazoo's errors of a migration (:mod:`pybk.meta.migrate`) as MetadataError."""
    try:
        yield
    except NoAuthError:
        raise _refused(address, "move the logs under the root") from None
    except KazooException as e:
        raise MetadataError(f"{address}: moving the logs under the root failed: "
                            f"{e!r}") from e


def migrate_logs(address: str | ZooKeeperAddress, logs: Sequence[str] | None = None,
                 settings: ZooKeeperSettings | None = None) -> migrate.Migration | None:
    """Move the cluster at ``address`` into pybk's current layout with the logs named in
    ``logs`` from the former one (all of them when None, if no other cluster of the
    former layout shares its parent); what it did, or None if the cluster was in the
    current layout already (:mod:`pybk.meta.migrate`; opening a store does the same with
    ``logs`` None)."""
    address = (address if isinstance(address, ZooKeeperAddress)
               else parse_zookeeper_address(address))
    conn = Connection(address, settings or ZooKeeperSettings(), lambda *_event: None)
    try:
        _check_layout(conn, _Namespace(address.root), None)
        with _migration_errors(address):
            return migrate.migrate(conn, address.root, logs)
    finally:
        conn.close()


def format_cluster(address: str | ZooKeeperAddress, layout: str = "hierarchical",
                   settings: ZooKeeperSettings | None = None) -> str:
    """Format the cluster at ``address`` with the named ledger layout and return its
    instance id.  Formatting a cluster formatted with the same layout already changes
    nothing (and returns its instance id); another layout raises MetadataError, and so
    does a root that holds records but no LAYOUT."""
    address = (address if isinstance(address, ZooKeeperAddress)
               else parse_zookeeper_address(address))
    wanted = layouts.layout_named(layout)
    ns = _Namespace(address.root)

    def op(client: KazooClient, _retrying: bool) -> None:
        try:
            names = conn.wait(client.get_children_async(address.root))
        except NoNodeError:
            names = []
        if names:
            raise MetadataError(f"{address}: {address.root} holds records ("
                                f"{', '.join(sorted(names)[:5])}) but no LAYOUT: it is not "
                                "a pybk or BookKeeper cluster; choose another root")
        instance_id = str(uuid.uuid4())
        nodes = [(ns.zk(p), b"") for p in (paths.AVAILABLE, paths.READONLY, paths.COOKIES,
                                            paths.IDGEN)]
        nodes += [(ns.zk(paths.INSTANCE_ID), instance_id.encode()),
                  (ns.base, migrate.READY), (ns.zk(paths.LAYOUT), layouts.encode(wanted))]
        try:
            conn.create_with_ancestors(client, nodes)  # the root comes as an ancestor
        except NodeExistsError:
            if conn.wait(client.exists_async(ns.zk(paths.LAYOUT))) is None:
                raise
            return  # formatted by another client meanwhile: checked below
        log.info("%s: formatted with the %s ledger layout, instance id %s", address,
                 wanted.name, instance_id)

    conn = Connection(address, settings or ZooKeeperSettings(), lambda *_event: None)
    try:
        if conn.read(ns.zk(paths.LAYOUT)) is None:
            conn.call(f"format {address.root}", op)
        return _check_layout(conn, ns, wanted)[1]
    except NoAuthError:
        raise _refused(address, f"format {address.root}") from None
    except KazooException as e:
        raise MetadataError(f"{address}: formatting failed: {e!r}") from e
    finally:
        conn.close()
