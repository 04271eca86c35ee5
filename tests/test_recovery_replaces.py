"""Recovery replaces a bookie it cannot write to, as a writer would (contract point 7).

Recovery re-writes every entry past the LAC to its whole write set.  When a bookie of
the last fragment is dead, does not answer adds, or refuses them (an error, a read-only
bookie: issue 31, section 7), recovery does not give up with LedgerRecoveryError: it
replaces that bookie with a writable one (never with one it replaced before), in a new
fragment that it writes together with state CLOSED.  The ledger then closes at its last
entry with a readable copy, every acknowledged entry reads back, and every entry of the
new fragment is on its whole write set.

Two kinds of test: bookies in this process with fault hooks (deterministic: which entry
is on which bookie is known), each run twice, with the bookies called in process and
over ZeroMQ with CURVE on both sides (clientutil's ``"zmq-curve"`` transport); and ``pybk
bookie`` processes with a writer process, both killed with SIGKILL (bookie processes
serving CURVE re-replicate in tests/test_security.py).  Every ledger is E=3, Qw=2,
Qa=2; with four bookies one is a spare, with five two are.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import zkutil
from clientutil import CURVE, FAST, Cluster, clusters
from clusterutil import PASSWORD, TESTS, address, bookies, child_env, payload  # noqa: F401

import pybk
from pybk.client import BookKeeper
from pybk.errors import (
    BookieReadOnly,
    BookKeeperError,
    LedgerClosed,
    LedgerFenced,
    LedgerRecoveryError,
    NotEnoughBookies,
)
from pybk.log import LogReader, LogWriter, Position
from pybk.log.metadata import read_log
from pybk.meta.ledger_metadata import Fragment, LedgerMetadata, LedgerState
from pybk.settings import LogSettings
from pybk.storage import LAST_ENTRY
from pybk.testing import WAIT_S, wait_until

pytestmark = pytest.mark.timeout(120)

#: A writer that never times out an add by itself: it stands for a writer that died with
#: adds in flight (its client would otherwise replace the silent bookie first).
STALLED_WRITER = dataclasses.replace(FAST, addEntryTimeout=3600.0)
#: Entries 0..9 acknowledged, then 10..14 sent while the first bookie of the ensemble
#: takes no adds: 10 (write set B, C) is acknowledged, 11..14 are not.
ACKED_FIRST = 10
TAIL = range(10, 15)
LAST = TAIL[-1]
REPLICATED = LogSettings(ensembleSize=3, writeQuorumSize=2, ackQuorumSize=2)


# -- in-process bookies ------------------------------------------------------------------

@pytest.fixture(params=("inprocess", CURVE))
def cluster_of(request, tmp_path):
    with clusters(tmp_path, request.param) as make:
        yield make


def write_with_unconfirmed_tail(cluster: Cluster, first_acked: int = ACKED_FIRST):
    """A ledger (ensemble A, B, C) whose writer stalled: entries 0..first_acked-1 are
    acknowledged on their whole write sets; then A takes no adds and entries
    first_acked..first_acked+4 are sent.  Returns (handle, ensemble, futures of the tail).

    Write sets (E=3, Qw=2): e % 3 == 0 -> A B, 1 -> B C, 2 -> C A.  With first_acked=10:
    10 is on B C (acknowledged), 11 on C, 12 on B, 13 on B C, 14 on C (none of 11..14
    acknowledged: 11 waits for A).  With first_acked=0: 0 on B, 1 on B C, 2 on C, 3 on B,
    4 on B C (none acknowledged)."""
    writer = cluster.client(STALLED_WRITER)
    lh = writer.create_ledger(3, 2, 2, password=PASSWORD)
    ensemble = lh.metadata.fragments[0].ensemble
    a = ensemble[0]
    for i in range(first_acked):
        assert lh.add_entry(payload(i)) == i
    cluster.faults[a].drop.add("add")
    tail = [lh.add_entry_async(payload(i)) for i in range(first_acked, first_acked + 5)]

    def on_survivors(entry_id: int) -> list[str]:
        return sorted(b for b in lh.metadata.write_set(entry_id) if b != a)

    for entry_id in range(first_acked, first_acked + 5):
        wait_until(lambda e=entry_id: sorted(
            b for b in cluster.holders(lh.id, e) if b != a) == on_survivors(e),
            f"entry {entry_id} stored on {on_survivors(entry_id)}")
    return lh, ensemble, tail


def spare_of(cluster: Cluster, ensemble: tuple[str, ...]) -> str:
    (spare,) = [b for b in cluster.bookie_ids if b not in ensemble]
    return spare


def recover(bk: BookKeeper, ledger_id: int, victim: str):
    try:
        return bk.open_ledger(ledger_id, password=PASSWORD, recovery=True)
    except LedgerRecoveryError as e:
        pytest.fail(f"recovery failed instead of replacing bookie {victim}: {e!r}")


def check_replaced(closed: LedgerMetadata, original: tuple[Fragment, ...], victim: str,
                   spare: str) -> Fragment:
    """The closed metadata keeps the original fragments and adds one whose ensemble is
    the last original one with ``victim`` replaced by ``spare``; returns it."""
    assert closed.state is LedgerState.CLOSED, closed
    assert len(closed.fragments) == len(original) + 1, \
        f"expected the original fragments {list(original)} and one new fragment, got " \
        f"{list(closed.fragments)}"
    assert closed.fragments[:len(original)] == original, \
        f"original fragments changed: {list(closed.fragments)} (was {list(original)})"
    new = closed.fragments[-1]
    expected = tuple(spare if b == victim else b for b in original[-1].ensemble)
    assert new.ensemble == expected, \
        f"new fragment {new}: expected ensemble {expected} ({victim} -> {spare} in place)"
    assert original[-1].first_entry_id < new.first_entry_id <= closed.last_entry_id, \
        f"new fragment {new} does not start inside the recovered entries (original last " \
        f"fragment {original[-1]}, last entry {closed.last_entry_id})"
    return new


def check_on_whole_write_sets(cluster: Cluster, closed: LedgerMetadata, first: int) -> None:
    for entry_id in range(first, closed.last_entry_id + 1):
        write_set = closed.write_set(entry_id)
        held = cluster.holders(closed.ledger_id, entry_id)
        assert set(write_set) <= set(held), \
            f"recovered entry {entry_id} is on {held}, not on its whole write set " \
            f"{write_set} under the new fragment"


def check_reads(cluster: Cluster, ledger_id: int, last: int) -> None:
    reader = cluster.client().open_ledger(ledger_id, password=PASSWORD, recovery=False)
    assert reader.metadata.last_entry_id == last
    got = [e.data for e in reader.read_entries(0, last)]
    wrong = [i for i in range(last + 1) if got[i] != payload(i)]
    assert not wrong, f"entries {wrong} read back with other bytes"


@pytest.mark.parametrize("failure", ["unreachable", "add times out"])
def test_recovery_replaces_a_dead_bookie_of_the_last_fragment(cluster_of, failure):
    """A (the first bookie of the ensemble) is unreachable for good, or reachable but
    answers no add: re-writing entry 11 (write set C, A) needs it, so recovery replaces
    A with the spare in a new fragment, and closes the ledger at 14 with that fragment."""
    cluster = cluster_of(4)
    lh, ensemble, tail = write_with_unconfirmed_tail(cluster)
    victim, spare = ensemble[0], spare_of(cluster, ensemble)
    assert tail[0].result(timeout=WAIT_S) == ACKED_FIRST
    assert not any(f.done() for f in tail[1:]), "entries 11..14 must be unacknowledged"
    original = lh.metadata.fragments
    assert original == (Fragment(0, ensemble),)
    if failure == "unreachable":
        cluster.faults[victim].unreachable = True
    # else: A still drops every add (recovery adds too); the recoverer's addEntryTimeout
    # (2 s) decides.

    recovered = recover(cluster.client(), lh.id, victim)
    closed = recovered.metadata
    assert closed.last_entry_id == LAST, \
        f"closed at {closed.last_entry_id}: entries 11..14 have a readable copy each, so " \
        f"recovery must keep them (last entry {LAST})"
    new = check_replaced(closed, original, victim, spare)
    assert new.first_entry_id in (ACKED_FIRST, ACKED_FIRST + 1), \
        f"new fragment {new}: recovery started at {ACKED_FIRST} and first needed {victim} " \
        f"for entry {ACKED_FIRST + 1}"
    stored = cluster.client().ledger_manager.read(lh.id).metadata
    assert stored == closed, f"stored metadata {stored} differs from the recovered {closed}"
    check_on_whole_write_sets(cluster, closed, new.first_entry_id)
    check_reads(cluster, lh.id, LAST)


def test_recovery_from_entry_zero_replaces_the_only_fragment_in_place(cluster_of):
    """Nothing was acknowledged: recovery starts at entry 0, whose write set (A, B)
    needs the dead A, so the replacement fragment starts where the only fragment does
    and replaces it (docs/DESIGN.md, "Ensemble changes": a new fragment at LAC + 1
    replaces the last one in place if that is where it starts)."""
    cluster = cluster_of(4)
    lh, ensemble, tail = write_with_unconfirmed_tail(cluster, first_acked=0)
    victim, spare = ensemble[0], spare_of(cluster, ensemble)
    assert not any(f.done() for f in tail), "entries 0..4 must be unacknowledged"
    cluster.faults[victim].unreachable = True

    closed = recover(cluster.client(), lh.id, victim).metadata
    assert closed.state is LedgerState.CLOSED
    assert closed.last_entry_id == 4, \
        f"closed at {closed.last_entry_id}: entries 0..4 each have a readable copy"
    replaced = tuple(spare if b == victim else b for b in ensemble)
    assert closed.fragments == (Fragment(0, replaced),), \
        f"expected the one fragment replaced in place, {victim} -> {spare}: " \
        f"{list(closed.fragments)}"
    check_on_whole_write_sets(cluster, closed, 0)
    check_reads(cluster, lh.id, 4)


def test_without_a_spare_recovery_fails_and_leaves_the_ledger_to_a_later_recovery(
        cluster_of):
    """Three bookies, A dead: no bookie can replace it, so recovery fails, writes no
    fragment and does not close the ledger (an entry with a readable copy must not be
    cut off); once A is back, a second recovery closes it at 14 on the old ensemble."""
    cluster = cluster_of(3)
    lh, ensemble, tail = write_with_unconfirmed_tail(cluster)
    victim = ensemble[0]
    assert tail[0].result(timeout=WAIT_S) == ACKED_FIRST
    original = lh.metadata.fragments
    cluster.faults[victim].unreachable = True

    with pytest.raises(BookKeeperError):
        cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=True)
    observer = cluster.client()
    deadline = time.monotonic() + 0.5  # nothing closes it in the background either
    while True:
        stored = observer.ledger_manager.read(lh.id).metadata
        assert stored.state is LedgerState.IN_RECOVERY and stored.fragments == original, \
            f"a failed recovery changed the metadata: {stored}"
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)

    cluster.faults[victim].unreachable = False
    cluster.faults[victim].drop.clear()
    closed = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=True).metadata
    assert closed.state is LedgerState.CLOSED and closed.last_entry_id == LAST, closed
    assert closed.fragments == original, \
        f"nothing failed this time, yet the fragments changed: {list(closed.fragments)}"
    check_on_whole_write_sets(cluster, closed, ACKED_FIRST)
    check_reads(cluster, lh.id, LAST)


# -- two bookies of the ensemble refuse recovery's adds --------------------------------

#: How a bookie refuses the recovering client's adds: with an error (the fault hook fails
#: them), by never answering (the hook drops them), or by being read-only for real (the
#: Bookie itself refuses every add, recovery adds included, with BookieReadOnly;
#: BookKeeper's read-only bookie takes recovery adds while its disks have room for them).
REFUSALS = ("error", "timeout", "read-only")
#: A recovering client without quarantine: nothing but recovery itself keeps it from
#: choosing a bookie that refused it as the replacement of another (with quarantine, a
#: client with too few other bookies falls back to quarantined ones just the same).
NO_QUARANTINE = dataclasses.replace(FAST, bookieQuarantineTimeSeconds=0)


def ten_acknowledged(cluster: Cluster):
    """A live writer's ledger, E=3, Qw=2, Qa=2, with entries 0..9 acknowledged."""
    lh = cluster.client().create_ledger(3, 2, 2, password=PASSWORD)
    for i in range(10):
        assert lh.add_entry(payload(i)) == i
    return lh


def refuse_adds(cluster: Cluster, bookie_id: str, refusal: str) -> None:
    if refusal == "error":
        cluster.faults[bookie_id].fail.add("add")
        cluster.faults[bookie_id].error = lambda: BookieReadOnly("injected: disk full")
    elif refusal == "timeout":
        cluster.faults[bookie_id].drop.add("add")
    else:
        cluster.bookies[bookie_id].set_read_only("the test switched it read-only")


@pytest.mark.parametrize("refusal", REFUSALS)
def test_recovery_replaces_two_bookies_that_refuse_its_adds(cluster_of, refusal):
    """Five bookies; a live writer had entries 0..9 acknowledged on ensemble A, B, C.
    Entry 9 carries LAC 8, so recovery re-writes entry 9, whose write set is A, B; both
    refuse recovery's adds.  Recovery replaces them with the two spares D, E (never with
    each other: before, A replaced by D and then B by A again, and so on, until
    LedgerRecoveryError "re-writing entries did not finish") in a fragment from entry 9
    written with state CLOSED, closes the ledger at 9, and every entry reads back from a
    fresh client.  The old writer stays fenced: its next add fails and lands nowhere, and
    its close accepts the end recovery chose."""
    cluster = cluster_of(5)
    lh = ten_acknowledged(cluster)
    ensemble = lh.metadata.fragments[0].ensemble
    refusing = ensemble[:2]
    assert lh.metadata.write_set(9) == refusing
    spares = sorted(b for b in cluster.bookie_ids if b not in ensemble)
    for bookie_id in refusing:
        refuse_adds(cluster, bookie_id, refusal)

    recovered = recover(cluster.client(NO_QUARANTINE), lh.id, " and ".join(refusing))
    closed = recovered.metadata
    assert closed.state is LedgerState.CLOSED and closed.last_entry_id == 9, closed
    assert closed.fragments[0] == Fragment(0, ensemble), list(closed.fragments)
    assert len(closed.fragments) == 2, \
        f"expected one new fragment replacing {refusing}: {list(closed.fragments)}"
    new = closed.fragments[1]
    assert new.first_entry_id == 9, f"new fragment {new} must start at the re-written 9"
    assert sorted(new.ensemble[:2]) == spares and new.ensemble[2] == ensemble[2], \
        f"new fragment {new}: expected {refusing} replaced by {spares} in place"
    check_on_whole_write_sets(cluster, closed, 9)
    assert cluster.client().ledger_manager.read(lh.id).metadata == closed

    with pytest.raises((LedgerFenced, LedgerClosed)):
        lh.add_entry(payload(10))
    assert not cluster.holders(lh.id, 10), "the fenced writer's entry 10 was stored"
    lh.close()
    assert cluster.client().ledger_manager.read(lh.id).metadata == closed
    check_reads(cluster, lh.id, 9)


def test_recovery_without_bookies_to_replace_the_refusing_ones_fails_clearly(cluster_of):
    """Four bookies: the one spare cannot replace both A and B, which refuse recovery's
    adds with an error.  Recovery never chooses a bookie that refused it again (the
    client's quarantine would let it: too few bookies outside it), so it fails with
    NotEnoughBookies as the cause, not when its wait for the re-writes runs out, and
    leaves the ledger IN_RECOVERY with its fragments for a later recovery."""
    cluster = cluster_of(4)
    lh = ten_acknowledged(cluster)
    original = lh.metadata.fragments
    for bookie_id in original[0].ensemble[:2]:
        refuse_adds(cluster, bookie_id, "error")

    with pytest.raises(LedgerRecoveryError) as failed:
        cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=True)
    assert isinstance(failed.value.__cause__, NotEnoughBookies), failed.value
    stored = cluster.client().ledger_manager.read(lh.id).metadata
    assert stored.state is LedgerState.IN_RECOVERY and stored.fragments == original, stored


def test_a_recovery_that_replaced_bookies_adopts_the_close_of_another_recovery(
        cluster_of):
    """Two recoveries of one ledger, each replacing A and B, which refuse their adds with
    an error.  The first one's CLOSED write is held until the second one's landed: its
    compare-and-set loses, it re-reads the ledger CLOSED and adopts that record, writing
    nothing more, so both recoveries end on the one stored record."""
    cluster = cluster_of(5)
    lh = ten_acknowledged(cluster)
    for bookie_id in lh.metadata.fragments[0].ensemble[:2]:
        refuse_adds(cluster, bookie_id, "error")
    faults = cluster.metadata_faults
    pool = ThreadPoolExecutor(2, thread_name_prefix="recovery")
    try:
        faults.hold_writes = True
        first = pool.submit(recover, cluster.client(NO_QUARANTINE), lh.id, "A and B")
        (to_recovery,) = faults.wait_held(1, WAIT_S)
        faults.release(to_recovery)
        (first_close,) = faults.wait_held(1, WAIT_S)
        second = pool.submit(recover, cluster.client(NO_QUARANTINE), lh.id, "A and B")
        second_close = faults.wait_held(2, WAIT_S)[1]
        faults.release(second_close)
        closed = second.result(WAIT_S).metadata
        assert closed.state is LedgerState.CLOSED and closed.last_entry_id == 9, closed
        assert len(closed.fragments) == 2 and closed.fragments[1].first_entry_id == 9, \
            f"the second recovery did not replace A and B from entry 9: {closed}"
        stored = cluster.client().ledger_manager.read(lh.id)
        faults.release_all()
        assert first.result(WAIT_S).metadata == closed, \
            "the first recovery did not adopt the second one's close"
        assert cluster.client().ledger_manager.read(lh.id) == stored, \
            "the first recovery wrote after losing its compare-and-set"
    finally:
        faults.release_all()
        pool.shutdown()
    check_reads(cluster, lh.id, 9)


# -- processes, killed with SIGKILL --------------------------------------------------------

class Children:
    """Helper scripts of tests/ run as processes; :meth:`close` SIGKILLs and reaps every
    one still running."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[tuple[subprocess.Popen, Path]] = []

    def start(self, script: str, *args: str) -> subprocess.Popen:
        output = self.workdir / f"{script}.{len(self.started)}.out"
        with open(output, "wb") as out:
            process = subprocess.Popen([sys.executable, os.path.join(TESTS, script), *args],
                                       env=child_env(), stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=subprocess.STDOUT)
        self.started.append((process, output))
        return process

    def output(self, process: subprocess.Popen) -> str:
        (path,) = [p for started, p in self.started if started is process]
        return path.read_bytes().decode(errors="replace")[-6000:]

    def kill(self, process: subprocess.Popen) -> None:
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        assert process.returncode == -signal.SIGKILL, \
            f"exited with {process.returncode}:\n{self.output(process)}"

    def close(self) -> None:
        for process, _ in self.started:
            if process.poll() is None:
                process.kill()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:  # pragma: no cover - cannot reap it
                pass


@pytest.fixture
def children(tmp_path):
    group = Children(tmp_path)
    yield group
    group.close()


def client(closing, address: str) -> BookKeeper:
    return closing.enter_context(pybk.connect(address, FAST,
                                                    zk_settings=zkutil.settings()))


def wait_for_acks(children: Children, writer: subprocess.Popen, acks: Path,
                  count: int) -> None:
    """Wait until the writer reported ``count`` acknowledged entries (a line each, after
    its first line naming the ledger)."""
    deadline = time.monotonic() + 60
    while _lines(acks) < count + 1:
        assert writer.poll() is None, \
            f"the writer exited with {writer.returncode}:\n{children.output(writer)}"
        assert time.monotonic() < deadline, f"{_lines(acks) - 1} acks in 60 s"
        time.sleep(0.01)


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def read_acks(acks: Path) -> tuple[int, list[bytes]]:
    """The ledger id and the acknowledgement lines (a line without its newline never
    finished)."""
    lines = acks.read_bytes().split(b"\n")[:-1]
    word, ledger_id = lines[0].split()
    assert word == b"ledger", lines[0]
    return int(ledger_id), lines[1:]


def kill_a_bookie_of(bk: BookKeeper, started: dict, ledger_id: int):
    """Kill a bookie of the ledger's (still open) last ensemble that recovery will need:
    one of the write set of the last entry any bookie holds, and one that does not hold
    it if there is one (so the entry survives).  That entry is past every LAC the dead
    writer sent (it was busy), so recovery re-writes it to its write set and must
    replace the victim.  Returns the metadata before, the victim and the spare (the one
    bookie outside the ensemble)."""
    before = bk.ledger_manager.read(ledger_id).metadata
    assert before.state is LedgerState.OPEN, before
    ensemble = before.fragments[-1].ensemble
    bk.resolve_bookies(ensemble)
    last_held = {}
    for bookie_id in ensemble:
        try:
            data = bytes(bk.bookie_client(bookie_id).read(ledger_id, LAST_ENTRY).result(
                timeout=WAIT_S))
        except BookKeeperError:
            continue
        last_held[bookie_id] = int.from_bytes(data[8:16], "big")
    last = max(last_held.values())
    write_set = before.write_set(last)
    victim = next((b for b in write_set if last_held.get(b, -1) < last), write_set[-1])
    (spare,) = [b for b in started if b not in ensemble]
    started[victim].kill()
    return before, victim, spare


def check_stored_on_whole_write_sets(bk: BookKeeper, closed: LedgerMetadata, first: int,
                                     payloads: bool = True) -> None:
    """Each entry from ``first`` on is on every bookie of its write set (read from each
    bookie directly, no failover); with ``payloads``, entry e carries ``payload(e)``."""
    bk.resolve_bookies(closed.fragments[-1].ensemble)
    for entry_id in range(first, closed.last_entry_id + 1):
        for bookie_id in closed.write_set(entry_id):
            future = bk.bookie_client(bookie_id).read(closed.ledger_id, entry_id)
            try:
                stored = bytes(future.result(timeout=WAIT_S))
            except BookKeeperError as e:
                pytest.fail(f"recovered entry {entry_id} is not on {bookie_id} of its write "
                            f"set {closed.write_set(entry_id)}: {e!r}")
            if payloads:
                assert stored.endswith(payload(entry_id)), \
                    f"entry {entry_id} on {bookie_id} holds other bytes than its payload"


#: The bookie processes of the kill -9 tests run no autorecovery: its replication worker
#: would also replace the killed bookie in the closed ledger's earlier fragments, racing
#: the checks that recovery itself kept them.
NO_AUTORECOVERY = ("--set", "autoRecoveryDaemonEnabled=false")


def test_recovery_after_kill_minus_nine_of_the_writer_and_a_bookie(
        tmp_path, bookies, closing, address, children):
    """A writer process (tests/cluster_writer.py, 64 adds in flight) and then one bookie
    of its ensemble are killed; three writable bookies remain.  Recovery re-writes the
    entries past the LAC, replacing the dead bookie with the spare, and every entry the
    writer reported as acknowledged reads back."""
    started = {b.bookie_id: b for b in bookies.start_serving(
        4, zk_timeout_ms=zkutil.SHORT_SESSION_TIMEOUT_MS, options=NO_AUTORECOVERY)}
    acks = tmp_path / "acks"
    writer = children.start("cluster_writer.py", "--zk", address, "--acks", str(acks))
    wait_for_acks(children, writer, acks, 300)
    children.kill(writer)
    ledger_id, lines = read_acks(acks)
    acked = [int(line) for line in lines]
    bk = client(closing, address)
    before, victim, spare = kill_a_bookie_of(bk, started, ledger_id)

    recovered = recover(client(closing, address), ledger_id, victim)
    closed = recovered.metadata
    last = closed.last_entry_id
    assert last >= max(acked), \
        f"closed at {last}, but the writer had entries up to {max(acked)} acknowledged"
    new = check_replaced(closed, before.fragments, victim, spare)

    reader_bk = client(closing, address)
    reader = reader_bk.open_ledger(ledger_id, password=PASSWORD, recovery=False)
    assert reader.metadata == closed
    got = [e.data for e in reader.read_entries(0, last)]
    wrong = [i for i in range(last + 1) if got[i] != payload(i)]
    assert not wrong, f"entries {wrong[:20]} read back with other bytes"
    check_stored_on_whole_write_sets(reader_bk, closed, new.first_entry_id)


def test_a_log_writer_takes_over_after_kill_minus_nine_of_the_writer_and_a_bookie(
        tmp_path, bookies, closing, address, children):
    """A log writer process (tests/cluster_log_writer.py) and then one bookie of its
    segment's ensemble are killed; three writable bookies remain.  LogWriter.open
    recovers the segment (replacing the dead bookie) and appends; every record the old
    writer reported as acknowledged reads back at its position."""
    started = {b.bookie_id: b for b in bookies.start_serving(
        4, zk_timeout_ms=zkutil.SHORT_SESSION_TIMEOUT_MS, options=NO_AUTORECOVERY)}
    acks = tmp_path / "acks"
    writer = children.start("cluster_log_writer.py", "--zk", address, "--log", "log",
                            "--acks", str(acks))
    wait_for_acks(children, writer, acks, 300)
    children.kill(writer)
    ledger_id, lines = read_acks(acks)
    acked = [(Position.parse(p.decode()), int(n))
             for p, n in (line.split() for line in lines)]
    bk = client(closing, address)
    before, victim, spare = kill_a_bookie_of(bk, started, ledger_id)
    # Its session ends within zkTimeout: from then on only live bookies are writable, so
    # the new writer's own ledger is placed on them.
    wait_until(lambda: victim not in bk.metadata.bookies(read_only=False),
               f"the killed bookie {victim} left the registry", timeout_s=30)

    try:
        new_writer = LogWriter.open(bk, "log", REPLICATED)
    except LedgerRecoveryError as e:
        pytest.fail(f"recovering the segment failed instead of replacing bookie {victim}: "
                    f"{e!r}")
    closing.callback(new_writer.close)
    assert new_writer.metadata.tail[-1].ledger_id != ledger_id
    assert ledger_id in [s.ledger_id for s in new_writer.metadata.tail], \
        "the killed writer's segment was dropped from the log"
    position = new_writer.append_async(b"after the takeover").result(timeout=30)
    new_writer.close()

    closed = bk.ledger_manager.read(ledger_id).metadata
    assert closed.last_entry_id >= max(p.entry for p, _ in acked), \
        f"segment closed at {closed.last_entry_id}, but the writer had entries up to " \
        f"{max(p.entry for p, _ in acked)} acknowledged"
    new = check_replaced(closed, before.fragments, victim, spare)
    assert [s.ledger_id for s in read_log(bk.metadata, "log").metadata.tail] == \
        [s.ledger_id for s in new_writer.metadata.tail]

    reader_bk = client(closing, address)
    records = list(LogReader(reader_bk, "log").read())
    found = dict(records)
    missing = [(str(p), n) for p, n in acked if found.get(p) != payload(n)]
    assert not missing, f"{len(missing)} acknowledged records missing or different, e.g. " \
        f"{missing[:10]}"
    assert [p for p, _ in records] == sorted(p for p, _ in records)
    assert records[-1] == (position, b"after the takeover")
    check_stored_on_whole_write_sets(reader_bk, closed, new.first_entry_id, payloads=False)
