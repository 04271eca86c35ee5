"""The offline tools on a stopped bookie's directories: ``pybk readjournal``, ``readlog``,
``lastmark`` and ``localconsistencycheck`` run as processes on what a real bookie wrote
(in this process, closed; or a bookie process killed with SIGKILL), checked against what
was written; damage (a torn journal tail, a garbled entry log record, a damaged
lastMark) is reported, nothing is changed, and a running bookie's directories, missing
directories and unknown files are refused in one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from clusterutil import child_env
from conftest import KEY, entry
from crashutil import children, crash_settings, expected_entry, read_acks, settings_of  # noqa: F401

from pybk.settings import ServerSettings
from pybk.storage import Bookie, format_bookie
from pybk.storage.entries import ENTRY_HEADER_SIZE

pytestmark = pytest.mark.timeout(120)

#: Bytes of a payload that ``--msg`` shows (pybk.cli.offline.MSG_BYTES).
MSG_BYTES = 64
#: The longest one offline command may take (a fraction of a second of work; the bound
#: allows for a busy machine).
COMMAND_S = 60.0


def pybk(*args: str) -> subprocess.Popen:
    """Start ``python -m pybk *args`` with its output captured."""
    return subprocess.Popen([sys.executable, "-m", "pybk", *args], env=child_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run_all(*commands: list[str]) -> list[subprocess.CompletedProcess]:
    """Run ``pybk`` commands side by side (each one costs an interpreter start); every
    one is waited for, and killed if it outlives :data:`COMMAND_S`."""
    procs = [pybk(*command) for command in commands]
    results = []
    try:
        for command, proc in zip(commands, procs):
            out, err = proc.communicate(timeout=COMMAND_S)
            results.append(subprocess.CompletedProcess(command, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=COMMAND_S)
    return results


def run(*args: str) -> subprocess.CompletedProcess:
    return run_all(list(args))[0]


def run_json(*args: str) -> dict:
    result = run(*args, "--json")
    assert result.returncode == 0 and not result.stderr, result
    return json.loads(result.stdout)


def dir_options(settings: ServerSettings) -> list[str]:
    options = ["--journal-dir", settings.journalDirectory]
    for directory in settings.ledgerDirectories:
        options += ["--ledger-dir", directory]
    return options


def entry_logs(settings: ServerSettings) -> list[str]:
    """The paths of the bookie's entry logs."""
    return sorted(str(path) for directory in settings.ledgerDirectories
                  for path in Path(directory, "current").glob("*.log"))


def snapshot(settings: ServerSettings) -> dict[str, tuple[int, str]]:
    """Every file of the bookie's directories but its lock file: (mtime, SHA-256)."""
    found = {}
    for top in (settings.journalDirectory, *settings.ledgerDirectories):
        for parent, _dirs, names in os.walk(top):
            for name in names:
                if name != "LOCK":
                    path = os.path.join(parent, name)
                    with open(path, "rb") as f:
                        found[path] = (os.stat(path).st_mtime_ns,
                                       hashlib.sha256(f.read()).hexdigest())
    return found


def assert_one_line_error(result: subprocess.CompletedProcess, command: str,
                          *phrases: str) -> None:
    assert result.returncode == 1, result
    assert result.stderr.startswith(f"pybk {command}: ") and \
        result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr and not result.stdout, result
    for phrase in phrases:
        assert phrase in result.stderr, result.stderr


# -- what a bookie wrote -----------------------------------------------------------------

@dataclass
class Written:
    settings: ServerSettings
    options: list[str]
    entries: dict[tuple[int, int], bytes]  # (ledger, entry) -> the entry's bytes


TEXT_LEDGER, BINARY_LEDGER, DELETED_LEDGER = 1, 2, 3
EXPLICIT_LAC = 7


@pytest.fixture
def written(settings_factory) -> Written:
    """A bookie's directories after it took text entries on ledger 1 (and an explicit
    LAC), binary entries longer than ``--msg`` shows on ledger 2 (then fenced it), and
    an entry on ledger 3 (then deleted it), and was closed."""
    settings = settings_factory()
    format_bookie(settings)
    entries = {(TEXT_LEDGER, e): entry(TEXT_LEDGER, e) for e in range(10)}
    entries.update({(BINARY_LEDGER, e): entry(BINARY_LEDGER, e, bytes(range(e, e + 200)))
                    for e in range(5)})
    with Bookie(settings) as bookie:
        for (ledger_id, entry_id), data in entries.items():
            bookie.add_entry(ledger_id, entry_id, data, KEY)
        bookie.set_explicit_lac(TEXT_LEDGER, EXPLICIT_LAC, KEY).result(timeout=30)
        bookie.fence(BINARY_LEDGER, KEY).result(timeout=30)
        bookie.add_entry(DELETED_LEDGER, 0, entry(DELETED_LEDGER, 0), KEY)
        bookie.delete_ledger(DELETED_LEDGER)
    return Written(settings, dir_options(settings), entries)


def shown(body: bytes) -> str:
    """What ``--msg`` shows for an entry body: the text of printable ones, else hex, cut
    at :data:`MSG_BYTES` with the size."""
    head = body[:MSG_BYTES]
    text = head.decode() if head.isascii() and head.decode().isprintable() \
        else "0x" + head.hex()
    return text if len(head) == len(body) else f"{text}... ({len(body)} bytes)"


# -- readjournal ---------------------------------------------------------------------------

def test_readjournal_shows_every_record_the_bookie_journaled(written):
    """The one journal file holds, in order, each ledger's master key, every add (ids,
    LAC, size, payload as text or cut hex), the explicit LAC, the fence and the delete;
    its records end cleanly."""
    listing, records, table = run_all(
        ["readjournal", "--json", *written.options],
        ["readjournal", "1", "--msg", "--json", *written.options],
        ["readjournal", "0000000000000001.txn", *written.options])
    files = json.loads(listing.stdout)["files"]
    assert [(f["journal_id"], f["torn"]) for f in files] == [(1, None)], listing
    found = json.loads(records.stdout)
    assert found["torn"] is None and found["end_offset"] == files[0]["end_offset"]
    rows = found["records"]
    assert found["records_count"] == len(rows)
    adds = [(r["ledger"], r["entry"], r["lac"], r["size"], r["message"])
            for r in rows if r["type"] == "ADD"]
    assert adds == [(ledger, entry_id, entry_id - 1, len(data),
                     shown(data[ENTRY_HEADER_SIZE:]))
                    for (ledger, entry_id), data in written.entries.items()] + [
        (DELETED_LEDGER, 0, -1, len(entry(DELETED_LEDGER, 0)),
         shown(entry(DELETED_LEDGER, 0)[ENTRY_HEADER_SIZE:]))]
    assert adds[0][4].startswith("ledger 1 entry 0 ")  # printable: as text
    assert adds[10][4].startswith("0x000102") and adds[10][4].endswith("(200 bytes)")
    others = [(r["type"], r["ledger"], r["lac"], r["message"]) for r in rows
              if r["type"] != "ADD"]
    assert others == [("MASTER_KEY", TEXT_LEDGER, None, KEY.decode()),
                      ("MASTER_KEY", BINARY_LEDGER, None, KEY.decode()),
                      ("EXPLICIT_LAC", TEXT_LEDGER, EXPLICIT_LAC, ""),
                      ("FENCE", BINARY_LEDGER, None, ""),
                      ("MASTER_KEY", DELETED_LEDGER, None, KEY.decode()),
                      ("DELETE", DELETED_LEDGER, None, "")]
    offsets = [r["offset"] for r in rows]
    assert offsets == sorted(offsets) and offsets[0] == 32  # right after the file header
    lines = table.stdout.splitlines()
    assert table.returncode == 0 and lines[0].split() == [
        "OFFSET", "TYPE", "LEDGER", "ENTRY", "LAC", "SIZE"], table
    assert lines[-1].endswith(f"ending at offset {found['end_offset']}: clean")


def test_readjournal_reports_a_torn_tail_where_the_valid_records_stop(written):
    """A journal cut in the middle of its last record lists every record before it and
    says that the records stop at that record's offset, and why, with status 0; one
    garbled in the middle stops at the damaged record."""
    path = os.path.join(written.settings.journalDirectory, "current",
                        "0000000000000001.txn")
    rows = run_json("readjournal", "1", *written.options)["records"]
    last, middle = rows[-1], rows[5]
    with open(path, "r+b") as f:
        f.truncate(last["offset"] + 4)
    torn = run_json("readjournal", path, *written.options)
    assert torn["records"] == rows[:-1]
    assert (torn["end_offset"], torn["torn"]) == (last["offset"], "truncated record header")
    with open(path, "r+b") as f:
        f.seek(middle["offset"] + 9 + ENTRY_HEADER_SIZE)  # into the entry's body
        f.write(b"garbled")
    garbled, listing = run_all(["readjournal", "1", *written.options],
                               ["readjournal", "--json", *written.options])
    assert garbled.returncode == 0, garbled
    assert garbled.stdout.splitlines()[-1].endswith(
        f"ending at offset {middle['offset']}: torn: checksum mismatch, "
        f"{os.path.getsize(path) - middle['offset']} bytes discarded"), garbled.stdout
    assert len(garbled.stdout.splitlines()) == 1 + 5 + 1  # header, 5 records, summary
    assert json.loads(listing.stdout)["files"][0]["records"] == 5


# -- readlog ---------------------------------------------------------------------------------

def test_readlog_shows_the_entries_in_the_entry_logs(written):
    """The closed bookie's entry log is sealed and holds its two live ledgers' entries
    (not the deleted one's) with their sizes and bodies; ``--ledger`` keeps one ledger."""
    listing = run_json("readlog", *written.options)["logs"]
    assert [(log["sealed"], log["ledgers"]) for log in listing] == [(True, 2)], listing
    log_id = str(listing[0]["log_id"])
    found, one_ledger = run_all(["readlog", log_id, "--msg", "--json", *written.options],
                                ["readlog", os.path.basename(listing[0]["file"]),
                                 "--ledger", str(BINARY_LEDGER), *written.options])
    result = json.loads(found.stdout)
    assert result["damaged"] is None and result["end_offset"] > 64
    assert {(e["ledger"], e["entry"]): (e["size"], e["message"])
            for e in result["entries"]} == {
        key: (len(data), shown(data[ENTRY_HEADER_SIZE:]))
        for key, data in written.entries.items()}
    lines = one_ledger.stdout.splitlines()
    assert lines[0].split() == ["LEDGER", "ENTRY", "OFFSET", "SIZE"], one_ledger
    assert [line.split()[:2] for line in lines[1:-1]] == [
        [str(BINARY_LEDGER), str(e)] for e in range(5)]


# -- lastmark ---------------------------------------------------------------------------------

def test_lastmark_shows_each_ledger_directory_mark(written, tmp_path):
    """After a clean close every ledger directory's mark is the end of the journal's
    records (directories named by a ``--conf`` file); a damaged one is named, and a
    bookie would replay from the start."""
    conf = tmp_path / "bk_server.conf"
    conf.write_text(f"journalDirectory={written.settings.journalDirectory}\n"
                    f"ledgerDirectories={','.join(written.settings.ledgerDirectories)}\n")
    marks, records = run_all(["lastmark", "--json", "--conf", str(conf)],
                             ["readjournal", "1", "--json", *written.options])
    end = json.loads(records.stdout)["end_offset"]
    result = json.loads(marks.stdout)
    assert [(m["directory"], m["journal_id"], m["offset"], m["problem"])
            for m in result["marks"]] == [(d, 1, end, None)
                                          for d in written.settings.ledgerDirectories]
    assert result["replay_from"] == {"journal_id": 1, "offset": end}
    damaged = os.path.join(written.settings.ledgerDirectories[1], "current", "lastMark")
    with open(damaged, "r+b") as f:
        f.write(b"\xff")
    result = run_json("lastmark", *written.options)
    assert result["marks"][1]["journal_id"] is None
    assert damaged in result["marks"][1]["problem"], result
    assert result["replay_from"] == {"journal_id": 0, "offset": 0}


# -- localconsistencycheck ---------------------------------------------------------------------

def test_localconsistencycheck_passes_then_reports_a_garbled_entry(written):
    """Every indexed entry checks out; after one entry's body is garbled in its entry
    log, exactly that entry is reported, with status 1 (the table lists it too)."""
    (log_file,) = entry_logs(written.settings)
    clean, log_entries = run_all(["localconsistencycheck", "--json", *written.options],
                                 ["readlog", log_file, "--json", *written.options])
    assert clean.returncode == 0, clean
    assert json.loads(clean.stdout) == {"entries_checked": len(written.entries),
                                        "entry_logs": 1, "inconsistencies": []}
    victim = next(e for e in json.loads(log_entries.stdout)["entries"]
                  if (e["ledger"], e["entry"]) == (TEXT_LEDGER, 4))
    with open(log_file, "r+b") as f:
        f.seek(victim["offset"] + 9 + ENTRY_HEADER_SIZE)
        f.write(b"GARBLED")
    bad_json, bad_table = run_all(["localconsistencycheck", "--json", *written.options],
                                  ["localconsistencycheck", *written.options])
    assert bad_json.returncode == 1 and not bad_json.stderr, bad_json
    assert json.loads(bad_json.stdout)["inconsistencies"] == [
        {"ledger": TEXT_LEDGER, "entry": 4, "log_id": 1, "offset": victim["offset"],
         "size": victim["size"], "problem": "checksum mismatch"}]
    assert bad_table.returncode == 1
    assert bad_table.stdout.splitlines()[0].endswith(": 1 inconsistent"), bad_table
    assert bad_table.stdout.splitlines()[-1].split() == [
        str(TEXT_LEDGER), "4", "1", str(victim["offset"]), str(victim["size"]), "checksum",
        "mismatch"]


def test_localconsistencycheck_reports_entries_whose_entry_log_is_gone(written):
    (log_file,) = entry_logs(written.settings)
    os.unlink(log_file)
    result = run("localconsistencycheck", "--json", *written.options)
    assert result.returncode == 1, result
    problems = json.loads(result.stdout)["inconsistencies"]
    assert {(p["ledger"], p["entry"]) for p in problems} == set(written.entries)
    assert {p["problem"] for p in problems} == {"entry log 1 does not exist"}


# -- a crashed bookie ---------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_the_tools_read_a_bookie_killed_by_sigkill_and_change_nothing(tmp_path, children):
    """A bookie process under load, killed with SIGKILL: every acknowledged entry is in a
    journal file or an entry log as the tools list them, with its size; the index is
    consistent; the tools changed no file, and the bookie then starts with every
    acknowledged entry."""
    values = crash_settings(tmp_path / "bookie")
    settings = settings_of(values)
    acks_path = tmp_path / "acks"
    child = children.start(values, acks_path, 1)
    children.wait_for_acks(child, acks_path, 300)
    children.kill(child)
    acks = read_acks(acks_path)
    options = dir_options(settings)
    before = snapshot(settings)
    journals, logs, marks, check = run_all(
        ["readjournal", "--json", *options], ["readlog", "--json", *options],
        ["lastmark", "--json", *options], ["localconsistencycheck", "--json", *options])
    assert check.returncode == 0 and json.loads(check.stdout)["inconsistencies"] == [], check
    journal_files = json.loads(journals.stdout)["files"]
    mark = json.loads(marks.stdout)["replay_from"]
    assert mark["journal_id"] in [f["journal_id"] for f in journal_files]
    per_file = run_all(*[["readjournal", str(f["journal_id"]), "--json", *options]
                         for f in journal_files],
                       *[["readlog", str(log["log_id"]), "--json", *options]
                         for log in json.loads(logs.stdout)["logs"]])
    sizes: dict[tuple[int, int], int] = {}
    for result in per_file:
        found = json.loads(result.stdout)
        for row in found.get("records", found.get("entries", [])):
            if row.get("type", "ADD") == "ADD":
                sizes[(row["ledger"], row["entry"])] = row["size"]
    acknowledged = {(ledger, e) for ledger, ids in acks.entries.items() for e in ids}
    assert acknowledged <= set(sizes), sorted(acknowledged - set(sizes))[:5]
    assert all(sizes[key] == len(expected_entry(*key)) for key in acknowledged)
    assert snapshot(settings) == before
    with Bookie(settings) as bookie:
        for ledger_id, entry_id in sorted(acknowledged):
            assert bookie.read_entry(ledger_id, entry_id) == expected_entry(ledger_id,
                                                                            entry_id)


# -- refusals in one line --------------------------------------------------------------------------

COMMANDS = (["readjournal"], ["readlog"], ["lastmark"], ["localconsistencycheck"])


def test_a_running_bookies_directories_are_refused(written):
    with Bookie(written.settings):
        results = run_all(*[[*command, *written.options] for command in COMMANDS])
    for command, result in zip(COMMANDS, results):
        assert_one_line_error(result, command[0], "is locked", "stop it first")


def test_missing_directories_and_files_fail_in_one_line(written, tmp_path):
    missing = str(tmp_path / "missing")
    journal = ["--journal-dir", written.settings.journalDirectory]
    results = run_all(
        ["readjournal", "--journal-dir", missing, "--ledger-dir", missing],
        ["lastmark", "--journal-dir", missing, "--ledger-dir", missing],
        ["readlog", *journal, "--ledger-dir", missing],
        ["localconsistencycheck", *journal, "--ledger-dir", missing],
        ["readjournal", "9", *written.options], ["readlog", "9", *written.options],
        ["lastmark", "--conf", str(tmp_path / "missing.conf")])
    assert_one_line_error(results[0], "readjournal", f"directory {missing} holds no bookie")
    assert_one_line_error(results[1], "lastmark", f"directory {missing} holds no bookie")
    for command, result in zip(("readlog", "localconsistencycheck"), results[2:4]):
        assert_one_line_error(result, command, f"ledger directory {missing} holds no bookie")
    assert_one_line_error(results[4], "readjournal", "no journal 9", "it holds id 1")
    assert_one_line_error(results[5], "readlog", "no entry log 9", "they hold id 1")
    assert_one_line_error(results[6], "lastmark", "cannot read settings file")


def test_a_damaged_entry_log_header_fails_in_one_line(written):
    (log_file,) = entry_logs(written.settings)
    with open(log_file, "r+b") as f:
        f.write(b"NOTALOG!")
    listing, one = run_all(["readlog", *written.options], ["readlog", "1", *written.options])
    for result in (listing, one):
        assert_one_line_error(result, "readlog", f"entry log {log_file} has a damaged "
                                                 "header")
