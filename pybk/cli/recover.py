"""``pybk recover`` and ``pybk decommission``: the admin shell's commands that move a
stopped bookie's data to the others.  The work, and what each does, is
:mod:`pybk.admin.recover`'s; these commands take the admin shell's options and answer
as it does (:mod:`pybk.cli.admin`: ``--zk``/``--conf``/``--set``, a table or ``--json``,
one line on standard error and exit status 1 on failure), with their progress on
standard error (:mod:`pybk.admin.progress`).

``recover BOOKIE[,BOOKIE...] [--query | --dry-run] [--skip-open] [--ledger ID]
[--delete-cookie]``
    Exit status 1 also when a ledger could not be recovered: after the table, one line
    names the ledgers that failed and why (running it again finishes the job).
``decommission BOOKIE [--timeout SECONDS]``
    Waits for autorecovery at most ``--timeout`` seconds (default 600).
"""

from __future__ import annotations

import argparse
from typing import Any

from pybk.admin import commands as admin
from pybk.admin import recover
from pybk.cli import options
from pybk.cli.admin import add_shell_command, run_on
from pybk.cli.output import fail, table


def add_commands(commands: Any) -> None:
    """Add ``recover`` and ``decommission`` to the ``pybk`` parser's ``commands``."""
    sub = add_shell_command(
        commands, "recover", "re-replicate the ledgers of stopped bookies from here, or "
                             "list them (--query), or say what would be copied (--dry-run)")
    sub.add_argument("bookies", type=_bookie_list, metavar="BOOKIE[,BOOKIE...]",
                     help="the stopped bookies' ids")
    what = sub.add_mutually_exclusive_group()
    what.add_argument("--query", action="store_true",
                      help="only list the ledgers with a fragment on them")
    what.add_argument("--dry-run", action="store_true",
                      help="only say what would be copied where")
    sub.add_argument("--skip-open", action="store_true",
                     help="leave the ledgers that are not closed as they are "
                          "(else they are fenced and closed first)")
    sub.add_argument("--ledger", type=options.whole_number, metavar="ID",
                     help="recover this ledger only")
    sub.add_argument("--delete-cookie", action="store_true",
                     help="then remove the bookies' cookies from the cluster")
    sub.set_defaults(run=run_recover)

    sub = add_shell_command(
        commands, "decommission", "retire a stopped bookie: autorecovery re-replicates "
                                  "its ledgers, then its cookie is removed")
    sub.add_argument("bookie", metavar="BOOKIE", help="the stopped bookie's id")
    sub.add_argument("--timeout", type=options.positive(float), default=600.0,
                     metavar="SECONDS", help="give up waiting for autorecovery "
                     "after this long (default 600)")
    sub.set_defaults(run=run_decommission)


def parse_bookies(text: str) -> list[str]:
    """``BOOKIE[,BOOKIE...]`` as a list, in order, without repeats; ValueError if it
    names none."""
    found = list(dict.fromkeys(b.strip() for b in text.split(",") if b.strip()))
    if not found:
        raise ValueError(f"{text!r} names no bookie")
    return found


def _bookie_list(text: str) -> list[str]:
    """An argument type: ``BOOKIE[,BOOKIE...]``."""
    try:
        return parse_bookies(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def run_recover(args: argparse.Namespace) -> int:
    """``recover``: 0, or 1 with one line on standard error (also after the table, for
    the ledgers that failed)."""
    def work(target: admin.Target) -> Any:
        return lambda bk: recover.recover(
            args.command, bk, target.settings, args.bookies, query=args.query,
            dry_run=args.dry_run, skip_open=args.skip_open, ledger_id=args.ledger,
            delete_cookie=args.delete_cookie)

    def status(result: Any) -> int:
        failed = ([r for r in result["ledgers"] if r["outcome"] == "failed"]
                  if isinstance(result, dict) else [])
        if not failed:
            return 0
        return fail(args.command, f"{len(failed)} ledgers not recovered ("
                    + "; ".join(f"ledger {r['ledger']}: {r['error']}" for r in failed)
                    + "): run it again"
                    + ("; the cookies are kept" if args.delete_cookie else ""))
    show = _show_query if args.query else _show_plan if args.dry_run else _show_recovered
    return run_on(args, work, show, admin.client, status)


def run_decommission(args: argparse.Namespace) -> int:
    """``decommission``: 0, or 1 with one line on standard error."""
    return run_on(args, lambda target: lambda store: recover.decommission(
        args.command, store, args.bookie, args.timeout), _show_decommissioned)


def _show_query(found: list[dict]) -> list[str]:
    return table(("LEDGER", "STATE", "ON BOOKIES"),
                 [(m["ledger"], m["state"], ",".join(m["bookies"])) for m in found])


def _show_plan(found: list[dict]) -> list[str]:
    lines = table(("LEDGER", "STATE", "ACTION", "ENTRIES", "BYTES (ESTIMATE)"),
                  [(m["ledger"], m["state"], m["action"], m["entries"],
                    m["bytes_estimate"]) for m in found])
    for m in found:
        lines += [f"  ledger {m['ledger']}, fragment from entry {c['first_entry']}: "
                  f"{len(c['entries'])} entries of {c['lost']} to {c['replacement']}"
                  for c in m["copies"]]
    return lines


def _show_recovered(result: dict) -> list[str]:
    lines = table(("LEDGER", "OUTCOME", "ENTRIES", "BYTES"),
                  [(r["ledger"], r["outcome"], r["entries"], r["bytes"])
                   for r in result["ledgers"]])
    if result["cookies_deleted"]:
        lines.append(f"cookies deleted: {', '.join(result['cookies_deleted'])}")
    return lines


def _show_decommissioned(r: dict) -> list[str]:
    return [f"bookie {r['bookie']} decommissioned: {len(r['ledgers'])} ledgers "
            f"re-replicated in {r['seconds']:.0f} s; "
            + ("its cookie is removed" if r["cookie_removed"] else "it had no cookie")]
