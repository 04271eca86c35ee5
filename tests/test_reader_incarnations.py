"""A reader (:class:`pybk.storage.readonly.BookieReader`, in its own process as beside a
running bookie) follows a ledger that the bookie forgot after its deletion and made
again: the new ledger is read, not refused as deleted; and it keeps what it learns of
ledgers from the journal only until a checkpoint's mark covers it."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from typing import Callable, Iterator

import pytest
from conftest import KEY, entry

from pybk.settings import ServerSettings

pytestmark = pytest.mark.timeout(120)

# Reads commands from stdin, one a line: "refresh", "read LEDGER ENTRY", "lac LEDGER" or
# "learned"; answers one line each (the entry in hex, the LAC, how many ledgers the
# reader holds facts of from the journal, or the error's class name).
READER = """
import json, sys
from pybk.settings import ServerSettings
from pybk.storage.readonly import BookieReader
reader = BookieReader(ServerSettings(**json.loads(sys.argv[1])))
print("ready", flush=True)
for line in sys.stdin:
    words = line.split()
    try:
        if words[0] == "refresh":
            reader.refresh()
            print("ok", flush=True)
        elif words[0] == "learned":
            print(reader.stats.learned_ledgers, flush=True)
        elif words[0] == "lac":
            print(reader.read_lac(int(words[1])), flush=True)
        else:
            print(reader.read_entry(int(words[1]), int(words[2])).hex(), flush=True)
    except Exception as e:
        print(type(e).__name__, flush=True)
reader.close()
"""


@contextlib.contextmanager
def reader_process(settings: ServerSettings) -> Iterator[Callable[[str], str]]:
    """A reader of ``settings``' directories in its own process; yields ``ask(command)``,
    which returns the reader's answer.  The process is ended on the way out."""
    dirs = {"journalDirectory": settings.journalDirectory,
            "ledgerDirectories": list(settings.ledgerDirectories)}
    reader = subprocess.Popen([sys.executable, "-c", READER, json.dumps(dirs)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(command: str) -> str:
        assert reader.stdin is not None and reader.stdout is not None
        reader.stdin.write(command + "\n")
        reader.stdin.flush()
        return reader.stdout.readline().strip()

    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "ready"
        yield ask
    finally:
        if reader.stdin is not None:
            reader.stdin.close()
        try:
            reader.wait(timeout=30)
        finally:
            if reader.poll() is None:
                reader.kill()
                reader.wait(timeout=30)
            if reader.stdout is not None:
                reader.stdout.close()


def test_a_reader_reads_a_ledger_made_again_after_its_deletion(bookie_factory,
                                                               settings_factory):
    settings = settings_factory(flushInterval=3_600_000, gcWaitTime=3_600_000,
                                minorCompactionInterval=0, majorCompactionInterval=0,
                                logSizeLimit=64 << 10, maxEntrySizeBytes=16 << 10)
    bookie = bookie_factory(settings, start_background_threads=False)
    bookie.add_entry(5, 0, entry(5, 0, body=b"o" * 4000), KEY)
    bookie.checkpoint()
    with reader_process(settings) as ask:
        assert ask("read 5 0") == entry(5, 0, body=b"o" * 4000).hex()
        bookie.delete_ledger(5)
        assert ask("refresh") == "ok"
        assert ask("read 5 0") == "NoSuchLedger"  # the reader saw the deletion
        for e in range(20):  # roll past the log holding ledger 5 so that GC may remove it
            bookie.add_entry(6, e, entry(6, e, body=b"x" * 4000), KEY)
        bookie.checkpoint()
        bookie.compact(1.0)
        assert not bookie.ledger_exists(5)
        bookie.add_entry(5, 0, entry(5, 0, body=b"new"), b"another key")  # a new ledger 5
        assert ask("refresh") == "ok"
        assert ask("read 5 0") == entry(5, 0, body=b"new").hex()  # from the journal
        bookie.checkpoint()
        assert ask("refresh") == "ok"
        assert ask("read 5 0") == entry(5, 0, body=b"new").hex()  # from the entry logs


def test_a_reader_forgets_what_a_checkpoint_put_in_the_index(bookie_factory,
                                                              settings_factory):
    """The reader holds facts (LACs, deletions) of the ledgers named in the journal after
    the mark only: after a checkpoint it holds none, however many ledgers it saw, and
    answers the same from the index."""
    settings = settings_factory(flushInterval=3_600_000, gcWaitTime=3_600_000,
                                minorCompactionInterval=0, majorCompactionInterval=0)
    bookie = bookie_factory(settings, start_background_threads=False)
    ledgers = range(1, 301)
    with reader_process(settings) as ask:
        for ledger_id in ledgers:
            for entry_id in range(3):  # the last entry carries LAC 1
                bookie.add_entry(ledger_id, entry_id, entry(ledger_id, entry_id), KEY)
        bookie.set_explicit_lac(7, 2, KEY).result(30)
        bookie.delete_ledger(9)
        assert ask("refresh") == "ok"
        assert ask("learned") == str(len(ledgers))

        def check_reads() -> None:
            for ledger_id in ledgers:
                if ledger_id == 9:
                    assert ask("lac 9") == ask("read 9 0") == "NoSuchLedger"
                    continue
                assert ask(f"lac {ledger_id}") == ("2" if ledger_id == 7 else "1")
                assert ask(f"read {ledger_id} 2") == entry(ledger_id, 2).hex()

        check_reads()  # from the journal
        bookie.checkpoint()
        assert ask("refresh") == "ok"
        assert ask("learned") == "0"  # the mark covers every record it learned from
        check_reads()  # from the index and the entry logs
        for ledger_id in (1000, 1001):
            bookie.add_entry(ledger_id, 0, entry(ledger_id, 0), KEY)
        assert ask("refresh") == "ok"
        assert ask("learned") == "2"
        assert ask("read 1001 0") == entry(1001, 0).hex()
