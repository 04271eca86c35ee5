"""``BookieDirectory``: bookie ids to ZeroMQ clients, through the bookie registry.

A bookie registers its endpoint (``tcp://host:port``) as the data of its registration
record (:meth:`pybk.meta.interface.MetadataStore.bookie_endpoint`).  The directory
resolves an id the first time it is asked for, makes one
:class:`~pybk.cluster.client.ZmqBookieClient` for it on the shared
:class:`~pybk.cluster.client.ClientLoop`, and hands out that client from then on: the
data path does not touch the metadata store again.

Refresh: while a bookie's connection is down (it crashed, or restarted elsewhere), a
lookup reads its endpoint again: at once the first time, then at most once per
:data:`REFRESH_INTERVAL_S`; if the
endpoint changed, a new client replaces the old one (whose outstanding requests fail
with BookieUnavailable, as they would anyway), otherwise the old client keeps
reconnecting by itself.  A bookie that is not registered, or whose endpoint cannot be
read, gets an :class:`~pybk.client.transport.UnavailableBookieClient` (every request
fails at once with BookieUnavailable), and is asked for again after the same interval.

A lookup that has to read the store blocks its caller for as long as the read takes
(normally a millisecond; at most ``zkOperationTimeoutMs`` while ZooKeeper is down).
"""

from __future__ import annotations

import logging
import math
import threading
import time

from pybk.client.transport import BookieClient, UnavailableBookieClient
from pybk.cluster.client import ClientLoop, ZmqBookieClient
from pybk.errors import BookKeeperError
from pybk.meta.interface import MetadataStore
from pybk.settings import ClientSettings

log = logging.getLogger(__name__)

#: Least time between two reads of one bookie's endpoint.
REFRESH_INTERVAL_S = 1.0


class _Resolved:
    """What the directory knows of one bookie id."""

    __slots__ = ("client", "endpoint", "checked_at")

    def __init__(self, client: BookieClient, endpoint: str | None) -> None:
        self.client = client
        self.endpoint = endpoint  # None: not resolved (client is an UnavailableBookieClient)
        # When the store was last read because the bookie was unreachable: the first
        # failure reads it at once, later ones once per REFRESH_INTERVAL_S.
        self.checked_at = -math.inf if endpoint is not None else time.monotonic()

    def current(self, now: float) -> bool:
        """Whether the client can be handed out without reading the store again."""
        reachable = isinstance(self.client, ZmqBookieClient) and not self.client.is_down
        return reachable or now - self.checked_at < REFRESH_INTERVAL_S


class BookieDirectory:
    """Bookie clients by id, for the bookies registered in ``store``; every client runs
    on ``loop``.  Thread-safe.  :meth:`close` closes the clients (not the loop or store)."""

    def __init__(self, store: MetadataStore, loop: ClientLoop,
                 settings: ClientSettings | None = None) -> None:
        self._store = store
        self._loop = loop
        self._settings = settings or ClientSettings()
        self._lock = threading.Lock()
        self._known: dict[str, _Resolved] = {}
        self._closed = False

    def __call__(self, bookie_id: str) -> BookieClient:
        return self.client(bookie_id)

    def client(self, bookie_id: str) -> BookieClient:
        """The client of ``bookie_id`` (see the module docstring); never raises."""
        now = time.monotonic()
        with self._lock:
            known = self._known.get(bookie_id)
        if known is not None and known.current(now):
            return known.client
        try:
            endpoint = self._store.bookie_endpoint(bookie_id)
            if not endpoint:
                raise BookKeeperError(f"bookie {bookie_id} registered no network endpoint: "
                                      "it serves its own process only")
        except BookKeeperError as e:
            return self._unresolved(bookie_id, known, now, str(e))
        return self._resolved(bookie_id, endpoint, now)

    def _unresolved(self, bookie_id: str, known: _Resolved | None, now: float,
                    reason: str) -> BookieClient:
        with self._lock:
            if known is not None and known.endpoint is not None:
                known.checked_at = now  # keep trying the last address it had
                return known.client
            client = UnavailableBookieClient(bookie_id, reason)
            self._known[bookie_id] = _Resolved(client, None)
            return client

    def _resolved(self, bookie_id: str, endpoint: str, now: float) -> BookieClient:
        stale: BookieClient | None = None
        with self._lock:
            if self._closed:
                return UnavailableBookieClient(bookie_id, "the bookie directory is closed")
            known = self._known.get(bookie_id)
            if known is not None and known.endpoint == endpoint:
                known.checked_at = now
                return known.client
            if known is not None:
                stale = known.client
                log.info("bookie %s moved from %s to %s", bookie_id, known.endpoint, endpoint)
            client = ZmqBookieClient(bookie_id, endpoint, self._settings, loop=self._loop)
            self._known[bookie_id] = _Resolved(client, endpoint)
        if isinstance(stale, ZmqBookieClient):
            stale.close()
        return client

    def close(self) -> None:
        """Close every client made here; later lookups give unavailable clients."""
        with self._lock:
            self._closed = True
            known, self._known = self._known, {}
        for resolved in known.values():
            if isinstance(resolved.client, ZmqBookieClient):
                resolved.client.close()
