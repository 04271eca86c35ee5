"""Golden files: pybk's on-disk and wire formats, pinned by files this version wrote.

``tests/golden/`` holds a journal, an entry log, a lastMark and the index's items as a
bookie leaves them, a directory cookie, a closed ledger's metadata, a bookie's cookie in
the cluster, a log's head and segment records, record batches of version 2 (the log
ledger's entries in the storage files are version 1 batches), and the frames of wire ADD and READ
requests and replies (and of deferred sync's: an ADD with a DEFERRED_SYNC run, a
FORCE_LEDGER and its reply, without and with the flag HELD), all written from the fixed
inputs below (ids, keys, payloads, salts, times, instance ids).  Its README.md says which
code writes each file and what a change of format must do.  Each format has two tests:

* ``test_writes_*``: the code writes exactly the golden bytes today, byte for byte (the
  storage files through a real :class:`~pybk.storage.Bookie` in a temporary directory);
* ``test_reads_*``: the code reads the golden file back to what was written (entries,
  states, fields), so a file an earlier pybk wrote stays readable after a change.

A deliberate format change regenerates the files::

    PYBK_REGENERATE_GOLDEN=1 pytest tests/test_golden.py

which rewrites them instead of comparing (the reading tests then read the new ones).
Review ``git diff tests/golden`` before committing: a changed file means that files or
messages of the old format exist in the wild, which the new code must still read.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import NamedTuple

import lmdb
import pytest
from recordutil import version_1_batch

from pybk.client import BookKeeper
from pybk.client.digest import DigestManager
from pybk.errors import Unauthorized
from pybk.log.batch import BatchFields, Headers, decode_batch, decode_fields, encode_batch
from pybk.log.metadata import NO_TIMESTAMP, Dropped, LogMetadata, Segment, SegmentRecord
from pybk.log.position import Position
from pybk.log.record import Record, batch_records
from pybk.meta.cookies import Cookie
from pybk.meta.ledger_metadata import DigestType, LedgerMetadata, LedgerState, hash_password
from pybk.net import wire
from pybk.net.wire import Op, Reply, Request
from pybk.settings import ServerSettings
from pybk.storage import LAST_ENTRY, Bookie, format_bookie
from pybk.storage import journal_codec as codec
from pybk.storage.cookie import BookieCookie, directory_cookie, read_cookie, write_cookies
from pybk.storage.entrylog import EntryLogger, log_file_name
from pybk.storage.journal import ZERO_FILL_STEP
from pybk.storage.lastmark import read_mark
from pybk.testing import WAIT_S

pytestmark = pytest.mark.timeout(60)

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
REGENERATE = os.environ.get("PYBK_REGENERATE_GOLDEN") == "1"
MAX_ENTRY_BYTES = ServerSettings().maxEntrySizeBytes

#: Every golden file, by its path under tests/golden (README.md and .gitattributes aside).
GOLDEN_FILES = frozenset({
    "storage/journal.txn", "storage/entrylog.log", "storage/lastMark", "storage/index.txt",
    "storage/index.v1.txt",
    "storage/COOKIE", "meta/ledger-closed.bin", "meta/ledger-closed-v1.bin",
    "meta/bookie-cookie.bin", "log/head.bin", "log/batch-v2.bin", "log/batch-v2-fields.bin",
    "log/segment-3.bin", "log/segment-4.bin", "log/head-v3.bin", "log/segment-3-v1.bin",
    "log/segment-4-v1.bin", "wire/add-request.0.bin",
    "wire/add-request.1.bin", "wire/add-reply.0.bin", "wire/add-reply.1.bin",
    "wire/read-request.0.bin", "wire/read-reply.0.bin", "wire/read-reply.1.bin",
    "wire/deferred-add-request.0.bin", "wire/deferred-add-request.1.bin",
    "wire/force-request.0.bin", "wire/force-reply.0.bin",
    "wire/force-held-request.0.bin", "wire/force-held-reply.0.bin",
})


# -- the fixed inputs -------------------------------------------------------------------

class GoldenLedger(NamedTuple):
    """A ledger of the storage script: its id, password, digest type and payloads."""

    ledger_id: int
    password: bytes
    digest_type: DigestType
    payloads: tuple[bytes, ...]

    @property
    def master_key(self) -> bytes:
        return BookKeeper.master_key(self.password)

    def entries(self) -> list[bytes]:
        """The entries as a writer sends them: LAC one behind, running length, digest."""
        digests = DigestManager(self.ledger_id, self.digest_type, self.password)
        entries, length = [], 0
        for entry_id, payload in enumerate(self.payloads):
            length += len(payload)
            entries.append(digests.encode(entry_id, entry_id - 1, length, payload))
        return entries

    def decode(self, entry_id: int, entry: bytes) -> bytes:
        """The payload of ``entry``, its digest verified."""
        return DigestManager(self.ledger_id, self.digest_type, self.password).decode(
            entry_id, entry).data


#: A log's ledger: each entry a batch of records (version 1: logs an older pybk wrote
#: stay readable), CRC-32C digests.
LOG_BATCHES = ((b"first record", b"second record"), (b"",), (b"\x00\xff" * 150,))
LOG_LEDGER = GoldenLedger(7, b"golden log", DigestType.CRC32C,
                          tuple(version_1_batch(batch) for batch in LOG_BATCHES))


class GoldenBatch(NamedTuple):
    """A record batch's records, field by field."""

    values: tuple[bytes, ...]
    timestamps: tuple[int, ...]
    keys: tuple[bytes | None, ...] | None = None
    headers: tuple[Headers, ...] | None = None

    def fields(self) -> BatchFields:
        count = len(self.values)
        return BatchFields(list(self.values), list(self.timestamps),
                           list(self.keys or (None,) * count),
                           list(self.headers or ((),) * count))


T0 = 1_764_028_800_000  # 2025-11-25T00:00:00Z, in milliseconds
#: Record batches of version 2, by golden file: records without key or headers,
#: appended within a second (deltas of 2 bytes); records with keys (one empty, some
#: none) and headers (a name twice, an empty value, a name beyond ASCII), with
#: timestamps out of order a day apart (deltas of 4 bytes).
RECORD_BATCHES = {
    "log/batch-v2.bin": GoldenBatch((b"first record", b"second record", b""),
                                    (T0, T0 + 7, T0 + 300)),
    "log/batch-v2-fields.bin": GoldenBatch(
        (b"keyed", b"plain", b"with headers", b"both"),
        (T0, T0 - 86_400_000, T0 + 1, T0),
        (b"user-17", None, None, b""),
        ((), (), (("trace", b"\x01\x02"), ("trace", b""), ("r\u00e9gion", b"eu")),
         (("source", b"golden"),))),
}
#: HMAC-SHA1 digests; two adds, an explicit LAC, a fence, then a recovery add.
FENCED_LEDGER = GoldenLedger(9, b"golden fenced", DigestType.MAC,
                             (b"alpha", b"beta", b"recovered gamma"))
FENCED_EXPLICIT_LAC = 1
#: One add, then the ledger is deleted.
DELETED_LEDGER = GoldenLedger(11, b"golden deleted", DigestType.DUMMY, (b"gone",))

BOOKIES = ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181", "10.0.0.4:3181")
CLOSED_METADATA = LedgerMetadata(
    ledger_id=LOG_LEDGER.ledger_id, ensemble_size=3, write_quorum_size=2,
    ack_quorum_size=2,
    fragments=((0, BOOKIES[:3]), (2, (BOOKIES[0], BOOKIES[3], BOOKIES[2]))),
    digest_type=LOG_LEDGER.digest_type,
    password_hash=hash_password(LOG_LEDGER.password, salt=bytes(range(16))),
    state=LedgerState.CLOSED, last_entry_id=len(LOG_LEDGER.payloads) - 1,
    length=sum(map(len, LOG_LEDGER.payloads)), creation_time_ms=1_764_028_800_000,
    custom_metadata={"application": b"pybk golden", "empty": b""})

#: Version 4: the tail's max_before values (segment 3 the first of the index, with none
#: before it; 5 after records up to a time).
LOG_HEAD = LogMetadata(
    name="golden-log", tail=(Segment(3, LOG_LEDGER.ledger_id, NO_TIMESTAMP),
                             Segment(5, 12, 1_764_028_800_123)),
    next_segment=6, truncated_before=Position(3, 1, 0), oldest_segment=2,
    dropping=(Dropped(4, 10),), epoch=5, sinks={"sink-a": 17}, committing=("job-b",),
    aborted=("job-a",))
#: A segment's record and the dead record of the dropped segment 4.
SEGMENT_RECORDS = (SegmentRecord(3, LOG_LEDGER.ledger_id, max_before=1_764_028_800_123),
                   SegmentRecord(4, None, 5))
#: The same, as pybk wrote them in head format 3 and segment format 1 (no max_before):
#: read with max_before None.
LOG_HEAD_3 = dataclasses.replace(
    LOG_HEAD, tail=tuple(Segment(s.number, s.ledger_id) for s in LOG_HEAD.tail),
    format_version=3)
SEGMENT_RECORDS_1 = tuple(r._replace(max_before=None) for r in SEGMENT_RECORDS)

COOKIE = BookieCookie(instance_id="0123456789abcdef0123456789abcdef",
                      bookie_id="10.0.0.1:3181", ledger_directory_count=1,
                      journal_directory=None, ledger_directories=None)
COOKIE_ROLES = ("journal", "ledgers/0")
#: The cluster's copy of a bookie server's cookie: bound to its directories' paths.
CLUSTER_COOKIE = Cookie("10.0.0.2:3181", "fedcba9876543210fedcba9876543210",
                        "/srv/pybk/journal", ("/srv/pybk/ledgers0", "/srv/pybk/ledgers1"))

ADD_RUNS = (wire.AddRun(LOG_LEDGER.ledger_id, [0, 1, 2], LOG_LEDGER.entries(),
                        LOG_LEDGER.master_key),
            wire.AddRun(FENCED_LEDGER.ledger_id, [2], FENCED_LEDGER.entries()[2:],
                        FENCED_LEDGER.master_key, recovery=True))
ADD_STATUSES = (0, 0, 0, Unauthorized.code)
ADD_MESSAGE = "Unauthorized: wrong master key for ledger 9"
READ_REQUEST = Request(Op.READ, 43, FENCED_LEDGER.ledger_id, LAST_ENTRY, flags=wire.FENCE,
                       master_key=FENCED_LEDGER.master_key)
READ_REPLY = Reply(Op.READ, 43, body=FENCED_LEDGER.entries()[2])
#: Deferred sync: a message with a DEFERRED_SYNC run and a durable one (the flag is per
#: run), and the FORCE_LEDGER that makes the deferred adds durable, with its reply.
DEFERRED_ADD_RUNS = (wire.AddRun(LOG_LEDGER.ledger_id, [0, 1, 2], LOG_LEDGER.entries(),
                                 LOG_LEDGER.master_key, deferred=True),
                     wire.AddRun(FENCED_LEDGER.ledger_id, [0], FENCED_LEDGER.entries()[:1],
                                 FENCED_LEDGER.master_key))
FORCE_REQUEST = Request(Op.FORCE_LEDGER, 45, LOG_LEDGER.ledger_id)
FORCE_REPLY = Reply(Op.FORCE_LEDGER, 45)
#: The force a writer sends since the flag HELD (of entries 1..2), answered with how many
#: of them the bookie holds.
FORCE_HELD_REQUEST = Request(Op.FORCE_LEDGER, 46, LOG_LEDGER.ledger_id, entry_id=1, lac=2,
                             flags=wire.HELD)
FORCE_HELD_REPLY = Reply(Op.FORCE_LEDGER, 46, lac=2)


def add_request() -> Request:
    return Request(Op.ADD, 42, entry=wire.encode_adds(ADD_RUNS, MAX_ENTRY_BYTES))


def deferred_add_request() -> Request:
    return Request(Op.ADD, 44, entry=wire.encode_adds(DEFERRED_ADD_RUNS, MAX_ENTRY_BYTES))


def add_reply() -> Reply:
    return Reply(Op.ADD, 42, message=ADD_MESSAGE,
                 body=wire.encode_add_statuses(ADD_STATUSES))


# -- golden files -------------------------------------------------------------------------

def golden(name: str) -> bytes:
    with open(os.path.join(GOLDEN, name), "rb") as f:
        return f.read()


def pinned(name: str, data: bytes) -> None:
    """Assert that ``data`` is golden file ``name``; write it instead when regenerating."""
    assert name in GOLDEN_FILES, f"{name} is not listed in GOLDEN_FILES"
    path = os.path.join(GOLDEN, name)
    if REGENERATE:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        return
    expected = golden(name)
    if data != expected:
        at = next((i for i, (a, b) in enumerate(zip(data, expected)) if a != b),
                  min(len(data), len(expected)))
        pytest.fail(f"tests/golden/{name}: this pybk writes {len(data)} bytes, the golden "
                    f"file has {len(expected)}, first difference at offset {at}. A format "
                    "change must bump the format's version, keep reading the old file and "
                    "add a new golden file (tests/golden/README.md)")


def pinned_frames(name: str, frames: list[bytes]) -> None:
    """Pin a message's frames as ``<name>.<frame index>.bin``, and their number."""
    listed = sorted(n for n in GOLDEN_FILES if n.startswith(name + "."))
    assert listed == [f"{name}.{i}.bin" for i in range(len(frames))], \
        f"{name} has {len(frames)} frames, the golden files {listed}"
    for i, frame in enumerate(frames):
        pinned(f"{name}.{i}.bin", frame)


def golden_frames(name: str) -> list[bytes]:
    return [golden(n) for n in sorted(n for n in GOLDEN_FILES if n.startswith(name + "."))]


# -- storage: journal, entry log, lastMark, written by a real bookie -----------------------

class Written(NamedTuple):
    """What the storage script left in a bookie's directories."""

    journal: bytes
    mark: codec.LogMark  # of the checkpoint after the script: the end of the records
    entry_log: bytes
    last_mark: bytes
    index: bytes  # its items (dump_index)


#: The index's LMDB tables (pybk/storage/index.py); format 1 had no ``deleted``.
INDEX_TABLES = ("entries", "ledgers", "deleted", "meta")


def dump_index(directory: str) -> bytes:
    """The items of the index in ``directory`` as text: a line ``<table> <key in hex>
    <value in hex>`` per item, tables in INDEX_TABLES order, keys in LMDB's order.  (An
    LMDB file's bytes depend on its page allocation; its items are the format.)"""
    env = lmdb.open(directory, readonly=True, lock=False, max_dbs=len(INDEX_TABLES))
    try:
        lines = []
        for table in INDEX_TABLES:
            with env.begin(db=env.open_db(table.encode(), create=False)) as txn:
                lines += [f"{table} {key.hex()} {value.hex()}\n" for key, value in txn.cursor()]
    finally:
        env.close()
    return "".join(lines).encode()


def load_index(directory: str, dump: bytes) -> None:
    """Create the index in ``directory`` holding the items of ``dump`` (dump_index)."""
    env = lmdb.open(directory, max_dbs=len(INDEX_TABLES))
    try:
        with env.begin(write=True) as txn:
            tables = {t: env.open_db(t.encode(), txn=txn) for t in INDEX_TABLES}
            for line in dump.decode().splitlines():
                table, key, value = line.split(" ")
                txn.put(bytes.fromhex(key), bytes.fromhex(value), db=tables[table])
    finally:
        env.close()


def bookie_settings(root: str) -> ServerSettings:
    return ServerSettings(journalDirectory=os.path.join(root, "journal"),
                          ledgerDirectories=(os.path.join(root, "ledgers"),),
                          journalPreAllocSizeMB=1)


def run_script(bookie: Bookie) -> None:
    """The mutations the golden journal records, each durable before the next."""
    for ledger in (LOG_LEDGER, FENCED_LEDGER):
        for entry_id, entry in enumerate(ledger.entries()[:2]):
            bookie.add_entry(ledger.ledger_id, entry_id, entry, ledger.master_key)
    bookie.add_entry(LOG_LEDGER.ledger_id, 2, LOG_LEDGER.entries()[2], LOG_LEDGER.master_key)
    fenced = FENCED_LEDGER
    bookie.set_explicit_lac(fenced.ledger_id, FENCED_EXPLICIT_LAC,
                            fenced.master_key).result(WAIT_S)
    bookie.fence(fenced.ledger_id, fenced.master_key).result(WAIT_S)
    bookie.add_entry(fenced.ledger_id, 2, fenced.entries()[2], fenced.master_key,
                     recovery=True)
    bookie.add_entry(DELETED_LEDGER.ledger_id, 0, DELETED_LEDGER.entries()[0],
                     DELETED_LEDGER.master_key)
    bookie.delete_ledger(DELETED_LEDGER.ledger_id)


def journal_records() -> list[tuple[int, bytes]]:
    """``(type, payload)`` of each record the script journals, in order."""
    def ledger_id(ledger: GoldenLedger) -> bytes:
        return ledger.ledger_id.to_bytes(8, "big")

    log, fenced, deleted = LOG_LEDGER, FENCED_LEDGER, DELETED_LEDGER
    return [
        (codec.MASTER_KEY, ledger_id(log) + log.master_key),
        (codec.ADD, log.entries()[0]), (codec.ADD, log.entries()[1]),
        (codec.MASTER_KEY, ledger_id(fenced) + fenced.master_key),
        (codec.ADD, fenced.entries()[0]), (codec.ADD, fenced.entries()[1]),
        (codec.ADD, log.entries()[2]),
        (codec.EXPLICIT_LAC, ledger_id(fenced) + FENCED_EXPLICIT_LAC.to_bytes(8, "big")),
        (codec.FENCE, ledger_id(fenced)),
        (codec.ADD, fenced.entries()[2]),
        (codec.MASTER_KEY, ledger_id(deleted) + deleted.master_key),
        (codec.ADD, deleted.entries()[0]),
        (codec.DELETE, ledger_id(deleted)),
    ]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Written:
    """Run the script on a new bookie, checkpoint, close it, and take its files."""
    root = str(tmp_path_factory.mktemp("golden-bookie"))
    settings = bookie_settings(root)
    format_bookie(settings)
    with Bookie(settings, start_background_threads=False) as bookie:
        run_script(bookie)
        mark = bookie.checkpoint()
    ledgers = os.path.join(settings.ledgerDirectories[0], "current")
    assert [n for n in os.listdir(ledgers) if n.endswith(".log")] == [log_file_name(1)]
    assert codec.list_journal_ids(os.path.join(settings.journalDirectory, "current")) == [1]

    def read(*parts: str) -> bytes:
        with open(os.path.join(*parts), "rb") as f:
            return f.read()

    return Written(read(settings.journalDirectory, "current", codec.journal_file_name(1)), mark,
                   read(ledgers, log_file_name(1)), read(ledgers, "lastMark"),
                   dump_index(os.path.join(ledgers, "index")))


def test_writes_journal(written):
    """The golden journal is the file's records; the rest is preallocated zeros, to a
    whole number of zero-fill steps."""
    assert written.mark.journal_id == 1
    records_end = written.mark.offset
    pinned("storage/journal.txn", written.journal[:records_end])
    assert written.journal[records_end:] == bytes(len(written.journal) - records_end)
    assert len(written.journal) % ZERO_FILL_STEP == 0


def test_writes_entry_log(written):
    pinned("storage/entrylog.log", written.entry_log)


def test_writes_last_mark(written):
    pinned("storage/lastMark", written.last_mark)


def test_writes_index(written):
    pinned("storage/index.txt", written.index)


def preallocated_journal(path: str) -> None:
    """Write the golden journal to ``path`` as a bookie leaves it: zeros after it."""
    with open(path, "wb") as f:
        f.write(golden("storage/journal.txn") + bytes(ZERO_FILL_STEP))


def test_reads_journal_records(tmp_path):
    """A scan of the golden journal (with preallocated zeros after it, as on disk) yields
    every record the script journaled, and ends cleanly at the zeros."""
    path = str(tmp_path / codec.journal_file_name(1))
    preallocated_journal(path)
    records = []
    scanner = codec.scan_journal(path)
    while True:
        try:
            rtype, payload, _end, _crc = next(scanner)
        except StopIteration as stop:
            report: codec.ScanReport = stop.value
            break
        records.append((rtype, bytes(payload)))
    assert records == journal_records()
    assert (report.reason, report.end_offset) == ("", len(golden("storage/journal.txn")))


def test_bookie_replays_golden_journal(tmp_path):
    """A new bookie whose journal directory holds the golden journal (preallocated zeros
    after it) replays it: entries, explicit LAC, fence, master keys and the delete."""
    settings = bookie_settings(str(tmp_path))
    format_bookie(settings)
    preallocated_journal(os.path.join(settings.journalDirectory, "current",
                                      codec.journal_file_name(1)))
    with Bookie(settings, start_background_threads=False) as bookie:
        assert bookie.replayed_records == len(journal_records())
        check_script_state(bookie)


@pytest.mark.parametrize("index_file", ["index.txt", "index.v1.txt"])
def test_bookie_reads_golden_checkpoint(tmp_path, index_file):
    """A bookie whose directories hold the golden journal, entry log, lastMark and index
    (a checkpoint after the last record; the index of this format or of format 1) replays
    nothing and reads every entry from the entry log through the index, with the ledgers'
    states."""
    settings = bookie_settings(str(tmp_path))
    format_bookie(settings)
    preallocated_journal(os.path.join(settings.journalDirectory, "current",
                                      codec.journal_file_name(1)))
    ledgers = os.path.join(settings.ledgerDirectories[0], "current")
    for name, target in (("entrylog.log", log_file_name(1)), ("lastMark", "lastMark")):
        shutil.copyfile(os.path.join(GOLDEN, "storage", name), os.path.join(ledgers, target))
    load_index(os.path.join(ledgers, "index"), golden(f"storage/{index_file}"))
    with Bookie(settings, start_background_threads=False) as bookie:
        assert bookie.replayed_records == 0
        check_script_state(bookie)


def check_script_state(bookie: Bookie) -> None:
    """The bookie holds what the script wrote: entries, explicit LAC, fence, master keys
    and the delete."""
    log = LOG_LEDGER
    stored = [bookie.read_entry(log.ledger_id, e) for e in range(len(log.payloads))]
    assert stored == log.entries()
    assert [decode_batch(log.decode(e, entry)) for e, entry in enumerate(stored)] == \
        [list(batch) for batch in LOG_BATCHES]
    assert [batch_records(3, e, log.decode(e, entry)) for e, entry in enumerate(stored)] == \
        [[Record(Position(3, e, slot), value, None, None, ())
          for slot, value in enumerate(batch)] for e, batch in enumerate(LOG_BATCHES)]
    fenced = FENCED_LEDGER
    assert [fenced.decode(e, bookie.read_entry(fenced.ledger_id, e))
            for e in range(3)] == list(fenced.payloads)
    assert bookie.read_explicit_lac(fenced.ledger_id) == FENCED_EXPLICIT_LAC
    assert bookie.read_lac(fenced.ledger_id) == FENCED_EXPLICIT_LAC
    assert bookie.is_fenced(fenced.ledger_id) and not bookie.is_fenced(log.ledger_id)
    assert not bookie.ledger_exists(DELETED_LEDGER.ledger_id)
    with pytest.raises(Unauthorized):  # the stored master key is checked
        bookie.add_entry(log.ledger_id, 3, _next_entry(log), b"another key")
    bookie.add_entry(log.ledger_id, 3, _next_entry(log), log.master_key)


def _next_entry(ledger: GoldenLedger) -> bytes:
    """The entry after the ledger's golden ones."""
    entry_id, payload = len(ledger.payloads), b"after"
    return DigestManager(ledger.ledger_id, ledger.digest_type, ledger.password).encode(
        entry_id, entry_id - 1, sum(map(len, ledger.payloads)) + len(payload), payload)


def test_reads_entry_log(tmp_path):
    """The golden entry log, sealed: its ledger map is read as written (no rescan: the
    file stays as it is), and every record reads back by scan and by location."""
    current = tmp_path / "ledgers" / "current"
    current.mkdir(parents=True)
    path = str(current / log_file_name(1))
    shutil.copyfile(os.path.join(GOLDEN, "storage/entrylog.log"), path)
    ledgers = str(tmp_path / "ledgers")
    logs = EntryLogger([ledgers], 1024 * 1024, lambda: ledgers)
    try:
        entries = {(ledger.ledger_id, e): entry
                   for ledger in (LOG_LEDGER, FENCED_LEDGER)
                   for e, entry in enumerate(ledger.entries())}
        assert logs.ledger_maps == {1: {
            ledger.ledger_id: sum(codec.RECORD.size + len(e) for e in ledger.entries())
            for ledger in (LOG_LEDGER, FENCED_LEDGER)}}
        scanned = list(logs.scan(1, strict=True))
        assert [(ledger, entry) for _loc, ledger, entry, _len, _crc in scanned] == \
            sorted(entries)
        for location, ledger_id, entry_id, length, _crc in scanned:
            assert logs.read(location, length, ledger_id, entry_id) == \
                entries[ledger_id, entry_id]
    finally:
        logs.close()
    with open(path, "rb") as f:
        assert f.read() == golden("storage/entrylog.log")


def test_reads_last_mark(tmp_path):
    """The golden lastMark points at the end of the golden journal's records."""
    current = tmp_path / "current"
    current.mkdir()
    shutil.copyfile(os.path.join(GOLDEN, "storage/lastMark"), current / "lastMark")
    assert read_mark([str(tmp_path)]) == \
        codec.LogMark(1, len(golden("storage/journal.txn")))


# -- the directory cookie -------------------------------------------------------------------

def cookie_settings(directory: str) -> ServerSettings:
    """One directory as both the journal and the ledger directory (roles of both)."""
    return ServerSettings(journalDirectory=directory, ledgerDirectories=(directory,))


def test_writes_cookie(tmp_path):
    write_cookies(cookie_settings(str(tmp_path)), COOKIE)
    with open(tmp_path / "current" / "COOKIE", "rb") as f:
        pinned("storage/COOKIE", f.read())


def test_reads_cookie(tmp_path):
    (tmp_path / "current").mkdir()
    shutil.copyfile(os.path.join(GOLDEN, "storage/COOKIE"), tmp_path / "current" / "COOKIE")
    assert read_cookie(str(tmp_path)) == (COOKIE, COOKIE_ROLES)
    assert directory_cookie(cookie_settings(str(tmp_path))) == COOKIE


# -- metadata records -----------------------------------------------------------------------

def test_writes_ledger_metadata():
    pinned("meta/ledger-closed.bin", CLOSED_METADATA.to_bytes())


def test_reads_ledger_metadata():
    metadata = LedgerMetadata.from_bytes(golden("meta/ledger-closed.bin"))
    assert metadata == CLOSED_METADATA
    assert dict(metadata.custom_metadata) == dict(CLOSED_METADATA.custom_metadata)
    assert metadata.check_password(LOG_LEDGER.password)
    assert not metadata.check_password(b"another password")
    assert metadata.write_set(2) == (BOOKIES[2], BOOKIES[0])


def test_reads_ledger_metadata_of_format_1():
    """A closed ledger's metadata as pybk wrote it before format 2: read, with its MAC
    digests keyed as they were written (the master key's prefix)."""
    metadata = LedgerMetadata.from_bytes(golden("meta/ledger-closed-v1.bin"))
    assert metadata == dataclasses.replace(CLOSED_METADATA, mac_key_prefix="ledger")
    assert metadata.check_password(LOG_LEDGER.password)


def test_writes_cluster_cookie():
    pinned("meta/bookie-cookie.bin", CLUSTER_COOKIE.to_bytes())


def test_reads_cluster_cookie():
    assert Cookie.from_bytes(golden("meta/bookie-cookie.bin")) == CLUSTER_COOKIE


def test_writes_log_records():
    pinned("log/head.bin", LOG_HEAD.to_bytes())
    for record in SEGMENT_RECORDS:
        pinned(f"log/segment-{record.number}.bin", record.to_bytes())


def test_writes_record_batches():
    for name, batch in RECORD_BATCHES.items():
        pinned(name, encode_batch(*batch))


def test_reads_record_batches():
    for name, batch in RECORD_BATCHES.items():
        data = golden(name)
        assert decode_fields(data) == batch.fields()
        assert decode_batch(data) == list(batch.values)


def test_reads_log_records():
    assert LogMetadata.from_bytes(golden("log/head.bin")) == LOG_HEAD
    for record in SEGMENT_RECORDS:
        assert SegmentRecord.from_bytes(golden(f"log/segment-{record.number}.bin"),
                                        record.number) == record


def test_reads_log_records_of_older_formats():
    assert LogMetadata.from_bytes(golden("log/head-v3.bin")) == LOG_HEAD_3
    for record in SEGMENT_RECORDS_1:
        assert SegmentRecord.from_bytes(golden(f"log/segment-{record.number}-v1.bin"),
                                        record.number) == record


# -- wire messages ---------------------------------------------------------------------------

def test_writes_wire_messages():
    pinned_frames("wire/add-request", wire.encode_request(add_request(), MAX_ENTRY_BYTES))
    pinned_frames("wire/add-reply", wire.encode_reply(add_reply(), MAX_ENTRY_BYTES))
    pinned_frames("wire/read-request", wire.encode_request(READ_REQUEST, MAX_ENTRY_BYTES))
    pinned_frames("wire/read-reply", wire.encode_reply(READ_REPLY, MAX_ENTRY_BYTES))
    pinned_frames("wire/deferred-add-request",
                  wire.encode_request(deferred_add_request(), MAX_ENTRY_BYTES))
    pinned_frames("wire/force-request", wire.encode_request(FORCE_REQUEST, MAX_ENTRY_BYTES))
    pinned_frames("wire/force-reply", wire.encode_reply(FORCE_REPLY, MAX_ENTRY_BYTES))
    pinned_frames("wire/force-held-request",
                  wire.encode_request(FORCE_HELD_REQUEST, MAX_ENTRY_BYTES))
    pinned_frames("wire/force-held-reply",
                  wire.encode_reply(FORCE_HELD_REPLY, MAX_ENTRY_BYTES))


def test_reads_wire_messages():
    request = wire.decode_request(golden_frames("wire/add-request"), MAX_ENTRY_BYTES)
    assert request == add_request()
    assert wire.decode_adds(request.entry, MAX_ENTRY_BYTES) == list(ADD_RUNS)
    reply = wire.decode_reply(golden_frames("wire/add-reply"), MAX_ENTRY_BYTES)
    assert reply == add_reply()
    assert wire.decode_add_statuses(reply.body, len(ADD_STATUSES)) == list(ADD_STATUSES)
    assert wire.decode_request(golden_frames("wire/read-request"), MAX_ENTRY_BYTES) == \
        READ_REQUEST
    reply = wire.decode_reply(golden_frames("wire/read-reply"), MAX_ENTRY_BYTES)
    assert reply == READ_REPLY
    assert FENCED_LEDGER.decode(2, reply.body) == FENCED_LEDGER.payloads[2]
    request = wire.decode_request(golden_frames("wire/deferred-add-request"),
                                  MAX_ENTRY_BYTES)
    assert request == deferred_add_request()
    runs = wire.decode_adds(request.entry, MAX_ENTRY_BYTES)
    assert runs == list(DEFERRED_ADD_RUNS)
    assert [run.deferred for run in runs] == [True, False]
    assert wire.decode_request(golden_frames("wire/force-request"), MAX_ENTRY_BYTES) == \
        FORCE_REQUEST
    assert wire.decode_reply(golden_frames("wire/force-reply"), MAX_ENTRY_BYTES) == \
        FORCE_REPLY
    assert wire.decode_request(golden_frames("wire/force-held-request"),
                               MAX_ENTRY_BYTES) == FORCE_HELD_REQUEST
    assert wire.decode_reply(golden_frames("wire/force-held-reply"), MAX_ENTRY_BYTES) == \
        FORCE_HELD_REPLY


# -- the directory ----------------------------------------------------------------------------

def test_golden_directory_holds_the_listed_files():
    found = {os.path.relpath(os.path.join(d, f), GOLDEN)
             for d, _, files in os.walk(GOLDEN) for f in files}
    assert found == GOLDEN_FILES | {"README.md", ".gitattributes"}
    total = sum(os.path.getsize(os.path.join(GOLDEN, name)) for name in found)
    assert total < 200 * 1024
