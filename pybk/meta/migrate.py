"""A ZooKeeper cluster's own records under its root, and moving there the logs that
pybk's former layout kept beside the root.

The layouts
    The ZooKeeper store (:mod:`pybk.meta.zookeeper`) keeps the contract's records
    outside ``/ledgers`` (the logs, :mod:`pybk.log.metadata`) under
    ``<root>/pybk``, the *namespace node*; its data (ASCII) says the cluster is in this
    layout: ``1`` (:data:`READY`), or ``1 cleaning`` (:data:`CLEANING`) while the old
    records of a migration are still being deleted.  pybk before it kept them under the
    root's parent: log ``L`` of the cluster at ``/p/ra`` was ``/p/logs/L``, where the
    cluster at ``/p/rb`` kept its log ``L`` too (issue 31 section 8: the two shared it).
    A cluster without that data (formatted by that pybk, or by BookKeeper) is in the
    *former* layout.  That pybk wrote nothing else outside the root: only ``logs`` moves.

Which opens move the logs
    A store that may change logs (:class:`~pybk.meta.zookeeper.ZooKeeperMetadataStore`
    by default: log writers, commits, truncation, consumers' updates) moves them when it
    opens a cluster of the former layout (:func:`ensure_namespace`), since its changes
    must land where the cluster will read them.  A store opened with
    ``move_logs=False``, by callers that change no log (the admin commands, bookie
    nodes and their autorecovery, ``pybk consumers list``), leaves such a cluster as it
    is: it reads the logs where they are (:func:`in_current_layout`) and refuses to
    change them, so looking at a cluster does not move it under the feet of the former
    pybk still running there.  So upgrading bookies and tools changes nothing, and the
    logs move when the first upgraded log writer opens the cluster: stop the former
    pybk's processes before that (see what is promised to them below).  A store opened
    with ``move_logs=False`` before another one moves the logs finds the moved records
    (MalformedMetadata naming magic b"PBKM"): it is to be opened again.

Which logs are whose
    The former layout cannot tell whose a log in ``<parent>/logs`` is.  Opening a
    cluster of the former layout (:func:`ensure_namespace`) moves them all under its
    root only when no other cluster of the former layout shares its parent (a child of
    the parent with a ``LAYOUT`` and no namespace data); otherwise it refuses with
    MetadataError, and the operator says which logs each cluster takes
    (``pybk migrate-logs --zk <address> --logs L1,L2``, :func:`migrate`; ``--logs ""``:
    none); the last cluster left takes the rest when opened.  Logs are moved into a
    cluster of the former layout only, once.  A child of ``<parent>/logs`` that is no
    pybk log head (another program's node) is left where it is, with a warning.

What the operator is told: a migration logs one warning, ``<address>: moved N log(s)
(L1, L2) from <parent>/logs to <root>/pybk/logs; ...`` (``pybk migrate-logs`` prints
the same line); a node it could not fence, one warning each, saying why; a store
opened with ``move_logs=False`` on a cluster of the former layout logs (INFO) where it
reads the logs.

The migration, under an ephemeral lock node ``<root>/pybk-migration`` (one migrator at
a time; a migrator that dies loses it with its session).  A migrator whose session
expires loses the lock but may go on (a long pause, then a new session): so each one,
once it holds the lock, *takes the migration over* by changing the namespace node's
version (making the node if it is missing), and every write of its steps 1 to 3 is a
ZooKeeper transaction that checks that version.  Another migrator taking over changes it
again, so a migrator that lost the lock writes nothing more (MetadataError):

1. Delete what a migration that died left under the namespace node (nothing else writes
   there before step 3).
2. Copy each log's records (its head, segments, consumers, jobs: the whole subtree)
   from ``<parent>/logs/<name>`` to ``<root>/pybk/logs/<name>``, noting the version of
   each head as read before its subtree.
3. *The switch*, one ZooKeeper transaction: each old head becomes a *moved* record
   (sealed, magic b"PBKM", version 1, ``{"moved_to": <its new ZooKeeper path>}``) if it
   is still at the version read in step 2, and the namespace node's data becomes
   CLEANING.  A head that moved on (a writer of the former pybk still running) fails
   the transaction: steps 1 to 3 run again, at most :data:`SWITCH_ATTEMPTS_MAX` times.
4. *The fence*: take CREATE and WRITE out of the ACL of each moved head that names this
   cluster, then delete the records below it; then, if no cluster of the former layout
   is left beside this one (every sibling root with a LAYOUT has its namespace data)
   and ``<parent>/logs`` holds only pybk's records, take CREATE and WRITE out of its
   ACL too; then set the namespace data to READY.  A cluster found CLEANING when opened
   does this step (each part of it is idempotent).

Crashes: before the switch commits, the former layout is whole (the migration only read
it) and the new one is not in use (no store serves a cluster without the namespace
data from there: ``move_logs=False`` reads the former layout; the next opening that
moves starts again at step 1); after it, the new one is complete (step
2 copied everything before the switch) and the former one is no longer used; what
step 4 had not deleted yet is deleted by the next opening.  The moved records stay for
good (a sibling's migration skips them): a pybk of the former layout that opens such a
log fails on its head (MalformedMetadata, naming magic b"PBKM") instead of starting a
second copy of the log.

The fence
    Each entry of a fenced node's ACL keeps its identity and loses CREATE and WRITE:
    READ, DELETE and ADMIN stay, so with ``zkEnableSecurity`` the cluster's digest user
    still reads and deletes the moved records (world-readable ones stay readable), and
    whoever must undo the fence can (``setAcl``, ADMIN).  ZooKeeper ACLs are per node:
    records already below ``<parent>/logs`` keep theirs.  A node whose ACL this client
    may not change (no ADMIN) is left open, with a warning.  A sibling cluster of the
    former layout keeps ``<parent>/logs`` open (its logs live there) until it is moved
    itself; its migration fences it then (if it is retired instead, ``pybk
    migrate-logs`` on a moved cluster runs step 4 again).  A ``<parent>/logs`` holding
    another program's nodes is left open, with a warning (fencing it would break that
    program); one that does not exist is not made (a cluster that BookKeeper formatted
    gets no node beside its root).  Refusing is chosen over finding such writes later and
    moving them: a refused write is reported to the process that made it, while a log
    made in ``<parent>/logs`` after the move could be any sibling's as far as the
    former layout tells, and a reader of the new layout would not see it meanwhile.

What is promised to a process of the former pybk still running after the move
    * A change of a moved log's head fails: its CAS finds the moved record (BadVersion,
      then MalformedMetadata naming magic b"PBKM"; from the fence on, NoAuth); a head
      change between step 2 and the switch fails the switch instead, which is tried
      again with the change copied.
    * A new record below a moved head (a consumer position, a job, a segment) or a new
      log in a fenced ``<parent>/logs`` is refused (ZooKeeper's NoAuth, before
      anything is acknowledged), from the fence on.
    * Not promised, so stop every pybk process of the former layout before upgrading
      a cluster's log writers: a consumer position or job record that such a process
      writes between step 2 and the fence of step 4 is deleted with the old records
      (acknowledged, then lost); while a sibling of the former layout keeps
      ``<parent>/logs`` open, or when it cannot be fenced, a log such a process makes
      there is the siblings' for the migration (the next one moved takes it); and
      where ``<parent>/logs`` did not exist, the first log such a process makes there
      is not fenced.

Limit: the switch is one transaction, at most :data:`SWITCH_BYTES_MAX` bytes (ZooKeeper
refuses a request over its ``jute.maxbuffer``, 1 MiB by default): some thousands of
logs.  A cluster with more is refused, saying so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import Any, Collection, Iterator

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.security import ACL, Permissions

from pybk.errors import MalformedMetadata, MetadataError, MetadataUnavailable
from pybk.meta import paths
from pybk.meta.sealed import seal, unseal
from pybk.meta.zkconnection import Connection

log = logging.getLogger(__name__)

#: The node under the root that holds the contract's records outside ``/ledgers``.
NAMESPACE_NAME = "pybk"
#: The namespace node's data: the cluster is in the new layout ...
READY = b"1"
#: ... and the records a migration moved away are still being deleted (step 4).
CLEANING = b"1 cleaning"
#: The ephemeral node a migrator holds, beside the namespace node.
LOCK_NAME = "pybk-migration"
#: Where the former layout kept the logs, under the root's parent.
FORMER_LOGS_NAME = "logs"
#: The moved record that replaces an old head in the switch.
MOVED_MAGIC = b"PBKM"
MOVED_VERSION = 1
_MOVED_KEYS = frozenset(("moved_to",))
_LOG_MAGIC = b"PBKG"  # pybk.log.metadata.MAGIC: a log head of any format
_LAYOUT_NAME = paths.split(paths.LAYOUT)[1]  # a formatted cluster has it
#: The largest switch transaction, in bytes (paths and data of its operations).
SWITCH_BYTES_MAX = 512 * 1024
_SWITCH_OP_OVERHEAD_BYTES = 32
#: How often steps 1 to 3 run before a migration whose heads keep changing gives up.
SWITCH_ATTEMPTS_MAX = 3
#: How long an opening waits for another process's migration to finish.
LOCK_WAIT_S = 300.0
_LOCK_POLL_S = 0.1
#: How many ZooKeeper requests a copy or delete keeps in flight, and how many operations
#: one of their transactions holds ...
_REQUESTS_IN_FLIGHT_MAX = 1000
#: ... and how many bytes of paths and data at most (one larger node goes alone: a
#: record's data is at most MAX_DATA_BYTES, 128 KiB under ZooKeeper's jute.maxbuffer).
_TRANSACTION_BYTES_MAX = 256 * 1024
#: How often taking a migration over is tried while other migrators change the node.
_TAKE_OVER_ATTEMPTS_MAX = 10
#: The permissions a fenced node of the former layout no longer grants anyone.
_FENCED_OUT = Permissions.CREATE | Permissions.WRITE


@dataclasses.dataclass(frozen=True)
class Migration:
    """What a migration did: the logs it moved, from where to where."""

    logs: tuple[str, ...]
    source: str
    target: str

    def __str__(self) -> str:
        if not self.logs:
            return f"no logs to move from {self.source}; the cluster's records live under " \
                   f"{paths.split(self.target)[0]}"
        return (f"moved {len(self.logs)} log(s) ({', '.join(self.logs)}) from {self.source} "
                f"to {self.target}; each old head now names its new place")


def namespace_path(root: str) -> str:
    """The namespace node of the cluster at ZooKeeper path ``root``."""
    return paths.join(root, NAMESPACE_NAME)


def in_current_layout(conn: Connection, root: str) -> bool:
    """Whether the cluster at ``root`` is in the new layout (its namespace node says
    so: READY, or CLEANING)."""
    found = conn.read(namespace_path(root))
    return found is not None and found[0] in (READY, CLEANING)


def ensure_namespace(conn: Connection, root: str) -> Migration | None:
    """Make sure the cluster at ``root`` is in the new layout, migrating it if it is not
    and it shares its parent with no other cluster of the former layout (MetadataError
    otherwise; see the module docstring).  None if it was in the new layout already."""
    found = conn.read(namespace_path(root))
    if found is not None and found[0] == READY:
        return None
    if found is not None and found[0] == CLEANING:
        _clean(conn, root)
        return None
    return migrate(conn, root)


def migrate(conn: Connection, root: str,
            logs: Collection[str] | None = None) -> Migration | None:
    """Move the cluster at ``root`` into the new layout with the former logs named in
    ``logs`` (all of them when None, if no other cluster of the former layout shares the
    parent).  None if it is in the new layout already (``logs`` not given): then step 4
    runs again, fencing ``<parent>/logs`` if the siblings that kept it open are gone."""
    parent = paths.split(root)[0]
    source = paths.join(parent, FORMER_LOGS_NAME)
    target = paths.join(namespace_path(root), FORMER_LOGS_NAME)
    with _lock(conn, root):
        found = conn.read(namespace_path(root))
        if found is not None and found[0] in (READY, CLEANING):
            if logs is not None:
                raise MetadataError(f"{conn.address}: the cluster at {root} is in pybk's "
                                    "current layout already: no logs can be moved into it")
            _clean(conn, root)  # again: fences what a sibling of the former layout kept open
            return None
        # A root named like the former parent of the logs could hold none (that pybk
        # refused the contract path /<root's name>)
        former = _former_logs(conn, source) if source != root else set()
        if logs is None:
            taken = sorted(former)
            others = _former_clusters(conn, parent, root) if taken else []
            if others:
                example = dataclasses.replace(conn.address, root=others[0])
                raise MetadataError(
                    f"{conn.address}: {source} holds logs of pybk's former layout "
                    f"({', '.join(taken[:10])}), and {parent} holds other clusters of that "
                    f"layout ({', '.join(others[:10])}), which shared them: it cannot tell "
                    "whose a log is.  Stop every pybk process of these clusters, then give "
                    "all of them but one their logs (pybk migrate-logs --zk "
                    f"{example} --logs NAME,...); the last one opened takes the rest")
        else:
            taken = sorted(set(logs))
            missing = [name for name in taken if name not in former]
            if missing:
                raise MetadataError(f"{conn.address}: {source} holds no log of pybk's "
                                    f"former layout named {', '.join(missing)}")
        _check_switch_size(conn, source, target, taken)
        fence = _take_over(conn, root)
        for _ in range(SWITCH_ATTEMPTS_MAX):
            _delete_below(conn, namespace_path(root), (namespace_path(root), fence))
            if taken:
                _make(conn, target, (namespace_path(root), fence))
            versions = {name: _copy_tree(conn, paths.join(source, name),
                                         paths.join(target, name),
                                         (namespace_path(root), fence)) for name in taken}
            if _switch(conn, root, source, target, versions, fence):
                break
        else:
            raise MetadataError(f"{conn.address}: the logs in {source} kept changing while "
                                f"they were moved ({SWITCH_ATTEMPTS_MAX} attempts): a pybk "
                                "of the former layout is writing them; stop it and open the "
                                "cluster again")
        _clean(conn, root)
    migration = Migration(tuple(taken), source, target)
    log.log(logging.WARNING if taken else logging.INFO, "%s: %s", conn.address, migration)
    return migration


# -- reading the former layout ----------------------------------------------------------


def _former_logs(conn: Connection, source: str) -> set[str]:
    """The names of the log heads in ``source`` (moved records and other nodes left
    out, the latter with a warning)."""
    heads = set()
    for name, data in _children_data(conn, source):
        if data.startswith(_LOG_MAGIC):
            heads.add(name)
        elif not data.startswith(MOVED_MAGIC):
            log.warning("%s: %s/%s is no pybk log (its data starts with %r): left where "
                        "it is", conn.address, source, name, data[:4])
    return heads


def _former_clusters(conn: Connection, parent: str, root: str) -> list[str]:
    """The other children of ``parent`` that are clusters of the former layout."""
    others = []
    for name in _children(conn, parent):
        child = paths.join(parent, name)
        if child == root or conn.read(paths.join(child, _LAYOUT_NAME)) is None:
            continue
        found = conn.read(namespace_path(child))
        if found is None or found[0] not in (READY, CLEANING):
            others.append(child)
    return others


def _children(conn: Connection, path: str) -> list[str]:
    def op(client: KazooClient, _retrying: bool) -> list[str]:
        try:
            return sorted(conn.wait(client.get_children_async(path)))
        except NoNodeError:
            return []

    return conn.call(f"list {path}", op)


def _children_data(conn: Connection, path: str) -> list[tuple[str, bytes]]:
    """``(name, data)`` of each child of ``path`` (none if it has none or is gone)."""
    names = _children(conn, path)

    def op(client: KazooClient, _retrying: bool) -> list[tuple[str, bytes]]:
        found = _gather(conn, [client.get_async(paths.join(path, name)) for name in names])
        return [(name, result[0] or b"") for name, result in zip(names, found)
                if result is not None]

    return conn.call(f"read the children of {path}", op)


def _gather(conn: Connection, pending: list[Any]) -> list[Any]:
    """The results of requests sent together, None for a node that is gone."""
    results = []
    for async_result in pending:
        try:
            results.append(conn.wait(async_result))
        except NoNodeError:
            results.append(None)
    return results


def _read_tree(client: KazooClient, conn: Connection, top: str
               ) -> Iterator[tuple[str, bytes, int]]:
    """``(path relative to top, data, version)`` of ``top`` and every node below it,
    parents first (a level at a time; a node deleted meanwhile is left out)."""
    level = [""]
    while level:
        nodes = []
        for start in range(0, len(level), _REQUESTS_IN_FLIGHT_MAX):
            window = level[start:start + _REQUESTS_IN_FLIGHT_MAX]
            reads = _gather(conn, [client.get_async(top + rel) for rel in window])
            lists = _gather(conn, [client.get_children_async(top + rel) for rel in window])
            for rel, read, names in zip(window, reads, lists):
                if read is None or names is None:
                    continue
                yield rel, read[0] or b"", read[1].version
                nodes += [f"{rel}/{name}" for name in sorted(names)]
        level = nodes


# -- the steps --------------------------------------------------------------------------


@contextlib.contextmanager
def _lock(conn: Connection, root: str) -> Iterator[None]:
    """Hold the migration lock of ``root`` (waiting up to LOCK_WAIT_S for another
    process's)."""
    path = paths.join(root, LOCK_NAME)
    deadline = time.monotonic() + LOCK_WAIT_S

    def take(client: KazooClient, retrying: bool) -> bool:
        try:
            conn.wait(client.create_async(path, b"", ephemeral=True))
        except NodeExistsError:
            if not retrying:
                return False
            found = conn.wait(client.exists_async(path))
            return found is not None and found.ephemeralOwner == conn.session_id
        return True

    while not conn.call(f"lock {path}", take):
        if time.monotonic() > deadline:
            raise MetadataUnavailable(f"{conn.address}: another process has been moving "
                                      f"the logs of {root} for over {LOCK_WAIT_S:.0f} s "
                                      f"(it holds {path}); try again later")
        time.sleep(_LOCK_POLL_S)

    def release(client: KazooClient, _retrying: bool) -> None:
        found = conn.wait(client.exists_async(path))
        if found is None or found.ephemeralOwner != conn.session_id:
            return  # lost with an expired session: another migrator's now, or no one's
        try:
            conn.wait(client.delete_async(path, found.version))
        except (NoNodeError, BadVersionError):
            pass

    try:
        yield
    finally:
        with contextlib.suppress(MetadataError):
            conn.call(f"unlock {path}", release)


#: A migration's fence: the namespace node and the version it has while this migrator
#: holds the migration (:func:`_take_over`).
Fence = tuple[str, int]


class _TakenOver(MetadataError):
    pass


def _taken_over(conn: Connection, namespace: str) -> _TakenOver:
    return _TakenOver(f"{conn.address}: another process took over moving the logs into "
                      f"{namespace} (this one lost its ZooKeeper session, and the lock "
                      "with it): this one stopped; open the cluster again")


def _take_over(conn: Connection, root: str) -> int:
    """Change the version of the namespace node (made if it is missing), which every
    later write of this migration checks; the version."""
    namespace = namespace_path(root)

    def op(client: KazooClient, _retrying: bool) -> int:
        for _ in range(_TAKE_OVER_ATTEMPTS_MAX):
            try:
                data, stat = conn.wait(client.get_async(namespace))
            except NoNodeError:
                with contextlib.suppress(NodeExistsError):
                    conn.wait(client.create_async(namespace, b"", makepath=True))
                continue
            if data in (READY, CLEANING):
                raise _taken_over(conn, namespace)
            try:
                return int(conn.wait(client.set_async(namespace, data, stat.version))
                           .version)
            except BadVersionError:
                continue
        raise _taken_over(conn, namespace)

    return conn.call(f"take over moving the logs into {namespace}", op)


def _commit_fenced(conn: Connection, client: KazooClient, fence: Fence,
                   add: Any) -> None:
    """One transaction: the check of ``fence``, then the operations ``add(txn)`` adds.
    _TakenOver if the check fails; another failure raised as kazoo's error."""
    txn = client.transaction()
    txn.check(fence[0], fence[1])
    add(txn)
    results = conn.wait(txn.commit_async())
    failed = [r for r in results if isinstance(r, Exception)
              and not isinstance(r, (RolledBackError, RuntimeInconsistency))]
    if failed and isinstance(results[0], BadVersionError):
        raise _taken_over(conn, fence[0])
    if failed:
        raise failed[0]


def _batches(nodes: list[tuple[str, bytes]]) -> Iterator[list[tuple[str, bytes]]]:
    """``nodes`` in order, in transactions of at most _REQUESTS_IN_FLIGHT_MAX nodes and
    _TRANSACTION_BYTES_MAX bytes (a larger node alone)."""
    batch: list[tuple[str, bytes]] = []
    size = 0
    for path, data in nodes:
        cost = len(path) + len(data) + _SWITCH_OP_OVERHEAD_BYTES
        if batch and (len(batch) == _REQUESTS_IN_FLIGHT_MAX
                      or size + cost > _TRANSACTION_BYTES_MAX):
            yield batch
            batch, size = [], 0
        batch.append((path, data))
        size += cost
    if batch:
        yield batch


def _create_all(conn: Connection, client: KazooClient, fence: Fence,
                nodes: list[tuple[str, bytes]]) -> None:
    """Create ``nodes`` (parents first) in one transaction checking ``fence``."""
    _commit_fenced(conn, client, fence, lambda txn: [txn.create(path, data)
                                                     for path, data in nodes])


def _make(conn: Connection, path: str, fence: Fence) -> None:
    """Create ``path`` (its parent exists) under ``fence``, unless it exists."""
    def op(client: KazooClient, _retrying: bool) -> None:
        with contextlib.suppress(NodeExistsError):
            _commit_fenced(conn, client, fence, lambda txn: txn.create(path, b""))

    conn.call(f"create {path}", op)


def _check_switch_size(conn: Connection, source: str, target: str,
                       names: list[str]) -> None:
    size = sum(len(paths.join(source, name)) + len(_moved(paths.join(target, name)))
               + _SWITCH_OP_OVERHEAD_BYTES for name in names)
    if size > SWITCH_BYTES_MAX:
        raise MetadataError(f"{conn.address}: moving the {len(names)} logs of {source} "
                            f"takes a ZooKeeper transaction of {size} bytes, over "
                            f"SWITCH_BYTES_MAX={SWITCH_BYTES_MAX}: delete the logs no "
                            "longer needed with the former pybk, then open it again")


def _delete_below(conn: Connection, top: str, fence: Fence | None = None) -> int:
    """Delete every node below ``top`` (not ``top``), in transactions checking ``fence``
    if given; how many."""
    def op(client: KazooClient, _retrying: bool) -> int:
        return _delete_tree(conn, client, top, fence, keep_top=True)

    return conn.call(f"delete the records below {top}", op)


def _delete_tree(conn: Connection, client: KazooClient, top: str, fence: Fence | None,
                 keep_top: bool) -> int:
    below = [top + rel for rel, _data, _version in _read_tree(client, conn, top)
             if rel or not keep_top]
    below.reverse()  # children before their parents
    for start in range(0, len(below), _REQUESTS_IN_FLIGHT_MAX):
        window = below[start:start + _REQUESTS_IN_FLIGHT_MAX]
        if fence is None:
            _gather(conn, [client.delete_async(path) for path in window])
        else:
            _commit_fenced(conn, client, fence, lambda txn, window=window: [
                txn.delete(path) for path in window])
    return len(below)


def _copy_tree(conn: Connection, source: str, target: str, fence: Fence) -> int:
    """Copy ``source`` and every node below it to ``target`` (which does not exist; its
    parent does), in transactions checking ``fence``; the version of ``source`` as read
    before the nodes below it."""
    def op(client: KazooClient, retrying: bool) -> int:
        if retrying:  # what an attempt whose connection was lost made goes first
            _delete_tree(conn, client, target, fence, keep_top=False)
        nodes = iter(_read_tree(client, conn, source))
        head = next(nodes, None)
        if head is None:
            raise MetadataError(f"{conn.address}: {source} was deleted while it was being "
                                "moved: a pybk of the former layout is running; stop it "
                                "and open the cluster again")
        _rel, data, version = head
        # Parents before their children, in one transaction or an earlier one.
        copies = [(target, data)] + [(target + rel, data) for rel, data, _v in nodes]
        for batch in _batches(copies):
            _create_all(conn, client, fence, batch)
        return version

    return conn.call(f"copy {source} to {target}", op)


def _fence(conn: Connection, path: str) -> None:
    """Take the CREATE and WRITE permissions out of every entry of the ACL of ``path``,
    keeping READ, DELETE and ADMIN for the same identities (nothing if it is gone or
    fenced already; a warning if this client may not change its ACL)."""
    def op(client: KazooClient, _retrying: bool) -> None:
        try:
            acls, _stat = conn.wait(client.get_acls_async(path))
        except NoNodeError:
            return
        fenced = [ACL(acl.perms & ~_FENCED_OUT, acl.id) for acl in acls]
        if fenced != list(acls):
            conn.wait(client.set_acls_async(path, fenced))

    try:
        conn.call(f"fence {path}", op)
    except NoNodeError:
        pass  # deleted since its ACL was read
    except NoAuthError:
        log.warning("%s: %s cannot be fenced (this client may not change its ACL): a pybk "
                    "of the former layout still running can write there what no cluster "
                    "reads; stop every such process", conn.address, path)


def _moved(target: str) -> bytes:
    """The moved record that replaces a head copied to ``target``."""
    return seal(MOVED_MAGIC, MOVED_VERSION, {"moved_to": target})


def _switch(conn: Connection, root: str, source: str, target: str,
            versions: dict[str, int], fence: int) -> bool:
    """Step 3: False if a head moved on since it was copied."""
    namespace = namespace_path(root)

    def op(client: KazooClient, retrying: bool) -> bool:
        data, _stat = conn.wait(client.get_async(namespace))
        if data in (READY, CLEANING):
            if retrying:
                return True  # an earlier attempt took effect; its answer was lost
            raise MetadataError(f"{conn.address}: {root} was moved to pybk's current "
                                "layout by another process meanwhile, not holding "
                                f"{paths.join(root, LOCK_NAME)}")
        txn = client.transaction()
        txn.set_data(namespace, CLEANING, fence)  # first: its failure is a takeover
        for name, version in versions.items():
            txn.set_data(paths.join(source, name), _moved(paths.join(target, name)), version)
        results = conn.wait(txn.commit_async())
        failed = [r for r in results if isinstance(r, Exception)
                  and not isinstance(r, (RolledBackError, RuntimeInconsistency))]
        if not failed:
            return True
        if isinstance(results[0], BadVersionError):
            raise _taken_over(conn, namespace)
        if isinstance(failed[0], BadVersionError):
            return False
        raise failed[0]

    return conn.call(f"switch {root} to pybk's current layout", op)


def _clean(conn: Connection, root: str) -> None:
    """Step 4: fence each moved head naming this cluster and delete the records below
    it; fence ``<parent>/logs`` if no cluster of the former layout is left beside this
    one and it holds only pybk's records; then mark the namespace READY."""
    parent = paths.split(root)[0]
    source = paths.join(parent, FORMER_LOGS_NAME)
    mine = paths.join(namespace_path(root), FORMER_LOGS_NAME) + "/"
    deleted = 0
    foreign = []
    for name, data in _children_data(conn, source):
        if not data.startswith(MOVED_MAGIC):
            if not data.startswith(_LOG_MAGIC):
                foreign.append(name)
            continue
        try:
            moved_to = unseal(data, MOVED_MAGIC, MOVED_VERSION, _MOVED_KEYS,
                              "moved log record")["moved_to"]
        except MalformedMetadata as e:
            log.warning("%s: %s/%s: %s; left as it is", conn.address, source, name, e)
            continue
        if isinstance(moved_to, str) and moved_to.startswith(mine):
            _fence(conn, paths.join(source, name))  # first: nothing is made below it after
            deleted += _delete_below(conn, paths.join(source, name))
    if source != root and not _former_clusters(conn, parent, root):
        if foreign:
            log.warning("%s: %s holds nodes that are no pybk records (%s): it is left open, "
                        "so a pybk of the former layout still running can make a log there "
                        "that no cluster reads; stop every such process", conn.address,
                        source, ", ".join(foreign[:10]))
        else:
            _fence(conn, source)
    conn.call(f"finish moving the logs of {root}", lambda client, _retrying: conn.wait(
        client.set_async(namespace_path(root), READY)))
    if deleted:
        log.info("%s: deleted the %d records below the moved heads in %s", conn.address,
                 deleted, source)
