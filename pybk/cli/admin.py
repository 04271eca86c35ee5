"""The admin shell of ``pybk``: an operator's everyday commands on a running cluster, with
BookKeeper's names.  Their work is :mod:`pybk.admin.commands`' and
:mod:`pybk.admin.inspect`'s (which describe each result); this module parses their
options and shows the results.

``autorecovery enable|disable|status``, ``listunderreplicated``, ``whoisauditor``,
``triggeraudit``, ``lostbookierecoverydelay [N]``
    Automatic re-replication's switches and state.
``listbookies [--rw|--ro]``, ``clusterinfo``, ``listledgers [--meta] [--bookie ID]``,
``ledgermetadata ID``, ``deleteledger ID``
    The bookie registry and the ledgers.
``bookieinfo [--timeout S]``, ``readledger ID [--first N] [--last M] [--bookie ID |
--unconfirmed]``
    What the bookies answer themselves: their disk space and state, a ledger's entries.

``recover`` and ``decommission`` belong to the shell too (:mod:`pybk.cli.recover`).
Every command finds the cluster by ``--zk ADDRESS`` or by ``metadataServiceUri`` of a
``--conf`` file (whose ``zkTimeout`` bounds the wait for ZooKeeper); ``--set`` sets any
other setting (``bookieRecoveryPasswd`` for ``readledger``, the credentials).  Output
(:mod:`pybk.cli.output`): an aligned table (or a few lines) for people on standard
output by default; with ``--json``, exactly one JSON document on standard output, the
work's result as it is.  Times are shown as UTC times (ISO 8601) in tables and stay
milliseconds since the epoch in JSON.  Exit status 0 on success, 1 with one line ``pybk
COMMAND: reason`` on standard error if the cluster cannot be reached, the ledger or
bookie is unknown, or the metadata is malformed; 2 (a usage error) if no cluster is
given.  ``listledgers`` prints each ledger as it reads it (:func:`output.run_streamed
<pybk.cli.output.run_streamed>`).

Payloads in ``readledger``'s table: printable text between double quotes, anything
else as ``0x`` and its hex digits, cut to :data:`PAYLOAD_WIDTH` characters (a cut one
ends with ``...``); with ``--json`` they are whole and base64-encoded.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import itertools
from typing import Any, Callable, ContextManager, Iterable, Iterator

from pybk.admin import commands as admin
from pybk.admin import inspect
from pybk.cli import options
from pybk.cli.output import Show, UsageError, run, run_streamed, stream_table, table
from pybk.errors import InvalidConfiguration

#: Characters of a payload a table shows (the quotes or ``0x`` included).
PAYLOAD_WIDTH = 60
#: What ``autorecovery`` takes instead of running (:mod:`pybk.cli.cluster` adds it).
AUTORECOVERY_ACTIONS = ("enable", "disable", "status")
#: BookKeeper's name of an admin command where pybk's is shorter.
_BOOKKEEPER_NAMES = {"decommission": "decommissionbookie"}

#: A command's work on what its opener opens (the metadata store, or a ledger client).
Work = Callable[[Any], Any]


def add_shell_command(commands: Any, name: str, text: str) -> argparse.ArgumentParser:
    """Add an admin shell command to the ``pybk`` parser's ``commands``, with ``--zk``,
    ``--conf``, ``--set`` and ``--json``; its parser, for its own options."""
    sub = commands.add_parser(name, help=text, description=text[0].upper() + text[1:]
                              + f" (BookKeeper's {_BOOKKEEPER_NAMES.get(name, name)}).")
    options.add_cluster(sub)
    sub.add_argument("--json", action="store_true",
                     help="one JSON document for scripts instead of a table")
    return sub


def target_of(args: argparse.Namespace) -> admin.Target:
    """The cluster an admin command goes to, from its options; :class:`UsageError` if
    they name none or are wrong."""
    try:
        return admin.target(options.settings_of(args))
    except InvalidConfiguration as e:
        raise UsageError(str(e)) from None


def run_on(args: argparse.Namespace, work: Callable[[admin.Target], Work], show: Show,
           opener: Callable[[admin.Target], ContextManager[Any]] = admin.open_store,
           status: Callable[[Any], int] | None = None) -> int:
    """Run an admin command: open the cluster's store (or what ``opener`` opens:
    :func:`pybk.admin.commands.client`), do the ``work`` made for its target, and answer
    (:func:`pybk.cli.output.run`, with ``status``)."""
    target = target_of(args)

    def opened() -> Any:
        with opener(target) as on:
            return work(target)(on)
    return run(args.command, opened, show, args.json, status)


def _run_listledgers(args: argparse.Namespace) -> int:
    """``listledgers``: streamed, since a cluster may hold millions."""
    target = target_of(args)
    work = admin.list_ledgers(args.meta, args.bookie)

    @contextlib.contextmanager
    def listing() -> Iterator[Iterator[dict]]:
        with admin.open_store(target) as store:
            yield work(store)
    return run_streamed(args.command, listing, show_ledgers, args.json)


# -- tables -----------------------------------------------------------------------------------

def show_autorecovery(result: dict) -> list[str]:
    return [f"autorecovery is {'enabled' if result['enabled'] else 'disabled'}"]


def show_underreplicated(found: list[dict]) -> list[str]:
    return table(("LEDGER", "MISSING REPLICAS", "MARKED", "CLAIMED BY"),
                 [(m["ledger"], ",".join(m["missing"]),
                   None if m["marked_ms"] is None else utc_time(m["marked_ms"]),
                   m["claimed_by"]) for m in found])


def show_auditor(result: dict) -> list[str]:
    return [f"auditor: {result['auditor'] or '(none: no autorecovery process is running)'}"]


def show_trigger(result: dict) -> list[str]:
    if result["auditor"] is None:
        return ["audit requested; no auditor runs now: the next one elected audits"]
    return [f"audit requested from auditor {result['auditor']}"]


def show_delay(result: dict) -> list[str]:
    verb = "set to" if result["set"] else "is"
    return [f"lostBookieRecoveryDelay {verb} {result['seconds']} s"]


def show_bookies(found: list[dict]) -> list[str]:
    return table(("BOOKIE", "STATE", "ENDPOINT", "LOCATION"),
                 [(b["bookie"], b["state"], b["endpoint"], b["location"]) for b in found])


def show_ledgers(found: Iterable[dict]) -> Iterator[str]:
    """:func:`pybk.admin.commands.list_ledgers`'s table, line by line as the ledgers
    come."""
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


def _ensembles(m: dict) -> str:
    return " ".join(f"{f['first_entry']}:[{','.join(f['ensemble'])}]" for f in m["fragments"])


def show_metadata(m: dict) -> list[str]:
    """``ledgermetadata``'s lines; its creation time as a UTC time (ISO 8601), which
    ``--json`` keeps as milliseconds since the epoch (``creation_time_ms``), for
    scripts."""
    lines = [f"ledger {m['ledger']}: {m['state']}, E={m['ensemble_size']} "
             f"Qw={m['write_quorum_size']} Qa={m['ack_quorum_size']}, digest "
             f"{m['digest_type']}, created {utc_time(m['creation_time_ms'])}"]
    if m["state"] == "CLOSED":
        lines.append(f"  last entry {m['last_entry_id']}, {m['length']} bytes")
    if m["custom_metadata"]:
        lines.append(f"  custom metadata: {', '.join(m['custom_metadata'])}")
    lines += [f"  from entry {f['first_entry']}: {', '.join(f['ensemble'])}"
              for f in m["fragments"]]
    return lines


def utc_time(epoch_ms: int) -> str:
    """Milliseconds since the Unix epoch as a UTC time in ISO 8601, to the millisecond:
    ``2026-11-28T15:57:06.123Z`` (as ``N ms`` if no calendar has that year)."""
    try:
        moment = datetime.datetime.fromtimestamp(epoch_ms // 1000, datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return f"{epoch_ms} ms"
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def show_deleted(result: dict) -> list[str]:
    return [f"deleted ledger {result['deleted']}"]


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


def show_bookie_info(result: dict) -> list[str]:
    human_bytes = inspect.human_bytes
    rows = [(b["bookie"], b["state"], human_bytes(b["free_bytes"]),
             human_bytes(b["total_bytes"]),
             None if b["used_percent"] is None else f"{b['used_percent']:.1f}%",
             b["location"])
            for b in result["bookies"]]
    lines = table(("BOOKIE", "STATE", "FREE", "TOTAL", "USED", "LOCATION"), rows)
    total = result["total_bytes"]
    used = f" ({100.0 * (total - result['free_bytes']) / total:.1f}% used)" if total else ""
    lines.append(f"total: {human_bytes(result['free_bytes'])} free of {human_bytes(total)}"
                 f"{used} on {len(rows) - result['unreachable']} bookies; "
                 f"{result['unreachable']} unreachable")
    return lines


def show_ledger_entries(result: dict) -> list[str]:
    entries = result["entries"]
    where = (f"bookie {result['bookie']}'s copies" if result["bookie"] else
             "read through the client")
    bad = sum(1 for e in entries if e["status"] != "ok")
    past = sum(1 for e in entries if e["entry"] > result["last_readable"])
    lines = [f"ledger {result['ledger']}: {result['state']}, last readable entry "
             f"{result['last_readable']}; {len(entries)} entries, {where}"
             + (f", {bad} missing or unreadable there" if result["bookie"] else "")
             + (f", {past} past the LAC (unconfirmed)" if result["unconfirmed"] else "")]
    return lines + table(("ENTRY", "SIZE", "PAYLOAD"), list(_entry_rows(entries)))


def _entry_rows(entries: list[dict]) -> Iterator[tuple]:
    for e in entries:
        if e["status"] == "ok":
            yield e["entry"], e["size"], payload_text(base64.b64decode(e["payload_base64"]))
        else:
            yield e["entry"], None, f"({e['status']})"


def payload_text(payload: bytes, width: int = PAYLOAD_WIDTH) -> str:
    """A payload for a table: printable text between double quotes, else ``0x`` and hex;
    at most ``width`` characters, ending with ``...`` when cut."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    shown = (f'"{text}"' if text is not None and text.isprintable()
             else "0x" + payload[:width // 2].hex())
    return shown if len(shown) <= width else shown[:width - 3] + "..."


# -- the commands -----------------------------------------------------------------------------

def _add_ledger(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("ledger", type=options.whole_number, metavar="ID", help="the ledger's id")


def _add_readledger(sub: argparse.ArgumentParser) -> None:
    _add_ledger(sub)
    sub.add_argument("--first", type=options.whole_number, default=0, metavar="N",
                     help="the first entry to show (default 0)")
    sub.add_argument("--last", type=options.whole_number, metavar="M",
                     help="the last entry to show (default, and at most: the last "
                          "entry of a closed ledger, the LAC of an open one)")
    sub.add_argument("--bookie", metavar="ID",
                     help="read only this bookie's copies of the entries its "
                          "write sets give it, to check one replica")
    sub.add_argument("--unconfirmed", action="store_true",
                     help="read an open ledger past its LAC too, to the last "
                          "entry its bookies hold (or --last): entries that may "
                          "not be acknowledged yet")


def _add_bookieinfo(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--timeout", type=options.positive(float), metavar="SECONDS",
                     default=5.0, help="how long to wait for the bookies' answers, "
                                       "all together (default 5)")


def _add_delay(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("seconds", type=options.whole_number, nargs="?", metavar="N",
                     help="set it to N seconds (default: show it)")


def _add_listbookies(sub: argparse.ArgumentParser) -> None:
    which = sub.add_mutually_exclusive_group()
    which.add_argument("--rw", dest="read_only", action="store_false", default=None,
                       help="writable bookies only")
    which.add_argument("--ro", dest="read_only", action="store_true",
                       help="read-only bookies only")


def _add_listledgers(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--meta", action="store_true", help="with their metadata")
    sub.add_argument("--bookie", metavar="ID",
                     help="only ledgers with a fragment on this bookie")


def _no_options(sub: argparse.ArgumentParser) -> None:
    pass


def _on_store(work: Callable[[argparse.Namespace, admin.Target], Work], show: Show
              ) -> Callable[[argparse.Namespace], int]:
    """A command whose ``work(args, target)`` runs on the metadata store."""
    return lambda args: run_on(args, lambda t: work(args, t), show)


def _on_client(work: Callable[[argparse.Namespace, admin.Target], Work], show: Show
               ) -> Callable[[argparse.Namespace], int]:
    """A command whose ``work(args, target)`` runs on a ledger client."""
    return lambda args: run_on(args, lambda t: work(args, t), show, admin.client)


#: The admin shell's commands (but ``autorecovery``, ``recover``, ``decommission``): the
#: help, what adds its own options, and how it runs.
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                          Callable[[argparse.Namespace], int]]] = {
    "listunderreplicated": (
        "the under-replicated ledgers: missing replicas, who repairs them", _no_options,
        _on_store(lambda a, t: admin.list_underreplicated, show_underreplicated)),
    "whoisauditor": (
        "the elected auditor", _no_options,
        _on_store(lambda a, t: admin.who_is_auditor, show_auditor)),
    "triggeraudit": (
        "make the auditor audit the missing bookies now", _no_options,
        _on_store(lambda a, t: admin.trigger_audit, show_trigger)),
    "lostbookierecoverydelay": (
        "show or set how long a bookie may be gone before its ledgers are marked "
        "under-replicated", _add_delay,
        _on_store(lambda a, t: admin.lost_bookie_recovery_delay(a.seconds), show_delay)),
    "listbookies": (
        "the registered bookies", _add_listbookies,
        _on_store(lambda a, t: admin.list_bookies(a.read_only), show_bookies)),
    "clusterinfo": (
        "bookies writable, read-only and lost; the auditor; autorecovery; the "
        "under-replicated backlog; whether one more bookie stopping would lose an entry",
        _no_options, _on_store(lambda a, t: admin.cluster_info, show_cluster)),
    "listledgers": (
        "the ledgers, or those on one bookie", _add_listledgers, _run_listledgers),
    "ledgermetadata": (
        "one ledger's metadata", _add_ledger,
        _on_store(lambda a, t: admin.ledger_metadata(a.ledger), show_metadata)),
    "deleteledger": (
        "delete a ledger: its metadata, then its entries on its bookies", _add_ledger,
        _on_client(lambda a, t: admin.delete_ledger(a.ledger), show_deleted)),
    "bookieinfo": (
        "each registered bookie's state, free and total disk space, as it answers "
        "itself (unreachable if it does not)", _add_bookieinfo,
        _on_store(lambda a, t: inspect.bookie_info(a.timeout, t.settings),
                  show_bookie_info)),
    "readledger": (
        "a ledger's entries, read through the client without recovery, or one bookie's "
        "copies of them", _add_readledger,
        _on_client(lambda a, t: inspect.read_ledger(a.ledger, a.first, a.last, a.bookie,
                                                    t.password, a.unconfirmed),
                   show_ledger_entries)),
}


#: ``autorecovery enable|disable|status`` (:mod:`pybk.cli.cluster` adds ``autorecovery``).
run_autorecovery = _on_store(lambda a, t: admin.autorecovery(a.action), show_autorecovery)


def add_commands(commands: Any) -> None:
    """Add the admin shell's commands to the ``pybk`` parser's ``commands``."""
    for name, (text, add_options, command) in COMMANDS.items():
        sub = add_shell_command(commands, name, text)
        add_options(sub)
        sub.set_defaults(run=command)
