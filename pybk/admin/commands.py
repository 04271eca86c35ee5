"""The admin shell's work: what an operator asks of a running cluster, with BookKeeper's
names, for the ``pybk`` command (:mod:`pybk.cli.admin` parses, prints tables or JSON and
reports failures) and for the HTTP admin API (:mod:`pybk.http.endpoints`).

``autorecovery enable|disable|status``, ``listunderreplicated``, ``whoisauditor``,
``triggeraudit``, ``lostbookierecoverydelay [N]``
    Automatic re-replication's switches and state
    (:class:`~pybk.meta.underreplication.UnderreplicationManager`).
``listbookies [--rw|--ro]``, ``clusterinfo``, ``listledgers [--meta] [--bookie ID]``,
``ledgermetadata ID``, ``deleteledger ID``
    The bookie registry and the ledgers.
``bookieinfo``, ``readledger ID [--first N] [--last M] [--bookie ID]``
    What the bookies answer themselves: their disk space and state, a ledger's entries
    (:mod:`pybk.admin.inspect`).
``recover BOOKIE[,BOOKIE...]``, ``decommission BOOKIE``
    A stopped bookie's data moved to the others (:mod:`pybk.admin.recover`).

A command's work is a function of the cluster's metadata store (opened by
:func:`open_store`) or, for those that read or delete ledgers, of a ledger client
(:func:`client`); both reach the cluster a :class:`Target` names.  Each returns plain
data (dicts, lists, strings, numbers, booleans, None), the document ``pybk COMMAND
--json`` prints, described under "JSON" with each function; it raises a
:class:`~pybk.errors.BookKeeperError` when the cluster cannot be reached, the ledger or
bookie is unknown, or the metadata is malformed.  Nothing here prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

from pybk.autorecovery.replicas import coverage
from pybk.errors import BookKeeperError, InvalidConfiguration, NoSuchBookie
from pybk.meta.interface import MetadataStore
from pybk.meta.ledger_metadata import LedgerMetadata, LedgerState
from pybk.meta.underreplication import UnderreplicationManager
from pybk.settings import ServerSettings
from pybk.topology import DEFAULT_LOCATION

if TYPE_CHECKING:
    from pybk.client import BookKeeper
    from pybk.meta.zookeeper import ZooKeeperSettings
    from pybk.net.connect import ClusterBookKeeper


@dataclass(frozen=True)
class Target:
    """Where an admin command goes: ``address`` is the cluster's ``zk://`` address,
    ``zk_timeout_ms`` bounds the wait for its ZooKeeper; ``password`` opens ledgers to
    read them (``bookieRecoveryPasswd``, as BookKeeper's admin does) and
    ``max_entry_bytes`` is the largest entry a bookie may answer (``maxEntrySizeBytes``);
    ``settings`` are the shell's, for its ZooKeeper credentials (``zkEnableSecurity``)
    and CURVE keys."""

    address: str
    zk_timeout_ms: int
    password: bytes = b""
    max_entry_bytes: int = ServerSettings.maxEntrySizeBytes
    settings: ServerSettings = ServerSettings()


def target(settings: ServerSettings) -> Target:
    """The :class:`Target` of ``settings`` (``--zk`` or ``--conf`` made them, or a
    bookie's); InvalidConfiguration if they name no cluster."""
    if not settings.metadataServiceUri:
        raise InvalidConfiguration("no cluster given: pass --zk zk://host:port/ledgers, or "
                                   "--conf with metadataServiceUri")
    return Target(settings.metadataServiceUri, settings.zkTimeout,
                  settings.bookieRecoveryPasswd.encode("utf-8"), settings.maxEntrySizeBytes,
                  settings)


@contextlib.contextmanager
def open_store(target_: Target) -> Iterator[MetadataStore]:
    """The metadata store of the target's cluster, open until the block ends.  The
    admin commands change no log: a cluster of pybk's former layout is left as it is."""
    from pybk.meta.address import open_metadata_store

    with open_metadata_store(target_.address, _zookeeper_settings(target_),
                             move_logs=False) as store:
        yield store


def client(target_: Target) -> "ClusterBookKeeper":
    """A ledger client of the cluster, closed with it: its ZooKeeper waited
    for up to ``zk_timeout_ms``, bookies' replies taken up to ``max_entry_bytes``."""
    from pybk.net.connect import connect
    from pybk.net.curve import client_settings_of
    from pybk.settings import ClientSettings, placement_settings_of

    return connect(target_.address,
                   ClientSettings(maxEntrySizeBytes=target_.max_entry_bytes,
                                  **client_settings_of(target_.settings),
                                  **placement_settings_of(target_.settings)),
                   zk_settings=_zookeeper_settings(target_), move_logs=False)


def _zookeeper_settings(target_: Target) -> "ZooKeeperSettings":
    from pybk.meta.zookeeper import ZooKeeperSettings

    return dataclasses.replace(ZooKeeperSettings.of(target_.settings),
                               zkTimeout=target_.zk_timeout_ms)


# -- autorecovery ---------------------------------------------------------------------------

def autorecovery(action: str) -> Callable[[MetadataStore], dict]:
    """``autorecovery enable|disable|status``.  JSON: ``{"enabled": bool}``, after the
    change."""
    def work(store: MetadataStore) -> dict:
        manager = UnderreplicationManager(store)
        if action == "enable":
            manager.enable()
        elif action == "disable":
            manager.disable()
        return {"enabled": manager.is_enabled()}
    return work


def list_underreplicated(store: MetadataStore) -> list[dict]:
    """``listunderreplicated``.  JSON: ``[{"ledger": id, "missing": [bookie id, ...],
    "marked_ms": ms since the epoch or null, "claimed_by": owner or null}, ...]`` by
    ledger id."""
    manager = UnderreplicationManager(store)
    claims = manager.claimed()
    found = []
    for ledger_id in sorted(manager.ledger_ids()):
        mark = manager.get(ledger_id)
        if mark is not None:  # else repaired meanwhile
            found.append({"ledger": ledger_id, "missing": list(mark.replicas),
                          "marked_ms": mark.ctime_ms, "claimed_by": claims.get(ledger_id)})
    return found


def who_is_auditor(store: MetadataStore) -> dict:
    """``whoisauditor``.  JSON: ``{"auditor": candidate or null}``."""
    return {"auditor": UnderreplicationManager(store).auditor()}


def trigger_audit(store: MetadataStore) -> dict:
    """``triggeraudit``: the auditor audits the missing bookies now, whatever the delay.
    JSON: ``{"triggered": true, "auditor": candidate or null}``."""
    manager = UnderreplicationManager(store)
    manager.trigger_audit()
    return {"triggered": True, "auditor": manager.auditor()}


def lost_bookie_recovery_delay(seconds: int | None) -> Callable[[MetadataStore], dict]:
    """``lostbookierecoverydelay [N]``: show the delay, or set it to ``N`` seconds.
    JSON: ``{"seconds": int, "set": bool}`` (the cluster's value: 0, the default, if no
    auditor or operator wrote one yet)."""
    def work(store: MetadataStore) -> dict:
        manager = UnderreplicationManager(store)
        if seconds is not None:
            manager.set_lost_bookie_recovery_delay(seconds)
        return {"seconds": manager.lost_bookie_recovery_delay(), "set": seconds is not None}
    return work


# -- bookies and ledgers ----------------------------------------------------------------------

def list_bookies(read_only: bool | None) -> Callable[[MetadataStore], list[dict]]:
    """``listbookies [--rw|--ro]``: registered bookies, writable ones (False), read-only
    ones (True) or both (None).  JSON: ``[{"bookie": id, "endpoint": str or null,
    "state": "rw"|"ro", "location": "/region/rack"}, ...]`` by id (the location a bookie
    registered, the default rack for one that registered none)."""
    def work(store: MetadataStore) -> list[dict]:
        read_only_ids = set(store.bookies(read_only=True))
        found = []
        for bookie_id in store.bookies(read_only):
            try:
                endpoint: str | None = store.bookie_endpoint(bookie_id)
            except BookKeeperError:
                endpoint = None  # unregistered meanwhile, or an older registration
            found.append({"bookie": bookie_id, "endpoint": endpoint,
                          "state": "ro" if bookie_id in read_only_ids else "rw",
                          "location": location_of(store, bookie_id)})
        return found
    return work


def location_of(store: MetadataStore, bookie_id: str) -> str:
    """The network location placement sees for the bookie (the default rack if it
    registered none)."""
    return store.bookie_location(bookie_id) or DEFAULT_LOCATION


def describe(metadata: LedgerMetadata) -> dict:
    """A ledger's metadata for people and scripts (the password hash left out):
    ``{"ledger": id, "state": "OPEN"|"IN_RECOVERY"|"CLOSED", "ensemble_size",
    "write_quorum_size", "ack_quorum_size", "last_entry_id", "length", "digest_type",
    "creation_time_ms": milliseconds since the Unix epoch (a number, for scripts),
    "custom_metadata": [its keys, sorted], "fragments": [{"first_entry": id,
    "ensemble": [bookie id, ...]}, ...]}``."""
    return {"ledger": metadata.ledger_id, "state": metadata.state.name,
            "ensemble_size": metadata.ensemble_size,
            "write_quorum_size": metadata.write_quorum_size,
            "ack_quorum_size": metadata.ack_quorum_size,
            "last_entry_id": metadata.last_entry_id, "length": metadata.length,
            "digest_type": metadata.digest_type.name,
            "creation_time_ms": metadata.creation_time_ms,
            "custom_metadata": sorted(metadata.custom_metadata),
            "fragments": [{"first_entry": f.first_entry_id, "ensemble": list(f.ensemble)}
                          for f in metadata.fragments]}


def list_ledgers(with_metadata: bool, bookie: str | None
                 ) -> Callable[[MetadataStore], Iterator[dict]]:
    """``listledgers [--meta] [--bookie ID]``: every ledger, or those with a fragment on
    ``bookie``, read a page at a time and yielded as they are read (in the layout's
    order: :meth:`~pybk.meta.ledgers.LedgerManager.iter_ledger_ids`).  JSON:
    ``[{"ledger": id}, ...]``, or with ``--meta`` (or ``--bookie``, which reads it
    anyway) :func:`describe` of each.  A bookie that neither is registered nor appears
    in any ledger is refused as unknown, once the listing found none."""
    def work(store: MetadataStore) -> Iterator[dict]:
        from pybk.meta.ledgers import LedgerManager
        ledgers = LedgerManager(store)
        if not (with_metadata or bookie):
            yield from ({"ledger": ledger_id} for ledger_id in ledgers.iter_ledger_ids())
            return
        found = False
        for metadata, _version in ledgers.iter_ledgers():
            if bookie is None or any(bookie in f.ensemble for f in metadata.fragments):
                found = True
                yield describe(metadata) if with_metadata else {"ledger": metadata.ledger_id}
        if bookie is not None and not found and bookie not in store.bookies():
            raise NoSuchBookie(f"bookie {bookie} is unknown: it is not registered and "
                               "no ledger names it")
    return work


def ledger_metadata(ledger_id: int) -> Callable[[MetadataStore], dict]:
    """``ledgermetadata ID``.  JSON: :func:`describe`; NoSuchLedger if absent."""
    def work(store: MetadataStore) -> dict:
        from pybk.meta.ledgers import LedgerManager
        return describe(LedgerManager(store).read(ledger_id).metadata)
    return work


def delete_ledger(ledger_id: int) -> Callable[["BookKeeper"], dict]:
    """``deleteledger ID`` (through :func:`client`): its metadata, then its entries on its
    bookies (as :meth:`pybk.client.BookKeeper.delete_ledger`).  JSON: ``{"deleted":
    id}``."""
    def work(bk: "BookKeeper") -> dict:
        bk.delete_ledger(ledger_id)
        return {"deleted": ledger_id}
    return work


# -- clusterinfo ------------------------------------------------------------------------------

def cluster_info(store: MetadataStore) -> dict:
    """``clusterinfo``.  JSON: ``{"writable": [id...], "read_only": [id...], "lost": [id...]
    (bookies with a cookie in the cluster but not registered), "auditor": candidate or
    null, "autorecovery": bool, "lost_bookie_recovery_delay_s": int, "underreplicated":
    marked ledgers now, "backlog": the auditor's last measure {"auditor", "time_ms",
    "ledgers", "entries", "min_replicas"} or null, "fewest_live_replicas": the fewest
    registered bookies holding any entry of any ledger (null without entries),
    "at_risk_ledgers": [id...] (ledgers with an entry on one registered bookie only: one
    more bookie stopping would make it unreadable), "unreadable_ledgers": [id...]
    (ledgers with an entry on no registered bookie: unreadable until one comes back)}``.
    The last three are worked out from the ledgers' metadata and the registry, now."""
    from pybk.meta import paths
    from pybk.meta.ledgers import LedgerManager

    manager = UnderreplicationManager(store)
    live = set(store.bookies())
    read_only = store.bookies(read_only=True)
    try:
        with_cookie = set(store.children(paths.COOKIES))
    except BookKeeperError:
        with_cookie = set()  # no bookie ever formatted on this cluster
    ledgers = LedgerManager(store)
    fewest: int | None = None
    at_risk, unreadable = [], []
    for metadata, _version in ledgers.iter_ledgers():
        least = _fewest_live_replicas(metadata, live)
        if least is not None:
            fewest = least if fewest is None else min(fewest, least)
            if least == 1:
                at_risk.append(metadata.ledger_id)
            elif least == 0:
                unreadable.append(metadata.ledger_id)
    backlog = manager.backlog()
    return {"writable": sorted(live - set(read_only)), "read_only": read_only,
            "lost": sorted(with_cookie - live), "auditor": manager.auditor(),
            "autorecovery": manager.is_enabled(),
            "lost_bookie_recovery_delay_s": manager.lost_bookie_recovery_delay(),
            "underreplicated": sum(1 for _ in manager.ledger_ids()),
            "backlog": None if backlog is None else {
                "auditor": backlog.auditor, "time_ms": backlog.time_ms,
                "ledgers": backlog.ledgers, "entries": backlog.entries,
                "min_replicas": backlog.min_replicas},
            "fewest_live_replicas": fewest, "at_risk_ledgers": at_risk,
            "unreadable_ledgers": unreadable}


def _fewest_live_replicas(metadata: LedgerMetadata, live: set[str]) -> int | None:
    """The fewest bookies of ``live`` in the write set of any entry the ledger may have,
    or None if it has no entries.  An open ledger's last fragment counts as holding an
    entry on each of its write sets (its end is not in the metadata): it is given an end
    E - 1 entries after its start."""
    end = None
    if metadata.state is not LedgerState.CLOSED:
        end = metadata.fragments[-1].first_entry_id + metadata.ensemble_size - 1
    missing = {b for f in metadata.fragments for b in f.ensemble if b not in live}
    return coverage(metadata, missing, end).min_replicas
