"""The admin shell: an operator's everyday ``pybk`` commands on a running cluster, with
BookKeeper's names (:mod:`pybk.cli` parses their arguments).

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
    A stopped bookie's data moved to the others (:mod:`pybk.admin.recover`,
    which uses this module's :func:`answer`, :func:`fail` and :func:`run`).

Every command finds the cluster by ``--zk ADDRESS`` or by ``metadataServiceUri`` of a
``--conf`` file (whose ``zkTimeout`` bounds the wait for ZooKeeper).  Output: an aligned
table (or one line) for people on standard output by default; with ``--json``, exactly
one JSON document on standard output, described with each command.  Exit status 0 on
success, 1 with one line ``pybk COMMAND: reason`` on standard error if the cluster
cannot be reached, the ledger or bookie is unknown, or the metadata is malformed; never
a traceback.  :func:`run` does this for every command, on the metadata store or, for
those that read or delete ledgers, on a ledger client (:func:`client`);
:func:`run_streamed` for ``listledgers``, which prints each ledger as it reads it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterable, Iterator, Sequence

from pybk.admin.tables import stream_table, table
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
    """Where an admin command goes, and how it answers: ``address`` is the cluster's
    ``zk://`` address, ``zk_timeout_ms`` bounds the wait for its ZooKeeper, ``as_json``
    asks for one JSON document instead of a table; ``password`` opens ledgers to read
    them (``bookieRecoveryPasswd``, as BookKeeper's admin does) and ``max_entry_bytes``
    is the largest entry a bookie may answer (``maxEntrySizeBytes``); ``settings`` are
    the shell's, for its ZooKeeper credentials (``zkEnableSecurity``) and CURVE keys."""

    command: str
    address: str
    zk_timeout_ms: int
    as_json: bool
    password: bytes = b""
    max_entry_bytes: int = ServerSettings.maxEntrySizeBytes
    settings: ServerSettings = ServerSettings()


def target(command: str, settings: ServerSettings, as_json: bool) -> Target:
    """The :class:`Target` of ``settings`` (``--zk`` or ``--conf`` made them);
    InvalidConfiguration if they name no cluster."""
    if not settings.metadataServiceUri:
        raise InvalidConfiguration("no cluster given: pass --zk zk://host:port/ledgers, or "
                                   "--conf with metadataServiceUri")
    return Target(command, settings.metadataServiceUri, settings.zkTimeout, as_json,
                  settings.bookieRecoveryPasswd.encode("utf-8"), settings.maxEntrySizeBytes,
                  settings)


def run(target_: Target, work: Callable[[Any], Any], show: Callable[[Any], Sequence[str]],
        opener: Callable[[Target], ContextManager[Any]] | None = None) -> int:
    """Open the cluster's store (or what ``opener`` opens: :func:`client`), ``work`` on
    it, and print the result: ``show(result)``'s lines, or the result as JSON.  0, or 1
    with the reason on standard error."""
    try:
        with (opener or open_store)(target_) as opened:
            result = work(opened)
    except BookKeeperError as e:
        return fail(target_, e)
    answer(target_, result, show)
    return 0


def answer(target_: Target, result: Any, show: Callable[[Any], Sequence[str]]) -> None:
    """Print a command's result on standard output: ``show(result)``'s lines, or the
    result as one JSON document."""
    if target_.as_json:
        print(json.dumps(result, sort_keys=True), flush=True)
    else:
        for line in show(result):
            print(line, flush=True)


def run_streamed(target_: Target, work: Callable[[MetadataStore], Iterator[Any]],
                 show: Callable[[Iterator[Any]], Iterator[str]]) -> int:
    """:func:`run` for a listing (``listledgers``): each item is printed as soon as
    ``work`` yields it, while the store stays open, so the first lines come before the
    listing ends and nothing holds the whole of it.  With ``--json`` the output is still
    one JSON document, an array with one item per line (``[`` comes with the first one,
    and ``]`` on a line of its own).  A failure mid-way prints its reason on standard
    error after the lines already printed (exit 1).  A reader that stops reading
    (``| head``) ends the listing quietly."""
    try:
        with open_store(target_) as store:
            items = work(store)
            for line in (_json_lines(items) if target_.as_json else show(items)):
                print(line, flush=True)
    except BookKeeperError as e:
        return fail(target_, e)
    except BrokenPipeError:
        # Python would complain again when it flushes stdout at exit: point it elsewhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


def _json_lines(items: Iterator[Any]) -> Iterator[str]:
    """One JSON array, an item per line: ``[first``, ``,second``, ..., ``]`` (``[]`` if
    empty)."""
    opening = "["
    for item in items:
        yield opening + json.dumps(item, sort_keys=True)
        opening = ","
    yield "[]" if opening == "[" else "]"


def fail(target_: Target, error: BaseException) -> int:
    """Say why the command failed, in one line on standard error; its exit status, 1."""
    print(f"pybk {target_.command}: {error}", file=sys.stderr, flush=True)
    return 1


@contextlib.contextmanager
def open_store(target_: Target) -> Iterator[MetadataStore]:
    """The metadata store of the target's cluster, open until the block ends.  The
    admin commands change no log: a cluster of pybk's former layout is left as it is."""
    from pybk.meta.address import open_metadata_store

    with open_metadata_store(target_.address, _zookeeper_settings(target_),
                             move_logs=False) as store:
        yield store


def client(target_: Target) -> "ClusterBookKeeper":
    """A ledger client of the cluster (an opener for :func:`run`): its ZooKeeper waited
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


def show_autorecovery(result: dict) -> list[str]:
    return [f"autorecovery is {'enabled' if result['enabled'] else 'disabled'}"]


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


def show_underreplicated(found: list[dict]) -> list[str]:
    return table(("LEDGER", "MISSING REPLICAS", "MARKED (ms)", "CLAIMED BY"),
                 [(m["ledger"], ",".join(m["missing"]), m["marked_ms"], m["claimed_by"])
                  for m in found])


def who_is_auditor(store: MetadataStore) -> dict:
    """``whoisauditor``.  JSON: ``{"auditor": candidate or null}``."""
    return {"auditor": UnderreplicationManager(store).auditor()}


def show_auditor(result: dict) -> list[str]:
    return [f"auditor: {result['auditor'] or '(none: no autorecovery process is running)'}"]


def trigger_audit(store: MetadataStore) -> dict:
    """``triggeraudit``: the auditor audits the missing bookies now, whatever the delay.
    JSON: ``{"triggered": true, "auditor": candidate or null}``."""
    manager = UnderreplicationManager(store)
    manager.trigger_audit()
    return {"triggered": True, "auditor": manager.auditor()}


def show_trigger(result: dict) -> list[str]:
    if result["auditor"] is None:
        return ["audit requested; no auditor runs now: the next one elected audits"]
    return [f"audit requested from auditor {result['auditor']}"]


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


def show_delay(result: dict) -> list[str]:
    verb = "set to" if result["set"] else "is"
    return [f"lostBookieRecoveryDelay {verb} {result['seconds']} s"]


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


def show_bookies(found: list[dict]) -> list[str]:
    return table(("BOOKIE", "STATE", "ENDPOINT", "LOCATION"),
                 [(b["bookie"], b["state"], b["endpoint"], b["location"]) for b in found])


def location_of(store: MetadataStore, bookie_id: str) -> str:
    """The network location placement sees for the bookie (the default rack if it
    registered none)."""
    return store.bookie_location(bookie_id) or DEFAULT_LOCATION


def describe(metadata: LedgerMetadata) -> dict:
    """A ledger's metadata for people and scripts (the password hash left out)."""
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


def show_ledgers(found: Iterable[dict]) -> Iterator[str]:
    """:func:`list_ledgers`'s table, line by line as the ledgers come."""
    found = iter(found)
    first = next(found, None)
    if first is None:
        yield from table(("LEDGER",), [])
        return
    found = itertools.chain([first], found)
    if "state" in first:
        yield from stream_table(
            ("LEDGER", "STATE", "E/Qw/Qa", "LAST ENTRY", "BYTES", "ENSEMBLES"),
            ((m["ledger"], m["state"], f"{m['ensemble_size']}/"
              f"{m['write_quorum_size']}/{m['ack_quorum_size']}", m["last_entry_id"],
              m["length"], _ensembles(m)) for m in found))
    else:
        yield from stream_table(("LEDGER",), ((m["ledger"],) for m in found))


def ledger_metadata(ledger_id: int) -> Callable[[MetadataStore], dict]:
    """``ledgermetadata ID``.  JSON: :func:`describe`; NoSuchLedger (exit 1) if absent."""
    def work(store: MetadataStore) -> dict:
        from pybk.meta.ledgers import LedgerManager
        return describe(LedgerManager(store).read(ledger_id).metadata)
    return work


def show_metadata(m: dict) -> list[str]:
    lines = [f"ledger {m['ledger']}: {m['state']}, E={m['ensemble_size']} "
             f"Qw={m['write_quorum_size']} Qa={m['ack_quorum_size']}, digest "
             f"{m['digest_type']}, created {m['creation_time_ms']} ms"]
    if m["state"] == "CLOSED":
        lines.append(f"  last entry {m['last_entry_id']}, {m['length']} bytes")
    if m["custom_metadata"]:
        lines.append(f"  custom metadata: {', '.join(m['custom_metadata'])}")
    lines += [f"  from entry {f['first_entry']}: {', '.join(f['ensemble'])}"
              for f in m["fragments"]]
    return lines


def _ensembles(m: dict) -> str:
    return " ".join(f"{f['first_entry']}:[{','.join(f['ensemble'])}]" for f in m["fragments"])


def delete_ledger(ledger_id: int) -> Callable[["BookKeeper"], dict]:
    """``deleteledger ID`` (through :func:`client`): its metadata, then its entries on its
    bookies (as :meth:`pybk.client.BookKeeper.delete_ledger`).  JSON: ``{"deleted":
    id}``."""
    def work(bk: "BookKeeper") -> dict:
        bk.delete_ledger(ledger_id)
        return {"deleted": ledger_id}
    return work


def show_deleted(result: dict) -> list[str]:
    return [f"deleted ledger {result['deleted']}"]


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


def show_cluster(info: dict) -> list[str]:
    backlog = info["backlog"]
    risk, unreadable = info["at_risk_ledgers"], info["unreadable_ledgers"]
    return [
        f"bookies writable ({len(info['writable'])}): {', '.join(info['writable']) or '-'}",
        f"bookies read-only ({len(info['read_only'])}): "
        f"{', '.join(info['read_only']) or '-'}",
        f"bookies lost ({len(info['lost'])}): {', '.join(info['lost']) or '-'}",
        f"auditor: {info['auditor'] or '(none)'}",
        f"autorecovery: {'enabled' if info['autorecovery'] else 'disabled'}, "
        f"lostBookieRecoveryDelay {info['lost_bookie_recovery_delay_s']} s",
        f"under-replicated ledgers: {info['underreplicated']}"
        + ("" if backlog is None else
           f" (auditor's last measure: {backlog['ledgers']} ledgers, {backlog['entries']} "
           f"entries, fewest replicas {_or_dash(backlog['min_replicas'])})"),
        f"fewest live replicas of any entry: {_or_dash(info['fewest_live_replicas'])}",
        "one more bookie stopping would lose entries of ledgers "
        + ", ".join(map(str, risk)) if risk else
        "no entry would lose its last replica if one more bookie stopped",
    ] + ([f"entries with no live replica (unreadable until a bookie returns) in ledgers "
          f"{', '.join(map(str, unreadable))}"] if unreadable else [])


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)
