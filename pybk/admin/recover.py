"""The work of ``pybk recover`` and ``pybk decommission`` (and of the HTTP admin API's
``autorecovery/bookie`` and ``autorecovery/decommission``): moving a stopped bookie's
data to the others, BookKeeper's ``recover`` (``BookKeeperAdmin.recoverBookieData``)
and ``decommissionbookie``.  They reach the cluster as the rest of the admin shell's
work does (:mod:`pybk.admin.commands`) and return plain data (:mod:`pybk.cli.recover`
shows it); their progress goes to standard error (:mod:`pybk.admin.progress`), for the
operator who waits on a command or the bookie's log.

``recover BOOKIE[,BOOKIE...]``
    Re-replicates, from this process, every ledger that gives one of the bookies an
    entry (:func:`pybk.autorecovery.replicas.bookie_holds_entries`), one ledger at a time,
    with the replication workers' :class:`~pybk.autorecovery.rereplication.LedgerRepair`: it
    copies exactly the entries each bookie held from their surviving replicas to a
    replacement chosen by placement, then compare-and-sets the fragment's ensemble.  An
    open ledger whose last fragment names one of the bookies is fenced and closed first
    (recovery), as BookKeeper does; ``--skip-open`` leaves every ledger that is not
    closed as it is.  An open ledger whose last fragment is healthy keeps its writer:
    only its earlier fragments are repaired.  ``--ledger ID`` does that one ledger only;
    ``--delete-cookie`` then removes the bookies' cookies from the cluster (so that
    their ids may serve again on new disks), only once no ledger gives them an entry.
    A ledger that fails does not stop the others; the command then exits 1 naming it,
    and running it again finishes the job (what was recorded stays done).

    ``--query`` lists the ledgers with a fragment on the bookies and changes nothing.
    ``--dry-run`` says, per ledger, which entries would be copied from which bookie to
    which replacement (as placement chooses now), with an estimate of the bytes (from
    a closed ledger's length), and changes nothing.

    Registered bookies (writable or read-only) are refused, unlike BookKeeper, which
    copies from whatever bookie still answers: LedgerRepair counts a registered bookie
    as a surviving replica, so nothing it holds would be moved, and a bookie that runs
    can still take writes of open ledgers while it is being replaced.  Stop the bookie
    first (``--query`` works on a live one).

``decommission BOOKIE``
    BookKeeper's: refuses a registered bookie; asks the auditor to audit now
    (``triggeraudit``: it marks the ledgers of bookies that are gone), waits, at most
    ``--timeout`` seconds, until autorecovery's workers re-replicated every ledger that
    gave the bookie an entry and none is marked for it, showing the ledgers still
    waiting; then removes its cookie.  It fails at once, rather than wait for nothing,
    when autorecovery is disabled or no auditor runs.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Sequence

from pybk.admin.progress import Progress
from pybk.autorecovery.replicas import bookie_holds_entries, holds, spans
from pybk.autorecovery.rereplication import LedgerRepair, Outcome, writer_lost_bookies
from pybk.errors import BookKeeperError, NoSuchBookie
from pybk.meta.interface import MetadataStore
from pybk.meta.ledger_metadata import LedgerMetadata, LedgerState
from pybk.meta.ledgers import LedgerManager
from pybk.meta.underreplication import UnderreplicationManager
from pybk.settings import ServerSettings

if TYPE_CHECKING:
    from pybk.client import BookKeeper

#: Seconds between two looks at the ledgers while ``decommission`` waits.
POLL_S = 1.0


# -- recover ----------------------------------------------------------------------------------

def recover(command: str, bk: "BookKeeper", settings: ServerSettings,
            bookies: Sequence[str], *, query: bool = False, dry_run: bool = False,
            skip_open: bool = False, ledger_id: int | None = None,
            delete_cookie: bool = False) -> Any:
    """What ``recover`` does (see the module docstring) with the ledger client ``bk``
    (:func:`pybk.admin.commands.client`); progress on standard error under
    ``command``'s name.  BookKeeperError for a bookie that is registered (unless
    ``query``) or unknown, or a ledger ``ledger_id`` that does not exist; a ledger that
    fails to be recovered is not an error: its outcome says so.

    JSON: with ``query``, ``[{"ledger": id, "state": str, "bookies": [the given bookies
    its fragments name]}, ...]``; with ``dry_run``, ``[{"ledger": id, "state": str,
    "action": "copy"|"fence, close, copy"|"skip", "copies": [{"first_entry": int,
    "lost": bookie, "replacement": bookie, "entries": [id, ...]}, ...], "entries": int,
    "bytes_estimate": int or null}, ...]`` (an open ledger's last fragment, copied
    after it is closed, is not in it); else ``{"ledgers": [{"ledger": id, "outcome":
    "replicated"|"deleted"|"skipped"|"failed", "entries": int, "bytes": int,
    "error": str or null}, ...], "cookies_deleted": [bookie, ...]}`` (with
    ``delete_cookie``, the cookies are removed only if no ledger failed)."""
    ledgers = _ledgers_naming(bk.ledger_manager, bookies, ledger_id)
    _check_known(bk.metadata, bookies, ledgers, ledger_id, live_ok=query)
    if query:
        return [{"ledger": m.ledger_id, "state": m.state.name,
                 "bookies": _named(m, bookies)} for m in ledgers]
    holding = [m for m in ledgers if any(bookie_holds_entries(m, b) for b in bookies)]
    repair = LedgerRepair(bk, settings, threading.Event())
    if dry_run:
        return [_plan(repair, bk.metadata, m, bookies, skip_open) for m in holding]
    result = _recover(command, repair, holding, bookies, skip_open)
    if delete_cookie and not any(r["outcome"] == "failed" for r in result["ledgers"]):
        result["cookies_deleted"] = _delete_cookies(bk.metadata, bk.ledger_manager,
                                                    bookies)
    return result


def _ledgers_naming(ledgers: LedgerManager, bookies: Sequence[str],
                    ledger_id: int | None) -> list[LedgerMetadata]:
    """The ledgers (only ``ledger_id``, if given: NoSuchLedger if it has none) with a
    fragment on one of ``bookies``, by id."""
    if ledger_id is not None:
        metadata = ledgers.read(ledger_id).metadata
        return [metadata] if _named(metadata, bookies) else []
    found = [metadata for metadata, _version in ledgers.iter_ledgers()
             if _named(metadata, bookies)]
    return sorted(found, key=lambda m: m.ledger_id)


def _named(metadata: LedgerMetadata, bookies: Sequence[str]) -> list[str]:
    return [b for b in bookies if any(b in f.ensemble for f in metadata.fragments)]


def _check_known(store: MetadataStore, bookies: Sequence[str],
                 ledgers: list[LedgerMetadata], ledger_id: int | None,
                 live_ok: bool) -> None:
    """Refuse a bookie that is registered (unless ``live_ok``), or that is unknown: not
    registered, no cookie in the cluster, and named by none of ``ledgers``."""
    writable = set(store.bookies(read_only=False))
    read_only = set(store.bookies(read_only=True))
    named = {b for m in ledgers for b in _named(m, bookies)}
    for bookie in bookies:
        if bookie in writable or bookie in read_only:
            if live_ok:
                continue
            state = "writable" if bookie in writable else "read-only"
            raise BookKeeperError(
                f"bookie {bookie} is registered ({state}): stop it before recovering its "
                "data (pybk copies from the surviving replicas only, and a running bookie "
                "can still take writes)")
        if bookie not in named and store.read_cookie(bookie) is None:
            scope = "no ledger names it" if ledger_id is None else \
                f"ledger {ledger_id} does not name it"
            raise NoSuchBookie(f"bookie {bookie} is unknown: it is not registered, has "
                                  f"no cookie in the cluster, and {scope}")


def _plan(repair: LedgerRepair, store: MetadataStore, metadata: LedgerMetadata,
          bookies: Sequence[str], skip_open: bool) -> dict:
    """What recovering the ledger would do (``--dry-run``)."""
    closed = metadata.state is LedgerState.CLOSED
    if skip_open and not closed:
        action, copies = "skip", []
    else:
        action = "fence, close, copy" if writer_lost_bookies(
            metadata, set(store.bookies())) else "copy"
        copies = repair.plan(metadata, bookies)
    entries = sum(len(c.entry_ids) for c in copies)
    return {"ledger": metadata.ledger_id, "state": metadata.state.name, "action": action,
            "copies": [{"first_entry": c.first_entry, "lost": c.lost,
                        "replacement": c.replacement, "entries": list(c.entry_ids)}
                       for c in copies],
            "entries": entries,
            "bytes_estimate": _bytes_estimate(metadata, entries)}


def _bytes_estimate(metadata: LedgerMetadata, entries: int) -> int | None:
    """About how many bytes ``entries`` of the ledger are: its mean entry size times
    that (None while it is not closed: its length is not known)."""
    if metadata.state is not LedgerState.CLOSED:
        return None
    count = metadata.closed_last_entry_id() + 1
    length = metadata.length
    assert length is not None  # a closed ledger's
    return length * entries // count if count > 0 else 0


def _held(metadata: LedgerMetadata, bookies: Sequence[str]) -> int:
    """How many entries of the ledger's fragments with a known end ``bookies`` hold
    (an entry on two of them counts twice: it is copied twice)."""
    count = 0
    for span in spans(metadata):
        if span.last is None:
            continue
        for index, bookie in enumerate(span.ensemble):
            if bookie in bookies:
                count += sum(1 for e in range(span.first, span.last + 1)
                             if holds(metadata, index, e))
    return count


def _recover(command: str, repair: LedgerRepair, ledgers: list[LedgerMetadata],
             bookies: Sequence[str], skip_open: bool) -> dict:
    """Re-replicate ``ledgers`` one by one, showing progress; what became of each."""
    estimate = sum(_bytes_estimate(m, _held(m, bookies)) or 0 for m in ledgers) or None
    done = []
    with Progress(command, len(ledgers), estimate) as progress:
        for metadata in ledgers:
            found: dict[str, Any] = {"ledger": metadata.ledger_id, "outcome": "skipped",
                                     "entries": 0, "bytes": 0, "error": None}
            if not (skip_open and metadata.state is not LedgerState.CLOSED):
                try:
                    result = repair.run(metadata.ledger_id, bookies, writer_grace_over=True)
                except BookKeeperError as e:
                    found.update(outcome="failed", error=str(e))
                else:
                    assert result.outcome is not Outcome.WAIT_FOR_WRITER, result
                    found.update(outcome="deleted" if result.outcome is Outcome.DELETED
                                 else "replicated", entries=result.entries,
                                 bytes=result.bytes)
            done.append(found)
            progress.done(metadata.ledger_id, found["outcome"], found["entries"],
                          found["bytes"])
    return {"ledgers": done, "cookies_deleted": []}


def _delete_cookies(store: MetadataStore, ledgers: LedgerManager,
                    bookies: Sequence[str]) -> list[str]:
    """Remove the cookies of ``bookies``, once no ledger gives them an entry (else
    BookKeeperError, nothing removed); the bookies whose cookie was removed."""
    holding = _ledgers_holding(ledgers, bookies)
    if holding:
        raise BookKeeperError(
            f"cookies kept: ledgers {_ids(holding)} still give entries to "
            f"{', '.join(sorted({b for bs in holding.values() for b in bs}))}"
            " (skipped with --skip-open or --ledger?)")
    return [b for b in bookies if _remove_cookie(store, b)]


def _ledgers_holding(ledgers: LedgerManager, bookies: Sequence[str]) -> dict[int, list[str]]:
    """The ledgers that give one of ``bookies`` an entry, with those bookies."""
    found = {}
    for metadata in _ledgers_naming(ledgers, bookies, None):
        holding = [b for b in bookies if bookie_holds_entries(metadata, b)]
        if holding:
            found[metadata.ledger_id] = holding
    return found


def _remove_cookie(store: MetadataStore, bookie: str) -> bool:
    """Remove the bookie's cookie from the cluster; whether it had one."""
    found = store.read_cookie(bookie)
    if found is None:
        return False
    store.remove_cookie(bookie, found[1])
    return True


# -- decommission -----------------------------------------------------------------------------

def decommission(command: str, store: MetadataStore, bookie: str,
                 timeout_s: float) -> dict:
    """What ``decommission`` does (see the module docstring) on ``store``, waiting at
    most ``timeout_s``; progress on standard error under ``command``'s name.
    BookKeeperError for a bookie that is registered or unknown, autorecovery disabled or
    without an auditor, or the time out.  JSON: ``{"bookie": id, "ledgers": [ids
    re-replicated meanwhile], "seconds": float, "cookie_removed": bool}``."""
    started = time.monotonic()
    if bookie in store.bookies():
        raise BookKeeperError(f"bookie {bookie} is still registered: stop it (for good) "
                              "before decommissioning it")
    manager = UnderreplicationManager(store)
    ledgers = LedgerManager(store)
    waiting = _waiting_for(ledgers, manager, bookie)
    if not waiting and store.read_cookie(bookie) is None:
        raise NoSuchBookie(f"bookie {bookie} is unknown: it is not registered, has no "
                              "cookie in the cluster, and no ledger names it")
    _check_autorecovery(manager)
    if manager.auditor() is None:
        raise BookKeeperError("no auditor runs (no bookie with autoRecoveryDaemonEnabled "
                              "and no pybk autorecovery process): nothing would "
                              "re-replicate the bookie's ledgers")
    manager.trigger_audit()
    first = set(waiting)
    reported: set[int] = set()
    deadline = started + timeout_s
    with Progress(command, len(first), None) as progress:
        while True:
            for ledger_id in sorted(first - waiting - reported):
                progress.done(ledger_id, "re-replicated")
                reported.add(ledger_id)
            if not waiting:
                break
            if time.monotonic() >= deadline:
                raise BookKeeperError(
                    f"bookie {bookie}: ledgers {_ids(waiting)} still hold entries on it "
                    f"after {timeout_s:.0f} s (see pybk listunderreplicated); its cookie "
                    "is kept: run it again to go on waiting")
            progress.note(f"waiting for autorecovery to re-replicate ledgers "
                          f"{_ids(waiting)}")
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
            _check_autorecovery(manager)
            waiting = _waiting_for(ledgers, manager, bookie)
            first |= waiting  # marked for it only now
    return {"bookie": bookie, "ledgers": sorted(first),
            "seconds": round(time.monotonic() - started, 3),
            "cookie_removed": _remove_cookie(store, bookie)}


def _check_autorecovery(manager: UnderreplicationManager) -> None:
    if not manager.is_enabled():
        raise BookKeeperError("autorecovery is disabled, so nothing would re-replicate "
                              "the bookie's ledgers: pybk autorecovery enable, then run it "
                              "again (or pybk recover the bookie from here)")


def _waiting_for(ledgers: LedgerManager, manager: UnderreplicationManager,
                 bookie: str) -> set[int]:
    """The ledgers that still give ``bookie`` an entry, or are marked for it."""
    found = set(_ledgers_holding(ledgers, [bookie]))
    found.update(m.ledger_id for m in manager.underreplicated(lambda r: bookie in r))
    return found


def _ids(ledger_ids: Any) -> str:
    return ", ".join(map(str, sorted(ledger_ids)))
