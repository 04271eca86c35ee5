"""``BookieDirectory``: bookie ids to bookie clients, through the bookie registry.

A bookie registers its endpoint (``tcp://host:port``, with its CURVE public key when it
serves CURVE: :mod:`pybk.net.curve`) as the data of its registration record
(:meth:`pybk.meta.interface.MetadataStore.bookie_endpoint`).  The directory makes
one :class:`~pybk.net.client.ZmqBookieClient` per bookie on the shared
:class:`~pybk.net.client.ClientLoop` and hands out that client from then on: the data
path does not touch the metadata store.

Local bookies: a process that hosts bookies passes their clients (``local``, normally
:class:`~pybk.client.transport.InProcessBookieClient`: no serialization, no socket).
They are handed out as they are, never looked up and never closed here.

No lookup blocks the data path.  :meth:`BookieDirectory.client` never reads the store:
the ledger client calls it from whatever thread sends an add, including completion
callbacks on the ClientLoop's thread and on a bookie's journal thread, and a store read
takes up to ``zkOperationTimeoutMs`` while ZooKeeper is down.  Instead:

* Ahead: :meth:`BookieDirectory.resolve` reads the endpoints of bookies not known yet,
  on the caller's thread.  The cluster client calls it off the data path, when a ledger's
  bookies are chosen (creation, ensemble change) and when a ledger is opened or deleted,
  as BookKeeper resolves bookies at ensemble time.
* In the background: a lookup :meth:`~BookieDirectory.client` needs (a bookie never
  resolved, or one whose connection is down) runs on the directory's lookup thread, one
  at a time.  Meanwhile the caller gets a stand-in client that queues its requests
  (at most :data:`WAITING_REQUESTS_MAX`) and sends them, in order, to the bookie's client
  once the lookup is done; a request waits no longer than the lookup (itself bounded by
  the store's ``zkOperationTimeoutMs``), and the caller's own time limits
  (``addEntryTimeout``, ``readTimeout``) apply throughout.

Refresh: while a bookie's connection is down (it crashed, or restarted elsewhere), its
endpoint is read again: at once the first time, then at most once per
:data:`REFRESH_INTERVAL_S`.  Requests made while that read is in flight wait for it (so
a bookie that came back at another address gets them); but once it has taken
:data:`REFRESH_WAIT_S` (ZooKeeper is slow or down), the next request goes to the last
known client, which fails it at once while the bookie is unreachable, and so do the
requests that waited and every later one until the read ends.  If the endpoint
changed, a new client replaces the old one (whose outstanding requests fail with
BookieUnavailable, as they would anyway); otherwise the old client keeps reconnecting by
itself.  A bookie that is not registered, or whose endpoint cannot be read, and that has
no last known endpoint, gets an :class:`~pybk.client.transport.UnavailableBookieClient`
(every request fails at once with BookieUnavailable), and is looked up again after the
same interval.

Threads: one, ``pybk-bookie-lookup``, reads the store for lookups in the background;
:meth:`~BookieDirectory.resolve` reads on its caller's thread.  Waiting requests are
sent on the thread that ends their wait (the lookup's, or the caller that found the
wait over): sending never blocks.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from concurrent.futures import Future
from typing import Callable, Iterable, Mapping

from pybk.client.transport import AddCallback, BookieClient, UnavailableBookieClient, chain
from pybk.errors import BookieUnavailable, BookKeeperError
from pybk.meta.interface import MetadataStore
from pybk.net import curve
from pybk.net.client import ClientLoop, ZmqBookieClient
from pybk.settings import ClientSettings

log = logging.getLogger(__name__)

#: Least time between two reads of one bookie's endpoint.
REFRESH_INTERVAL_S = 1.0
#: How long requests to a known bookie wait for a refresh of its endpoint in flight
#: before going to its last known client (a store read normally takes a millisecond;
#: while ZooKeeper is down it takes up to ``zkOperationTimeoutMs``).
REFRESH_WAIT_S = 0.5
#: Requests queued for one bookie while its endpoint is looked up; more fail at once
#: with BookieUnavailable.
WAITING_REQUESTS_MAX = 10_000

Send = Callable[[BookieClient], None]


class BookieDirectory:
    """Bookie clients by id: ``local`` ones as given, the others for the bookies
    registered in ``store``, over ZeroMQ on ``loop``.  Thread-safe.  :meth:`close` stops
    the lookup thread and closes the ZeroMQ clients (not the loop, the store or the local
    clients)."""

    def __init__(self, store: MetadataStore, loop: ClientLoop,
                 settings: ClientSettings | None = None,
                 local: Mapping[str, BookieClient] | None = None) -> None:
        self._store = store
        self._loop = loop
        self._settings = settings or ClientSettings()
        self._local = dict(local or {})
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the lookup thread's wake-up
        self._known: dict[str, _Known] = {}
        self._queued: collections.deque[str] = collections.deque()  # background lookups
        self._looking_up = False  # the lookup thread is reading the store
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="pybk-bookie-lookup",
                                        daemon=True)
        self._thread.start()

    def __call__(self, bookie_id: str) -> BookieClient:
        return self.client(bookie_id)

    def client(self, bookie_id: str) -> BookieClient:
        """The client of ``bookie_id`` (see the module docstring).  Never blocks on the
        store and never raises."""
        local = self._local.get(bookie_id)
        if local is not None:
            return local
        known = self._known.get(bookie_id)  # read without the lock: the fast path
        if known is not None:
            client = known.client
            if isinstance(client, ZmqBookieClient) and not client.is_down:
                return client
        return self._client_slowly(bookie_id)

    def resolve(self, bookie_ids: Iterable[str]) -> None:
        """Look up, on this thread, the bookies among ``bookie_ids`` that are not known
        yet or are due a refresh, and wait for lookups of them already in flight, so that
        :meth:`client` hands out their clients at once.  Blocks for as long as the store
        reads take; for callers off the data path (creating, opening or changing a
        ledger).  Never raises: a bookie that cannot be resolved gets a client that fails
        its requests."""
        mine: list[str] = []
        theirs: list[threading.Event] = []
        now = time.monotonic()
        with self._lock:
            for bookie_id in dict.fromkeys(bookie_ids):
                if self._closed or bookie_id in self._local:
                    continue
                known = self._known_locked(bookie_id)
                if known.in_flight is not None:
                    theirs.append(known.in_flight)
                elif not known.current(now):
                    self._start_lookup_locked(known, now)
                    mine.append(bookie_id)
        for bookie_id in mine:
            self._look_up_safely(bookie_id)
        for event in theirs:
            event.wait()

    def close(self) -> None:
        """Close every ZeroMQ client made here and stop the lookup thread; requests
        waiting for a lookup and later lookups fail with BookieUnavailable."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            known, self._known = self._known, {}
            self._queued.clear()
            reading = self._looking_up
            self._work.notify_all()
        for entry in known.values():
            if entry.waiting is not None:
                entry.waiting.release(UnavailableBookieClient(
                    entry.bookie_id, "the bookie directory is closed"))
            if entry.in_flight is not None:
                entry.in_flight.set()
            if isinstance(entry.client, ZmqBookieClient):
                entry.client.close()
        if not reading:  # else it ends once its read does (at the latest with the store)
            self._thread.join()

    # -- lookups ------------------------------------------------------------------------

    def _client_slowly(self, bookie_id: str) -> BookieClient:
        now = time.monotonic()
        release: tuple[_Waiting, BookieClient] | None = None
        with self._lock:
            if self._closed:
                return UnavailableBookieClient(bookie_id, "the bookie directory is closed")
            known = self._known_locked(bookie_id)
            if known.in_flight is None:
                if known.client is not None and known.current(now):
                    return known.client
                self._start_lookup_locked(known, now)
                self._queued.append(bookie_id)
                self._work.notify()
                return known.waiting  # type: ignore[return-value]
            # A lookup is in flight.
            if known.waiting is not None and (known.client is None
                                              or now - known.started_at < REFRESH_WAIT_S):
                return known.waiting
            if known.waiting is not None:  # waited long enough: the last known client
                release = (known.waiting, known.client)  # type: ignore[assignment]
                known.waiting = None
            client = known.client
        if release is not None:
            release[0].release(release[1])
        return client  # type: ignore[return-value]

    def _known_locked(self, bookie_id: str) -> "_Known":
        known = self._known.get(bookie_id)
        if known is None:
            known = self._known[bookie_id] = _Known(bookie_id)
        return known

    def _start_lookup_locked(self, known: "_Known", now: float) -> None:
        known.in_flight = threading.Event()
        known.started_at = now
        known.waiting = _Waiting(known.bookie_id)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queued and not self._closed:
                    self._work.wait()
                if self._closed:
                    return
                bookie_id = self._queued.popleft()
                self._looking_up = True
            try:
                self._look_up_safely(bookie_id)
            finally:
                with self._lock:
                    self._looking_up = False

    def _look_up_safely(self, bookie_id: str) -> None:
        try:
            self._look_up(bookie_id)
        except Exception as e:  # a bug: still never leave requests waiting for nothing
            log.exception("looking up bookie %s failed", bookie_id)
            self._finish_lookup(bookie_id, UnavailableBookieClient(
                bookie_id, f"looking up bookie {bookie_id} failed: {e!r}"))

    def _finish_lookup(self, bookie_id: str, client: BookieClient) -> None:
        """End a lookup in flight that failed unexpectedly, failing its requests."""
        with self._lock:
            known = self._known.get(bookie_id)
            if known is None or known.in_flight is None:
                return
            if known.client is None:
                known.client = client
            known.checked_at = time.monotonic()
            waiting, done = known.end_lookup()
            target = known.client
        if waiting is not None:
            waiting.release(target)
        done.set()

    def _look_up(self, bookie_id: str) -> None:
        """Read the bookie's endpoint, update what is known and hand the waiting requests
        to the bookie's client.  The caller marked the lookup in flight."""
        reason = ""
        try:
            endpoint = self._store.bookie_endpoint(bookie_id)
            if not endpoint:
                raise BookKeeperError(f"bookie {bookie_id} registered no network endpoint: "
                                      "it serves its own process only")
        except BookKeeperError as e:
            endpoint, reason = "", str(e)
        except Exception as e:  # the store failed unexpectedly: as if unreadable
            log.exception("reading the endpoint of bookie %s failed", bookie_id)
            endpoint, reason = "", f"its endpoint could not be read: {e}"
        stale: BookieClient | None = None
        with self._lock:
            known = self._known.get(bookie_id)
            if known is None or known.in_flight is None:
                return  # the directory was closed meanwhile: close() released everything
            now = time.monotonic()
            if not endpoint:
                if known.endpoint is None:
                    known.client = UnavailableBookieClient(bookie_id, reason)
                # else keep trying the last address it had: it may come back there
                known.checked_at = now
            elif endpoint == known.endpoint:
                known.checked_at = now
            else:
                if known.endpoint is not None:
                    log.info("bookie %s moved from %s to %s", bookie_id, known.endpoint,
                             endpoint)
                stale = known.client
                known.client = _connect(bookie_id, endpoint, self._settings, self._loop)
                known.endpoint = endpoint
                known.checked_at = -math.inf  # its first failure reads the store at once
            waiting, done = known.end_lookup()
            client = known.client
        if waiting is not None:
            waiting.release(client)  # type: ignore[arg-type]
        done.set()
        if isinstance(stale, ZmqBookieClient):
            stale.close()


class _Known:
    """What the directory knows of one bookie id (guarded by the directory's lock)."""

    __slots__ = ("bookie_id", "client", "endpoint", "checked_at", "in_flight",
                 "started_at", "waiting")

    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        self.client: BookieClient | None = None  # None until the first lookup ends
        self.endpoint: str | None = None  # what ``client`` connects to; None: unresolved
        # When the store was last read for it: a lookup is due once the client is
        # unreachable and REFRESH_INTERVAL_S has passed since (-inf: due at once).
        self.checked_at = -math.inf
        self.in_flight: threading.Event | None = None  # set when the lookup ends
        self.started_at = 0.0
        self.waiting: _Waiting | None = None  # requests waiting for the lookup

    def current(self, now: float) -> bool:
        """Whether the client can be handed out without reading the store again."""
        client = self.client
        if client is None:
            return False
        reachable = isinstance(client, ZmqBookieClient) and not client.is_down
        return reachable or now - self.checked_at < REFRESH_INTERVAL_S

    def end_lookup(self) -> "tuple[_Waiting | None, threading.Event]":
        """Mark the lookup in flight ended: its waiting requests (to release to the
        client) and its event (to set), both outside the lock."""
        waiting, self.waiting = self.waiting, None
        done, self.in_flight = self.in_flight, None
        assert done is not None, f"no lookup of bookie {self.bookie_id} was in flight"
        return waiting, done


class _Waiting(BookieClient):
    """Stands for a bookie while its endpoint is looked up: queues requests (at most
    :data:`WAITING_REQUESTS_MAX`) and, once :meth:`release` gives it the bookie's
    client, sends them to it in order, then forwards every later request at once."""

    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        self._lock = threading.Lock()
        self._queue: collections.deque[Send] = collections.deque()
        self._target: BookieClient | None = None
        self._releasing = False

    def release(self, target: BookieClient) -> None:
        """Send the queued requests to ``target`` (on this thread), then forward."""
        with self._lock:
            if self._releasing:
                return
            self._releasing = True
        while True:
            # Requests queued while earlier ones are sent come after them, in order;
            # sending outside the lock lets a completion callback send again.
            with self._lock:
                if not self._queue:
                    self._target = target
                    return
                batch = list(self._queue)
                self._queue.clear()
            for send in batch:
                _send_safely(send, target)

    def _submit(self, send: Send) -> None:
        with self._lock:
            target = self._target
            if target is None:
                if len(self._queue) < WAITING_REQUESTS_MAX:
                    self._queue.append(send)
                    return
                target = UnavailableBookieClient(
                    self.bookie_id, f"bookie {self.bookie_id}: {WAITING_REQUESTS_MAX} "
                    "requests already wait for its endpoint to be looked up")
        _send_safely(send, target)

    def _future(self, call: Callable[[BookieClient], Future]) -> Future:
        future: Future = Future()

        def send(client: BookieClient) -> None:
            try:
                chain(call(client), future)
            except Exception as e:  # noqa: BLE001 - clients report errors in futures
                future.set_exception(_as_bookkeeper_error(client, e))

        self._submit(send)
        return future

    def add(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
            recovery: bool = False, *, deferred: bool = False) -> Future:
        return self._future(lambda c: c.add(ledger_id, entry_id, entry, master_key, recovery,
                                            deferred=deferred))

    def add_then(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
                 callback: AddCallback, recovery: bool = False, *,
                 deferred: bool = False) -> None:
        def send(client: BookieClient) -> None:
            try:
                client.add_then(ledger_id, entry_id, entry, master_key, callback, recovery,
                                deferred=deferred)
            except Exception as e:  # noqa: BLE001 - clients report errors by callback
                callback(_as_bookkeeper_error(client, e))

        self._submit(send)

    def read(self, ledger_id: int, entry_id: int, fence: bool = False,
             master_key: bytes = b"") -> Future:
        return self._future(lambda c: c.read(ledger_id, entry_id, fence, master_key))

    def read_lac(self, ledger_id: int) -> Future:
        return self._future(lambda c: c.read_lac(ledger_id))

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> Future:
        return self._future(lambda c: c.write_lac(ledger_id, lac, master_key))

    def delete_ledger(self, ledger_id: int) -> Future:
        return self._future(lambda c: c.delete_ledger(ledger_id))

    def force_ledger(self, ledger_id: int, first: int = 0, last: int = -1) -> Future:
        return self._future(lambda c: c.force_ledger(ledger_id, first, last))


def _connect(bookie_id: str, registered: str, settings: ClientSettings,
             loop: ClientLoop) -> BookieClient:
    """The client of a bookie with that registration data (endpoint and, with CURVE,
    the public key it pins), or one that fails every request with the reason it cannot
    be reached (CURVE on one side only, a malformed key, an unreadable key file)."""
    try:
        address, server_key = curve.split_registered(registered)
        return ZmqBookieClient(bookie_id, address, settings, loop=loop,
                               server_key=server_key)
    except BookKeeperError as e:
        log.warning("bookie %s cannot be reached: %s", bookie_id, e)
        return UnavailableBookieClient(bookie_id, str(e))


def _send_safely(send: Send, client: BookieClient) -> None:
    try:
        send(client)
    except Exception:  # a callback of an already failed request raised: not ours
        log.exception("sending a waiting request to bookie %s failed", client.bookie_id)


def _as_bookkeeper_error(client: BookieClient, error: Exception) -> BookKeeperError:
    if isinstance(error, BookKeeperError):
        return error
    log.error("bookie client %s raised instead of failing a request: %r", client.bookie_id,
              error)
    return BookieUnavailable(f"bookie {client.bookie_id}: {error}")


__all__ = ["BookieDirectory", "REFRESH_INTERVAL_S", "REFRESH_WAIT_S",
           "WAITING_REQUESTS_MAX"]
