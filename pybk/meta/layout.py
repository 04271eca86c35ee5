"""Where ledger metadata lives under ``/ledgers``: BookKeeper's ledger managers.

A layout maps a ledger id to the path of its metadata record and lists the ids of the
ledgers present.  Ids are decimal, zero-padded; names that are not ledgers (``available``,
``cookies``, ``idgen``, ``INSTANCEID``, ``LAYOUT``, ...) are never mistaken for one.

Flat (:data:`FLAT`, BookKeeper's ``FlatLedgerManagerFactory``)
    ``/ledgers/L<id, 10 digits or more>``: ledger 7 is ``/ledgers/L0000000007``.  One
    parent for every ledger: simple, and what the embedded store uses (it pages through
    one parent with a cursor).  On ZooKeeper it cannot page: listing it is one
    ``getChildren`` of every ledger, a reply of about 15 bytes per ledger, held whole in
    memory.  ZooKeeper's server sends it at any size, and pybk's client (kazoo) reads it,
    but ZooKeeper's Java client drops the connection on a reply over its
    ``jute.maxbuffer`` (1 MiB by default, passed near 70,000 ledgers; ZooKeeper 3.9's
    own CLI gets ConnectionLoss listing 80,000), so BookKeeper's tools cannot list such
    a cluster.  New ZooKeeper clusters are hierarchical
    (:func:`pybk.meta.zookeeper.format_cluster`).

Hierarchical (:data:`HIERARCHICAL`, BookKeeper's ``HierarchicalLedgerManagerFactory``)
    Ids below 2^31 - 1 take 10 digits split {2}{4}{4}: ledger 1 is
    ``/ledgers/00/0000/L0001``, ledger 1234567890 ``/ledgers/12/3456/L7890``.  Larger ids
    take 19 digits split {3}{4}{4}{4}{4} (BookKeeper's long hierarchical form): ledger
    2^31 is ``/ledgers/000/0000/0021/4748/L3648``.  No ZooKeeper node then holds
    more than 10,000 children, which keeps listings and ZooKeeper's packets small: a
    listing reads one parent at a time (at most 10,000 names, about 150 KB).

Listing order
    :meth:`LedgerLayout.ledger_ids` yields ids in the order of their record names, page
    by page (:meth:`~pybk.meta.interface.MetadataStore.iter_children`): ascending in the
    hierarchical layout, and in the flat one ascending among ids of the same number of
    digits (``L9999999999`` sorts after ``L10000000000``; ZooKeeper's ids have at most 10
    digits, an embedded store's all have as many).  Each listing is in the same order, so
    a position in it (the n-th id) means the same ledger while none is created or
    deleted.

The layout of a ZooKeeper cluster is chosen when it is formatted and kept in
``/ledgers/LAYOUT`` in BookKeeper's text form (see :func:`encode` and :func:`decode`):
``2\\n<ledger manager factory class>:<manager version>``.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Iterator, Protocol

from pybk.errors import MalformedMetadata, MetadataError, NoNode
from pybk.meta import paths

#: How many names a listing reads at a time where the store pages (the embedded store's
#: cursor; see :meth:`~pybk.meta.interface.MetadataStore.iter_children`): a bound on one
#: read transaction's work and on what a listing holds.
LIST_PAGE_NAMES = 1000

# BookKeeper's LedgerLayout.LAYOUT_FORMAT_VERSION: the first line of /ledgers/LAYOUT.
LAYOUT_FORMAT_VERSION = 2
_FACTORY_PACKAGE = "org.apache.bookkeeper.meta."
_SHORT_ID_MAX = 2 ** 31 - 1  # Integer.MAX_VALUE: from here on, the long form
_FLAT_NAME = re.compile(r"L([0-9]{10,})\Z")


class PagedChildren(Protocol):
    """What a layout lists ledgers from: the children of a record, ``page_size`` names
    at a time.  A :class:`~pybk.meta.interface.MetadataStore` (a store names the layout
    it keeps ledgers in, so the contract is above this module)."""

    def iter_children(self, path: str, page_size: int) -> Iterator[str]: ...


class LedgerLayout(ABC):
    """Maps ledger ids to metadata paths and lists the ledgers in a store."""

    #: pybk's name of the layout (``format_cluster(layout=...)``).
    name: str
    #: BookKeeper's ledger manager factory class and version, as kept in LAYOUT.
    factory_class: str
    manager_version = 1

    @abstractmethod
    def ledger_path(self, ledger_id: int) -> str:
        """The path of the ledger's metadata record."""

    @abstractmethod
    def ledger_ids(self, store: PagedChildren,
                   page_size: int = LIST_PAGE_NAMES) -> Iterator[int]:
        """The ids of the ledgers with a metadata record in ``store``, in name order (see
        "Listing order"), read ``page_size`` names at a time where the store pages."""

    def __repr__(self) -> str:
        return f"<{self.name} ledger layout>"


class FlatLayout(LedgerLayout):
    name = "flat"
    factory_class = _FACTORY_PACKAGE + "FlatLedgerManagerFactory"

    def ledger_path(self, ledger_id: int) -> str:
        return f"{paths.LEDGERS}/L{paths.check_ledger_id(ledger_id):010d}"

    def ledger_ids(self, store: PagedChildren,
                   page_size: int = LIST_PAGE_NAMES) -> Iterator[int]:
        for name in _children(store, paths.LEDGERS, page_size):
            match = _FLAT_NAME.match(name)
            if match:
                yield int(match.group(1))


class HierarchicalLayout(LedgerLayout):
    name = "hierarchical"
    factory_class = _FACTORY_PACKAGE + "HierarchicalLedgerManagerFactory"

    # Digits of each level: the short form (ids below 2^31 - 1) and the long form.
    _SHORT = (2, 4, 4)
    _LONG = (3, 4, 4, 4, 4)

    def ledger_path(self, ledger_id: int) -> str:
        paths.check_ledger_id(ledger_id)
        widths = self._SHORT if ledger_id < _SHORT_ID_MAX else self._LONG
        digits = f"{ledger_id:0{sum(widths)}d}"
        parts, start = [], 0
        for width in widths:
            parts.append(digits[start:start + width])
            start += width
        parts[-1] = "L" + parts[-1]
        return paths.LEDGERS + "/" + "/".join(parts)

    def ledger_ids(self, store: PagedChildren,
                   page_size: int = LIST_PAGE_NAMES) -> Iterator[int]:
        for widths in (self._SHORT, self._LONG):
            for digits in self._walk(store, paths.LEDGERS, widths, page_size):
                yield int(digits)

    def _walk(self, store: PagedChildren, path: str, widths: tuple[int, ...],
              page_size: int, prefix: str = "") -> Iterator[str]:
        """The digit strings of the ledgers below ``path`` whose remaining levels have
        ``widths`` digits, one parent at a time (depth first, so at most one page per
        level is held)."""
        last = len(widths) == 1
        pattern = re.compile(("L" if last else "") + f"[0-9]{{{widths[0]}}}\\Z")
        for name in _children(store, path, page_size):
            if not pattern.match(name):
                continue
            if last:
                yield prefix + name[1:]
            else:
                yield from self._walk(store, paths.join(path, name), widths[1:],
                                      page_size, prefix + name)


FLAT = FlatLayout()
HIERARCHICAL = HierarchicalLayout()
LAYOUTS = {layout.name: layout for layout in (FLAT, HIERARCHICAL)}


def layout_named(name: str) -> LedgerLayout:
    """The layout called ``name`` (``flat`` or ``hierarchical``)."""
    try:
        return LAYOUTS[name]
    except KeyError:
        raise MetadataError(f"unknown ledger layout {name!r}: choose one of "
                            f"{', '.join(sorted(LAYOUTS))}") from None


def encode(layout: LedgerLayout) -> bytes:
    """The LAYOUT record's data, byte for byte as BookKeeper writes it."""
    return (f"{LAYOUT_FORMAT_VERSION}\n{layout.factory_class}:{layout.manager_version}"
            .encode())


def decode(data: bytes) -> LedgerLayout:
    """The layout a LAYOUT record names; MalformedMetadata if it is not one pybk knows."""
    text = data.decode("utf-8", "replace")
    lines = text.split("\n")
    if lines[0].strip() != str(LAYOUT_FORMAT_VERSION) or len(lines) < 2:
        raise MalformedMetadata(f"LAYOUT {text!r} is not in layout format "
                                f"{LAYOUT_FORMAT_VERSION} ('2\\n<factory class>:<version>')")
    for layout in LAYOUTS.values():
        if lines[1].strip() == f"{layout.factory_class}:{layout.manager_version}":
            return layout
    raise MalformedMetadata(f"LAYOUT names ledger manager {lines[1]!r}, which pybk does not "
                            f"implement (it knows {', '.join(sorted(LAYOUTS))})")


def _children(store: PagedChildren, path: str, page_size: int) -> Iterator[str]:
    """``path``'s children, none if it is gone (deleted under a listing, or never made)."""
    try:
        yield from store.iter_children(path, page_size)
    except NoNode:
        return
