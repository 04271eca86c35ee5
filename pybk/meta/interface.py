"""The contract every metadata store keeps (embedded, ZooKeeper).

Records
    A record is bytes at a path (see :mod:`pybk.meta.paths`) with a version: 0 when it
    is created, one more at every :meth:`~MetadataStore.set`.  Records form a tree, as
    in ZooKeeper: :meth:`~MetadataStore.create` makes the missing ancestors too, as
    empty persistent records (like kazoo's ``makepath=True``), in the same atomic step;
    :meth:`~MetadataStore.delete` refuses a record that has children.  Data is at most
    :data:`MAX_DATA_BYTES`, so that any request fits ZooKeeper's default packet limit.

Sequential records
    :meth:`~MetadataStore.create_sequential` creates a record whose name is the given
    prefix followed by a sequence number of :data:`SEQUENCE_DIGITS` decimal digits
    (ZooKeeper's ``PERSISTENT_SEQUENTIAL`` and ``EPHEMERAL_SEQUENTIAL``): under one
    parent the numbers increase with every sequential create and are never handed out
    twice while the parent exists, so names sorted by their number are in creation
    order.  Elections are built on ephemeral ones (the lowest live number wins).

Compare-and-set
    ``create`` succeeds only if the path is free (else :class:`NodeExists`); ``set``
    and ``delete`` only if the record's version is ``expected_version`` (else
    :class:`BadVersion`; :data:`ANY_VERSION` skips the check, as -1 does in ZooKeeper).
    A missing record raises :class:`NoNode`.  Each call is atomic and durable when it
    returns.  Concurrent calls are linearizable: of several CAS calls that expect the
    same version, exactly one wins.

A set with a delete
    :meth:`~MetadataStore.set_and_delete` compare-and-sets one record and deletes another
    (if it is there) in one atomic step: a record that says how far a walk got moves on
    together with the deletion of the record that carried the walk there.

Batches
    :meth:`~MetadataStore.create_many` creates many persistent records (and their missing
    ancestors; a record's parent in the batch comes before it) in one atomic, durable
    step: all of them, or none if one path holds a record (:class:`NodeExists` naming
    it; a path given twice is one of those) or cannot be created.  It is one LMDB
    transaction on the embedded store and one ZooKeeper ``multi`` on ZooKeeper, so a
    batch is bounded: at most :data:`MAX_BATCH_RECORDS` records and
    :data:`MAX_BATCH_BYTES` (as :func:`batch_bytes` counts; a single record always
    fits).  :func:`batches` cuts a longer list into batches, in order.  A writer of
    thousands of records pays one commit per batch instead of one per record.

Sessions and ephemeral records
    A store object is one session.  An ephemeral record (``create(..., ephemeral=True)``)
    is deleted when its session ends: at :meth:`~MetadataStore.close`, or when the
    process dies (the embedded store deletes a dead session's records when the directory
    is opened next; ZooKeeper when the session expires).  Ephemeral records have no
    children.  The bookie registry is built on them: a bookie is registered for as long
    as the store that registered it is open.  A registration record's data is the
    bookie's network endpoint (e.g. ``tcp://10.0.0.5:3181``) as UTF-8 text, like
    BookKeeper's BookieServiceInfo: clients find a bookie by its id through
    :meth:`~MetadataStore.bookie_endpoint`.

Cookies
    :meth:`~MetadataStore.read_cookie`, :meth:`~MetadataStore.write_cookie` and
    :meth:`~MetadataStore.remove_cookie` keep each bookie's cookie
    (:class:`~pybk.meta.cookies.Cookie`) at ``/ledgers/cookies/<bookie id>``, under
    compare-and-set like any record: writing a cookie for an id that has none is a
    create-if-absent, so of two bookies racing for one id exactly one wins.  A bookie
    node checks its cookie against the store's at every start (:mod:`pybk.cluster.cookies`).
    Both stores keep them alike: the checks are meaningful wherever the metadata does
    not live on the bookie's own disks (always with ZooKeeper; with an embedded store
    given to a node as its ``metadataServiceUri``).  An embedded WAL's bookie and
    metadata share one directory, which no cookie could tell apart from itself, so the
    WAL does not check one until it is promoted into a cluster.

Session changes
    A store whose session can break while it is open (ZooKeeper's) tells its session
    listeners (:meth:`~MetadataStore.add_session_listener`) of every change, as
    :class:`SessionState`; see :mod:`pybk.meta.zookeeper` for when.  The embedded
    store's session lasts until it is closed: its listeners are never called.

Watches
    :meth:`~MetadataStore.watch` is persistent until cancelled; see
    :mod:`pybk.meta.watches` for when callbacks run and on which thread.

Ledger ids
    :meth:`~MetadataStore.next_ledger_id` never returns the same id twice in the life of
    the store, across restarts and crashes; ids increase.

Ledger layout
    :attr:`~MetadataStore.layout` says where ledger metadata lives under ``/ledgers``
    (:mod:`pybk.meta.layout`): flat unless the store was formatted otherwise.

Listings that page
    :meth:`~MetadataStore.iter_children` yields a record's children in name order,
    reading at most ``page_size`` names at a time where the store can page: the embedded
    store reads each page in a read transaction of its own, starting after the last
    name of the page before.  ZooKeeper cannot page one parent (``getChildren`` answers
    with every child in one reply), so its pages are one parent each; layouts bound them
    by spreading records over many parents (:mod:`pybk.meta.layout`).  A listing is not
    one snapshot: a child created or deleted while it runs may be listed or not, but
    every child present from its start to its end is listed exactly once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import Enum
from typing import Callable, Iterable, Iterator, Self, Sequence

from pybk.errors import BookieUnavailable, MalformedMetadata, MetadataError, NodeExists, NoNode
from pybk.meta import paths
from pybk.meta.cookies import Cookie, cookie_path
from pybk.meta.layout import FLAT, LIST_PAGE_NAMES, LedgerLayout
from pybk.meta.watches import Watch, WatchCallback

ANY_VERSION = -1
#: Digits of the sequence number that :meth:`MetadataStore.create_sequential` appends
#: (ZooKeeper's: a zero-padded signed 32-bit counter).
SEQUENCE_DIGITS = 10
# ZooKeeper's default jute.maxbuffer (1 MiB - 1) bounds a whole request, not the data: the
# rest carries the path and, for a create that makes ancestors, every ancestor's create
# (at most about 75 KiB under MAX_PATH_BYTES).  128 KiB are left for them.
MAX_DATA_BYTES = 0xFFFFF - 128 * 1024
#: How many records one :meth:`MetadataStore.create_many` may create (a bound on a
#: ZooKeeper multi's work and on one LMDB write transaction's time).
MAX_BATCH_RECORDS = 2000
#: How large a :meth:`MetadataStore.create_many` batch may be, as :func:`batch_bytes`
#: counts: it fits ZooKeeper's request limit with the missing ancestors' creates, as a
#: single create does.
MAX_BATCH_BYTES = MAX_DATA_BYTES
# What one create adds to a ZooKeeper multi besides its path and data: the operation's
# header, lengths, the ACL and flags (about 40 bytes; rounded up).
_BATCH_RECORD_OVERHEAD_BYTES = 64


def check_data(data: bytes) -> bytes:
    """``data`` as bytes if a record can hold it, else MetadataError."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MetadataError(f"record data must be bytes, not {type(data).__name__}")
    if len(data) > MAX_DATA_BYTES:
        raise MetadataError(f"record data of {len(data)} bytes is over "
                            f"MAX_DATA_BYTES={MAX_DATA_BYTES}")
    return bytes(data)


def batch_bytes(records: Sequence[tuple[str, bytes]]) -> int:
    """The size of a :meth:`MetadataStore.create_many` batch against MAX_BATCH_BYTES: its
    paths and data plus a fixed overhead per record."""
    return sum(len(path.encode("utf-8")) + len(data) + _BATCH_RECORD_OVERHEAD_BYTES
               for path, data in records)


def check_batch(records: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """``records`` as a list of (path, data as bytes) if they make one
    :meth:`MetadataStore.create_many` batch (valid paths and data, at most
    MAX_BATCH_RECORDS, at most MAX_BATCH_BYTES unless a single record), else
    MetadataError."""
    checked = [(paths.check_path(path), check_data(data)) for path, data in records]
    places = {path: i for i, (path, _data) in enumerate(checked)}
    for i, (path, _data) in enumerate(checked):
        if any(places.get(ancestor, -1) > i for ancestor in paths.ancestors(path)):
            raise MetadataError(f"{path} comes before its ancestor in the batch: a batch "
                                "lists parents before their children")
    if len(checked) > MAX_BATCH_RECORDS:
        raise MetadataError(f"a batch of {len(checked)} records is over "
                            f"MAX_BATCH_RECORDS={MAX_BATCH_RECORDS}; cut it with batches()")
    if len(checked) > 1 and (size := batch_bytes(checked)) > MAX_BATCH_BYTES:
        raise MetadataError(f"a batch of {size} bytes is over MAX_BATCH_BYTES="
                            f"{MAX_BATCH_BYTES}; cut it with batches()")
    return checked


def batches(records: Iterable[tuple[str, bytes]]) -> Iterator[list[tuple[str, bytes]]]:
    """``records`` cut, in order, into the fewest batches that :meth:`MetadataStore.
    create_many` takes (each as large as the bounds allow)."""
    batch: list[tuple[str, bytes]] = []
    size = 0
    for record in records:
        record_size = batch_bytes([record])
        if batch and (len(batch) == MAX_BATCH_RECORDS or size + record_size > MAX_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(record)
        size += record_size
    if batch:
        yield batch


def check_page_size(page_size: int) -> int:
    """``page_size`` if it can be the size of a listing's page (a whole number over 0)."""
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
        raise MetadataError(f"page size {page_size!r} is not a whole number over 0")
    return page_size


def sequence_number(name: str) -> int:
    """The sequence number at the end of a sequential record's name; MalformedMetadata if
    it has none."""
    digits = name[-SEQUENCE_DIGITS:]
    if len(name) < SEQUENCE_DIGITS or not digits.isdigit():
        raise MalformedMetadata(f"{name!r} is not the name of a sequential record (it "
                                f"must end in {SEQUENCE_DIGITS} digits)")
    return int(digits)


def sequential_prefix(prefix: str) -> tuple[str, str]:
    """``(parent, name prefix)`` of a :meth:`MetadataStore.create_sequential` prefix
    (``/a/V_`` -> ``("/a", "V_")``, ``/a/`` -> ``("/a", "")``), checked: the names it
    makes must be valid."""
    if not isinstance(prefix, str):
        raise MetadataError(f"{prefix!r} is not a path prefix")
    parent, _, name_prefix = prefix.rpartition("/")
    paths.check_path(prefix + "0" * SEQUENCE_DIGITS)
    return parent or paths.ROOT, name_prefix


def check_version(version: int) -> int:
    """``version`` if it can be an expected version (>= 0, or ANY_VERSION)."""
    if not isinstance(version, int) or isinstance(version, bool) or version < ANY_VERSION:
        raise MetadataError(f"expected version {version!r} is neither a version (>= 0) "
                            "nor ANY_VERSION (-1)")
    return version


class SessionState(str, Enum):  # noqa: UP042 (StrEnum would change str() of a state)
    """What a session listener hears (see :mod:`pybk.meta.zookeeper`)."""

    CONNECTED = "connected"
    SUSPENDED = "suspended"
    EXPIRED = "expired"


SessionListener = Callable[[SessionState], None]


class MetadataStore(ABC):
    """Versioned records with compare-and-set, ledger ids, the bookie registry, watches.

    Thread-safe.  Close it (or use it as a context manager); every call after
    :meth:`close` raises :class:`~pybk.errors.MetadataError`.
    """

    #: Where ledger metadata lives; a store formatted with another layout overrides it.
    layout: LedgerLayout = FLAT

    # -- records -------------------------------------------------------------------

    @abstractmethod
    def create(self, path: str, data: bytes, ephemeral: bool = False) -> int:
        """Create the record (and its missing ancestors); return its version, 0.

        Raises NodeExists if the path holds a record, MetadataError if an ancestor is
        ephemeral."""

    @abstractmethod
    def create_many(self, records: Sequence[tuple[str, bytes]]) -> None:
        """Create the persistent records ``(path, data)`` and their missing ancestors, all
        in one atomic, durable step (see "Batches" in the module docstring).  Raises
        NodeExists if a path holds a record or is given twice, MetadataError if an
        ancestor is ephemeral or the batch is over the bounds (:func:`check_batch`);
        then none is created."""

    @abstractmethod
    def create_sequential(self, prefix: str, data: bytes, ephemeral: bool = False) -> str:
        """Create a record at ``prefix`` followed by the parent's next sequence number
        (``/a/V_`` -> ``/a/V_0000000007``), with its missing ancestors; return its path.
        Raises MetadataError if an ancestor is ephemeral."""

    @abstractmethod
    def get(self, path: str) -> tuple[bytes, int]:
        """The record's ``(data, version)``; raises NoNode."""

    def get_latest(self, path: str) -> tuple[bytes, int]:
        """As :meth:`get`, and at least as new as every write that any session of the
        store had completed when the call began (a check that must not act on an old
        answer: :mod:`pybk.cluster.admission`).  A store in one process reads the latest
        already; ZooKeeper's, whose servers may lag the leader, syncs first."""
        return self.get(path)

    @abstractmethod
    def set(self, path: str, data: bytes, expected_version: int) -> int:
        """Replace the record's data if its version is ``expected_version``; return the
        new version.  Raises BadVersion or NoNode."""

    @abstractmethod
    def delete(self, path: str, expected_version: int) -> None:
        """Delete the record if its version is ``expected_version``.  Raises BadVersion,
        NoNode, or MetadataError if it has children."""

    @abstractmethod
    def set_and_delete(self, path: str, data: bytes, expected_version: int,
                       delete_path: str) -> int:
        """Compare-and-set the record at ``path`` (as :meth:`set`) and delete the record at
        ``delete_path`` if there is one, in one atomic, durable step (one LMDB
        transaction; one ZooKeeper ``multi``); return the new version of ``path``.
        Raises BadVersion or NoNode for ``path``, MetadataError if ``delete_path`` has
        children: then neither changed by this call, except after a lost answer (as
        :meth:`set`): a step that landed, then met another write to ``path`` before the
        retry, is reported as BadVersion, so a caller re-reads to tell."""

    @abstractmethod
    def children(self, path: str) -> list[str]:
        """The names (not paths) of the record's children, sorted; the root is allowed.
        Raises NoNode."""

    def iter_children(self, path: str, page_size: int = LIST_PAGE_NAMES) -> Iterator[str]:
        """The names of the record's children in name order, read ``page_size`` at a time
        where the store can page (see "Listings that page" in the module docstring).
        Raises NoNode (when it is first advanced) if there is no record at ``path``.
        This default reads them all at once: a store that can page overrides it."""
        check_page_size(page_size)
        yield from self.children(path)

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether a record is at ``path`` (always true for the root)."""

    @abstractmethod
    def watch(self, path: str, callback: WatchCallback) -> Watch:
        """Call ``callback(path)`` after every change of the record at ``path`` (created,
        set, deleted) or of its set of children, until the returned watch is cancelled.
        The path need not exist yet; the root is allowed."""

    # -- ledger ids ------------------------------------------------------------------

    @abstractmethod
    def next_ledger_id(self) -> int:
        """A ledger id never handed out before by this store (0, 1, 2, ...)."""

    # -- the bookie registry ----------------------------------------------------------

    def register_bookie(self, bookie_id: str, read_only: bool = False,
                        endpoint: str = "", host: str = "", location: str = "") -> None:
        """Register the bookie as available (or read-only) for as long as this session
        lasts, with its network ``endpoint`` (a bookie of this process may have none),
        the ``host`` it runs on (none if empty; see :meth:`bookies_on_host`) and its
        network ``location`` (none if empty; see :meth:`bookie_location`), recorded
        before the registration so that placement never sees the bookie without it.
        Registering again moves it between the two lists or changes its endpoint;
        BookKeeper's order is kept: the new registration exists before the old one is
        removed."""
        paths.check_name(bookie_id)
        if bookie_id == paths.READONLY_NAME:
            raise MetadataError(f"{bookie_id!r} is reserved and cannot be a bookie id")
        if host:
            paths.check_name(host)
        data = check_data(endpoint.encode("utf-8"))
        new, old = paths.join(paths.AVAILABLE, bookie_id), paths.join(paths.READONLY, bookie_id)
        if read_only:
            new, old = old, new
        if location:
            self._create_registration(paths.join(paths.LOCATIONS, bookie_id),
                                      check_data(location.encode("utf-8")))
        self._create_registration(new, data)
        self._delete_if_present(old)
        if host:
            self._create_registration(paths.host_bookie(host, bookie_id), b"")

    def bookies_on_host(self, host: str) -> list[str]:
        """Bookies registered on ``host`` (writable or read-only), sorted.  A host record
        lives as long as the registration's session: it is not removed when the bookie
        turns read-only, so intersect with :meth:`bookies` for writable ones."""
        return sorted(self._children_or_none(paths.join(paths.HOSTS, paths.check_name(host))))

    def bookie_location(self, bookie_id: str) -> str | None:
        """The network location the bookie registered with (``/region/rack``), or None
        if it registered none (an older bookie, or one that is not registered)."""
        try:
            return self.get(paths.join(paths.LOCATIONS, paths.check_name(bookie_id)))[0] \
                .decode("utf-8")
        except NoNode:
            return None

    def bookie_endpoint(self, bookie_id: str) -> str:
        """The endpoint the bookie registered with ("" if it gave none).  Raises
        BookieUnavailable if the bookie is not registered (down, or never started)."""
        paths.check_name(bookie_id)
        for parent in (paths.AVAILABLE, paths.READONLY):
            try:
                return self.get(paths.join(parent, bookie_id))[0].decode("utf-8")
            except NoNode:
                continue
        raise BookieUnavailable(f"bookie {bookie_id} is not registered (neither available "
                                "nor read-only): it is down or was never started")

    def unregister_bookie(self, bookie_id: str, host: str = "") -> None:
        """Remove the bookie's registration (either kind) and its record on ``host``;
        harmless if there is none."""
        paths.check_name(bookie_id)
        self._delete_if_present(paths.join(paths.AVAILABLE, bookie_id))
        self._delete_if_present(paths.join(paths.READONLY, bookie_id))
        self._delete_if_present(paths.join(paths.LOCATIONS, bookie_id))
        if host:
            self._delete_if_present(paths.host_bookie(host, bookie_id))

    def bookies(self, read_only: bool | None = None) -> list[str]:
        """Registered bookie ids, sorted: writable ones (``False``), read-only ones
        (``True``) or all (``None``).  Watch :data:`~pybk.meta.paths.AVAILABLE` and
        :data:`~pybk.meta.paths.READONLY` to hear of changes."""
        found: set[str] = set()
        if read_only is not True:
            found.update(self._children_or_none(paths.AVAILABLE))
            found.discard(paths.READONLY_NAME)
        if read_only is not False:
            found.update(self._children_or_none(paths.READONLY))
        return sorted(found)

    def _create_registration(self, path: str, data: bytes) -> None:
        """Create the ephemeral registration record at ``path`` holding ``data``, or update
        the one there already.  A store whose records may belong to other sessions
        checks whose."""
        try:
            self.create(path, data, ephemeral=True)
        except NodeExists:  # registered there already
            if self.get(path)[0] != data:
                self.set(path, data, ANY_VERSION)

    def _delete_if_present(self, path: str) -> None:
        try:
            self.delete(path, ANY_VERSION)
        except NoNode:
            pass

    def _children_or_none(self, path: str) -> list[str]:
        try:
            return self.children(path)
        except NoNode:
            return []

    # -- cookies ----------------------------------------------------------------------

    def read_cookie(self, bookie_id: str) -> tuple[Cookie, int] | None:
        """The bookie's cookie and its record's version, or None if the store has none.
        Raises MalformedMetadata if the record holds no cookie of that bookie."""
        path = cookie_path(bookie_id)
        try:
            data, version = self.get(path)
        except NoNode:
            return None
        cookie = Cookie.from_bytes(data)
        if cookie.bookie_id != bookie_id:
            raise MalformedMetadata(f"{path} holds the cookie of bookie {cookie.bookie_id}, "
                                    f"not {bookie_id}")
        return cookie, version

    def write_cookie(self, cookie: Cookie, expected_version: int | None = None) -> int:
        """Write the cookie of ``cookie.bookie_id`` and return its record's version.
        ``expected_version`` None creates it if the bookie has none (NodeExists if it
        has); a version replaces the one at that version (BadVersion, NoNode)."""
        path = cookie_path(cookie.bookie_id)
        if expected_version is None:
            return self.create(path, cookie.to_bytes())
        return self.set(path, cookie.to_bytes(), expected_version)

    def remove_cookie(self, bookie_id: str, expected_version: int) -> None:
        """Delete the bookie's cookie if its version is ``expected_version``
        (:data:`ANY_VERSION`: whatever it is), e.g. to let new disks take the id of a
        bookie whose data is gone.  Raises BadVersion or NoNode."""
        self.delete(cookie_path(bookie_id), expected_version)

    # -- sessions -------------------------------------------------------------------------

    # Optional for a store: by default, there are no session changes to hear.
    def add_session_listener(self, listener: SessionListener) -> None:  # noqa: B027
        """Call ``listener(SessionState)`` at every change of this store's session (never,
        for a store whose session cannot break while it is open)."""

    def remove_session_listener(self, listener: SessionListener) -> None:  # noqa: B027
        """Stop calling a listener added by :meth:`add_session_listener`."""

    # -- life cycle ---------------------------------------------------------------------

    @abstractmethod
    def close(self) -> None:
        """End the session: delete its ephemeral records, deliver queued watch calls,
        cancel every watch and release the store.  Closing twice is harmless."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
