"""The admin shell's work that asks the bookies themselves, over the wire
(:mod:`pybk.admin.commands` holds the work that reads the metadata only, and how it
reaches the cluster; :mod:`pybk.cli.admin` shows the results).

``bookieinfo``
    Each registered bookie's own answer to an INFO request: writable or read-only, free
    and total bytes of its ledger directories.  The bookies are asked in parallel and
    given ``--timeout`` seconds together; one that does not answer (down, stopped,
    unreachable) is shown as unreachable, which is not a failure of the command.
``readledger ID [--first N] [--last M] [--bookie ID | --unconfirmed]``
    A ledger's entries, as BookKeeper's ``readledger``.  Through the client by default:
    each entry from a bookie of its write set, its digest checked, up to the last entry
    of a closed ledger or the LAC of an open one.  An open ledger is read without
    recovery (BookKeeper's ``openLedgerNoRecovery``): nothing is fenced, its writer goes
    on.  With ``--bookie`` only that bookie is read, for the entries of the range its
    write sets give it, so an operator can check one replica: each is shown as held
    (digest checked), missing, or with a bad digest.  Ledgers are opened with
    ``bookieRecoveryPasswd`` (``--set bookieRecoveryPasswd=...``), as BookKeeper's admin
    opens them.  With ``--unconfirmed`` an open ledger is read past its LAC too
    (BookKeeper's ``readUnconfirmedEntries``: entries the writer may not have had
    acknowledged yet, which recovery may leave out if it dies), up to ``--last`` or the
    end of what its bookies hold: the read stops before the first entry that no bookie
    of its write set holds.  A closed ledger is never read past its last entry.  The
    entries are gathered before anything is printed (the JSON document is one value):
    for a long ledger, ask for a range with ``--first`` and ``--last``.  Payloads are
    whole and base64-encoded (``payload_base64``): JSON has no bytes, and base64 is
    compact and what every language decodes.
"""

from __future__ import annotations

import base64
import contextlib
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Callable

from pybk.admin.commands import location_of
from pybk.client.digest import DigestManager
from pybk.client.reads import READ_BATCH_MAX_BYTES
from pybk.errors import (
    BookieUnavailable,
    BookKeeperError,
    DigestMismatch,
    NoSuchBookie,
    NoSuchEntry,
    NoSuchLedger,
    Timeout,
    Unauthorized,
)
from pybk.meta.interface import MetadataStore
from pybk.meta.ledger_metadata import LedgerMetadata, LedgerState
from pybk.settings import ServerSettings

if TYPE_CHECKING:
    from pybk.client import BookKeeper
    from pybk.client.ledger import LedgerHandle

#: Entries one ``read_unconfirmed`` call asks for, without ``--last`` (whose end is
#: unknown until an entry is missing).
UNCONFIRMED_CHUNK_ENTRIES = 1000
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


# -- bookieinfo -------------------------------------------------------------------------------

def bookie_info(timeout_s: float,
                settings: ServerSettings | None = None) -> Callable[[MetadataStore], dict]:
    """``bookieinfo``: ask every registered bookie for its disk space and state, all at
    once, waiting ``timeout_s`` for them together.  JSON: ``{"bookies": [{"bookie": id,
    "state": "writable"|"read-only"|"unreachable", "free_bytes": int or null,
    "total_bytes": int or null, "used_percent": float or null, "location": its network
    location as in ``listbookies``, "error": why it is unreachable, or null}, ...] by id,
    "free_bytes": sum over the bookies that answered, "total_bytes": likewise,
    "unreachable": how many did not answer}``.  The state is the bookie's own (a bookie
    turns read-only before the registry says so).  The shell reaches bookies that serve
    CURVE with the key pair of its ``settings``."""
    def work(store: MetadataStore) -> dict:
        from pybk.net import curve
        from pybk.net.client import ClientLoop, ZmqBookieClient
        from pybk.settings import ClientSettings

        client_settings = ClientSettings(
            readTimeout=timeout_s, **curve.client_settings_of(settings or ServerSettings()))
        bookies = []
        with contextlib.ExitStack() as opened:
            loop = opened.enter_context(ClientLoop())
            asked: dict[str, Future | BaseException] = {}
            for bookie_id in store.bookies():
                try:
                    endpoint, key = curve.split_registered(store.bookie_endpoint(bookie_id))
                    if not endpoint:
                        raise BookKeeperError("it registered no endpoint")
                    client = opened.enter_context(ZmqBookieClient(
                        bookie_id, endpoint, client_settings, loop=loop, server_key=key))
                except BookKeeperError as e:  # unregistered meanwhile, CURVE on one side
                    asked[bookie_id] = e
                    continue
                asked[bookie_id] = client.bookie_info()
            deadline = time.monotonic() + timeout_s
            for bookie_id, asking in asked.items():
                bookies.append(_info_row(bookie_id, asking, deadline)
                               | {"location": location_of(store, bookie_id)})
        answered = [b for b in bookies if b["error"] is None]
        return {"bookies": bookies,
                "free_bytes": sum(b["free_bytes"] for b in answered),
                "total_bytes": sum(b["total_bytes"] for b in answered),
                "unreachable": len(bookies) - len(answered)}
    return work


def _info_row(bookie_id: str, asking: "Future | BaseException", deadline: float) -> dict:
    """One bookie's line of :func:`bookie_info` from its INFO future (or the error that
    kept it from being asked)."""
    try:
        if isinstance(asking, BaseException):
            raise asking
        # the request fails by itself after readTimeout; the margin is for its thread
        info = asking.result(timeout=max(0.0, deadline - time.monotonic()) + 1.0)
    except (BookKeeperError, FutureTimeout) as e:
        return {"bookie": bookie_id, "state": "unreachable", "free_bytes": None,
                "total_bytes": None, "used_percent": None,
                "error": str(e) or "no answer in time"}
    used = (round(100.0 * (info.total_bytes - info.free_bytes) / info.total_bytes, 1)
            if info.total_bytes else None)
    return {"bookie": bookie_id, "state": "read-only" if info.read_only else "writable",
            "free_bytes": info.free_bytes, "total_bytes": info.total_bytes,
            "used_percent": used, "error": None}


def human_bytes(count: int | None) -> str | None:
    """``count`` bytes in binary units, 3 significant digits or more: ``512 B``, ``1.5
    KiB``, ``20.0 GiB``, ``252 GiB`` (None stays None: a table shows ``-``)."""
    if count is None:
        return None
    value, unit = float(count), 0
    while value >= 1024 and unit + 1 < len(_UNITS):
        value, unit = value / 1024, unit + 1
    if unit == 0:
        return f"{count} B"
    return f"{value:.3g} {_UNITS[unit]}" if value < 100 else f"{value:.0f} {_UNITS[unit]}"


# -- readledger -------------------------------------------------------------------------------

def read_ledger(ledger_id: int, first: int, last: int | None, bookie: str | None,
                password: bytes, unconfirmed: bool = False) -> Callable[["BookKeeper"], dict]:
    """``readledger`` (through :func:`pybk.admin.commands.client`): entries
    ``first`` .. ``last`` (None: to the end), clipped to the readable ones, or with
    ``unconfirmed`` to those the bookies hold (module docstring).  JSON:
    ``{"ledger": id, "state": "OPEN"|"IN_RECOVERY"|"CLOSED", "last_readable": the last
    entry of a closed ledger or the LAC of an open one (-1: none), "bookie": id or null,
    "unconfirmed": bool, "entries": [{"entry": id, "status": "ok", "size": payload
    bytes, "payload_base64": str} or, with ``--bookie``, {"entry": id, "status":
    "missing"|"bad digest"|"error", "error": str}, ...] by entry id}``.
    BookKeeperError: ``first`` over ``last``, ``unconfirmed`` with ``bookie``,
    no such ledger, a wrong password, an entry the client cannot read, or with
    ``bookie``: a bookie not in the ledger's ensembles, or one that does not answer."""
    def work(bk: "BookKeeper") -> dict:
        if last is not None and first > last:
            raise BookKeeperError(f"--first {first} is after --last {last}")
        if unconfirmed and bookie is not None:
            raise BookKeeperError("--unconfirmed reads through the client, --bookie one "
                                  "bookie's copies: give one of them")
        if bookie is not None:
            _check_in_ensembles(bk, bk.ledger_manager.read(ledger_id).metadata, bookie)
        try:
            handle = bk.open_ledger(ledger_id, password, recovery=False)
        except Unauthorized as e:
            raise Unauthorized(f"{e} (readledger opens ledgers with bookieRecoveryPasswd: "
                               "--set bookieRecoveryPasswd=...)") from None
        try:
            limit = handle.last_add_confirmed
            end = limit if last is None else min(last, limit)
            if bookie is not None:
                entries = _read_replica(bk, handle.metadata, bookie, first, end, password)
            elif unconfirmed and handle.metadata.state is not LedgerState.CLOSED:
                entries = _read_unconfirmed(handle, first, last)
            else:
                entries = _read_through_client(handle, first, end)
        finally:
            handle.close()
        return {"ledger": ledger_id, "state": handle.metadata.state.name,
                "last_readable": limit, "bookie": bookie, "unconfirmed": unconfirmed,
                "entries": entries}
    return work


def _check_in_ensembles(bk: "BookKeeper", metadata: LedgerMetadata, bookie: str) -> None:
    if any(bookie in f.ensemble for f in metadata.fragments):
        return
    if bookie in bk.metadata.bookies():
        raise BookKeeperError(f"bookie {bookie} is not in any ensemble of ledger "
                              f"{metadata.ledger_id}: it holds none of its entries")
    raise NoSuchBookie(f"bookie {bookie} is unknown: it is not registered and ledger "
                          f"{metadata.ledger_id} does not name it")


def _read_through_client(handle: "LedgerHandle", first: int, last: int) -> list[dict]:
    if first > last:
        return []
    return [_held(entry.entry_id, entry.data) for entry in handle.read_entries(first, last)]


def _read_unconfirmed(handle: "LedgerHandle", first: int, last: int | None) -> list[dict]:
    """Entries ``first .. last`` (None: no end) of an open ledger as its bookies hold
    them, up to the first one none of its write set holds."""
    found: list[dict] = []
    at = first
    while last is None or at <= last:
        end = at + UNCONFIRMED_CHUNK_ENTRIES - 1
        end = end if last is None else min(last, end)
        try:
            for entry in handle.read_unconfirmed(at, end):
                found.append(_held(entry.entry_id, entry.data))
        except NoSuchEntry:
            break  # the end of what the bookies hold
        at = end + 1
    return found


def _read_replica(bk: "BookKeeper", metadata: LedgerMetadata, bookie: str, first: int,
                  last: int, password: bytes) -> list[dict]:
    """What ``bookie`` answers for the entries of ``first .. last`` its write sets give
    it, many per request (:meth:`~pybk.client.transport.BookieClient.read_batch`)."""
    wanted = [e for e in range(first, last + 1) if bookie in metadata.write_set(e)]
    digest = DigestManager(metadata.ledger_id, metadata.digest_type, password,
                           metadata.mac_key_prefix)
    client = bk.bookie_client(bookie)
    found: list[dict] = []
    while len(found) < len(wanted):
        asked = wanted[len(found):]
        try:
            answers = client.read_batch(metadata.ledger_id, asked, READ_BATCH_MAX_BYTES) \
                .result(timeout=bk.settings.readTimeout + 1.0)
        except FutureTimeout:
            raise BookKeeperError(f"bookie {bookie} did not answer within "
                                  f"{bk.settings.readTimeout} s") from None
        except BookKeeperError as e:
            raise BookKeeperError(f"cannot read bookie {bookie}: {e}") from None
        for entry_id, answer in zip(asked, answers):
            if isinstance(answer, (BookieUnavailable, Timeout)):  # the bookie, not an entry
                raise BookKeeperError(f"cannot read bookie {bookie}: {answer}")
            found.append(_replica_row(digest, entry_id, answer))
    return found


def _replica_row(digest: DigestManager, entry_id: int, answer: bytes | BaseException
                 ) -> dict:
    if isinstance(answer, (NoSuchEntry, NoSuchLedger)):
        return {"entry": entry_id, "status": "missing", "error": str(answer)}
    if isinstance(answer, BaseException):
        return {"entry": entry_id, "status": "error", "error": str(answer)}
    try:
        return _held(entry_id, digest.decode(entry_id, answer).data)
    except DigestMismatch as e:
        return {"entry": entry_id, "status": "bad digest", "error": str(e)}


def _held(entry_id: int, payload: bytes) -> dict:
    return {"entry": entry_id, "status": "ok", "size": len(payload),
            "payload_base64": base64.b64encode(payload).decode("ascii")}
