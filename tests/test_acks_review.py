"""Acknowledgements as watermarks, attacked: an entry acknowledged by Qa bookies of its
write set is confirmed as soon as the answers that make it so are in (also when the LAC
moving lets a bookie's answers waiting ahead of its watermark count), never before (a
model of every bookie's answers, in random orders with duplicates and answers for ids
confirmed already, against the handle's LAC after every reply), and add_entries calls
waiting for the throttle's permits do not split them between themselves."""

from __future__ import annotations

import dataclasses
import random
import threading
import time

import pytest
from clientutil import FAST, clusters

from pybk.errors import BookKeeperError, TooManyRequests
from pybk.testing import WAIT_S, wait_until

pytestmark = pytest.mark.timeout(120)
PASSWORD = b"secret"


@pytest.fixture
def cluster(tmp_path):
    with clusters(tmp_path, "inprocess") as make:
        yield make(5)


def payload(i: int) -> bytes:
    return b"entry-%d-" % i * 4


def test_answers_waiting_ahead_count_once_the_lac_passes_the_missing_one(cluster):
    """E = Qw = 3, Qa = 2.  Bookie A's answer for entry 1 is held (its answer for 2 comes
    and waits ahead of its watermark); C's answers for 1 and 2 are held; B answers all.
    Releasing C's answer for 1 confirms 1 (B, C) and lifts A's watermark over 2: entry 2
    then has A's and B's acknowledgements and must be confirmed at once, not after
    another reply or A/C timing out (addEntryTimeout is a minute here)."""
    bk = cluster.client(dataclasses.replace(FAST, addEntryTimeout=60.0))
    lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
    a, _b, c = lh.metadata.fragments[0].ensemble
    cluster.faults[a].hold.add("add")
    cluster.faults[a].only_entries = {1}
    cluster.faults[c].hold.add("add")
    cluster.faults[c].only_entries = {1, 2}
    futures = [lh.add_entry_async(payload(i)) for i in range(3)]
    cluster.faults[a].wait_held(1)
    cluster.faults[c].wait_held(2)
    assert futures[0].result(timeout=WAIT_S) == 0
    wait_until(lambda: lh._ahead.get(a) == {2}, "A's answer for 2 waits ahead")
    assert lh.last_add_confirmed == 0
    cluster.faults[c].wait_answered()
    cluster.faults[c].release(entries={1})
    assert futures[1].result(timeout=WAIT_S) == 1
    assert futures[2].result(timeout=WAIT_S) == 2  # A and B acknowledged it
    assert lh.metadata.fragments == lh.metadata.fragments[:1]  # no ensemble change
    cluster.faults[a].release()
    cluster.faults[c].release()
    lh.close()


QUORUMS = [(3, 3, 2), (3, 3, 3), (3, 3, 1), (3, 2, 2), (3, 2, 1), (4, 3, 2), (4, 2, 2),
           (5, 3, 2), (5, 2, 1), (4, 4, 2), (5, 4, 3), (2, 2, 1)]


def _reference_lac(lac: int, last: int, write_set, acked: dict[str, set[int]],
                   qa: int) -> int:
    """The LAC the watermarks promise: entry by entry from ``lac``, the next one is
    confirmed when Qa bookies of its write set acknowledged every entry of their write
    sets above the LAC up to it."""
    while lac < last:
        entry_id = lac + 1
        count = 0
        for bookie_id in write_set(entry_id):
            if all(x in acked[bookie_id] for x in range(lac + 1, entry_id + 1)
                   if bookie_id in write_set(x)):
                count += 1
        if count < qa:
            return lac
        lac = entry_id
    return lac


def _answers_held(cluster, seed: int, adv: bool):
    """A new ledger (ids given by the caller if ``adv``) with the seed's quorums, whose
    bookies' add answers are all held: the model tests give the handle its answers."""
    ensemble, write, ack = QUORUMS[seed % len(QUORUMS)]
    bk = cluster.client(dataclasses.replace(FAST, addEntryTimeout=60.0))
    for faults in cluster.faults.values():
        faults.hold.add("add")
    create = bk.create_ledger_adv if adv else bk.create_ledger
    return create(ensemble, write, ack, password=PASSWORD)


@pytest.mark.parametrize("seed", range(24))
def test_watermarks_against_a_model_of_every_answer(cluster, seed):
    """Every bookie's answers held; the test then gives the handle answers itself (as
    its transport would: several per reply, in any order, with duplicates and answers
    for ids confirmed already) and checks after each reply that every confirmed entry
    has Qa acknowledgements from its write set, and that the LAC is where a model of
    the watermarks puts it; once every answer is in, every entry is confirmed."""
    rng = random.Random(seed)
    lh = _answers_held(cluster, seed, adv=False)
    metadata = lh.metadata
    ack = metadata.ack_quorum_size
    count = rng.randint(1, 40)
    futures = [lh.add_entry_async(payload(i)) for i in range(count)]
    answers = [(b, e) for e in range(count) for b in metadata.write_set(e)]
    rng.shuffle(answers)
    # Bias towards order per bookie, as a transport mostly gives it.
    if rng.random() < 0.5:
        answers.sort(key=lambda be: (be[1] + rng.randint(0, 3)))
    acked: dict[str, set[int]] = {b: set() for b in metadata.fragments[0].ensemble}
    given = 0
    while given < len(answers):
        bookie_id = answers[given][0]
        reply = []
        while given < len(answers) and answers[given][0] == bookie_id \
                and len(reply) < rng.randint(1, 6):
            reply.append(answers[given][1])
            given += 1
        if reply and rng.random() < 0.3:
            reply.append(rng.choice(reply))  # a duplicate
        if acked[bookie_id] and rng.random() < 0.2:
            reply.append(rng.choice(sorted(acked[bookie_id])))  # answered before
        rng.shuffle(reply)
        before = lh.last_add_confirmed
        lh._on_acks(bookie_id, reply, None)
        acked[bookie_id].update(reply)
        after = lh.last_add_confirmed
        assert after >= before
        for entry_id in range(0, after + 1):
            holders = [b for b in metadata.write_set(entry_id) if entry_id in acked[b]]
            assert len(holders) >= ack, (seed, entry_id, holders)
        expected = _reference_lac(-1, count - 1, metadata.write_set, acked, ack)
        assert after == expected, (seed, QUORUMS[seed % len(QUORUMS)], reply, bookie_id,
                                   after, expected)
    assert lh.last_add_confirmed == count - 1
    assert [f.result(timeout=WAIT_S) for f in futures] == list(range(count))
    for faults in cluster.faults.values():
        faults.hold.clear()
    lh.close()


def test_two_calls_waiting_for_permits_do_not_split_them(cluster):
    """throttle = 8, all 8 permits held by adds whose answers are held; two add_entries
    calls of 5 wait for permits.  The held adds are then acknowledged one by one: 8
    permits come back, enough for one call, then its 5 come back for the other.  Taking
    them one at a time, each waiter takes every other permit and both wait for the
    three they lack until addEntryTimeout: one fails with TooManyRequests with nothing
    outstanding."""
    bk = cluster.client(dataclasses.replace(FAST, addEntryTimeout=3.0, throttle=8))
    lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
    for bookie_id in lh.metadata.fragments[0].ensemble:
        cluster.faults[bookie_id].hold.add("add")
        cluster.faults[bookie_id].only_entries = set(range(8))
    held = [lh.add_entry_async(payload(i)) for i in range(8)]
    for bookie_id in lh.metadata.fragments[0].ensemble:
        cluster.faults[bookie_id].wait_held(8)
    outcomes: dict[int, object] = {}

    def call(k: int) -> None:
        try:
            outcomes[k] = lh.add_entries([payload(100 * k + i) for i in range(5)])
        except Exception as e:  # noqa: BLE001 - recorded for the assertion
            outcomes[k] = e

    threads = [threading.Thread(target=call, args=(k,)) for k in (1, 2)]
    for thread in threads:
        thread.start()
        time.sleep(0.2)  # both waiting for permits
    for entry_id in range(8):
        for bookie_id in lh.metadata.fragments[0].ensemble:
            cluster.faults[bookie_id].release(entries={entry_id})
        assert held[entry_id].result(timeout=WAIT_S) == entry_id
        time.sleep(0.05)  # the woken waiter takes its permit and waits again
    for thread in threads:
        thread.join(timeout=30)
    assert not any(isinstance(o, TooManyRequests) for o in outcomes.values()), outcomes
    assert sorted(outcomes.values()) == [(8, 12), (13, 17)]
    lh.close()


@pytest.fixture
def seven(tmp_path):
    with clusters(tmp_path, "inprocess") as make:
        yield make(7)


@pytest.mark.parametrize("seed", range(40))
def test_watermarks_across_ensemble_changes_against_a_model(seven, seed):
    """As above, with adds made along the way (one by one and in add_entries calls) and
    ensemble changes: a bookie fails an add (alone, or in a reply that also acknowledges
    other adds), is replaced, and its late answers (also once a later change chose it
    again, at another position) come in with the others.  After every step: each
    confirmed entry has Qa acknowledgements from its write set in the ledger's
    metadata, and the LAC is where the model puts it."""
    from pybk.errors import BookKeeperError

    rng = random.Random(seed)
    ensemble, write, ack = QUORUMS[seed % len(QUORUMS)]
    bk = seven.client(dataclasses.replace(FAST, addEntryTimeout=60.0,
                                          bookieQuarantineTimeSeconds=0.0))
    for faults in seven.faults.values():
        faults.hold.add("add")
    lh = bk.create_ledger(ensemble, write, ack, password=PASSWORD)
    futures: list = []
    sent: dict[str, set[int]] = {b: set() for b in seven.faults}   # adds it owes answers
    fed: dict[str, set[int]] = {b: set() for b in seven.faults}    # answers given so far
    counted: dict[str, set[int]] = {b: set() for b in seven.faults}  # this tenure's
    expected = -1
    changes = 0

    def add(count: int) -> None:
        first = len(futures)
        if count > 1 and rng.random() < 0.5:
            future = lh.add_entries_async([payload(first + i) for i in range(count)])
            futures.extend([future] * count)
        else:
            futures.extend(lh.add_entry_async(payload(first + i)) for i in range(count))
        for entry_id in range(first, first + count):
            for bookie_id in lh.metadata.write_set(entry_id):
                sent[bookie_id].add(entry_id)

    def change(bookie_id: str, reply: list[int]) -> None:
        nonlocal changes
        before = lh.metadata.fragments[-1].ensemble
        if reply:
            errors = [BookKeeperError("injected")] + [None] * (len(reply) - 1)
            lh._on_acks(bookie_id, reply, errors)
            fed[bookie_id].update(reply[1:])
        else:
            lh._on_add_error(bookie_id, BookKeeperError("injected"))
        wait_until(lambda: not lh._changing_ensemble
                   and lh.metadata.fragments[-1].ensemble != before, "the ensemble changed")
        changes += 1
        after = lh.metadata.fragments[-1].ensemble
        counted[bookie_id] = set()  # gone: its answers count for nothing now
        for joined in set(after) - set(before):
            counted[joined] = set()
            for entry_id in range(lh.last_add_confirmed + 1, len(futures)):
                if joined in lh.metadata.write_set(entry_id):
                    sent[joined].add(entry_id)  # re-sent to the replacement
                    fed[joined].discard(entry_id)  # (again, if it served before)

    def check() -> None:
        nonlocal expected
        lac = lh.last_add_confirmed
        metadata = lh.metadata
        for entry_id in range(expected + 1, lac + 1):
            holders = [b for b in metadata.write_set(entry_id) if entry_id in fed[b]]
            assert len(holders) >= ack, (seed, entry_id, holders, metadata.fragments)
        assert lac >= expected
        current = metadata.fragments[-1].ensemble
        expected = _reference_lac(expected, len(futures) - 1, metadata.write_set,
                                  {b: counted[b] if b in current else set()
                                   for b in counted}, ack)
        assert lac == expected, (seed, (ensemble, write, ack), lac, expected)

    add(rng.randint(1, 6))
    for _step in range(rng.randint(10, 60)):
        action = rng.random()
        current = lh.metadata.fragments[-1].ensemble
        if action < 0.2:
            add(rng.randint(1, 6))
        elif action < 0.28 and changes < 3:
            victim = rng.choice(current)
            owed = sorted(sent[victim] - fed[victim])
            change(victim, rng.sample(owed, min(len(owed), rng.randint(0, 3))) if owed
                   and rng.random() < 0.5 else [])
        else:
            candidates = [b for b in sent if sent[b] - fed[b] or (fed[b] and rng.random() < .1)]
            if not candidates:
                add(rng.randint(1, 3))
                continue
            bookie_id = rng.choice(candidates)
            owed = sorted(sent[bookie_id] - fed[bookie_id])
            reply = owed[:rng.randint(1, 6)] if owed else []
            if rng.random() < 0.3 and len(reply) > 1:
                rng.shuffle(reply)
            if fed[bookie_id] and rng.random() < 0.2:
                reply.append(rng.choice(sorted(fed[bookie_id])))
            if not reply:
                continue
            lh._on_acks(bookie_id, reply, None)
            fed[bookie_id].update(reply)
            if bookie_id in lh.metadata.fragments[-1].ensemble:
                counted[bookie_id].update(reply)
        check()
    # Every bookie of the last ensemble answers everything it was sent: all confirmed.
    for bookie_id in lh.metadata.fragments[-1].ensemble:
        owed = sorted(sent[bookie_id] - fed[bookie_id])
        if owed:
            lh._on_acks(bookie_id, owed, None)
            fed[bookie_id].update(owed)
            counted[bookie_id].update(owed)
        check()
    assert lh.last_add_confirmed == len(futures) - 1
    for future in futures:
        future.result(timeout=WAIT_S)
    for faults in seven.faults.values():
        faults.hold.clear()
    lh.close()


@pytest.mark.parametrize("quorums, silent, entries", [
    ((3, 3, 3), "all", None),       # answers nothing
    ((3, 3, 3), "some", {1, 4}),    # answers all but two
    ((4, 2, 2), "all", None),       # striping: a bookie of half the write sets
    ((4, 2, 2), "some", {1, 5}),
    ((4, 3, 3), "some", {5}),
])
def test_a_bookie_that_does_not_answer_times_out_and_is_replaced(seven, quorums, silent,
                                                                   entries):
    """Qa = Qw: a bookie whose answers (all, or those of some entries) never come is
    replaced once addEntryTimeout passed, and every add then succeeds; then its
    replacement stops answering too and is replaced in turn."""
    bk = seven.client(dataclasses.replace(FAST, addEntryTimeout=0.5))
    lh = bk.create_ledger(*quorums, password=PASSWORD)
    first = lh.metadata.fragments[0].ensemble
    victim = first[1]
    seven.faults[victim].drop.add("add")
    seven.faults[victim].only_entries = entries
    futures = [lh.add_entry_async(payload(i)) for i in range(8)]
    assert [f.result(timeout=WAIT_S) for f in futures] == list(range(8))
    assert victim not in lh.metadata.fragments[-1].ensemble
    replacement = next(b for b in lh.metadata.fragments[-1].ensemble if b not in first)
    seven.faults[replacement].drop.add("add")
    futures = [lh.add_entry_async(payload(i)) for i in range(8, 16)]
    assert lh.add_entries([payload(i) for i in range(16, 20)]) == (16, 19)
    assert [f.result(timeout=WAIT_S) for f in futures] == list(range(8, 16))
    assert replacement not in lh.metadata.fragments[-1].ensemble
    lh.close()
    reader = seven.client().open_ledger(lh.id, password=PASSWORD)
    assert [e.data for e in reader.read_entries(0, 19)] == [payload(i) for i in range(20)]


def test_a_call_failing_part_way_tells_what_it_acknowledged(tmp_path):
    """Three bookies, E = Qw = 3, Qa = 2: a call of 6 whose last 3 are answered by one
    bookie only.  The two silent bookies time out and no bookie can replace them: the
    ledger closes at 10, the call fails with ``acknowledged`` 8..10, the single add
    after it fails too; a cancelled call's adds went on; every throttle permit is back,
    once."""
    with clusters(tmp_path, "inprocess") as make:
        cluster = make(3)
        bk = cluster.client(dataclasses.replace(FAST, addEntryTimeout=0.3, throttle=16))
        lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
        ensemble = lh.metadata.fragments[0].ensemble
        cancelled = lh.add_entries_async([payload(i) for i in range(4)])
        cancelled.cancel()  # too late or not: the adds go on
        assert lh.add_entries([payload(i) for i in range(4, 8)]) == (4, 7)
        for bookie_id in ensemble[:2]:
            cluster.faults[bookie_id].drop.add("add")
            cluster.faults[bookie_id].only_entries = {11, 12, 13}
        future = lh.add_entries_async([payload(i) for i in range(8, 14)])
        later = lh.add_entry_async(payload(14))
        with pytest.raises(BookKeeperError) as failed:
            future.result(timeout=WAIT_S)
        assert failed.value.acknowledged == range(8, 11)
        with pytest.raises(BookKeeperError):
            later.result(timeout=WAIT_S)
        assert lh.last_add_confirmed == 10
        assert bk._add_permits._value == 16  # every permit back, once
        lh.close()
        assert lh.metadata.last_entry_id == 10
        reader = cluster.client().open_ledger(lh.id, password=PASSWORD)
        assert reader.last_add_confirmed == 10
        assert [e.data for e in reader.read_entries(0, 10)] == [payload(i) for i in range(11)]


def test_a_deferred_call_failing_part_way_tells_only_what_the_ledger_keeps(cluster):
    """DEFERRED_SYNC, nothing forced: a call of 6 whose entries 3..5 a bookie refuses.
    The handle closes at the durable LAC (-1: BookKeeper's rule), so entries 0..2,
    written on Qa bookies, are not in the ledger: the failed call must not report them
    acknowledged (a log writer would return their records as appended)."""
    from pybk.client.deferred import WriteFlag

    bk = cluster.client(dataclasses.replace(FAST, addEntryTimeout=60.0))
    lh = bk.create_ledger(3, 3, 2, password=PASSWORD, write_flags={WriteFlag.DEFERRED_SYNC})
    victim, slow, _ = lh.metadata.fragments[0].ensemble
    for bookie_id in (victim, slow):
        cluster.faults[bookie_id].hold.add("add")
        cluster.faults[bookie_id].only_entries = {3, 4, 5}
    future = lh.add_entries_async([payload(i) for i in range(6)])
    cluster.faults[victim].wait_held(3)
    wait_until(lambda: lh.last_add_acknowledged == 2, "entry 2 acknowledged")
    cluster.faults[victim].release(BookKeeperError("refused by the test"))
    with pytest.raises(BookKeeperError) as failed:
        future.result(timeout=WAIT_S)
    wait_until(lambda: lh.metadata.last_entry_id is not None, "the ledger closed")
    closed_at = lh.metadata.last_entry_id
    assert closed_at == -1
    acknowledged = failed.value.acknowledged
    assert acknowledged is not None and (not acknowledged or acknowledged[-1] <= closed_at), \
        (acknowledged, closed_at)
    cluster.faults[slow].release()


@pytest.mark.parametrize("quorums", [(3, 3, 2), (4, 2, 2), (5, 3, 1)])
def test_calls_and_single_adds_from_many_threads(cluster, quorums):
    """Four threads add one by one and in calls of up to 20, while one bookie answers
    late: every call gets consecutive ids, the ids of all of them are 0..n-1 once each,
    completions come one at a time in id order, and the ledger holds what each added."""
    bk = cluster.client(dataclasses.replace(FAST, throttle=64))
    lh = bk.create_ledger(*quorums, password=PASSWORD)
    cluster.faults[lh.metadata.fragments[0].ensemble[1]].delay_s = 0.002
    lock = threading.Lock()
    completed: list[tuple[int, int]] = []  # (first, last) in completion order
    data: dict[int, bytes] = {}
    inside = [0]

    def done_for(buffers):
        def done(last, error):
            assert error is None, error
            with lock:
                inside[0] += 1
                assert inside[0] == 1, "completions overlap"
            first = last - len(buffers) + 1
            for i, buffer in enumerate(buffers):
                data[first + i] = buffer
            completed.append((first, last))
            with lock:
                inside[0] -= 1
        return done

    def writer(k: int) -> None:
        rng = random.Random(k)
        for n in range(40):
            count = rng.choice([1, 1, 2, 5, 20])
            buffers = [b"t%d-c%d-%d" % (k, n, i) for i in range(count)]
            if count == 1 and rng.random() < 0.5:
                lh.add_entry_then(buffers[0], done_for(buffers))
            else:
                lh.add_entries_then(buffers, done_for(buffers))

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    wait_until(lambda: lh.pending_adds == 0, "no add pending", 30)
    lh.close()
    last = lh.metadata.last_entry_id
    assert [first for first, _ in completed] == sorted(first for first, _ in completed)
    assert sum(b - a + 1 for a, b in completed) == last + 1 == len(data)
    assert all(completed[i][1] + 1 == completed[i + 1][0] for i in range(len(completed) - 1))
    assert {e.entry_id: e.data for e in lh.read_entries(0, last)} == data


@pytest.mark.parametrize("order", ["recovery first", "change first"])
def test_an_ensemble_change_racing_a_recovery_confirms_nothing_past_the_close(cluster,
                                                                               order):
    """Entries 5..9 are acknowledged by two bookies (Qa) while the third fails them and
    the ensemble change's metadata write is held; a recovery by another client runs
    meanwhile.  Whichever write lands first, the writer confirms no entry the recovered
    ledger does not hold, and a confirmed entry is never past its last entry."""
    bk = cluster.client(dataclasses.replace(FAST, addEntryTimeout=60.0))
    lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
    for i in range(5):
        assert lh.add_entry(payload(i)) == i
    victim = lh.metadata.fragments[0].ensemble[0]
    cluster.metadata_faults.hold_writes = True
    cluster.faults[victim].fail.add("add")
    futures = [lh.add_entry_async(payload(i)) for i in range(5, 10)]
    change = cluster.metadata_faults.wait_held(1)[0]
    time.sleep(0.2)
    assert lh.last_add_confirmed == 4 and not any(f.done() for f in futures)
    outcome: dict[str, object] = {}

    def recover() -> None:
        try:
            outcome["ledger"] = cluster.client().open_ledger(lh.id, password=PASSWORD)
        except Exception as e:  # noqa: BLE001 - recorded for the assertion
            outcome["error"] = e

    if order == "change first":
        cluster.metadata_faults.release(change)
        wait_until(lambda: lh.last_add_confirmed == 9, "entry 9 confirmed")
    recoverer = threading.Thread(target=recover)
    recoverer.start()
    if order == "recovery first":
        in_recovery = next(w for w in cluster.metadata_faults.wait_held(2) if w is not change)
        cluster.metadata_faults.release(in_recovery)
    cluster.metadata_faults.release_all()
    recoverer.join(timeout=30)
    recovered = outcome["ledger"]
    last = recovered.metadata.last_entry_id
    confirmed = [f.result() for f in futures if f.done() and f.exception() is None]
    assert all(entry_id <= last for entry_id in confirmed), (confirmed, last)
    assert lh.last_add_confirmed <= last
    assert [e.data for e in recovered.read_entries(0, last)] == [
        payload(i) for i in range(last + 1)]
    cluster.faults[victim].fail.clear()


@pytest.mark.parametrize("quorums", [(3, 3, 2), (4, 3, 3), (4, 2, 2)])
def test_a_second_failure_during_a_change(seven, quorums):
    """A bookie fails adds and the change's metadata write is held; meanwhile a second
    bookie fails, and adds keep coming.  Once the write lands both are replaced, the
    pending adds are re-sent to the replacements, every add succeeds, and every entry
    is held by Qa bookies (all of Qw here) of its write set in the metadata."""
    bk = seven.client(dataclasses.replace(FAST, addEntryTimeout=60.0))
    lh = bk.create_ledger(*quorums, password=PASSWORD)
    futures = [lh.add_entry_async(payload(i)) for i in range(4)]
    assert [f.result(timeout=WAIT_S) for f in futures] == list(range(4))
    first, second = lh.metadata.fragments[0].ensemble[:2]
    seven.metadata_faults.hold_writes = True
    seven.faults[first].fail.add("add")
    futures += [lh.add_entry_async(payload(i)) for i in range(4, 8)]
    change = seven.metadata_faults.wait_held(1)[0]
    seven.faults[second].fail.add("add")
    futures += [lh.add_entry_async(payload(i)) for i in range(8, 12)]
    assert lh.add_entries_async([payload(i) for i in range(12, 16)]) is not None
    time.sleep(0.2)
    seven.metadata_faults.release(change)
    seven.metadata_faults.release_all()
    assert [f.result(timeout=WAIT_S) for f in futures] == list(range(12))
    wait_until(lambda: lh.last_add_confirmed == 15, "entry 15 confirmed")
    ensemble = lh.metadata.fragments[-1].ensemble
    assert first not in ensemble and second not in ensemble
    for entry_id in range(16):
        holders = set(seven.holders(lh.id, entry_id)) & set(lh.metadata.write_set(entry_id))
        assert len(holders) >= quorums[2], (entry_id, holders, lh.metadata.fragments)
    lh.close()
    for bookie_id in (first, second):
        seven.faults[bookie_id].fail.clear()


@pytest.mark.parametrize("seed", range(16))
def test_caller_given_ids_against_a_model(cluster, seed):
    """create_ledger_adv: ids added in a random order (holes filled later), answers
    given by the test as in the model test above: the LAC stops before the first hole
    and is where the model puts it after every step; completions come in id order."""
    rng = random.Random(seed)
    lh = _answers_held(cluster, seed, adv=True)
    metadata = lh.metadata
    ack = metadata.ack_quorum_size
    count = rng.randint(1, 30)
    ids = list(range(count))
    rng.shuffle(ids)
    order: list[int] = []
    acked: dict[str, set[int]] = {b: set() for b in metadata.fragments[0].ensemble}
    owed: dict[str, list[int]] = {b: [] for b in acked}
    added: set[int] = set()
    expected = -1
    while ids or any(owed.values()):
        if ids and (rng.random() < 0.4 or not any(owed.values())):
            entry_id = ids.pop()
            lh.add_entry_then(entry_id, payload(entry_id),
                              lambda e, error: order.append(e if error is None else -2))
            added.add(entry_id)
            for bookie_id in metadata.write_set(entry_id):
                owed[bookie_id].append(entry_id)
        else:
            bookie_id = rng.choice([b for b in owed if owed[b]])
            rng.shuffle(owed[bookie_id])
            reply = owed[bookie_id][:rng.randint(1, 4)]
            del owed[bookie_id][:len(reply)]
            lh._on_acks(bookie_id, reply, None)
            acked[bookie_id].update(reply)
        last = max(added)
        expected = _reference_lac(expected, last, metadata.write_set, acked, ack)
        assert lh.last_add_confirmed == expected, (seed, lh.last_add_confirmed, expected)
    assert lh.last_add_confirmed == count - 1
    assert order == list(range(count))
    for faults in cluster.faults.values():
        faults.hold.clear()
    lh.close()


def test_calls_of_many_adds_without_blocking_do_not_refuse_each_other(cluster):
    """throttleBlocking off, permits plentiful: calls of many adds from four threads at
    once all go through (none is refused for another taking its permits)."""
    bk = cluster.client(dataclasses.replace(FAST, throttle=4000, throttleBlocking=False))
    lh = bk.create_ledger(3, 2, 2, password=PASSWORD)
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        for n in range(50):
            try:
                lh.add_entries_async([b"%d-%d-%d" % (k, n, i) for i in range(5)])
            except BaseException as e:  # noqa: BLE001 - recorded for the assertion
                errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors[:3]
    wait_until(lambda: lh.last_add_confirmed == 999, "entry 999 confirmed", 30)
    lh.close()
