"""Ledger metadata kept in a metadata store: BookKeeper's ledger managers.

A ledger's :meth:`~pybk.meta.ledger_metadata.LedgerMetadata.to_bytes` is the record at
the path the store's layout gives it (``store.layout``, :mod:`pybk.meta.layout`: flat
``/ledgers/L0000000007`` or hierarchical ``/ledgers/00/0000/L0007``), and the record's
version is the metadata's version: every change is a compare-and-set on it.  Built only
on the :class:`~pybk.meta.interface.MetadataStore` contract, so it works the same on
every store.

Listings page (:meth:`LedgerManager.iter_ledger_ids`, :meth:`LedgerManager.iter_ledgers`):
they hold one page of ids at a time, never every id, so a store of millions of ledgers
lists in bounded memory; :meth:`LedgerManager.ledger_ids` is the whole list, for small
stores and tests.

A missing ledger raises :class:`~pybk.errors.NoSuchLedger`; a lost compare-and-set
:class:`~pybk.errors.BadVersion`, after which the caller re-reads and decides again.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Iterator, Mapping, NamedTuple, Sequence

from pybk.errors import (
    InvalidLedgerMetadata,
    LedgerExists,
    MalformedMetadata,
    MetadataError,
    NodeExists,
    NoNode,
    NoSuchLedger,
)
from pybk.meta.interface import ANY_VERSION, MetadataStore
from pybk.meta.layout import LIST_PAGE_NAMES
from pybk.meta.ledger_metadata import DigestType, Fragment, LedgerMetadata, hash_password
from pybk.meta.watches import Watch

log = logging.getLogger(__name__)

# A fresh ledger id finds its path taken only if someone wrote there by hand; like
# BookKeeper, take another id then, at most this many times in all.
CREATE_ATTEMPTS_MAX = 10


class Versioned(NamedTuple):
    """Ledger metadata and the version of the record it was read from (or written as)."""

    metadata: LedgerMetadata
    version: int


class LedgerManager:
    """Create, read, compare-and-set, delete, list and watch ledger metadata."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.layout = store.layout

    def create_ledger(self, ensemble: Sequence[str] | Callable[[int], Sequence[str]],
                      write_quorum_size: int, ack_quorum_size: int, digest_type: DigestType,
                      password: bytes, custom_metadata: Mapping[str, bytes] | None = None,
                      ensemble_size: int | None = None,
                      ledger_id: int | None = None) -> Versioned:
        """A new OPEN ledger with a fresh id, on ``ensemble``: the bookies, or a function
        that chooses ``ensemble_size`` of them for the new id (placement by ledger id).

        The metadata is validated before an id is taken, so invalid arguments
        (InvalidLedgerMetadata) use up no id.  With ``ledger_id`` the ledger gets that id
        (BookKeeper's ``createLedgerAdv(ledgerId, ...)``), or LedgerExists if it is taken."""
        size = ensemble_size if callable(ensemble) else len(ensemble)
        if size is None:
            raise InvalidLedgerMetadata("an ensemble chosen by a function needs its "
                                        "ensemble_size")
        template = LedgerMetadata(
            ledger_id=0, ensemble_size=size, write_quorum_size=write_quorum_size,
            ack_quorum_size=ack_quorum_size,
            fragments=(Fragment(0, tuple(f"bookie-{i}" for i in range(size))
                                if callable(ensemble) else tuple(ensemble)),),
            digest_type=digest_type, password_hash=hash_password(password),
            custom_metadata=custom_metadata or {})
        if ledger_id is not None:
            return self._create_with_id(template, ensemble, ledger_id)
        for _ in range(CREATE_ATTEMPTS_MAX):
            metadata = _with_id(template, ensemble, self.store.next_ledger_id())
            try:
                version = self.store.create(self.layout.ledger_path(metadata.ledger_id),
                                            metadata.to_bytes())
            except NodeExists:
                log.warning("ledger id %d is taken in the metadata store although it was "
                            "fresh; taking another", metadata.ledger_id)
                continue
            return Versioned(metadata, version)
        raise MetadataError(f"{CREATE_ATTEMPTS_MAX} fresh ledger ids in a row were taken in "
                            f"{self.store!r}: something else writes ledger records there")

    def _create_with_id(self, template: LedgerMetadata,
                        ensemble: Sequence[str] | Callable[[int], Sequence[str]],
                        ledger_id: int) -> Versioned:
        """``template`` created under the caller's ``ledger_id`` (one attempt: the id is
        the caller's, there is no other to take)."""
        if not isinstance(ledger_id, int) or isinstance(ledger_id, bool) \
                or not 0 <= ledger_id < 2 ** 63:
            raise InvalidLedgerMetadata(f"ledger id {ledger_id!r} is not an integer in "
                                        "[0, 2^63)")
        metadata = _with_id(template, ensemble, ledger_id)
        try:
            version = self.store.create(self.layout.ledger_path(ledger_id),
                                        metadata.to_bytes())
        except NodeExists:
            raise LedgerExists(f"ledger {ledger_id} exists already: choose another id, "
                               "or leave the id to the metadata store") from None
        return Versioned(metadata, version)

    def read(self, ledger_id: int, latest: bool = False) -> Versioned:
        """The ledger's metadata; ``latest``: at least as new as every change completed
        when the call began (:meth:`~pybk.meta.interface.MetadataStore.get_latest`)."""
        path = self.layout.ledger_path(ledger_id)
        try:
            data, version = (self.store.get_latest if latest else self.store.get)(path)
        except NoNode:
            raise NoSuchLedger(f"ledger {ledger_id} has no metadata ({path})") from None
        try:
            metadata = LedgerMetadata.from_bytes(data)
        except MalformedMetadata as e:
            raise MalformedMetadata(f"{path}: {e}") from e
        if metadata.ledger_id != ledger_id:
            raise MalformedMetadata(f"{path} holds the metadata of ledger "
                                    f"{metadata.ledger_id}")
        return Versioned(metadata, version)

    def update(self, metadata: LedgerMetadata, expected_version: int) -> int:
        """Write ``metadata`` if its record is still at ``expected_version``; return the
        new version.  Raises BadVersion or NoSuchLedger."""
        path = self.layout.ledger_path(metadata.ledger_id)
        try:
            return self.store.set(path, metadata.to_bytes(), expected_version)
        except NoNode:
            raise NoSuchLedger(f"ledger {metadata.ledger_id} has no metadata ({path}): "
                               "it was deleted") from None

    def delete(self, ledger_id: int, expected_version: int = ANY_VERSION) -> None:
        """Delete the ledger's metadata (if at ``expected_version``).  Raises BadVersion
        or NoSuchLedger."""
        path = self.layout.ledger_path(ledger_id)
        try:
            self.store.delete(path, expected_version)
        except NoNode:
            raise NoSuchLedger(f"ledger {ledger_id} has no metadata ({path})") from None

    def ledger_ids(self) -> list[int]:
        """The ids of every ledger with metadata, ascending, in one list (memory grows
        with the ledgers: a store of many lists with :meth:`iter_ledger_ids`)."""
        return sorted(self.iter_ledger_ids())

    def iter_ledger_ids(self, page_size: int = LIST_PAGE_NAMES) -> Iterator[int]:
        """The ids of the ledgers with metadata, in the layout's listing order (ascending
        in the hierarchical layout; :mod:`pybk.meta.layout`), read a page at a time.  A
        ledger created or deleted meanwhile may be listed or not; every other ledger is
        listed once."""
        return self.layout.ledger_ids(self.store, page_size)

    def iter_ledgers(self, page_size: int = LIST_PAGE_NAMES) -> Iterator[Versioned]:
        """The metadata of the ledgers :meth:`iter_ledger_ids` lists, read one ledger at
        a time as the caller goes; a ledger deleted after its id was listed is left
        out."""
        for ledger_id in self.iter_ledger_ids(page_size):
            try:
                yield self.read(ledger_id)
            except NoSuchLedger:
                continue  # deleted meanwhile

    def watch(self, ledger_id: int, callback: Callable[[int], None]) -> Watch:
        """Call ``callback(ledger_id)`` after every change of the ledger's metadata
        (created, updated, deleted) until the watch is cancelled."""
        return self.store.watch(self.layout.ledger_path(ledger_id),
                                lambda _path: callback(ledger_id))


def _with_id(template: LedgerMetadata,
             ensemble: Sequence[str] | Callable[[int], Sequence[str]],
             ledger_id: int) -> LedgerMetadata:
    """``template`` as ledger ``ledger_id``, its ensemble chosen for that id if
    ``ensemble`` is a function."""
    return dataclasses.replace(
        template, ledger_id=ledger_id,
        fragments=(Fragment(0, tuple(ensemble(ledger_id))),) if callable(ensemble)
        else template.fragments)
