"""A reader (:class:`pybk.storage.readonly.BookieReader`, in its own process as beside a
running bookie) follows a ledger that the bookie forgot after its deletion and made
again: the new ledger is read, not refused as deleted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import KEY, entry

pytestmark = pytest.mark.timeout(120)

# Reads commands from stdin, one a line: "refresh", or "read LEDGER ENTRY"; answers one
# line each (the entry in hex, or the error's class name).
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
        else:
            print(reader.read_entry(int(words[1]), int(words[2])).hex(), flush=True)
    except Exception as e:
        print(type(e).__name__, flush=True)
reader.close()
"""


def test_a_reader_reads_a_ledger_made_again_after_its_deletion(bookie_factory,
                                                               settings_factory):
    settings = settings_factory(flushInterval=3_600_000, gcWaitTime=3_600_000,
                                minorCompactionInterval=0, majorCompactionInterval=0,
                                logSizeLimit=64 << 10, maxEntrySizeBytes=16 << 10)
    bookie = bookie_factory(settings, start_background_threads=False)
    bookie.add_entry(5, 0, entry(5, 0, body=b"o" * 4000), KEY)
    bookie.checkpoint()
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
