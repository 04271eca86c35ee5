"""The embedded metadata store: the contract of :mod:`pybk.meta.interface` in one directory
of one process, with no server.  The default for an embedded WAL.

Files in the directory
    ``LOCK``                an empty file; the open store holds an exclusive ``flock`` on
                            it, so a second store on the directory (in this process or
                            another) is refused with DirectoryLocked.  The kernel drops the
                            lock when the process dies, even by kill -9.
    ``data.mdb``, ``lock.mdb``   an LMDB environment with three tables:

``records``
    key: the parent's path in UTF-8, one NUL byte, the record's name in UTF-8
    (``/ledgers/L0000000007`` -> ``b"/ledgers\\x00L0000000007"``, ``/ledgers`` ->
    ``b"/\\x00ledgers"``).  Names hold no NUL, so a record's children are exactly the
    keys that start with its path and a NUL: listing them is one range scan, and no
    deeper descendant falls in the range.
    value: version (8, unsigned, big-endian), flags (1: bit 0 ephemeral, other bits 0),
    then the data.

``ephemerals``
    key: the key of an ephemeral record; value: empty.  Ends a session without a scan.

``meta``
    ``format``: 2 bytes, big-endian, this layout's number (1); a store refuses others.
    ``next_ledger_id``: 8 bytes, big-endian, the next id :meth:`next_ledger_id` returns.
    ``sequence\\x00<parent path>``: 8 bytes, big-endian, the next sequence number
    :meth:`create_sequential` appends under that parent (from 0; never reset, so a
    number is not handed out twice even after the parent was deleted).
    A new store starts at a random multiple of 2**20 below 2**60 (:func:`first_ledger_id`),
    not at 0: an embedded WAL promoted into a cluster brings its ledgers' metadata along
    under their ids, and those must not collide with the ids the cluster's ZooKeeper
    hands out (0, 1, 2, ...) or with another promoted WAL's.

Atomicity and durability
    Every mutating call is one LMDB write transaction that checks (the CAS) and writes,
    committed with LMDB's default ``sync=True, metasync=True``: the new pages are fsync'd,
    then the meta page that points at them.  LMDB never overwrites live pages (copy on
    write, two alternating meta pages), so a crash at any moment (kill -9 or power loss)
    leaves the state of the last committed transaction: every record at its old or its
    new version, never a mix, and a returned call survives.

Sessions
    The store object is the session.  :meth:`close` deletes its ephemeral records; after
    a crash, the next open deletes the dead session's (only one store can have the
    directory open, so whatever is in ``ephemerals`` then belongs to a dead session).

Cookies
    Kept like any record, with the ZooKeeper store's contract
    (:meth:`~pybk.meta.interface.MetadataStore.read_cookie` and its siblings), not as a
    no-op: a bookie node given this store checks its cookie here just as against
    ZooKeeper, which catches wiped or foreign bookie disks whenever the store's
    directory is not on them.  (An embedded WAL keeps store and bookie in one directory
    and checks none; see :mod:`pybk.meta.interface`.)

Read-only stores
    ``EmbeddedMetadataStore(directory, read_only=True)`` reads a store that another
    process may have open and be writing: it takes no ``LOCK``, registers in LMDB's reader
    table as LMDB's readers in other processes do (the writer never waits for it, and
    never reuses pages its read transactions see), sees each write once it is committed,
    and refuses every change with MetadataError.  Its watches hear nothing (the writer's
    changes reach other processes only as new reads).

Threads
    Any thread may call any method.  Writes are serialised by one lock (LMDB allows one
    writer anyway) and publish their watch events while holding it, so watch callbacks run
    in commit order; reads run concurrently in their own read transactions.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import struct
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence, TypeVar

import lmdb

from pybk.errors import BadVersion, DirectoryLocked, MetadataError, NodeExists, NoNode
from pybk.fileio import fsync_directory, lock_file
from pybk.meta import paths
from pybk.meta.interface import (
    ANY_VERSION,
    SEQUENCE_DIGITS,
    MetadataStore,
    check_batch,
    check_data,
    check_page_size,
    check_version,
    sequential_prefix,
)
from pybk.meta.layout import LIST_PAGE_NAMES
from pybk.meta.watches import Notifier, Watch, WatchCallback

log = logging.getLogger(__name__)

T = TypeVar("T")

FORMAT = 1
_RECORD = struct.Struct(">QB")
assert _RECORD.size == 9, "a record value is documented as version (8), flags (1), data"
_U64 = struct.Struct(">Q")
_FORMAT_VALUE = struct.Struct(">H")
_FLAG_EPHEMERAL = 1
_FORMAT_KEY = b"format"
_NEXT_LEDGER_ID_KEY = b"next_ledger_id"
_SEQUENCE_KEY_PREFIX = b"sequence\0"
LOCK_FILE = "LOCK"

# LMDB reserves address space, not disk: the file grows only as the records do.
_MAP_SIZE_BYTES = 1 << 36
_MAX_READERS = 256  # concurrent read transactions (one per reading thread at a time)


def first_ledger_id() -> int:
    """Where a new embedded store's ledger ids start (see the module docstring)."""
    return (1 + secrets.randbelow((1 << 40) - 1)) << 20


def _key(path: str) -> bytes:
    parent, name = paths.split(path)
    return parent.encode() + b"\0" + name.encode()


def _children_prefix(path: str) -> bytes:
    return path.encode() + b"\0"


def _path(key: bytes) -> str:
    parent, name = key.split(b"\0")
    return paths.join(parent.decode(), name.decode())


def _with_parents(created_or_deleted: list[str]) -> list[str]:
    """The paths whose watches a creation or deletion of these records concerns."""
    return [p for path in created_or_deleted for p in (paths.split(path)[0], path)]


class EmbeddedMetadataStore(MetadataStore):
    """The metadata store in ``directory`` (created if missing).  See the module docstring."""

    def __init__(self, directory: str | os.PathLike, read_only: bool = False) -> None:
        self.directory = os.fspath(directory)
        self.read_only = read_only
        self._lock_fd = -1  # a read-only store takes no lock
        if not read_only:
            os.makedirs(self.directory, exist_ok=True)
            lock_path = os.path.join(self.directory, LOCK_FILE)
            try:
                self._lock_fd = lock_file(lock_path)
            except BlockingIOError:
                raise DirectoryLocked(f"{lock_path} is locked: another metadata store (in "
                                      "this or another process) has this directory "
                                      "open") from None
        self._env: lmdb.Environment  # set first below, then closed if a later step fails
        dead: list[str] = []
        try:
            self._env = lmdb.open(self.directory, map_size=_MAP_SIZE_BYTES, max_dbs=3,
                                  max_readers=_MAX_READERS, readahead=False,
                                  readonly=read_only, create=not read_only)
            # Free the slots of readers (read-only stores) killed inside a read
            # transaction, which would keep writers from reusing the pages they saw.
            self._env.reader_check()
            self._records, self._ephemerals, self._meta = (
                self._env.open_db(name, create=not read_only)
                for name in (b"records", b"ephemerals", b"meta"))
            with self._env.begin(write=not read_only) as txn:
                self._check_format(txn)
                if not read_only:
                    dead = self._delete_ephemerals(txn)
            if not read_only:
                fsync_directory(self.directory)  # the LMDB files' names, made at first open
        except BaseException as e:
            if hasattr(self, "_env"):
                self._env.close()
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
            if isinstance(e, lmdb.Error):
                raise MetadataError(f"cannot open the metadata store in {self.directory}: "
                                    f"{e}") from e
            raise
        if dead:
            log.info("%s: deleted the ephemeral records of a session that ended in a "
                     "crash: %s", self.directory, ", ".join(dead))
        self._write_lock = threading.Lock()
        self._state = threading.Condition()
        self._users = 0
        self._closed = False
        self._notifier = Notifier(f"pybk-meta-watch {os.path.basename(self.directory)}")

    def _check_format(self, txn: lmdb.Transaction[bytes]) -> None:
        stored = txn.get(_FORMAT_KEY, db=self._meta)
        if stored is None:
            if txn.stat(self._records)["entries"]:
                raise MetadataError(f"{self.directory} holds records but no format marker: "
                                    "it was not written by pybk's embedded store")
            if self.read_only:
                return
            txn.put(_FORMAT_KEY, _FORMAT_VALUE.pack(FORMAT), db=self._meta)
        elif stored != _FORMAT_VALUE.pack(FORMAT):
            raise MetadataError(f"{self.directory} holds metadata in format {stored.hex()}; "
                                f"this pybk reads format {FORMAT} only")

    def _delete_ephemerals(self, txn: lmdb.Transaction[bytes]) -> list[str]:
        """Delete every ephemeral record; return their paths."""
        keys = list(txn.cursor(db=self._ephemerals).iternext(values=False))
        for key in keys:
            txn.delete(key, db=self._records)
            txn.delete(key, db=self._ephemerals)
        return [_path(key) for key in keys]

    # -- the calling discipline ------------------------------------------------------

    @contextmanager
    def _using(self) -> Iterator[lmdb.Environment]:
        """Admit one call while the store is open (close waits for it to finish)."""
        with self._state:
            if self._closed:
                raise MetadataError(f"the metadata store in {self.directory} is closed")
            self._users += 1
        try:
            yield self._env
        except lmdb.Error as e:
            raise MetadataError(f"metadata store {self.directory}: {e}") from e
        finally:
            with self._state:
                self._users -= 1
                if not self._users:
                    self._state.notify_all()

    def _read(self, op: Callable[[lmdb.Transaction[bytes]], T]) -> T:
        with self._using() as env, env.begin() as txn:
            return op(txn)

    def _write(self, op: Callable[[lmdb.Transaction[bytes]], tuple[T, list[str]]]) -> T:
        """Run ``op`` in one durable write transaction; ``op`` returns (result, changed
        paths).  An exception from ``op`` aborts the transaction: nothing changes."""
        if self.read_only:
            raise MetadataError(f"the metadata store in {self.directory} is open read-only: "
                                "only the process that owns it changes it")
        with self._using() as env, self._write_lock:
            with env.begin(write=True) as txn:
                result, changed = op(txn)
            self._notifier.publish(dict.fromkeys(changed))
        return result

    def _record(self, txn: lmdb.Transaction[bytes], path: str) -> tuple[int, int, bytes]:
        """``(version, flags, data)`` of the record at ``path``; raises NoNode."""
        value = txn.get(_key(path), db=self._records)
        if value is None:
            raise NoNode(f"no record at {path}")
        version, flags = _RECORD.unpack_from(value)
        return version, flags, value[_RECORD.size:]

    @staticmethod
    def _check_expected(path: str, version: int, expected_version: int) -> None:
        if expected_version not in (ANY_VERSION, version):
            raise BadVersion(f"{path} is at version {version}, not the expected "
                             f"{expected_version}: it changed since it was read")

    # -- records -------------------------------------------------------------------------

    def create(self, path: str, data: bytes, ephemeral: bool = False) -> int:
        paths.check_path(path)
        data = check_data(data)
        return self._write(lambda txn: (0, self._create(txn, path, data, ephemeral)))

    def create_many(self, records: Sequence[tuple[str, bytes]]) -> None:
        batch = check_batch(records)
        if not batch:
            return

        def op(txn: lmdb.Transaction[bytes]) -> tuple[None, list[str]]:
            # One transaction: one fsync for the batch, and nothing of it if a create fails.
            return None, [p for path, data in batch for p in self._create(txn, path, data,
                                                                         False)]

        self._write(op)

    def create_sequential(self, prefix: str, data: bytes, ephemeral: bool = False) -> str:
        parent, name_prefix = sequential_prefix(prefix)
        data = check_data(data)

        def op(txn: lmdb.Transaction[bytes]) -> tuple[str, list[str]]:
            key = _SEQUENCE_KEY_PREFIX + parent.encode()
            stored = txn.get(key, db=self._meta)
            number = _U64.unpack(stored)[0] if stored is not None else 0
            if number >= 10 ** SEQUENCE_DIGITS:
                raise MetadataError(f"the sequence numbers of {parent} are used up")
            txn.put(key, _U64.pack(number + 1), db=self._meta)
            path = paths.join(parent, f"{name_prefix}{number:0{SEQUENCE_DIGITS}d}")
            return path, self._create(txn, path, data, ephemeral)

        return self._write(op)

    def _create(self, txn: lmdb.Transaction[bytes], path: str, data: bytes,
                ephemeral: bool) -> list[str]:
        """Create the record and its missing ancestors in ``txn``; the changed paths."""
        key = _key(path)
        if txn.get(key, db=self._records) is not None:
            raise NodeExists(f"a record exists at {path} already")
        created = []
        for ancestor in paths.ancestors(path):
            value = txn.get(_key(ancestor), db=self._records)
            if value is None:
                txn.put(_key(ancestor), _RECORD.pack(0, 0), db=self._records)
                created.append(ancestor)
            elif _RECORD.unpack_from(value)[1] & _FLAG_EPHEMERAL:
                raise MetadataError(f"cannot create {path}: {ancestor} is ephemeral, "
                                    "and ephemeral records have no children")
        flags = _FLAG_EPHEMERAL if ephemeral else 0
        txn.put(key, _RECORD.pack(0, flags) + data, db=self._records)
        if ephemeral:
            txn.put(key, b"", db=self._ephemerals)
        created.append(path)
        return _with_parents(created)

    def get(self, path: str) -> tuple[bytes, int]:
        paths.check_path(path)

        def op(txn: lmdb.Transaction[bytes]) -> tuple[bytes, int]:
            version, _flags, data = self._record(txn, path)
            return data, version

        return self._read(op)

    def set(self, path: str, data: bytes, expected_version: int) -> int:
        paths.check_path(path)
        data = check_data(data)
        check_version(expected_version)

        def op(txn: lmdb.Transaction[bytes]) -> tuple[int, list[str]]:
            version, flags, _old = self._record(txn, path)
            self._check_expected(path, version, expected_version)
            txn.put(_key(path), _RECORD.pack(version + 1, flags) + data, db=self._records)
            return version + 1, [path]

        return self._write(op)

    def set_and_delete(self, path: str, data: bytes, expected_version: int,
                       delete_path: str) -> int:
        paths.check_path(path)
        paths.check_path(delete_path)
        data = check_data(data)
        check_version(expected_version)

        def op(txn: lmdb.Transaction[bytes]) -> tuple[int, list[str]]:
            version, flags, _old = self._record(txn, path)
            self._check_expected(path, version, expected_version)
            changed = [path]
            if txn.get(_key(delete_path), db=self._records) is not None:
                changed += self._delete(txn, delete_path)
            txn.put(_key(path), _RECORD.pack(version + 1, flags) + data, db=self._records)
            return version + 1, changed

        return self._write(op)

    def delete(self, path: str, expected_version: int) -> None:
        paths.check_path(path)
        check_version(expected_version)

        def op(txn: lmdb.Transaction[bytes]) -> tuple[None, list[str]]:
            version, _flags, _data = self._record(txn, path)
            self._check_expected(path, version, expected_version)
            return None, self._delete(txn, path)

        self._write(op)

    def _delete(self, txn: lmdb.Transaction[bytes], path: str) -> list[str]:
        """Delete the record at ``path`` (it is there) in ``txn``; the changed paths.
        Raises MetadataError if it has children."""
        prefix = _children_prefix(path)
        cursor = txn.cursor(db=self._records)
        if cursor.set_range(prefix) and cursor.key().startswith(prefix):
            raise MetadataError(f"cannot delete {path}: it has children (first: "
                                f"{_path(cursor.key())}); delete them first")
        txn.delete(_key(path), db=self._records)
        txn.delete(_key(path), db=self._ephemerals)
        return _with_parents([path])

    def children(self, path: str) -> list[str]:
        paths.check_path(path, root_ok=True)

        def op(txn: lmdb.Transaction[bytes]) -> list[str]:
            if path != paths.ROOT:
                self._record(txn, path)
            prefix = _children_prefix(path)
            names = []
            cursor = txn.cursor(db=self._records)
            if cursor.set_range(prefix):
                for key in cursor.iternext(values=False):
                    if not key.startswith(prefix):
                        break
                    names.append(key[len(prefix):].decode())
            return names

        return self._read(op)

    def iter_children(self, path: str, page_size: int = LIST_PAGE_NAMES) -> Iterator[str]:
        """Pages of ``page_size`` names, each one cursor scan in a read transaction of its
        own (so that no transaction stays open while the caller works on a page), each
        starting after the last name of the page before."""
        paths.check_path(path, root_ok=True)
        check_page_size(page_size)
        prefix = _children_prefix(path)
        after: bytes | None = None
        while True:
            page = self._read(functools.partial(self._children_page, path=path,
                                                prefix=prefix, after=after,
                                                page_size=page_size))
            yield from (name[len(prefix):].decode() for name in page)
            if len(page) < page_size:
                return
            after = page[-1]

    def _children_page(self, txn: lmdb.Transaction[bytes], path: str, prefix: bytes,
                       after: bytes | None, page_size: int) -> list[bytes]:
        """The keys of up to ``page_size`` children of ``path`` after the key ``after``
        (from the first if None).  Raises NoNode on the first page if ``path`` has no
        record."""
        if after is None and path != paths.ROOT:
            self._record(txn, path)
        cursor = txn.cursor(db=self._records)
        if not cursor.set_range(after if after is not None else prefix):
            return []
        keys: list[bytes] = []
        for key in cursor.iternext(values=False):
            if key == after:
                continue
            if not key.startswith(prefix) or len(keys) == page_size:
                break
            keys.append(key)
        return keys

    def exists(self, path: str) -> bool:
        paths.check_path(path, root_ok=True)
        return self._read(lambda txn: path == paths.ROOT
                          or txn.get(_key(path), db=self._records) is not None)

    def watch(self, path: str, callback: WatchCallback) -> Watch:
        paths.check_path(path, root_ok=True)
        if not callable(callback):
            raise MetadataError(f"watch callback {callback!r} is not callable")
        with self._using():
            return self._notifier.add(path, callback)

    # -- ledger ids ------------------------------------------------------------------------

    def next_ledger_id(self) -> int:
        def op(txn: lmdb.Transaction[bytes]) -> tuple[int, list[str]]:
            stored = txn.get(_NEXT_LEDGER_ID_KEY, db=self._meta)
            ledger_id = _U64.unpack(stored)[0] if stored is not None else first_ledger_id()
            txn.put(_NEXT_LEDGER_ID_KEY, _U64.pack(ledger_id + 1), db=self._meta)
            return ledger_id, []

        return self._write(op)

    # -- life cycle --------------------------------------------------------------------------

    def close(self) -> None:
        with self._state:
            if self._closed:
                return
            self._closed = True
            while self._users:  # calls in progress finish; new ones are refused
                self._state.wait()
        try:
            if not self.read_only:
                with self._env.begin(write=True) as txn:
                    deleted = self._delete_ephemerals(txn)
                self._notifier.publish(dict.fromkeys(_with_parents(deleted)))
        except lmdb.Error:
            log.exception("%s: could not delete this session's ephemeral records; the next "
                          "open deletes them", self.directory)
        finally:
            self._notifier.close()
            self._env.close()
            if self._lock_fd >= 0:
                os.close(self._lock_fd)

    def __repr__(self) -> str:
        return f"EmbeddedMetadataStore({self.directory!r})"
