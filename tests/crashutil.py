"""Shared helpers of the crash tests: expected entry bytes, the acknowledgement log, the
crash child processes, checking a restarted bookie, and directory images.

Used by the parent tests and by ``tests/crash_child.py`` (which imports this module from
its own directory), so both compute the same entry bytes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pybk.errors import NoSuchEntry, NoSuchLedger
from pybk.settings import ServerSettings
from pybk.storage import Bookie, make_entry
from pybk.storage.entries import ENTRY_HEADER_SIZE

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
CHILD = os.path.join(TESTS, "crash_child.py")
KEY = b"crash-test-key"
LEDGERS = tuple(range(101, 109))  # 8 ledgers; the child's threads own them round-robin
#: ``crash_child.py --new-ledgers``: the first ledger id; thread t takes every
#: ``threads``-th id from ``NEW_LEDGERS_FROM + t``.
NEW_LEDGERS_FROM = 1001
KIB, MIB = 1024, 1024 * 1024


# -- entries -------------------------------------------------------------------

def expected_entry(ledger_id: int, entry_id: int) -> bytes:
    """The one and only content of entry (ledger, entry): 24 bytes up to 64 KiB, mostly
    small, derived from the ids alone."""
    seed = hashlib.blake2b(b"%d/%d" % (ledger_id, entry_id), digest_size=16).digest()
    roll = int.from_bytes(seed[:8], "big")
    if roll % 100 < 85:
        size = roll % 1024
    elif roll % 100 < 97:
        size = 1024 + roll % (15 * KIB)
    else:
        size = 16 * KIB + roll % (48 * KIB - ENTRY_HEADER_SIZE)
    return make_entry(ledger_id, entry_id, entry_id - 1, hashlib.shake_128(seed).digest(size))


# -- the acknowledgement log ---------------------------------------------------------

class AckLog:
    """Child side: one line per acknowledged operation, appended with O_APPEND.

    ``<ledger> <entry>`` for an add, ``lac <ledger> <value>`` for an explicit LAC,
    ``deleting <ledger>`` before a deletion is asked for and ``deleted <ledger>`` once it
    is acknowledged.  No fsync: a SIGKILL keeps the page cache, and power loss is only
    simulated.
    """

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def entry(self, ledger_id: int, entry_id: int) -> None:
        os.write(self._fd, b"%d %d\n" % (ledger_id, entry_id))

    def lac(self, ledger_id: int, lac: int) -> None:
        os.write(self._fd, b"lac %d %d\n" % (ledger_id, lac))

    def deleting(self, ledger_id: int) -> None:
        os.write(self._fd, b"deleting %d\n" % ledger_id)

    def deleted(self, ledger_id: int) -> None:
        os.write(self._fd, b"deleted %d\n" % ledger_id)


@dataclass
class Acks:
    """Parent side: what the children acknowledged, over all rounds."""

    entries: dict[int, set[int]] = field(default_factory=dict)
    lacs: dict[int, int] = field(default_factory=dict)
    #: Ledgers whose deletion was asked for (acknowledged or not).
    deleting: set[int] = field(default_factory=set)
    #: Ledgers whose deletion was acknowledged.
    deleted: set[int] = field(default_factory=set)

    @property
    def count(self) -> int:
        return sum(len(ids) for ids in self.entries.values())


def read_acks(path: str | Path) -> Acks:
    acks = Acks()
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return acks
    for line in data.split(b"\n")[:-1]:  # a line without its newline was never finished
        parts = line.split()
        if parts[0] == b"lac":
            ledger_id, lac = int(parts[1]), int(parts[2])
            acks.lacs[ledger_id] = max(lac, acks.lacs.get(ledger_id, lac))
        elif parts[0] == b"deleting":
            acks.deleting.add(int(parts[1]))
        elif parts[0] == b"deleted":
            acks.deleted.add(int(parts[1]))
        else:
            acks.entries.setdefault(int(parts[0]), set()).add(int(parts[1]))
    return acks


def count_lines(path: str | Path) -> int:
    try:
        return Path(path).read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


# -- checking a restarted bookie ---------------------------------------------------------

def check_bookie(bookie: Bookie, acks: Acks, ledgers=LEDGERS) -> int:
    """Assert the crash guarantee; return how many unacknowledged entries survived.

    Every acknowledged entry reads back byte-identical; every other id up to the highest
    one present reads its exact bytes or raises NoSuchEntry (any other error propagates);
    every acknowledged explicit LAC is still there (or a higher one).
    """
    survivors = 0
    for ledger_id in ledgers:
        acked = acks.entries.get(ledger_id, set())
        try:
            last = bookie.last_entry_id(ledger_id)
        except NoSuchLedger:
            assert not acked and ledger_id not in acks.lacs, \
                f"ledger {ledger_id} is gone, with {len(acked)} acknowledged entries"
            continue
        top = max([-1 if last is None else last, *acked])
        for entry_id in range(top + 1):
            try:
                data = bookie.read_entry(ledger_id, entry_id)
            except NoSuchEntry:
                assert entry_id not in acked, \
                    f"acknowledged entry {ledger_id}/{entry_id} is lost (last id {last})"
                continue
            expected = expected_entry(ledger_id, entry_id)
            if data != expected:
                pytest.fail(f"entry {ledger_id}/{entry_id} reads {len(data)} wrong bytes "
                            f"(expected {len(expected)}; acknowledged: {entry_id in acked})")
            survivors += entry_id not in acked
        if ledger_id in acks.lacs:
            explicit = bookie.read_explicit_lac(ledger_id)
            assert explicit is not None and explicit >= acks.lacs[ledger_id], \
                f"ledger {ledger_id}: explicit LAC {explicit}, acknowledged {acks.lacs[ledger_id]}"
    return survivors


def check_deleted(bookie: Bookie, ledger_id: int) -> None:
    """A deleted ledger stays deleted: it does not exist and reads as NoSuchLedger."""
    assert not bookie.ledger_exists(ledger_id), f"deleted ledger {ledger_id} exists again"
    with pytest.raises(NoSuchLedger):
        bookie.read_entry(ledger_id, 0)


def add_to_deleted(bookie: Bookie, ledger_id: int) -> bool:
    """Add entry 0 to a deleted ledger: refused while its deletion is recorded, or, once
    GC forgot it (docs/DESIGN.md, "Deletion"), accepted as the first entry of a new ledger
    that holds nothing else.  Returns whether the id was forgotten."""
    try:
        bookie.add_entry(ledger_id, 0, expected_entry(ledger_id, 0), KEY)
    except NoSuchLedger:
        return False
    assert bookie.entry_ids(ledger_id) == [0], \
        f"ledger {ledger_id}, deleted and made again, holds {bookie.entry_ids(ledger_id)}"
    return True


# -- durable steps -----------------------------------------------------------------------

#: The index transactions a crash child announces as steps (``FaultyFileIO.step``): the
#: checkpoint's commit, compaction's re-pointing, GC's forgetting of deleted ledgers.
INDEX_STEPS = ("commit_checkpoint", "relocate", "forget_ledgers")
#: Every kind of durable step a bookie takes, as :func:`step_kind` names them.
STEP_KINDS = ("journal-write", "journal-sync", "log-write", "log-sync", "log-rename",
              "log-unlink", "mark-write", "mark-sync", "mark-rename",
              *(f"index-{name}" for name in INDEX_STEPS))


def step_kind(op: str, path: str) -> str | None:
    """The kind of a FaultyFileIO step (``op`` on ``path``): the file (journal, entry log,
    LastLogMark) or ``index``, then the operation; None for other files."""
    if op in INDEX_STEPS:
        return f"index-{op}"
    name = os.path.basename(path)
    if name.endswith(".txn"):
        return f"journal-{op}"
    if name.endswith((".log", ".log.new")):
        return f"log-{op}"
    if name.startswith("lastMark"):
        return f"mark-{op}"
    return None


# -- settings ------------------------------------------------------------------------------

def crash_settings(base: Path, **overrides) -> dict[str, str]:
    """Small settings, so checkpoints, journal rolls and entry-log rolls happen often."""
    values = dict(journalDirectory=base / "journal",
                  ledgerDirectories=f"{base / 'ledgers0'},{base / 'ledgers1'}",
                  flushInterval=200, journalMaxSizeMB=1, journalPreAllocSizeMB=1,
                  logSizeLimit=2 * MIB, maxEntrySizeBytes=256 * KIB, writeCacheMaxSizeMb=4)
    values.update(overrides)
    return {key: str(value) for key, value in values.items()}


def settings_of(values: dict[str, str]) -> ServerSettings:
    return ServerSettings.from_mapping(values)


# -- child processes -------------------------------------------------------------------------

class Children:
    """Starts ``crash_child.py`` processes; :meth:`close` kills and reaps every one."""

    def __init__(self, workdir: Path) -> None:
        self._workdir = workdir
        self._procs: list[subprocess.Popen] = []

    def start(self, settings: dict[str, str], acks: Path, seed: int,
              *options: str) -> subprocess.Popen:
        """A ``crash_child.py`` on a bookie with ``settings``."""
        return self.spawn(CHILD, "--acks", str(acks), "--seed", str(seed), *options,
                          *(f"{key}={value}" for key, value in settings.items()))

    def spawn(self, script: str, *args: str) -> subprocess.Popen:
        """``python script args...`` with pybk importable; stderr kept for failures."""
        stderr_path = self._workdir / f"child-{len(self._procs)}.stderr"
        env = dict(os.environ, PYTHONPATH=ROOT)
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen((sys.executable, script, *args), env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=stderr)
        proc.stderr_path = stderr_path  # type: ignore[attr-defined]
        self._procs.append(proc)
        return proc

    @staticmethod
    def stderr(proc: subprocess.Popen) -> str:
        return Path(proc.stderr_path).read_text(errors="replace")[-4000:]

    def wait_for_acks(self, proc: subprocess.Popen, acks: Path, count: int,
                      timeout: float = 30.0) -> None:
        """Wait until the ack log holds ``count`` lines (the child must keep running)."""
        deadline = time.monotonic() + timeout
        while count_lines(acks) < count:
            assert proc.poll() is None, \
                f"child exited with {proc.returncode}:\n{self.stderr(proc)}"
            assert time.monotonic() < deadline, \
                f"child acknowledged {count_lines(acks)} of {count} adds in {timeout} s"
            time.sleep(0.01)

    def wait_for_exit(self, proc: subprocess.Popen, timeout: float) -> None:
        """Wait for a child to end by itself; SIGKILL it if it does not within ``timeout``."""
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)

    def kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL a running child and reap it; fail if it had ended by itself."""
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        self.assert_killed(proc)

    def assert_killed(self, proc: subprocess.Popen) -> None:
        assert proc.returncode == -signal.SIGKILL, \
            f"child ended with {proc.returncode}, not by SIGKILL:\n{self.stderr(proc)}"

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # pragma: no cover - a zombie we cannot reap
                pass


@pytest.fixture
def children(tmp_path):
    """Crash children of one test; each is killed and reaped even if the test fails."""
    group = Children(tmp_path)
    yield group
    group.close()


# -- directory images (crash by copying a running bookie's files) ----------------------------

def directories(settings: ServerSettings) -> list[str]:
    return [settings.journalDirectory, *settings.ledgerDirectories]


def take_image(settings: ServerSettings, dest: Path) -> Path:
    """Copy the bookie's directories as they are now (what a kill -9 now would leave)."""
    for i, directory in enumerate(directories(settings)):
        shutil.copytree(directory, dest / str(i))
    return dest


def restore_image(image: Path, settings: ServerSettings) -> None:
    """Put an image back in place of the bookie's directories (cookies name the paths)."""
    for i, directory in enumerate(directories(settings)):
        shutil.rmtree(directory, ignore_errors=True)
        shutil.copytree(image / str(i), directory)


def files(settings: ServerSettings, suffix: str) -> list[str]:
    """The bookie's journal (``.txn``) or entry log (``.log``) files, by name."""
    found = [os.path.join(parent, name) for directory in directories(settings)
             for parent, _dirs, names in os.walk(directory) for name in names
             if name.endswith(suffix)]
    return sorted(found, key=os.path.basename)


