"""BookKeeper's offline commands, on a *stopped* bookie's directories
(:mod:`pybk.storage.inspect` reads the files).

``readjournal [FILE|ID] [--msg]``
    The journal files (records, where they end and whether the tail is torn), or one
    file's records: offset, type, ledger, entry, LAC, size.
``readlog [LOGID|FILE] [--ledger ID] [--msg]``
    The entry logs (size, sealed, ledgers), or one log's entries: ledger, entry, offset,
    size, and where the valid records end.
``lastmark``
    The journal position (file id, offset) each ledger directory's LastLogMark holds,
    and the one a bookie would replay from.
``localconsistencycheck``
    Every index entry against the entry logs; exit 1 with the list if any does not point
    at a readable entry of that ledger and id with a good checksum.

The directories come from ``--conf`` (``journalDirectory``, ``ledgerDirectories``) or
``--journal-dir`` / ``--ledger-dir``, as for ``pybk bookie``.  Every command first takes
the bookie's directory lock (``<journalDirectory>/current/LOCK``, the ``flock`` a running
bookie holds) as a shared lock, and refuses to run if a bookie holds it (several tools
may run at once; a bookie does not start while one runs); it changes nothing: the index is
opened read-only, journals are not replayed, unsealed entry logs are not sealed.

``--msg`` shows payloads: an entry's bytes after its 24-byte header (a master key for a
MASTER_KEY record), as text if all of the shown bytes are printable ASCII, else as hex,
cut at :data:`MSG_BYTES`.  Output: an aligned table for people, or with ``--json`` one
JSON document (described with each command).  Exit status 0 (1 for inconsistencies
found); 1 with one line ``pybk COMMAND: reason`` on standard error for missing or
damaged directories and files, a locked directory or bad settings; never a traceback
(:mod:`pybk.cli.output`).
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import lmdb

from pybk.cli import options
from pybk.cli.output import FAILURES, UsageError, run, table
from pybk.settings import ServerSettings
from pybk.storage import inspect
from pybk.storage.cookie import locked_directories
from pybk.storage.entries import ENTRY_HEADER_SIZE
from pybk.storage.journal_codec import ScanReport, journal_file_name
from pybk.storage.lastmark import replay_start

#: The most payload bytes ``--msg`` shows per record.
MSG_BYTES = 64

#: A command's work: settings in, a JSON-ready result out.
Work = Callable[[ServerSettings], Any]

#: The offline tools' commands, with their help.
COMMANDS = {
    "readjournal": "the journal files, or one file's records; says where a torn tail starts",
    "readlog": "the entry logs, or one log's entries",
    "lastmark": "the journal position each ledger directory's LastLogMark holds",
    "localconsistencycheck": "check that every index entry points at a matching, intact "
                             "entry in an entry log",
}


def add_commands(commands: Any) -> None:
    """Add the offline tools to the ``pybk`` parser's ``commands``, each with the
    directory options of ``pybk bookie`` and ``--json``."""
    for name, text in COMMANDS.items():
        sub = commands.add_parser(
            name, help=text + " (on a stopped bookie's directories)",
            description=text[0].upper() + text[1:] + ", on a stopped bookie's directories "
            "(BookKeeper's command of that name).  Reads only; refuses directories a "
            "running bookie holds.")
        options.add_settings(sub, "a settings file naming the directories "
                                  "(journalDirectory, ledgerDirectories)")
        sub.add_argument("--journal-dir", help="the journal directory (journalDirectory)")
        sub.add_argument("--ledger-dir", action="append", default=[],
                         help="a ledger directory; repeat for several, in the bookie's "
                              "order (ledgerDirectories)")
        sub.add_argument("--json", action="store_true",
                         help="one JSON document for scripts instead of a table")
        if name == "readjournal":
            sub.add_argument("which", nargs="?", metavar="FILE|ID",
                             help="a journal file (name or path) or id: show its records")
        elif name == "readlog":
            sub.add_argument("which", nargs="?", metavar="LOGID|FILE",
                             help="an entry log id or file (name or path): show its entries")
            sub.add_argument("--ledger", type=options.whole_number, metavar="ID",
                             help="only this ledger's entries")
        if name in ("readjournal", "readlog"):
            sub.add_argument("--msg", action="store_true",
                             help="show payloads (text or hex, cut)")
        sub.set_defaults(run=run_offline)


def run_offline(args: argparse.Namespace) -> int:
    """An offline tool: load the settings, hold their directories' lock, work on them,
    print the result (a table, or JSON).  0 (1 if ``localconsistencycheck`` found
    inconsistencies); 1 with one line on standard error if the work cannot be done (bad
    settings included)."""
    status = None
    if args.command == "readjournal":
        work, show = ((journal_records(args.which, args.msg), show_journal_records)
                      if args.which else (journal_listing, show_journal_listing))
    elif args.command == "readlog":
        work, show = ((log_entries(args.which, args.ledger, args.msg), show_log_entries)
                      if args.which else (log_listing, show_log_listing))
    elif args.command == "lastmark":
        work, show = last_mark, show_last_mark
    else:
        work, show = consistency, show_consistency
        status = inconsistent
    if not getattr(args, "which", True) and (args.msg or getattr(args, "ledger", None)):
        raise UsageError(f"{args.command}: --msg and --ledger apply to one file's records: "
                         "name the file")

    def locked() -> Any:
        settings = options.bookie_settings(args)
        with locked_directories(settings, shared=True):
            return work(settings)
    return run(args.command, locked, show, args.json, status, FAILURES + (lmdb.Error,))


def show_payload(data: bytes, total_bytes: int | None = None) -> str:
    """Up to :data:`MSG_BYTES` of ``data`` (the start of a payload of ``total_bytes``, by
    default all of it): as text if printable ASCII, else as hex, followed by the
    payload's size when cut."""
    shown = data[:MSG_BYTES]
    total = len(data) if total_bytes is None else total_bytes
    text = shown.decode("ascii") if all(32 <= b < 127 for b in shown) else "0x" + shown.hex()
    return text if len(shown) == total else f"{text}... ({total} bytes)"


# -- readjournal -------------------------------------------------------------------------

def journal_listing(settings: ServerSettings) -> dict:
    """``readjournal``.  JSON: ``{"journal_directory": dir, "files": [{"journal_id",
    "file", "bytes", "records", "end_offset", "torn": reason or null,
    "discarded_bytes"}, ...]}`` by id; ``torn`` says why the valid records stop before
    the preallocated zeros or the file's end."""
    return {"journal_directory": settings.journalDirectory,
            "files": [{"journal_id": f.journal_id, "file": f.path, "bytes": f.size_bytes,
                       **_scan_end(f.report)}
                      for f in inspect.journal_files(settings.journalDirectory)]}


def _scan_end(report: ScanReport) -> dict:
    return {"records": report.records, "end_offset": report.end_offset,
            "torn": report.reason or None, "discarded_bytes": report.discarded_bytes}


def show_journal_listing(result: dict) -> list[str]:
    return table(("ID", "FILE", "BYTES", "RECORDS", "RECORDS END", "TAIL"),
                 [(f["journal_id"], f["file"], f["bytes"], f["records"], f["end_offset"],
                   _tail(f)) for f in result["files"]])


def _tail(found: dict) -> str:
    if found["torn"] is None:
        return "clean"
    return f"torn: {found['torn']}, {found['discarded_bytes']} bytes discarded"


def journal_records(which: str, with_msg: bool) -> Work:
    """``readjournal FILE|ID``.  JSON: ``{"file", "records": [{"offset", "type",
    "ledger", "entry", "lac", "size", "message" (with --msg)}, ...], "records_count",
    "end_offset", "torn": reason or null, "discarded_bytes"}``; ``entry`` is null except
    for ADD, ``lac`` is the entry's LAC for ADD and the LAC of EXPLICIT_LAC."""
    def work(settings: ServerSettings) -> dict:
        path = inspect.journal_path(settings.journalDirectory, which)
        records = []
        scan = inspect.Scan(inspect.scan_journal_file(path))
        for record in scan:
            fields = record.fields
            row: dict[str, Any] = {"offset": record.offset, "type": record.type_name,
                                   "ledger": fields.ledger_id, "entry": fields.entry_id,
                                   "lac": fields.lac, "size": record.size_bytes}
            if with_msg:
                row["message"] = show_payload(fields.data)
            records.append(row)
        assert scan.result is not None
        ends = _scan_end(scan.result)
        ends["records_count"] = ends.pop("records")
        return {"file": path, "records": records, **ends}
    return work


def show_journal_records(result: dict) -> list[str]:
    with_msg = any("message" in r for r in result["records"])
    header = ("OFFSET", "TYPE", "LEDGER", "ENTRY", "LAC", "SIZE") + (
        ("MESSAGE",) if with_msg else ())
    lines = table(header, [(r["offset"], r["type"], r["ledger"], r["entry"], r["lac"],
                            r["size"], *([r["message"]] if with_msg else []))
                           for r in result["records"]])
    where = f"{result['records_count']} records in {result['file']}, ending at offset " \
            f"{result['end_offset']}"
    return lines + [f"{where}: {_tail(result)}"]


# -- readlog -------------------------------------------------------------------------------

def log_listing(settings: ServerSettings) -> dict:
    """``readlog``.  JSON: ``{"logs": [{"log_id", "file", "bytes", "sealed", "ledgers":
    number of ledgers in its map or null, "map_damaged"}, ...]}`` by id."""
    return {"logs": [{"log_id": f.log_id, "file": f.path, "bytes": f.size_bytes,
                      "sealed": bool(f.header.map_offset),
                      "ledgers": None if f.ledger_map is None else len(f.ledger_map),
                      "map_damaged": f.map_damaged}
                     for f in inspect.entry_log_files(list(settings.ledgerDirectories))]}


def show_log_listing(result: dict) -> list[str]:
    return table(("ID", "FILE", "BYTES", "SEALED", "LEDGERS"),
                 [(f["log_id"], f["file"], f["bytes"],
                   "damaged map" if f["map_damaged"] else "yes" if f["sealed"] else "no",
                   f["ledgers"]) for f in result["logs"]])


def log_entries(which: str, ledger_id: int | None, with_msg: bool) -> Work:
    """``readlog LOGID|FILE [--ledger ID]``.  JSON: ``{"file", "entries": [{"ledger",
    "entry", "offset", "size", "message" (with --msg)}, ...], "entries_count",
    "end_offset", "damaged": reason or null}``: ``offset`` is the record's, ``size`` the
    entry's; ``damaged`` says why the valid records stop before the ledger map or the
    file's end."""
    def work(settings: ServerSettings) -> dict:
        path = inspect.entry_log_path(list(settings.ledgerDirectories), which)
        entries = []
        scan = inspect.Scan(inspect.scan_entry_log(path))
        for record in scan:
            if ledger_id is not None and record.ledger_id != ledger_id:
                continue
            row: dict[str, Any] = {"ledger": record.ledger_id, "entry": record.entry_id,
                                   "offset": record.location.offset,
                                   "size": record.size_bytes}
            if with_msg:
                row["message"] = show_payload(inspect.read_entry_body(path, record, MSG_BYTES),
                                              record.size_bytes - ENTRY_HEADER_SIZE)
            entries.append(row)
        assert scan.result is not None
        return {"file": path, "entries": entries, "entries_count": len(entries),
                "end_offset": scan.result.offset, "damaged": scan.result.reason or None}
    return work


def show_log_entries(result: dict) -> list[str]:
    with_msg = any("message" in e for e in result["entries"])
    header = ("LEDGER", "ENTRY", "OFFSET", "SIZE") + (("MESSAGE",) if with_msg else ())
    lines = table(header, [(e["ledger"], e["entry"], e["offset"], e["size"],
                            *([e["message"]] if with_msg else []))
                           for e in result["entries"]])
    where = f"{result['entries_count']} entries shown from {result['file']}; its valid " \
            f"records end at offset {result['end_offset']}"
    return lines + [where + (f": damaged: {result['damaged']}" if result["damaged"]
                             else "")]


# -- lastmark --------------------------------------------------------------------------------

def last_mark(settings: ServerSettings) -> dict:
    """``lastmark``.  JSON: ``{"marks": [{"directory", "journal_id", "offset", "file",
    "problem": why there is no mark, or null}, ...], "replay_from": {"journal_id",
    "offset"}}``: a bookie replays from the oldest mark, from the start if a directory
    has none."""
    marks = inspect.last_marks(list(settings.ledgerDirectories))
    rows = [{"directory": m.directory,
             "journal_id": m.mark.journal_id if m.mark else None,
             "offset": m.mark.offset if m.mark else None,
             "file": journal_file_name(m.mark.journal_id) if m.mark else None,
             "problem": m.problem or None} for m in marks]
    return {"marks": rows, "replay_from": replay_start([m.mark for m in marks])._asdict()}


def show_last_mark(result: dict) -> list[str]:
    lines = table(("LEDGER DIRECTORY", "JOURNAL ID", "OFFSET", "FILE", "PROBLEM"),
                  [(m["directory"], m["journal_id"], m["offset"], m["file"], m["problem"])
                   for m in result["marks"]])
    start = result["replay_from"]
    return lines + [f"a bookie starting on these directories replays the journal from id "
                    f"{start['journal_id']}, offset {start['offset']}"]


# -- localconsistencycheck --------------------------------------------------------------------

def consistency(settings: ServerSettings) -> dict:
    """``localconsistencycheck``.  JSON: ``{"entries_checked", "entry_logs",
    "inconsistencies": [{"ledger", "entry", "log_id", "offset", "size", "problem"},
    ...]}``."""
    report = inspect.check_consistency(list(settings.ledgerDirectories))
    return {"entries_checked": report.entries_checked, "entry_logs": report.entry_logs,
            "inconsistencies": [{"ledger": i.ledger_id, "entry": i.entry_id,
                                 "log_id": i.log_id, "offset": i.offset,
                                 "size": i.size_bytes, "problem": i.problem}
                                for i in report.inconsistencies]}


def inconsistent(result: dict) -> int:
    """``localconsistencycheck``'s exit status: 1 if it found inconsistencies (its
    table says which)."""
    return 1 if result["inconsistencies"] else 0


def show_consistency(result: dict) -> list[str]:
    found = result["inconsistencies"]
    summary = f"checked {result['entries_checked']} index entries in " \
              f"{result['entry_logs']} entry logs: "
    if not found:
        return [summary + "all consistent"]
    return [summary + f"{len(found)} inconsistent"] + table(
        ("LEDGER", "ENTRY", "LOG ID", "OFFSET", "SIZE", "PROBLEM"),
        [(i["ledger"], i["entry"], i["log_id"], i["offset"], i["size"], i["problem"])
         for i in found])
