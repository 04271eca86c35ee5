"""Metadata store addresses, and opening the store an address names.

Two forms:

``zk://host:port[,host:port...]/root``
    A ZooKeeper cluster (:class:`~pybk.meta.zookeeper.ZooKeeperMetadataStore`), its
    ledgers root ``root`` (``/ledgers`` when the address has no path).  Parsed by
    :mod:`pybk.meta.zkaddress`, below the ZooKeeper store, whose names
    (:func:`parse_zookeeper_address`, :class:`ZooKeeperAddress`,
    :func:`is_zookeeper_address`) are this module's too.  A malformed one raises
    :class:`~pybk.errors.InvalidConfiguration` saying which part is wrong.
any other string or path
    A directory holding an embedded store (:class:`~pybk.meta.embedded.EmbeddedMetadataStore`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from pybk.meta.zkaddress import ZooKeeperAddress, is_zookeeper_address, parse_zookeeper_address

if TYPE_CHECKING:
    from pybk.meta.interface import MetadataStore
    from pybk.meta.zookeeper import ZooKeeperSettings

__all__ = ["ZooKeeperAddress", "is_zookeeper_address", "open_metadata_store",
           "parse_zookeeper_address"]


def open_metadata_store(address_or_path: str | os.PathLike,
                        settings: "ZooKeeperSettings | None" = None,
                        move_logs: bool = True) -> "MetadataStore":
    """The store ``address_or_path`` names: a ZooKeeperMetadataStore for a ``zk://``
    address (connected, its layout checked; ``settings`` tune it; ``move_logs`` False
    for a caller that changes no log: a cluster of pybk's former layout is left as it
    is), else the embedded store in that directory."""
    if is_zookeeper_address(address_or_path):
        from pybk.meta.zookeeper import ZooKeeperMetadataStore  # kazoo only when needed
        return ZooKeeperMetadataStore(address_or_path, settings, move_logs=move_logs)
    from pybk.meta.embedded import EmbeddedMetadataStore
    return EmbeddedMetadataStore(address_or_path)
