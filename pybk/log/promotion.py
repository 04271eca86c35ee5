"""Promoting an embedded WAL to a cluster member without copying its data, and back.

What moves is metadata only: every ledger record of the WAL's embedded store is created
in the cluster's store under the same id (embedded ids start at a random base, so they
do not collide with the cluster's), and the log is created there as the log
``wal-<bookie instance id>``: its head, and a record for each of its segments and a
hollow dead record at the start of each gap between them (:mod:`pybk.log.metadata`; a
log still in format 1 is written in format 2).  Segments the log was dropping stay
behind: their ledgers are not copied and the copied head drops none (the embedded log
still lists them, for the writer that opens it next if it is ever demoted).  The entries
stay on the WAL's own bookie, which joins the cluster under the id its ledgers already
name (``bookie-<instance id>``) and serves them to any client; the WAL's own client
keeps calling it in-process (:func:`pybk.net.connect.connect` with
``local_bookies``).

All or nothing.  :class:`pybk.log.wal.WAL` promotes in these steps:

1. :func:`check`, before anything is written: the directory is not promoted to another
   cluster; the cluster holds no log of this WAL's bookie that an unfinished promotion
   of this directory did not leave (one written while this directory, before it was
   demoted, or a copy of it was a member: promoting over it would hide what it lists);
   and the cluster has enough writable bookies for the log's ensemble.
2. :func:`copy`: the intent (:data:`PROMOTING`, the cluster's address) goes into the
   embedded store, then the ledger records and the log are copied, replacing copies an
   unfinished promotion left, and deleting its copies of ledgers the WAL no longer
   holds or is dropping (until the commit the embedded store is the truth).
3. The WAL's bookie joins the cluster and the log's writer opens there.
4. :func:`commit`: :data:`PROMOTED` (the address) is written to the embedded store, the
   last step; from then on the directory opens only as a cluster member.  Then the
   intent is deleted.

A failure in steps 2 to 4 undoes what was done in the cluster (the writer's new ledger,
the registration, the copies: :meth:`Copy.undo`) and deletes the intent, so the
directory is the embedded WAL it was.  A crash in those steps leaves the intent: the
directory still opens as an embedded WAL, and the next promotion to the same cluster
replaces the stale copies.

Demotion (:func:`demote`) is the way back for a directory whose cluster is gone for
good.  It needs nothing from the cluster: the embedded store still holds the log as it
was at the promotion, since a cluster member writes its log's metadata to the cluster
only.  Demotion keeps that log's segments whose ledgers the WAL's bookie still holds and
drops the leading ones it no longer holds (the cluster truncated them, which deleted
them from this bookie too) by moving truncated_before past them: the next writer deletes
their records and ledger records, as after any truncation.  Records written while the
directory was a member are not in the demoted log: they are in segments whose metadata
lived in the cluster only, and their entries mostly on other bookies; the copies this
bookie holds stay on its disks, unused.  New segments of the demoted log are numbered
:data:`SEGMENT_GAP_AFTER_DEMOTION` after the log's last known number, so no position
handed out while the directory was a member is given to another record (a hollow dead
record covers the jump).  The cluster is not told: run demotion only once the cluster is
gone (its clients would miss this bookie's copies).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, NamedTuple

from pybk.errors import (
    BookKeeperError,
    InvalidConfiguration,
    MalformedMetadata,
    MetadataError,
    NodeExists,
    NoNode,
    NoSuchLedger,
    NotEnoughBookies,
)
from pybk.log.metadata import (
    FORMAT_VERSION,
    TAIL_SEGMENTS,
    LogMetadata,
    delete_log,
    ensure_records,
    live_segments,
    log_path,
    mark_dead,
    read_log,
    store_records,
)
from pybk.log.position import Position
from pybk.meta.interface import ANY_VERSION, MetadataStore, batches
from pybk.meta.ledger_metadata import LedgerMetadata
from pybk.meta.ledgers import LedgerManager

log = logging.getLogger(__name__)

#: The embedded store's record of the cluster a WAL was promoted to (its address).
PROMOTED = "/pybk/promoted"
#: The embedded store's record of a promotion under way or unfinished (the address).
PROMOTING = "/pybk/promoting"
#: How far a demoted log's segment numbers jump: more segments than a log can have made
#: while clustered (each one is a ledger created in ZooKeeper).
SEGMENT_GAP_AFTER_DEMOTION = 1 << 32


def promoted_to(embedded: MetadataStore) -> str | None:
    """The address of the cluster the WAL was promoted to, or None."""
    return _read(embedded, PROMOTED)


def promoting_to(embedded: MetadataStore) -> str | None:
    """The address of a promotion that was started but neither committed nor undone (a
    crash in the middle), or None."""
    return _read(embedded, PROMOTING)


def check(embedded: MetadataStore, cluster: MetadataStore, address: str,
          cluster_log: str, ensemble: int, own_bookie: str) -> None:
    """Refuse a promotion that cannot succeed or would do harm (step 1 of the module
    docstring); nothing is written."""
    already = promoted_to(embedded)
    if already is not None and already != address:
        raise InvalidConfiguration(f"this WAL was promoted to the cluster {already}, "
                                   f"not {address}")
    if cluster.exists(log_path(cluster_log)) and promoting_to(embedded) != address:
        raise InvalidConfiguration(
            f"the cluster {address} already holds the log {cluster_log} of this WAL's "
            f"bookie {own_bookie}, and not from an unfinished promotion of this "
            "directory: it lists what was written while this directory (before it was "
            "demoted) or a copy of it was a member, and promoting over it would hide "
            "those records.  Open the directory as an embedded WAL, or promote it to "
            "another cluster")
    others = [b for b in cluster.bookies(read_only=False) if b != own_bookie]
    if len(others) + 1 < ensemble:
        raise NotEnoughBookies(
            f"cannot promote to {address} with ensemble={ensemble}: the cluster has "
            f"{len(others)} other writable bookies, {len(others) + 1} with this WAL's "
            "own; start more bookies or pass a smaller ensemble= (nothing was changed: "
            "the directory is still an embedded WAL)")


class Copy:
    """What :func:`copy` wrote to the cluster, so that a failed promotion can undo it.

    It keeps no list of the copies: :meth:`undo` finds them by walking the WAL's ledgers
    again (a page of ids at a time), so what a promotion holds does not grow with the
    ledgers it copies."""

    def __init__(self, embedded: MetadataStore, cluster: MetadataStore,
                 cluster_log: str) -> None:
        self._embedded = embedded
        self._cluster = cluster
        self._log = cluster_log

    def undo(self) -> None:
        """Delete the copies from the cluster (metadata only: the entries are on the
        WAL's bookie), then the intent.  A copy is the cluster's record of a ledger of
        the embedded store that names the same first ensemble (:func:`_is_copy`), as
        this copy or an unfinished promotion's wrote it, or as the cluster changed it
        since (a recovery of the log's last ledger); a ledger of the cluster that took
        one of those ids is left alone.  Deleted too: the record of every other ledger
        that the cluster's copy of the log names (:func:`_remove_copies_left`).  If the
        cluster cannot be reached the intent stays, and the next promotion replaces what
        is left there."""
        remote = LedgerManager(self._cluster)
        try:
            _remove_copies_left(self._embedded, self._cluster, self._log, set())
            delete_log(self._cluster, self._log)
            for ledger, _version in LedgerManager(self._embedded).iter_ledgers():
                try:
                    if _is_copy(remote.read(ledger.ledger_id).metadata, ledger):
                        remote.delete(ledger.ledger_id)
                except (NoSuchLedger, MalformedMetadata):
                    pass  # not copied (yet), deleted meanwhile, or no copy of this WAL's
        except BookKeeperError as e:
            log.warning("a failed promotion could not remove its copies from the cluster "
                        "(%s); the next promotion there replaces them", e)
            return
        _delete(self._embedded, PROMOTING)


def copy(embedded: MetadataStore, cluster: MetadataStore, address: str, local_log: str,
         cluster_log: str) -> Copy:
    """Record the intent, then copy the WAL's ledger and log metadata into ``cluster``
    (step 2 of the module docstring); return the copy, to undo it if the promotion
    fails later.  Copies an unfinished promotion left are replaced; a ledger id that the
    cluster gives to another ledger raises MetadataError.  If copying fails, what was
    copied is removed before the error is raised."""
    _put(embedded, PROMOTING, address)
    copied = Copy(embedded, cluster, cluster_log)
    try:
        _copy_records(embedded, cluster, local_log, cluster_log)
    except BaseException:
        copied.undo()
        raise
    return copied


def _copy_records(embedded: MetadataStore, cluster: MetadataStore, local_log: str,
                  cluster_log: str) -> None:
    try:
        data, _version = embedded.get(log_path(local_log))
    except NoNode:
        metadata = LogMetadata(local_log)
    else:
        metadata = LogMetadata.from_bytes(data)
    dropping = {d.ledger_id for d in metadata.dropping}
    remote = LedgerManager(cluster)
    # A page of ledgers at a time, never every id at once; one create_many per batch.
    records = ((remote.layout.ledger_path(ledger.ledger_id), ledger.to_bytes())
               for ledger, _version in LedgerManager(embedded).iter_ledgers()
               if ledger.ledger_id not in dropping)  # being dropped: module docstring
    for batch in batches(records):
        try:
            cluster.create_many(batch)
        except NodeExists:  # stale copies an unfinished promotion left: one by one
            for path, data in batch:
                _copy_ledger(cluster, remote, path, data)
    # A stale copy an unfinished promotion left: first the ledgers it names that are not
    # copied now, which nothing else would find.
    _remove_copies_left(embedded, cluster, cluster_log, dropping)
    delete_log(cluster, cluster_log)
    start = metadata.truncated_before.segment
    # The head first: undoing walks the segment records it covers.
    _put(cluster, log_path(cluster_log), dataclasses.replace(
        metadata, name=cluster_log, tail=metadata.tail[-TAIL_SEGMENTS:], oldest_segment=start,
        dropping=(), format_version=FORMAT_VERSION).to_bytes())
    store_records(cluster, cluster_log, live_segments(embedded, metadata), start,
                  metadata.next_segment, hollow=True)


def _copy_ledger(cluster: MetadataStore, remote: LedgerManager, path: str,
                 data: bytes) -> None:
    """Create one ledger record in the cluster, or replace a stale copy of it."""
    try:
        cluster.create(path, data)
    except NodeExists:
        ledger = LedgerMetadata.from_bytes(data)
        if not _is_copy(remote.read(ledger.ledger_id).metadata, ledger):
            raise MetadataError(f"ledger id {ledger.ledger_id} is taken in the cluster by "
                                "another ledger: this WAL cannot be promoted") from None
        cluster.set(path, data, ANY_VERSION)


def _remove_copies_left(embedded: MetadataStore, cluster: MetadataStore, cluster_log: str,
                        dropping: set[int]) -> None:
    """Delete the cluster's records of the ledgers that the cluster's log ``cluster_log``
    (a copy of this WAL's log, as a promotion of it left it) names and that a walk of
    the embedded store's ledgers would not find, or that are in ``dropping``: those the
    embedded WAL deleted after an unfinished promotion copied them (it truncated or
    dropped their segments since), and a ledger the writer of that promotion made in the
    cluster.  Such a record is a copy of this WAL's by the log that names it; one of a
    ledger the embedded store still holds is deleted only if it is a copy
    (:func:`_is_copy`)."""
    try:
        metadata = read_log(cluster, cluster_log).metadata
    except NoNode:
        return
    local, remote = LedgerManager(embedded), LedgerManager(cluster)
    for segment in live_segments(cluster, metadata):
        try:
            ledger: LedgerMetadata | None = local.read(segment.ledger_id).metadata
        except NoSuchLedger:
            ledger = None
        if ledger is not None and segment.ledger_id not in dropping:
            continue  # copied, or found by Copy.undo's walk
        try:
            if ledger is None or _is_copy(remote.read(segment.ledger_id).metadata, ledger):
                remote.delete(segment.ledger_id)
        except (NoSuchLedger, MalformedMetadata):
            pass  # deleted meanwhile, or no ledger record of a promotion's


def _is_copy(remote: LedgerMetadata, ledger: LedgerMetadata) -> bool:
    """Whether the cluster's record ``remote`` is a copy of the WAL's ``ledger``: it
    names the same first ensemble (this WAL's bookie, whose id no other directory has);
    another ledger of that id would not."""
    return remote.fragments[0] == ledger.fragments[0]


def commit(embedded: MetadataStore, address: str) -> None:
    """Mark the directory as promoted to ``address`` (step 4: the commit), then forget
    the intent."""
    _put(embedded, PROMOTED, address)
    # Committed: whatever fails from here must not undo the promotion (the undo deletes
    # the cluster's copy of the log, which the mark now says is the log).  An intent
    # left behind is stale and harmless: it is read only by check(), which a promoted
    # directory does not call, and demote() deletes it before the mark.
    try:
        _delete(embedded, PROMOTING)
    except BookKeeperError as e:
        log.warning("WAL promoted to %s; its intent could not be deleted (%s), which "
                    "harms nothing", address, e)
    log.info("WAL promoted to %s", address)


class Demotion(NamedTuple):
    """What :func:`demote` did."""

    #: The address of the cluster the directory had been promoted to.
    cluster: str
    #: Segments of the log as it was at the promotion that the demoted log keeps.
    segments_kept: int
    #: Its leading segments whose ledgers the WAL's bookie no longer holds (truncated
    #: while clustered).
    segments_dropped: int


def demote(embedded: MetadataStore, holds_ledger: Callable[[int], bool], local_log: str,
           where: str) -> Demotion:
    """Make a promoted WAL's embedded store the truth again (see the module docstring).

    ``holds_ledger(ledger_id)`` says whether the WAL's bookie holds the ledger; ``where``
    names the directory in errors.  Raises InvalidConfiguration if it is not promoted.
    Every step can be repeated, so a crash in the middle is finished by demoting again."""
    address = promoted_to(embedded)
    if address is None:
        raise InvalidConfiguration(f"{where} is not promoted to a cluster: nothing to "
                                   "demote (it opens as an embedded WAL)")
    kept = dropped = 0
    try:
        data, version = embedded.get(log_path(local_log))
    except NoNode:
        pass  # promoted before its log was ever written
    else:
        metadata = LogMetadata.from_bytes(data)
        first_kept = None
        for segment in live_segments(embedded, metadata):
            if first_kept is None and not holds_ledger(segment.ledger_id):
                dropped += 1
                continue
            first_kept = first_kept or segment
            kept += 1
        truncated_before = metadata.truncated_before
        if dropped:
            first = first_kept.number if first_kept else metadata.next_segment
            truncated_before = max(truncated_before, Position(first, 0, 0))
        ensure_records(embedded, metadata)  # a format-1 log's are written here
        next_segment = metadata.next_segment + SEGMENT_GAP_AFTER_DEMOTION
        mark_dead(embedded, local_log, metadata.next_segment, next_segment, hollow=True)
        tail = tuple(s for s in metadata.tail if s.number >= truncated_before.segment)
        embedded.set(log_path(local_log), dataclasses.replace(
            metadata, tail=tail[-TAIL_SEGMENTS:], truncated_before=truncated_before,
            next_segment=next_segment, format_version=FORMAT_VERSION).to_bytes(), version)
    _delete(embedded, PROMOTING)  # before the mark: a stale intent would allow overwrites
    _delete(embedded, PROMOTED)
    log.info("%s demoted from %s: %d segments kept, %d dropped", where, address, kept,
             dropped)
    return Demotion(address, kept, dropped)


def _read(store: MetadataStore, path: str) -> str | None:
    try:
        return store.get(path)[0].decode("utf-8")
    except NoNode:
        return None


def _put(store: MetadataStore, path: str, text: str | bytes) -> None:
    """Create or replace the record at ``path``."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        store.create(path, data)
    except NodeExists:
        store.set(path, data, ANY_VERSION)


def _delete(store: MetadataStore, path: str) -> None:
    try:
        store.delete(path, ANY_VERSION)
    except NoNode:
        pass
