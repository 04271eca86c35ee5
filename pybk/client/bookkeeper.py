"""``pybk.BookKeeper``: create, open, delete and list ledgers.

A client needs a metadata store (:mod:`pybk.meta`) and a way to reach bookies (a
``bookie id -> BookieClient`` mapping, :mod:`pybk.client.transport`).
:meth:`BookKeeper.in_process` builds one over bookies of this process;
:func:`pybk.connect` one of a cluster (ZooKeeper and bookies over ZeroMQ).

Bookies are resolved off the data path: whenever a ledger's bookies become known to the
client (a new ledger's ensemble, replacements in an ensemble change, the fragments of an
opened or deleted ledger) it calls :meth:`BookKeeper.resolve_bookies`, which a client
whose bookie lookups read a store overrides (the cluster client does), so that sending
an add never waits for one.

Its ledger handles and recovery reach it through the interface it implements,
:class:`~pybk.client.context.ClientContext`: they import that, not this module.

After :meth:`BookKeeper.close` every call to create, open, delete or list ledgers raises
ClientClosed (handles opened before are not closed with the client).

Threads: one timer thread per client times out adds and sends explicit LACs for idle
writers; one worker thread runs ensemble changes and the metadata close after an error a
writer cannot recover from (they block on the metadata store and must not run on a
bookie's completion thread).  All of pybk's threads: docs/THREADS.md.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping, Self, Sequence

from pybk.client.context import ClientContext, Writer, timing
from pybk.client.deferred import WriteFlag
from pybk.client.ledger import LedgerHandle
from pybk.client.ledger_adv import LedgerHandleAdv
from pybk.client.placement import PlacementPolicy, RendezvousPlacement
from pybk.client.rackaware import Locate, RackAwarePlacement
from pybk.client.recovery import recover
from pybk.client.transport import BookieClient, InProcessBookieClient
from pybk.errors import (
    BookieUnavailable,
    ClientClosed,
    NotEnoughBookies,
    TooManyRequests,
    Unauthorized,
)
from pybk.meta.interface import MetadataStore
from pybk.meta.layout import LIST_PAGE_NAMES
from pybk.meta.ledger_metadata import DigestType, LedgerMetadata, LedgerState
from pybk.meta.ledgers import LedgerManager, Versioned
from pybk.settings import ClientSettings
from pybk.storage import Bookie

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from pybk.client.metrics import ClientMetrics

log = logging.getLogger(__name__)

_TICK_S = 0.05


class BookKeeper(ClientContext):
    """A ledger client.  Use as a context manager, or call :meth:`close`."""

    def __init__(self, metadata: MetadataStore, bookies: Mapping[str, BookieClient]
                 | Callable[[str], BookieClient], settings: ClientSettings | None = None,
                 available_bookies: Callable[[], list[str]] | None = None,
                 local_bookie: str | None = None,
                 metrics_registry: CollectorRegistry | None = None) -> None:
        """``available_bookies`` lists the writable bookies (by default: every known one,
        or the registry's writable ones); ``local_bookie`` is the bookie this process
        hosts, which placement puts first (else a bookie registered on the settings'
        ``clientHost``, if any).  With ``metrics_registry`` (a prometheus_client
        registry) the client reports its metrics there (:mod:`pybk.client.metrics`)."""
        self.settings = settings or ClientSettings()
        #: The client's metrics (None: it keeps none, and needs no prometheus_client).
        self.metrics: ClientMetrics | None = None
        if metrics_registry is not None:
            from pybk.client.metrics import ClientMetrics
            self.metrics = ClientMetrics.on(metrics_registry, self)
        self._locations: dict[str, str] = {}  # bookie id -> registered location
        self.placement = _policy(self.settings, local_bookie, self._locate)
        host = self.settings.clientHost
        self._same_host: Callable[[], list[str]] = (
            (lambda: metadata.bookies_on_host(host)) if host else list)
        self.metadata = metadata
        self.ledger_manager = LedgerManager(metadata)
        if callable(bookies):
            self._lookup, known = bookies, None
        else:
            known = dict(bookies)
            self._lookup = functools.partial(_lookup, known)
        self._available = available_bookies or (
            (lambda: sorted(known)) if known is not None else
            (lambda: metadata.bookies(read_only=False)))
        self._quarantined: dict[str, float] = {}  # bookie id -> until (monotonic)
        self._quarantine_lock = threading.Lock()
        self._writers: set[Writer] = set()
        self._writers_lock = threading.Lock()
        # One permit per outstanding add of this client's ledgers (ClientSettings.throttle):
        # taken by LedgerHandle.add_entry_then, given back when the add is acknowledged or
        # failed; bounded, so that a permit given back twice raises.
        self._add_permits = (threading.BoundedSemaphore(self.settings.throttle)
                             if self.settings.throttle else None)
        # Held by a call taking many permits (add_entries) while it takes them: two
        # taking theirs permit by permit would split the permits coming back between
        # them, and both would wait for the rest until addEntryTimeout.
        self._many_permits_lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pybk-client")
        self._stop = threading.Event()
        self._closed = False  # read by every add of the client's ledgers: a plain flag
        self._timer = threading.Thread(target=self._tick_loop, name="pybk-client-timer",
                                       daemon=True)
        self._timer.start()

    @classmethod
    def in_process(cls, bookies: Mapping[str, Bookie], metadata: MetadataStore,
                   settings: ClientSettings | None = None) -> "BookKeeper":
        """A client over bookies of this process (called directly, no serialization)."""
        return cls(metadata, {bookie_id: InProcessBookieClient(bookie_id, bookie)
                              for bookie_id, bookie in bookies.items()}, settings)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- ledgers ------------------------------------------------------------------

    def create_ledger(self, ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2,
                      digest: str | DigestType = "crc32c", password: bytes = b"",
                      custom_metadata: Mapping[str, bytes] | None = None,
                      write_flags: Iterable[WriteFlag] = ()) -> LedgerHandle:
        """A new ledger, open for writing.  E >= Qw >= Qa >= 1 or InvalidLedgerMetadata.

        ``write_flags``: ``{WriteFlag.DEFERRED_SYNC}`` has adds acknowledged before they
        are durable, made durable by :meth:`LedgerHandle.force`
        (:mod:`pybk.client.deferred`)."""
        flags = _write_flags(write_flags)
        versioned = self._create(ensemble, write_quorum, ack_quorum, digest, password,
                                 custom_metadata, None)
        return LedgerHandle(self, versioned, password, writable=True, write_flags=flags)

    def create_ledger_adv(self, ensemble: int = 3, write_quorum: int = 2,
                          ack_quorum: int = 2, digest: str | DigestType = "crc32c",
                          password: bytes = b"",
                          custom_metadata: Mapping[str, bytes] | None = None,
                          ledger_id: int | None = None,
                          write_flags: Iterable[WriteFlag] = ()) -> LedgerHandleAdv:
        """A new ledger whose writer gives each entry's id (BookKeeper's
        ``createLedgerAdv``; :mod:`pybk.client.ledger_adv`), with the id ``ledger_id``
        if given (LedgerExists if taken, InvalidLedgerMetadata if not in [0, 2^63)),
        else a fresh one.  Otherwise as :meth:`create_ledger`, ``write_flags`` included
        (a DEFERRED_SYNC adv ledger forces up to its LAC, the highest id acknowledged
        with every lower one)."""
        flags = _write_flags(write_flags)
        versioned = self._create(ensemble, write_quorum, ack_quorum, digest, password,
                                 custom_metadata, ledger_id)
        return LedgerHandleAdv(self, versioned, password, writable=True, write_flags=flags)

    def _create(self, ensemble: int, write_quorum: int, ack_quorum: int,
                digest: str | DigestType, password: bytes,
                custom_metadata: Mapping[str, bytes] | None,
                ledger_id: int | None) -> Versioned:
        """A new ledger's metadata, its bookies resolved."""
        with timing(self.metrics, "LEDGER_CREATE"):
            return self._create_metadata(ensemble, write_quorum, ack_quorum, digest,
                                         password, custom_metadata, ledger_id)

    def _create_metadata(self, ensemble: int, write_quorum: int, ack_quorum: int,
                         digest: str | DigestType, password: bytes,
                         custom_metadata: Mapping[str, bytes] | None,
                         ledger_id: int | None) -> Versioned:
        self._check_open()
        digest_type = _digest_type(digest)
        versioned = self.ledger_manager.create_ledger(
            lambda chosen_id: self._place(
                lambda available, exclude, same_host: self.placement.new_ensemble(
                    chosen_id, ensemble, write_quorum, available, exclude, same_host), ()),
            write_quorum, ack_quorum, digest_type, password, custom_metadata,
            ensemble_size=ensemble, ledger_id=ledger_id)
        self.resolve_bookies(versioned.metadata.fragments[0].ensemble)
        return versioned

    def open_ledger(self, ledger_id: int, password: bytes = b"",
                    recovery: bool = True) -> LedgerHandle:
        """Open a ledger for reading.

        ``recovery=True`` fences the ledger and closes it at its last recoverable entry
        (the writer, if alive, can add no more); ``recovery=False`` reads up to the LAC
        without disturbing the writer.
        """
        with timing(self.metrics, "LEDGER_OPEN"):
            return self._open(ledger_id, password, recovery)

    def _open(self, ledger_id: int, password: bytes, recovery: bool) -> LedgerHandle:
        self._check_open()
        versioned = self.ledger_manager.read(ledger_id)
        if not versioned.metadata.check_password(password):
            raise Unauthorized(f"wrong password for ledger {ledger_id}")
        self.resolve_bookies(_bookies_of(versioned.metadata))
        if recovery:
            with timing(self.metrics, "LEDGER_RECOVER"):
                versioned = recover(self, versioned, password)
        metadata = versioned.metadata
        lac = metadata.closed_last_entry_id() if metadata.state is LedgerState.CLOSED else -1
        handle = LedgerHandle(self, versioned, password, writable=False,
                              last_add_confirmed=lac)
        if metadata.state is LedgerState.CLOSED:
            handle._confirmed_length = metadata.length or 0
        else:
            handle.read_last_add_confirmed()
        return handle

    def delete_ledger(self, ledger_id: int) -> None:
        """Delete a ledger's metadata, then its entries on every bookie that held some."""
        with timing(self.metrics, "LEDGER_DELETE"):
            self._delete(ledger_id)

    def _delete(self, ledger_id: int) -> None:
        self._check_open()
        metadata = self.ledger_manager.read(ledger_id).metadata
        self.ledger_manager.delete(ledger_id)
        holders = _bookies_of(metadata)
        self.resolve_bookies(holders)
        for bookie_id in sorted(holders):
            try:
                self.bookie_client(bookie_id).delete_ledger(ledger_id).result(
                    timeout=self.settings.addEntryTimeout)
            except Exception as e:  # the bookie's own GC removes it later
                log.warning("ledger %d: bookie %s did not delete it now: %s", ledger_id,
                            bookie_id, e)

    def list_ledgers(self) -> list[int]:
        """The ids of every ledger in the metadata store, ascending, in one list: its
        memory grows with the ledgers, so a store of many lists with
        :meth:`iter_ledgers`."""
        self._check_open()
        return self.ledger_manager.ledger_ids()

    def iter_ledgers(self, page_size: int = LIST_PAGE_NAMES) -> Iterator[int]:
        """The ids of the ledgers in the metadata store, read a page at a time as the
        caller goes (BookKeeper's ``listLedgers``), in the layout's order: ascending in
        the hierarchical layout (:mod:`pybk.meta.layout`).  A ledger created or deleted
        meanwhile may be listed or not; every other ledger is listed once.  A client
        closed meanwhile ends the listing with ClientClosed."""
        self._check_open()
        for ledger_id in self.ledger_manager.iter_ledger_ids(page_size):
            self._check_open()
            yield ledger_id

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _check_open(self) -> None:
        if self._stop.is_set():
            raise ClientClosed("this BookKeeper client is closed: it creates, opens, "
                               "deletes and lists no more ledgers (make a new client)")

    # -- bookies ------------------------------------------------------------------

    def bookie_client(self, bookie_id: str) -> BookieClient:
        """The client of ``bookie_id``; called on the data path, so it must not block."""
        return self._lookup(bookie_id)

    def resolve_bookies(self, bookie_ids: Iterable[str]) -> None:
        """Make :meth:`bookie_client` ready to hand out the clients of ``bookie_ids`` at
        once.  Called off the data path, before a ledger uses them; it may block on the
        metadata store.  A client given its bookie clients has nothing to do."""

    def choose_replacements(self, ledger_id: int, ensemble: Sequence[str],
                            indexes: Sequence[int], write_quorum: int,
                            exclude: Iterable[str] = ()) -> list[str]:
        """Writable bookies for the places ``indexes`` (ascending) of the ledger's
        ``ensemble`` (write sets of ``write_quorum``), outside the ensemble and
        ``exclude``; NotEnoughBookies if too few (or, enforced, none keep the racks
        apart).  Resolved (:meth:`resolve_bookies`)."""
        chosen = self._place(
            lambda available, excluded, same_host: self.placement.replace(
                ledger_id, ensemble, indexes, write_quorum, available, excluded, same_host),
            tuple(ensemble) + tuple(exclude))
        self.resolve_bookies(chosen)
        return chosen

    def _place(self, place: Callable[[list[str], tuple[str, ...], set[str]], list[str]],
               exclude: Iterable[str]) -> list[str]:
        """``place(writable bookies, excluded ones, bookies on the client's host)``,
        avoiding quarantined bookies if that leaves enough (BookKeeper's fallback)."""
        available, exclude = self._available(), tuple(exclude)
        same_host = set(self._same_host())  # one read of the store, with clientHost
        quarantined = self._quarantined_now()
        if quarantined:
            try:
                return place(available, exclude + tuple(quarantined), same_host)
            except NotEnoughBookies:
                log.info("too few bookies outside quarantine %s; using them",
                         sorted(quarantined))
        return place(available, exclude, same_host)

    def _locate(self, bookie_ids: Iterable[str]) -> dict[str, str]:
        """The registered locations of ``bookie_ids`` (those without one are left out).
        A location found is kept for the client's life, as BookKeeper caches its rack
        mapping; one not found is read again next time (the bookie may register one)."""
        for bookie_id in bookie_ids:
            if bookie_id not in self._locations:
                location = self.metadata.bookie_location(bookie_id)
                if location:
                    self._locations[bookie_id] = location
        return self._locations

    def quarantine(self, bookie_ids: Iterable[str]) -> None:
        """Leave ``bookie_ids`` (replaced after failing adds) out of placements for
        ``bookieQuarantineTimeSeconds``, unless too few others are writable."""
        until = time.monotonic() + self.settings.bookieQuarantineTimeSeconds
        with self._quarantine_lock:
            for bookie_id in bookie_ids:
                self._quarantined[bookie_id] = until

    def _quarantined_now(self) -> list[str]:
        now = time.monotonic()
        with self._quarantine_lock:
            for bookie_id in [b for b, until in self._quarantined.items() if until <= now]:
                del self._quarantined[bookie_id]
            return list(self._quarantined)

    # -- background work ----------------------------------------------------------

    def _run_in_background(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` on the client's worker; False once the client is closed."""
        try:
            self._worker.submit(fn)
        except RuntimeError:  # closed: the worker takes no more work
            return False
        return True

    def _take_add_permits(self, count: int = 1) -> None:
        """Take a permit per add (see ``_add_permits``; ``count`` at most ``throttle``):
        wait up to addEntryTimeout in all (``throttleBlocking``) or not at all;
        TooManyRequests, none taken, if they did not all come."""
        settings = self.settings
        permits = self._add_permits
        assert permits is not None
        if count == 1:
            self._take_each_permit(1, None)
            return
        many = self._many_permits_lock
        deadline = None  # the clock is read only once something has to be waited for
        if not many.acquire(False):
            if not settings.throttleBlocking:
                many.acquire()  # held only while a call takes its permits without waiting
            else:
                deadline = time.monotonic() + settings.addEntryTimeout
                if not many.acquire(True, settings.addEntryTimeout):
                    raise TooManyRequests(
                        f"{settings.throttle} adds of this client are outstanding "
                        "(throttle): another call of many adds was still waiting for its "
                        f"permits after {settings.addEntryTimeout} s")
        try:
            self._take_each_permit(count, deadline)
        finally:
            many.release()

    def _take_each_permit(self, count: int, deadline: float | None) -> None:
        """:meth:`_take_add_permits`'s taking, permit by permit, waiting until
        ``deadline`` (None: addEntryTimeout from the first wait)."""
        settings = self.settings
        permits = self._add_permits
        assert permits is not None
        for taken in range(count):
            if permits.acquire(False):
                continue
            if settings.throttleBlocking:
                if deadline is None:
                    deadline = time.monotonic() + settings.addEntryTimeout
                if permits.acquire(True, max(0.0, deadline - time.monotonic())):
                    continue
            if taken:
                self._release_add_permits(taken)
            waited = f" for {settings.addEntryTimeout} s" if settings.throttleBlocking else ""
            raise TooManyRequests(f"{settings.throttle} adds of this client are "
                                  f"outstanding (throttle) and none finished{waited}" + (
                                      f" (still {count - taken} to take for {count} adds "
                                      "of one call)" if count > 1 else ""))

    def _release_add_permits(self, count: int = 1) -> None:
        self._add_permits.release(count)  # type: ignore[union-attr]

    def _register_writer(self, handle: Writer) -> None:
        with self._writers_lock:
            self._writers.add(handle)

    def _unregister_writer(self, handle: Writer) -> None:
        with self._writers_lock:
            self._writers.discard(handle)

    def pending_adds(self) -> int:
        """Adds sent and not yet acknowledged, over the client's writable ledgers."""
        with self._writers_lock:
            writers = list(self._writers)
        return sum(writer.pending_adds for writer in writers)

    def _tick_loop(self) -> None:
        while not self._stop.wait(_TICK_S):
            with self._writers_lock:
                writers = list(self._writers)
            now = time.monotonic()
            for handle in writers:
                try:
                    handle._tick(now)
                except Exception:
                    log.exception("ledger %d: timer work failed", handle.id)

    def close(self) -> None:
        """Stop the client's threads (open handles are not closed).  Closing again does
        nothing."""
        self._closed = True
        self._stop.set()
        self._timer.join()
        self._worker.shutdown(wait=True)


def _bookies_of(metadata: LedgerMetadata) -> list[str]:
    """Every bookie that holds (or held) entries of the ledger, the last ensemble first."""
    ordered = [b for fragment in reversed(metadata.fragments) for b in fragment.ensemble]
    return list(dict.fromkeys(ordered))


def _policy(settings: ClientSettings, local_bookie: str | None,
            locate: Locate) -> PlacementPolicy:
    """The placement ``settings.ensemblePlacementPolicy`` names."""
    if settings.ensemblePlacementPolicy == "rendezvous":
        return RendezvousPlacement(local_bookie)
    return RackAwarePlacement(locate, settings.minNumRacksPerWriteQuorum,
                              settings.enforceMinNumRacksPerWriteQuorum, local_bookie,
                              region_aware=settings.ensemblePlacementPolicy == "regionaware")


def _lookup(known: dict[str, BookieClient], bookie_id: str) -> BookieClient:
    client = known.get(bookie_id)
    if client is None:
        raise BookieUnavailable(f"bookie {bookie_id} is unknown to this client")
    return client


def _write_flags(write_flags: Iterable[WriteFlag]) -> set[WriteFlag]:
    flags = set(write_flags)
    if not all(isinstance(flag, WriteFlag) for flag in flags):
        raise ValueError(f"write_flags takes WriteFlag values, not {flags}")
    return flags


def _digest_type(digest: str | DigestType) -> DigestType:
    if isinstance(digest, DigestType):
        return digest
    try:
        return DigestType[digest.upper()]
    except KeyError:
        raise ValueError(f"digest must be one of {[d.name.lower() for d in DigestType]}, "
                         f"not {digest!r}") from None
