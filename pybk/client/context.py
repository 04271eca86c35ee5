"""What a ledger handle and recovery ask of the client that made them.

:class:`ClientContext` is that interface; :class:`~pybk.client.BookKeeper` implements it
and hands itself to every :class:`~pybk.client.ledger.LedgerHandle` it makes (and to
:func:`~pybk.client.recovery.recover`).  So the handles and recovery import this module,
not the client: the client imports them.  BookKeeper's ``ClientContext`` has the same
job.

A handle asks for: the client's settings, metrics and ledger manager; whether the client
is closed; the client of a bookie, off the data path (:meth:`ClientContext.bookie_client`);
replacements for failed bookies, and their quarantine; a worker thread for blocking work
(ensemble changes, the metadata close after an error); the permits of the client's
throttle; and the registration of writers, whose timeouts and explicit LACs the client's
timer drives (:class:`Writer`).  The members with an underscore are for the handles of
:mod:`pybk.client` only.
"""

from __future__ import annotations

import contextlib
import hashlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Callable, Iterable, Protocol, Sequence

from pybk.client.transport import BookieClient
from pybk.meta.ledgers import LedgerManager
from pybk.settings import ClientSettings

if TYPE_CHECKING:  # prometheus_client is imported only by a client that keeps metrics
    from pybk.client.metrics import ClientMetrics


def timing(metrics: ClientMetrics | None,
           name: str) -> contextlib.AbstractContextManager[None]:
    """``metrics.timing(name)`` (:meth:`~pybk.client.metrics.ClientMetrics.timing`), or
    nothing without metrics."""
    return contextlib.nullcontext() if metrics is None else metrics.timing(name)


class Writer(Protocol):
    """A ledger open for writing, as the client's timer and its metrics see it."""

    #: The ledger's id.
    id: int

    @property
    def pending_adds(self) -> int:
        """Adds sent and not yet acknowledged."""
        ...

    def _tick(self, now: float) -> None:
        """The timer's work at ``now`` (``time.monotonic()``): time out adds, send an
        explicit LAC when idle.  Must not block."""
        ...


class ClientContext(ABC):
    """The part of a ledger client that its ledger handles and recovery call."""

    #: The client's settings.
    settings: ClientSettings
    #: The client's metrics (None: it keeps none).
    metrics: ClientMetrics | None
    #: The ledgers' metadata in the client's store.
    ledger_manager: LedgerManager

    @property
    @abstractmethod
    def closed(self) -> bool:
        """Whether the client was closed; read by every add (keep it cheap)."""

    @abstractmethod
    def bookie_client(self, bookie_id: str) -> BookieClient:
        """The client of ``bookie_id``; called on the data path, so it must not block."""

    @abstractmethod
    def choose_replacements(self, ledger_id: int, ensemble: Sequence[str],
                            indexes: Sequence[int], write_quorum: int,
                            exclude: Iterable[str] = ()) -> list[str]:
        """Writable bookies for the places ``indexes`` (ascending) of the ledger's
        ``ensemble`` (write sets of ``write_quorum``), outside the ensemble and
        ``exclude``; NotEnoughBookies if too few.  Ready for :meth:`bookie_client`."""

    @abstractmethod
    def quarantine(self, bookie_ids: Iterable[str]) -> None:
        """Leave ``bookie_ids`` (replaced after failing adds) out of placements for a
        while (``bookieQuarantineTimeSeconds``)."""

    @staticmethod
    def master_key(password: bytes) -> bytes:
        """The key bookies check on every write (BookKeeper's: SHA-1 of "ledger" + password)."""
        return hashlib.sha1(b"ledger" + password).digest()

    @abstractmethod
    def _run_in_background(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` on the client's worker thread; False once the client is closed."""

    @abstractmethod
    def _take_add_permits(self, count: int = 1) -> None:
        """Take a permit of the client's throttle per add, ``count`` adds
        (``ClientSettings.throttle`` is not 0); TooManyRequests, none taken, if they did
        not all come."""

    @abstractmethod
    def _release_add_permits(self, count: int = 1) -> None:
        """Give back ``count`` permits taken by :meth:`_take_add_permits` (adds that were
        acknowledged or failed)."""

    @abstractmethod
    def _register_writer(self, handle: Writer) -> None:
        """From now on, tick ``handle`` and count its pending adds."""

    @abstractmethod
    def _unregister_writer(self, handle: Writer) -> None:
        """Stop ticking ``handle`` (closed); nothing if it is not registered."""
