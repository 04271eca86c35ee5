"""Promoting an embedded WAL to a cluster member, without copying its data.

What moves is metadata only: every ledger record of the WAL's embedded store is created
in the cluster's store under the same id (embedded ids start at a random base, so they
do not collide with the cluster's), and the log's ledger list is created there as the
log ``wal-<bookie instance id>``.  The entries stay on the WAL's own bookie, which joins
the cluster under the id its ledgers already name (``bookie-<instance id>``) and serves
them to any client; the WAL's own client keeps calling it in-process
(:func:`pybk.cluster.connect.connect` with ``local_bookies``).  Finally the embedded
store records the cluster's address at :data:`PROMOTED`, after which the directory opens
only as a cluster member.

Every step is idempotent, so a crash in the middle is finished by the next promotion.
"""

from __future__ import annotations

import dataclasses
import logging

from pybk.errors import InvalidConfiguration, MetadataError, NodeExists, NoNode
from pybk.log.metadata import LogMetadata, log_path
from pybk.meta.interface import MetadataStore
from pybk.meta.ledgers import LedgerManager

log = logging.getLogger(__name__)

#: The embedded store's record of the cluster a WAL was promoted to (its address).
PROMOTED = "/pybk/promoted"


def promoted_to(embedded: MetadataStore) -> str | None:
    """The address of the cluster the WAL was promoted to, or None."""
    try:
        return embedded.get(PROMOTED)[0].decode("utf-8")
    except NoNode:
        return None


def promote(embedded: MetadataStore, cluster: MetadataStore, address: str,
            local_log: str, cluster_log: str) -> None:
    """Copy the WAL's ledger and log metadata into ``cluster`` (see the module
    docstring) and mark the embedded store as promoted to ``address``."""
    already = promoted_to(embedded)
    if already is not None:
        if already != address:
            raise InvalidConfiguration(f"this WAL was promoted to the cluster {already}, "
                                       f"not {address}")
        return
    local, remote = LedgerManager(embedded), LedgerManager(cluster)
    ledger_ids = local.ledger_ids()
    for ledger_id in ledger_ids:
        metadata = local.read(ledger_id).metadata
        try:
            cluster.create(remote.layout.ledger_path(ledger_id), metadata.to_bytes())
        except NodeExists:
            if remote.read(ledger_id).metadata.fragments != metadata.fragments:
                raise MetadataError(f"ledger id {ledger_id} is taken in the cluster by "
                                    "another ledger: this WAL cannot be promoted") from None
    try:
        data, _version = embedded.get(log_path(local_log))
    except NoNode:
        data = LogMetadata(local_log).to_bytes()
    moved = LogMetadata.from_bytes(data)
    try:
        cluster.create(log_path(cluster_log),
                       dataclasses.replace(moved, name=cluster_log).to_bytes())
    except NodeExists:
        pass  # copied by an earlier promotion that crashed before its last step
    embedded.create(PROMOTED, address.encode("utf-8"))
    log.info("WAL promoted to %s: %d ledgers and the log %s now live in the cluster",
             address, len(ledger_ids), cluster_log)
