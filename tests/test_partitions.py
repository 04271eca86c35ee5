"""Real network faults (issue 35): ZooKeeper and five ``pybk bookie`` processes in network
namespaces of their own, the test process a client node among them, all joined by the
switch of tests/netbed.py, whose nemesis cuts, delays and drops frames while clients
write.  After each run a client that reaches everything checks the ledger rules: every
acknowledged entry is readable, once, in order, with its bytes; nothing beyond the
recovered close was acknowledged to a fenced writer.

The nodes: ``zk``; bookies ``b1``..``b5``; ``c1``..``c3``, namespaces for client
processes (tests/cluster_writer.py, tests/contending_log_writer.py); ``client``, the
test process (its own clients' traffic crosses the switch too).  One bed, server and
bookies serve the whole module; each test heals the network when it ends and uses
ledgers (or a log) of its own.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import netbed
import pytest
import zkutil
from autorecoveryutil import check_replicas, marks, write_ledger
from clusterutil import PASSWORD, TESTS, BookieProcess, BookieProcesses, Writer, child_env, payload
from test_interleavings import check_fragments

import pybk
from pybk.autorecovery.replicas import bookie_holds_entries
from pybk.errors import BookKeeperError
from pybk.log import LogReader, LogWriter, Position
from pybk.log.metadata import live_segments, read_log
from pybk.meta.ledger_metadata import LedgerState
from pybk.meta.underreplication import UnderreplicationManager
from pybk.meta.zookeeper import ZooKeeperMetadataStore
from pybk.settings import ClientSettings
from pybk.testing.waiting import wait_until

pytestmark = [pytest.mark.skipif(netbed.skip_reason() is not None,
                                 reason=str(netbed.skip_reason())),
              pytest.mark.zookeeper, pytest.mark.java, pytest.mark.processes]

BOOKIES = ["b1", "b2", "b3", "b4", "b5"]
#: The namespaces of client processes.
CLIENTS = ["c1", "c2", "c3"]
#: The switch's seed (loss and jitter draws).
SEED = 35
#: A client notices a silent bookie within about this long: its adds time out, or the
#: connection's heartbeats go unanswered; then it changes the ensemble.
CLIENT = ClientSettings(addEntryTimeout=2.0, readTimeout=1.0, zmqHeartbeatIntervalMs=300,
                        zmqHeartbeatTimeoutMs=1_500)
#: Ensemble size of the tests' ledgers (E3/Qw3/Qa2).
ENSEMBLE = 3
#: The bookies' ``lostBookieRecoveryDelay``: the auditor marks a bookie's ledgers once
#: it has been unregistered this long (its session expired: ``zkutil.SESSION_TIMEOUT_MS``).
LOST_BOOKIE_DELAY_S = 2
#: Every bookie's: the delay, and the password its replication worker opens ledgers with.
BOOKIE_OPTIONS = ("--set", f"lostBookieRecoveryDelay={LOST_BOOKIE_DELAY_S}",
                  "--set", f"bookieRecoveryPasswd={PASSWORD.decode()}")


@dataclass
class Cluster:
    bed: netbed.NetBed
    address: str
    bookies: dict[str, BookieProcess]  # by node
    workdir: Path

    def node_of(self, bookie_id: str) -> str:
        """The node of the bookie registered as ``bookie_id`` (``host:port``)."""
        return next(node for node, b in self.bookies.items() if b.bookie_id == bookie_id)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("partitions")
    with netbed.NetBed(["zk", *BOOKIES, *CLIENTS], host="client", seed=SEED) as bed:
        with zkutil.server(host=bed.address("zk"), command_prefix=bed.exec_prefix("zk")) as zk:
            address = zkutil.formatted_cluster(zk)
            group = BookieProcesses(workdir, address)
            try:
                started = {node: group.start(node, *BOOKIE_OPTIONS, host=bed.address(node),
                                             prefix=bed.exec_prefix(node))
                           for node in BOOKIES}
                for bookie in started.values():
                    bookie.wait_serving()
                yield Cluster(bed, address, started, workdir)
            finally:
                group.close()


@pytest.fixture
def nemesis(cluster):
    """The bed's nemesis; the network is healed when the test ends."""
    yield cluster.bed.nemesis
    cluster.bed.nemesis.heal()


def check_ledger(cluster: Cluster, ledger_id: int, acked: list[int]) -> int:
    """The rules, from a fresh client that reaches every node: the ledger is closed (its
    recovery if need be) with well-formed fragments of the cluster's bookies (the
    randomized interleaving test's checker), every acknowledged entry is at or below its
    last entry, and entries 0..last read back with the bytes added.  Then it is deleted,
    so that no later test's lost bookie makes the auditor copy it.  Returns the last
    entry."""
    assert acked == list(range(len(acked))), "acknowledged out of order or not once"
    with pybk.connect(cluster.address, CLIENT) as reader:
        ledger = reader.open_ledger(ledger_id, password=PASSWORD, recovery=True)
        assert ledger.metadata.state is LedgerState.CLOSED
        assert not check_fragments(ledger.metadata, ENSEMBLE,
                                   [b.bookie_id for b in cluster.bookies.values()])
        last = ledger.metadata.last_entry_id
        assert last >= len(acked) - 1, f"entries {acked[last + 1:]} acknowledged, then lost"
        assert [e.data for e in ledger.read_entries(0, last)] == \
            [payload(i) for i in range(last + 1)]
        reader.delete_ledger(ledger_id)
        return last


# -- scenario 2: a writer cut from one bookie, one way then the other ----------------------

def test_a_writer_cut_one_way_from_a_bookie_then_the_other_way_loses_nothing(
        cluster, nemesis):
    bed = cluster.bed
    with pybk.connect(cluster.address, CLIENT) as client:
        ledger = client.create_ledger(ENSEMBLE, 3, 2, password=PASSWORD)
        writer = Writer(ledger)
        try:
            writer.wait_for(100)
            for cut in ("to the bookie", "from the bookie"):
                fragments = len(ledger.metadata.fragments)
                victim = cluster.node_of(ledger.metadata.fragments[-1].ensemble[0])
                link = ("client", victim) if cut == "to the bookie" else (victim, "client")
                nemesis.one_way(*link)
                # Qa=2 of the two others acknowledge meanwhile; the silent one is replaced.
                wait_until(lambda before=fragments: len(ledger.metadata.fragments) > before,
                           f"an ensemble change away from {victim}, cut {cut}")
                assert cluster.bookies[victim].bookie_id not in \
                    ledger.metadata.fragments[-1].ensemble
                assert bed.frames(*link)[1] > 0
                writer.wait_for(100)
                nemesis.heal()
                writer.wait_for(100)
        finally:
            acked = writer.stop()
        ledger.close()
    assert check_ledger(cluster, ledger.id, acked) == len(acked) - 1


# -- scenario 1: a writer cut from ZooKeeper only, its ledger recovered by another client ----

#: The session timeout of the writer cut from ZooKeeper: its session expires soon after.
WRITER_SESSION_MS = zkutil.SHORT_SESSION_TIMEOUT_MS


def _acks(path: Path) -> list[bytes]:
    try:
        return path.read_bytes().split(b"\n")[:-1]  # a line without its newline: unfinished
    except FileNotFoundError:
        return []


def test_a_writer_cut_from_zookeeper_only_gets_nothing_acknowledged_past_the_recovery(
        cluster, nemesis, tmp_path):
    acks, output = tmp_path / "acks", tmp_path / "writer.log"
    with open(output, "wb") as out:
        writer = cluster.bed.popen(
            "c2", [sys.executable, os.path.join(TESTS, "cluster_writer.py"), "--zk",
                   cluster.address, "--acks", str(acks), "--zk-timeout-ms",
                   str(WRITER_SESSION_MS)],
            env=child_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        wait_until(lambda: len(_acks(acks)) > 100 or writer.poll() is not None,
                   "100 entries acknowledged to the writer")
        assert writer.poll() is None, output.read_text()
        nemesis.partition("c2", ["zk"])
        # Its session expires while its adds go on: the bookies do not need ZooKeeper.
        cut_at = len(_acks(acks))
        time.sleep(3 * WRITER_SESSION_MS / 1000)
        wait_until(lambda: len(_acks(acks)) > cut_at + 100 or writer.poll() is not None,
                   "100 entries acknowledged to the writer cut from ZooKeeper")
        assert writer.poll() is None, output.read_text()
        ledger_id = int(_acks(acks)[0].split()[1])
        with pybk.connect(cluster.address, CLIENT) as client:
            recovered = client.open_ledger(ledger_id, password=PASSWORD, recovery=True)
            last = recovered.metadata.last_entry_id
        # The fenced writer fails its next add and exits (status 2, cluster_writer.py).
        assert writer.wait(60) == 2, output.read_text()
    finally:
        if writer.poll() is None:
            writer.send_signal(signal.SIGKILL)
            writer.wait(60)
    acked = [int(line) for line in _acks(acks)[1:]]
    assert max(acked) <= last, f"entries {[i for i in acked if i > last]} acknowledged " \
        f"after the recovery closed the ledger at {last}:\n{output.read_text()}"
    assert check_ledger(cluster, ledger_id, acked) == last


# -- scenario 3: ZooKeeper cut from everyone for longer than the sessions ----------------------

def registered(address: str) -> set[str]:
    """The bookies registered as writable, read by a fresh store."""
    with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
        return set(store.bookies(read_only=False))


def wait_every_bookie_registered(cluster: Cluster) -> None:
    """Wait until every bookie is registered (again: one whose session expired while it
    was cut off registers in a new one soon after healing).  A fresh client cannot reach
    a bookie that is not registered (nor can BookKeeper's): it has no endpoint for it."""
    every_bookie = {b.bookie_id for b in cluster.bookies.values()}
    wait_until(lambda: registered(cluster.address) == every_bookie,
               "every bookie registered again", interval_s=0.2)  # a session each


def test_zookeeper_cut_from_everyone_past_the_sessions_then_healed(cluster, nemesis):
    with pybk.connect(cluster.address, CLIENT, zk_settings=zkutil.settings()) as client:
        ledger = client.create_ledger(ENSEMBLE, 3, 2, password=PASSWORD)
        writer = Writer(ledger)
        try:
            writer.wait_for(100)
            nemesis.partition("zk")
            # ZooKeeper expires every session (bookies' and the client's) meanwhile; the
            # bookies refuse adds once they have heard nothing for their zkTimeout.
            time.sleep(2 * zkutil.SESSION_TIMEOUT_MS / 1000)
            nemesis.heal()
            wait_every_bookie_registered(cluster)
            # The writer goes on, or has failed cleanly (a pybk error, every add answered).
            if not writer.errors:
                writer.wait_for(100)
        finally:
            acked = writer.stop(failures_ok=True)
        assert all(isinstance(e, BookKeeperError) for e in writer.errors), writer.errors
        if not writer.errors:
            ledger.close()
        # The cluster takes new ledgers again.
        with client.create_ledger(ENSEMBLE, 3, 2, password=PASSWORD) as fresh:
            for entry_id in range(10):
                fresh.add_entry(payload(entry_id))
    assert all(b.process.poll() is None for b in cluster.bookies.values())
    check_ledger(cluster, ledger.id, acked)
    print(f"scenario 3: {len(acked)} acknowledged in {len(ledger.metadata.fragments)} "
          f"fragments, writer errors: {writer.errors[:1]}")


# -- scenario 4: a bookie cut off past lostBookieRecoveryDelay, then back ---------------------

def test_a_bookie_cut_off_past_the_recovery_delay_is_replaced_and_harmless_back(
        cluster, nemesis):
    entries = 50
    with pybk.connect(cluster.address, CLIENT, zk_settings=zkutil.settings()) as client, \
            ZooKeeperMetadataStore(cluster.address, zkutil.settings()) as store:
        manager = UnderreplicationManager(store)
        ledgers = [write_ledger(client, ENSEMBLE, 3, entries) for _ in range(3)]
        lost = ledgers[0].metadata.fragments[0].ensemble[0]
        nemesis.partition(cluster.node_of(lost))

        def replaced() -> bool:
            return not marks(manager) and not any(
                bookie_holds_entries(client.ledger_manager.read(ledger.id).metadata, lost)
                for ledger in ledgers)

        # Its session expires, the delay passes, the auditor marks, workers copy.
        wait_until(replaced, f"the ledgers of {lost} re-replicated", interval_s=0.2)
        nemesis.heal()
        wait_until(lambda: lost in registered(cluster.address), f"{lost} registered again",
                   interval_s=0.2)
        # Its stale copies change nothing: every copy the metadata names is whole.
        for ledger in ledgers:
            metadata = client.ledger_manager.read(ledger.id).metadata
            assert lost not in {b for f in metadata.fragments for b in f.ensemble}
            check_replicas(client, metadata, entries - 1)
    for ledger in ledgers:
        assert check_ledger(cluster, ledger.id, list(range(entries))) == entries - 1


# -- scenario 5: delay with jitter and loss on every link under mixed work -------------------

#: How long the mixed work runs on the degraded network: a minute, long enough for
#: sessions, timeouts and retransmissions to meet the delays and losses many times.
DEGRADED_S = 60.0


def test_delay_and_loss_on_every_link_are_absorbed(cluster, nemesis):
    bed = cluster.bed
    pairs = [(a, b) for a in bed.nodes for b in bed.nodes if a != b]
    dropped_before = sum(bed.frames(*pair)[1] for pair in pairs)
    latencies: list[float] = []
    with pybk.connect(cluster.address, CLIENT, zk_settings=zkutil.settings()) as client:
        nemesis.delay(50, jitter_ms=20)
        nemesis.loss(0.02)
        ledger = client.create_ledger(ENSEMBLE, 3, 2, password=PASSWORD)
        writer = Writer(ledger)
        started = time.monotonic()
        churned = 0
        try:
            # Beside the writer: ledgers created, written one add at a time (timed),
            # closed, read back by a fresh handle and deleted.
            while time.monotonic() - started < DEGRADED_S:
                with client.create_ledger(ENSEMBLE, 3, 2, password=PASSWORD) as small:
                    for entry_id in range(10):
                        sent = time.monotonic()
                        small.add_entry(payload(entry_id))
                        latencies.append(time.monotonic() - sent)
                reread = client.open_ledger(small.id, password=PASSWORD, recovery=False)
                assert [e.data for e in reread.read_entries(0, 9)] == \
                    [payload(i) for i in range(10)]
                client.delete_ledger(small.id)
                churned += 1
        finally:
            acked = writer.stop()
        elapsed = time.monotonic() - started
        changes = len(ledger.metadata.fragments) - 1
        ledger.close()
    nemesis.heal()
    check_ledger(cluster, ledger.id, acked)
    dropped = sum(bed.frames(*pair)[1] for pair in pairs) - dropped_before
    latencies.sort()
    print(f"scenario 5 (50 ms ± 20 ms, 2% loss, {elapsed:.0f} s): writer "
          f"{len(acked) / elapsed:.0f} adds/s (64 in flight), {changes} ensemble changes; "
          f"{churned} ledgers created, written, read, deleted; one add at a time: p50 "
          f"{latencies[len(latencies) // 2] * 1000:.0f} ms, p99 "
          f"{latencies[len(latencies) * 99 // 100] * 1000:.0f} ms; {dropped} frames dropped")


# -- scenario 6: a random nemesis over log writers contending for one log ---------------------

#: The schedules run: seed 1 in CI; ``PYBK_PARTITION_SEEDS=N`` runs seeds 1..N.
SEEDS = range(1, int(os.environ.get("PYBK_PARTITION_SEEDS", "1")) + 1)
#: Faults of one schedule, each held 0.5 to 2.5 s.
SCHEDULE_STEPS = 8


def random_schedule(rng: random.Random, nodes: list[str]) -> list[tuple[str, tuple, float]]:
    """``(nemesis method, arguments, seconds held)`` steps; a step may heal first (half
    the time), so faults also pile up."""
    steps = []
    for _ in range(SCHEDULE_STEPS):
        if rng.random() < 0.5:
            steps.append(("heal", (), 0.0))
        kind = rng.choice(["partition", "partition_some", "one_way", "halves", "delay",
                           "loss"])
        node = rng.choice(nodes)
        others = [n for n in nodes if n != node]
        if kind == "partition":
            step = ("partition", (node,))
        elif kind == "partition_some":
            step = ("partition", (node, rng.sample(others, rng.randint(1, 3))))
        elif kind == "one_way":
            step = ("one_way", (node, rng.choice(others)))
        elif kind == "halves":
            shuffled = rng.sample(nodes, len(nodes))
            cut = rng.randint(1, len(nodes) - 1)
            step = ("halves", (shuffled[:cut], shuffled[cut:]))
        elif kind == "delay":
            step = ("delay", (rng.choice([20, 50, 100]), rng.choice([0, 10, 30])))
        else:
            step = ("loss", (rng.choice([0.01, 0.05, 0.1]),))
        steps.append((*step, rng.uniform(0.5, 2.5)))
    return steps


class Tailer:
    """A reader tailing the log from the test process while the nemesis runs (its
    traffic crosses the switch).  When a read fails (a bookie or ZooKeeper cut off) it
    opens a new reader at the position it reached.  ``read`` is every record it was
    given, which must all stay true: a reader reads only what a quorum acknowledged."""

    def __init__(self, address: str, log_name: str) -> None:
        self.read: list[tuple[Position, bytes]] = []
        self.failures = 0
        self._address, self._log_name = address, log_name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tailer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        position = None
        with pybk.connect(self._address, CLIENT, zk_settings=zkutil.settings()) as client:
            while not self._stop.is_set():
                try:
                    reader = LogReader(client, self._log_name, position)
                    while not self._stop.is_set():
                        record = reader.read_next(timeout=0.2)
                        if record is not None:
                            self.read.append((record[0], bytes(record[1])))
                        position = reader.position
                except BookKeeperError:
                    self.failures += 1
                    self._stop.wait(0.2)

    def stop(self) -> list[tuple[Position, bytes]]:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the tailer did not stop"
        return self.read


def closed_segments(client: pybk.BookKeeper, log_name: str) -> dict[int, tuple[int, int]]:
    """Each closed segment ledger of the log, by id: its last entry id and length."""
    metadata = read_log(client.metadata, log_name).metadata
    closed = {}
    for segment in live_segments(client.metadata, metadata):
        ledger = client.open_ledger(segment.ledger_id, recovery=False).metadata
        if ledger.state is LedgerState.CLOSED:
            closed[segment.ledger_id] = (ledger.last_entry_id, ledger.length)
    return closed


def check_tailed(tailed: list[tuple[Position, bytes]],
                 records: list[tuple[Position, bytes]]) -> list[str]:
    """What a tailing reader read (``tailed``) against the log read after the run: in
    position order, none twice, each the record the log holds at its position."""
    problems = []
    positions = [position for position, _ in tailed]
    if positions != sorted(set(positions)):
        problems.append("the tailer read records out of order or twice")
    read_at = dict(records)
    changed = [(p, v) for p, v in tailed if read_at.get(p) != v]
    if changed:
        problems.append(f"the tailer read records the log does not hold: {changed[:5]}")
    return problems


def _log_acks(path: Path) -> dict[Position, int]:
    acked = {}
    for line in _acks(path):
        position, number = line.split()
        acked[Position.parse(position.decode())] = int(number)
    return acked


def check_log(records: list[tuple[Position, bytes]],
              acked: dict[str, dict[Position, int]]) -> list[str]:
    """The log rules over what a reader read after the run (``records``) and what each
    writer was acknowledged: every acknowledged record is read once, at its position;
    nothing read but the acknowledged, except after the last acknowledged record of a
    segment (what a recovery keeps of a fenced writer's last appends); each writer's
    records in the order appended, none twice."""
    problems = []
    read_at = {position: value for position, value in records}
    for name, positions in acked.items():
        for position, number in positions.items():
            expected = b"%s %d" % (name.encode(), number)
            if read_at.get(position) != expected:
                problems.append(f"{name}'s record {number}, acknowledged at {position}, "
                                f"reads as {read_at.get(position)!r}")
    values = [value for _, value in records]
    if len(set(values)) != len(values):
        problems.append("a record is read twice")
    last_acked: dict[int, Position] = {}
    for positions in acked.values():
        for position in positions:
            last_acked[position.segment] = max(last_acked.get(position.segment, position),
                                               position)
    acked_at = {p for positions in acked.values() for p in positions}
    unacked_before = [p for p, _ in records
                      if p not in acked_at and p.segment in last_acked
                      and p < last_acked[p.segment]]
    if unacked_before:
        problems.append(f"records never acknowledged read before acknowledged ones of "
                        f"their segments: {unacked_before[:5]}")
    for name in acked:
        numbers = [int(value.split()[1]) for value in values
                   if value.split()[0] == name.encode()]
        if numbers != sorted(numbers):
            problems.append(f"{name}'s records are read out of the order appended")
    return problems


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_nemesis_over_contending_log_writers_keeps_the_log_rules(
        cluster, nemesis, tmp_path, seed):
    rng = random.Random(seed)
    targets = ["zk", *BOOKIES, *CLIENTS]
    schedule = random_schedule(rng, targets)
    print(f"scenario 6, seed {seed}: {schedule}")
    log_name = f"contended-{seed}"
    writers = {}
    tailer: Tailer | None = None
    try:
        for number, node in enumerate(CLIENTS):
            with open(tmp_path / f"{node}.log", "wb") as out:
                writers[node] = cluster.bed.popen(node, [
                    sys.executable, os.path.join(TESTS, "contending_log_writer.py"),
                    "--zk", cluster.address, "--log", log_name, "--name", node,
                    "--acks", str(tmp_path / f"{node}.acks"), "--seed", str(seed * 10 + number)],
                    env=child_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        total = lambda: sum(len(_acks(tmp_path / f"{node}.acks")) for node in CLIENTS)  # noqa: E731
        wait_until(lambda: total() > 100, "the writers write")
        tailer = Tailer(cluster.address, log_name)
        for method, arguments, held_s in schedule:
            getattr(nemesis, method)(*arguments)
            time.sleep(held_s)
        nemesis.heal()
        healed_at = total()
        wait_every_bookie_registered(cluster)
        with pybk.connect(cluster.address, CLIENT, zk_settings=zkutil.settings()) as client:
            closed_at_healing = closed_segments(client, log_name)
        # They go on: someone holds the log and is acknowledged records again.
        wait_until(lambda: total() > healed_at + 100, "records acknowledged after healing")
        wait_until(lambda: len(tailer.read) > healed_at, "the tailer reading after healing")
        for node, process in writers.items():
            assert process.poll() is None, (tmp_path / f"{node}.log").read_text()
    finally:
        tailed = tailer.stop() if tailer is not None else []
        for process in writers.values():
            process.send_signal(signal.SIGKILL)
            process.wait(60)
    acked = {node: _log_acks(tmp_path / f"{node}.acks") for node in CLIENTS}
    wait_every_bookie_registered(cluster)
    with pybk.connect(cluster.address, CLIENT, zk_settings=zkutil.settings()) as client:
        LogWriter.open(client, log_name).close()  # fences and recovers the last segments
        records = list(LogReader(client, log_name).read())
        closed_at_end = closed_segments(client, log_name)
    changed = {ledger_id: (at_healing, closed_at_end.get(ledger_id))
               for ledger_id, at_healing in closed_at_healing.items()
               if closed_at_end.get(ledger_id) != at_healing}
    assert not changed, f"closed segments changed after healing: {changed}"
    reopenings = sum((tmp_path / f"{node}.log").read_text().count("append failed")
                     for node in CLIENTS)
    print(f"scenario 6, seed {seed}: {len(records)} records read, "
          f"{sum(map(len, acked.values()))} acknowledged, {reopenings} writers fenced or "
          f"failed and reopened; the tailer read {len(tailed)} (reopened "
          f"{tailer.failures if tailer else 0} times); {len(closed_at_healing)} segments "
          "closed at healing, unchanged since")
    problems = check_log(records, acked) + check_tailed(tailed, records)
    assert not problems, problems


def test_the_log_checker_catches_broken_histories():
    def at(segment: int, entry: int) -> Position:
        return Position(segment, entry, 0)

    acked = {"c1": {at(1, 0): 0, at(1, 1): 1}, "c2": {at(2, 0): 0}}
    good = [(at(1, 0), b"c1 0"), (at(1, 1), b"c1 1"), (at(1, 2), b"c1 2"),
            (at(2, 0), b"c2 0")]
    assert check_log(good, acked) == []
    assert "reads as None" in check_log([r for r in good if r[0] != at(1, 1)], acked)[0]
    assert check_log([*good, (at(3, 0), b"c2 0")], acked) == ["a record is read twice"]
    assert "before acknowledged" in check_log(
        [(at(1, 0), b"c1 0"), (at(1, 1), b"c1 5"), (at(1, 2), b"c1 1"),
         (at(2, 0), b"c2 0")], {"c1": {at(1, 0): 0, at(1, 2): 1}, "c2": {at(2, 0): 0}})[0]
    assert check_log([(at(1, 0), b"c1 1"), (at(1, 1), b"c1 0"), (at(2, 0), b"c2 0")],
                     {"c1": {at(1, 0): 1, at(1, 1): 0}, "c2": {at(2, 0): 0}}) == \
        ["c1's records are read out of the order appended"]
    assert check_tailed(good[:2], good) == []
    assert check_tailed([good[1], good[0]], good) == \
        ["the tailer read records out of order or twice"]
    assert "does not hold" in check_tailed([(at(1, 0), b"c1 0"), (at(1, 1), b"c2 9")],
                                           good)[0]
