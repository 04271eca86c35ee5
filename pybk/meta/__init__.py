"""pybk's metadata layer: versioned records with compare-and-set, ledger ids, the bookie
registry, bookie cookies (:class:`Cookie`) and watches, behind one contract
(:class:`MetadataStore`).

Stores: :class:`EmbeddedMetadataStore` (LMDB files in a directory, no server) and
:class:`pybk.meta.zookeeper.ZooKeeperMetadataStore` (a ZooKeeper cluster, formatted with
:func:`pybk.meta.zookeeper.format_cluster`); :func:`pybk.meta.address.open_metadata_store`
opens either by address.  Typed ledger metadata: :class:`LedgerMetadata`, kept by
:class:`LedgerManager` where the store's ledger layout (:mod:`pybk.meta.layout`) says.
Under-replicated ledgers, replication claims and the auditor election:
:class:`pybk.meta.underreplication.UnderreplicationManager`, in BookKeeper's layout.

May import: the base modules, :mod:`pybk.storage`.
"""

from pybk.meta.cookies import Cookie
from pybk.meta.embedded import EmbeddedMetadataStore
from pybk.meta.interface import ANY_VERSION, MAX_DATA_BYTES, MetadataStore
from pybk.meta.ledger_metadata import (
    DigestType,
    Fragment,
    LedgerMetadata,
    LedgerState,
    hash_password,
)
from pybk.meta.ledgers import LedgerManager, Versioned
from pybk.meta.watches import Watch

__all__ = ["ANY_VERSION", "MAX_DATA_BYTES", "Cookie", "DigestType", "EmbeddedMetadataStore",
           "Fragment", "LedgerManager", "LedgerMetadata", "LedgerState", "MetadataStore",
           "Versioned", "Watch", "hash_password"]
