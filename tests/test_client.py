"""The ledger protocol with several bookies: quorums, striping, ensemble changes, fencing
and recovery (docs/DESIGN.md, "The ledger protocol"), driven by fault hooks.  Every test
runs over each transport: bookies called in-process, bookies served over ZeroMQ on
loopback TCP, and ``pybk bookie`` processes (a pool shared by the module's tests, its
metadata on ZooKeeper)."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from clientutil import FAST, PROCESSES, TRANSPORTS, BookiePool, clusters

from pybk.errors import (
    DigestMismatch,
    EntryTooLarge,
    InvalidConfiguration,
    InvalidLedgerMetadata,
    LedgerClosed,
    LedgerFenced,
    NoSuchEntry,
    NoSuchLedger,
    NotEnoughBookies,
    ReadOnlyLedger,
    TooManyRequests,
    Unauthorized,
)
from pybk.meta.ledger_metadata import LedgerState
from pybk.storage import make_entry
from pybk.testing import WAIT_S, wait_until

pytestmark = pytest.mark.timeout(120)
PASSWORD = b"secret"


@pytest.fixture(scope="module")
def bookie_pool(tmp_path_factory, zookeeper):
    pool = BookiePool(tmp_path_factory.mktemp("pool"), zookeeper, 5)
    yield pool
    pool.close()


@pytest.fixture(params=(*TRANSPORTS, PROCESSES))
def cluster_of(tmp_path, request):
    # Only when a test of this transport runs (the pool's processes take a while).
    pool = request.getfixturevalue("bookie_pool") if request.param == PROCESSES else None
    with clusters(tmp_path, request.param, pool) as make:
        yield make


def payload(i: int) -> bytes:
    return f"entry-{i}-".encode() * 8


def test_write_sets_follow_the_protocol_table(cluster_of):
    cluster = cluster_of(4)
    bk = cluster.client()
    lh = bk.create_ledger(ensemble=4, write_quorum=3, ack_quorum=3, password=PASSWORD)
    ensemble = lh.metadata.fragments[0].ensemble
    for i in range(6):
        assert lh.add_entry(payload(i)) == i
    b1, b2, b3, b4 = ensemble
    expected = [(b1, b2, b3), (b2, b3, b4), (b3, b4, b1), (b4, b1, b2), (b1, b2, b3),
                (b2, b3, b4)]
    for entry_id, write_set in enumerate(expected):
        assert lh.metadata.write_set(entry_id) == write_set
        assert sorted(cluster.holders(lh.id, entry_id)) == sorted(write_set)


def test_add_read_close_and_reopen(cluster_of):
    cluster = cluster_of(3)
    bk = cluster.client()
    with bk.create_ledger(3, 2, 2, password=PASSWORD, custom_metadata={"app": b"x"}) as lh:
        futures = [lh.add_entry_async(payload(i)) for i in range(200)]
        assert [f.result(timeout=30) for f in futures] == list(range(200))
        assert lh.last_add_confirmed == 199
        assert [e.data for e in lh.read_entries(0, 199)] == [payload(i) for i in range(200)]
    reader = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    assert reader.metadata.state is LedgerState.CLOSED
    assert reader.metadata.last_entry_id == 199
    assert reader.metadata.custom_metadata == {"app": b"x"}
    assert [e.entry_id for e in reader.read_entries(190, 199)] == list(range(190, 200))
    with pytest.raises(ReadOnlyLedger):
        reader.add_entry(b"no")
    assert lh.id in bk.list_ledgers()


def test_wrong_password_and_invalid_quorums_are_refused(cluster_of):
    cluster = cluster_of(3)
    bk = cluster.client()
    lh = bk.create_ledger(3, 2, 2, password=PASSWORD)
    lh.add_entry(b"x")
    with pytest.raises(Unauthorized):
        bk.open_ledger(lh.id, password=b"wrong")
    for e, qw, qa in [(2, 3, 2), (3, 2, 3), (3, 2, 0)]:
        with pytest.raises(InvalidLedgerMetadata):
            bk.create_ledger(e, qw, qa, password=PASSWORD)
    with pytest.raises(NotEnoughBookies):
        bk.create_ledger(4, 2, 2, password=PASSWORD)


def test_recovery_after_the_writer_dies_keeps_every_acknowledged_entry(cluster_of):
    cluster = cluster_of(5)
    writer = cluster.client()
    lh = writer.create_ledger(4, 3, 2, password=PASSWORD)
    acked = [lh.add_entry(payload(i)) for i in range(50)]
    # The writer dies with adds in flight: some reached one bookie, some none.
    ws = lh.metadata.write_set(50)
    cluster.faults[ws[1]].drop.add("add")
    cluster.faults[ws[2]].drop.add("add")
    in_flight = [lh.add_entry_async(payload(i)) for i in range(50, 55)]
    time.sleep(0.2)
    assert not any(f.done() for f in in_flight)
    cluster.faults[ws[1]].drop.clear()
    cluster.faults[ws[2]].drop.clear()
    recovered = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=True)
    last = recovered.metadata.last_entry_id
    assert recovered.metadata.state is LedgerState.CLOSED
    assert last >= max(acked)
    entries = list(recovered.read_entries(0, last))
    assert [e.data for e in entries[:50]] == [payload(i) for i in range(50)]
    assert [e.data for e in entries[50:]] == [payload(i) for i in range(50, last + 1)]
    # Every recovered entry is now on its whole write set.
    for entry_id in range(last + 1):
        assert sorted(cluster.holders(lh.id, entry_id)) == \
            sorted(recovered.metadata.write_set(entry_id))


def test_the_fenced_writer_can_neither_add_nor_close_differently(cluster_of):
    cluster = cluster_of(3)
    lh = cluster.client().create_ledger(3, 2, 2, password=PASSWORD)
    for i in range(10):
        lh.add_entry(payload(i))
    recovered = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=True)
    assert recovered.metadata.last_entry_id == 9
    with pytest.raises(LedgerFenced):
        lh.add_entry(payload(10))
    with pytest.raises((LedgerFenced, LedgerClosed)):
        lh.add_entry(payload(11))
    lh.close()  # closes at the same last entry: agrees with the recovered metadata
    after = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    assert after.metadata.last_entry_id == 9


def test_a_fenced_writer_with_an_extra_entry_cannot_close_past_recovery(cluster_of):
    cluster = cluster_of(3)
    lh = cluster.client().create_ledger(3, 3, 2, password=PASSWORD)
    for i in range(5):
        lh.add_entry(payload(i))
    recovered = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=True)
    # The old writer believes in one more entry than recovery found.
    lh._lac, lh._confirmed_length = 5, lh._confirmed_length + 10
    with pytest.raises(LedgerClosed):
        lh._close_metadata(5, lh._confirmed_length)
    assert recovered.metadata.last_entry_id == 4


def test_an_entry_on_one_bookie_of_its_write_set_is_recovered_or_absent_for_all(cluster_of):
    cluster = cluster_of(3)
    lh = cluster.client().create_ledger(3, 3, 2, password=PASSWORD)
    for i in range(5):
        lh.add_entry(payload(i))
    ws = lh.metadata.write_set(5)
    cluster.faults[ws[1]].drop.add("add")
    cluster.faults[ws[2]].drop.add("add")
    pending = lh.add_entry_async(payload(5))
    deadline = time.monotonic() + WAIT_S
    while cluster.holders(lh.id, 5) != [ws[0]] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cluster.holders(lh.id, 5) == [ws[0]] and not pending.done()
    cluster.faults[ws[1]].drop.clear()
    cluster.faults[ws[2]].drop.clear()
    first = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=True)
    second = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=True)
    last = first.metadata.last_entry_id
    assert last in (4, 5) and second.metadata.last_entry_id == last
    if last == 5:
        assert sorted(cluster.holders(lh.id, 5)) == sorted(ws)
        assert first.read_entry(5).data == second.read_entry(5).data == payload(5)


def test_faults_reach_the_batched_adds_a_ledger_really_sends(cluster_of):
    """The fault hooks wrap the path a ledger's adds take (the transport's batched
    sender, answers with a status per add): one held add among many in flight holds
    the LAC before it while the others are answered, and its release completes them; one
    failed add among many replaces its bookie, and nothing is lost."""
    cluster = cluster_of(4)
    bk = cluster.client()
    lh = bk.create_ledger(3, 3, 3, password=PASSWORD)
    first = lh.metadata.fragments[0].ensemble[0]
    assert bk.bookie_client(first).ledger_adds(lh.id, b"", lambda *_: None) is not None
    faults = cluster.faults[first]
    faults.hold, faults.only_entries = {"add"}, {20}
    futures = [lh.add_entry_async(payload(i)) for i in range(50)]
    faults.wait_held(1)
    assert [f.result(timeout=30) for f in futures[:20]] == list(range(20))
    assert faults.held() == [("add", 20)] and not futures[20].done()
    assert sorted(cluster.holders(lh.id, 49)) == sorted(lh.metadata.write_set(49))
    faults.hold = set()
    assert faults.release() == 1
    assert [f.result(timeout=30) for f in futures] == list(range(50))

    faults.fail = {"add"}
    faults.only_entries = {75}
    futures = [lh.add_entry_async(payload(i)) for i in range(50, 100)]
    assert [f.result(timeout=30) for f in futures] == list(range(50, 100))
    assert len(lh.metadata.fragments) == 2 and first not in lh.metadata.fragments[1].ensemble
    assert first not in cluster.holders(lh.id, 75)
    assert [e.data for e in lh.read_entries(0, 99)] == [payload(i) for i in range(100)]


def test_concurrent_recoverers_converge_on_one_last_entry(cluster_of):
    cluster = cluster_of(4)
    lh = cluster.client().create_ledger(4, 3, 2, password=PASSWORD)
    for i in range(30):
        lh.add_entry(payload(i))
    lh.add_entry_async(payload(30))
    results: list = []
    errors: list = []

    def recover():
        try:
            results.append(cluster.client().open_ledger(lh.id, password=PASSWORD).metadata)
        except Exception as e:  # noqa: BLE001 - the test reports it
            errors.append(e)

    threads = [threading.Thread(target=recover) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len({m.last_entry_id for m in results}) == 1
    assert results[0].last_entry_id >= 29


def test_a_failing_bookie_causes_an_ensemble_change_and_loses_nothing(cluster_of):
    cluster = cluster_of(4)
    bk = cluster.client()
    lh = bk.create_ledger(3, 2, 2, password=PASSWORD)
    for i in range(20):
        lh.add_entry(payload(i))
    failing = lh.metadata.fragments[0].ensemble[1]
    cluster.faults[failing].unreachable = True
    futures = [lh.add_entry_async(payload(i)) for i in range(20, 60)]
    assert [f.result(timeout=30) for f in futures] == list(range(20, 60))
    fragments = bk.ledger_manager.read(lh.id).metadata.fragments
    assert len(fragments) == 2
    assert fragments[1].first_entry_id == 20
    assert failing not in fragments[1].ensemble
    assert len(set(fragments[1].ensemble)) == 3
    lh.close()
    cluster.faults[failing].unreachable = False
    reader = cluster.client().open_ledger(lh.id, password=PASSWORD)
    assert [e.data for e in reader.read_entries(0, 59)] == [payload(i) for i in range(60)]


def test_no_replacement_left_fails_the_adds(cluster_of):
    cluster = cluster_of(3)
    lh = cluster.client().create_ledger(3, 2, 2, password=PASSWORD)
    lh.add_entry(payload(0))
    cluster.faults[lh.metadata.write_set(1)[0]].unreachable = True
    future = lh.add_entry_async(payload(1))
    with pytest.raises(NotEnoughBookies):
        future.result(timeout=WAIT_S)


def test_a_timed_out_bookie_is_replaced(cluster_of):
    cluster = cluster_of(4)
    lh = cluster.client().create_ledger(3, 3, 3, password=PASSWORD)
    slow = lh.metadata.fragments[0].ensemble[2]
    cluster.faults[slow].drop.add("add")  # no answer at all: addEntryTimeout (2 s) decides
    assert lh.add_entry(payload(0)) == 0
    assert slow not in lh.metadata.fragments[-1].ensemble


def test_a_corrupted_copy_is_skipped_for_a_good_one(cluster_of):
    cluster = cluster_of(3)
    bk = cluster.client()
    lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
    lh.add_entry(payload(0))
    lh.close()

    def second_copy() -> bytes | None:  # Qa answers can come before the third copy lands
        try:
            return cluster.stored_entry(lh.metadata.write_set(0)[1], lh.id, 0)
        except (NoSuchLedger, NoSuchEntry):
            return None
    good = wait_until(second_copy, "the entry stored on its second bookie")
    damaged = good[:-1] + bytes([good[-1] ^ 0xFF])
    first = lh.metadata.write_set(0)[0]
    cluster.put_entry(first, lh.id, 0, damaged, bk.master_key(PASSWORD))
    reader = bk.open_ledger(lh.id, password=PASSWORD)
    assert reader.read_entry(0).data == payload(0)
    for bookie_id in lh.metadata.write_set(0)[1:]:
        cluster.put_entry(bookie_id, lh.id, 0, damaged, bk.master_key(PASSWORD))
    with pytest.raises(DigestMismatch):
        reader.read_entry(0)


def test_reads_move_on_when_a_bookie_does_not_answer(cluster_of):
    cluster = cluster_of(3)
    bk = cluster.client()
    lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
    lh.add_entry(payload(0))
    cluster.faults[lh.metadata.write_set(0)[0]].drop.add("read")
    reader = bk.open_ledger(lh.id, password=PASSWORD, recovery=False)
    assert reader.read_entry(0).data == payload(0)


def test_long_poll_returns_promptly_on_a_new_entry(cluster_of):
    cluster = cluster_of(3)
    lh = cluster.client().create_ledger(3, 2, 2, password=PASSWORD)
    lh.add_entry(payload(0))
    reader = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    wait_until(lambda: reader.read_last_add_confirmed() == 0,
               "the idle writer's explicit LAC reaches the bookies")
    got: list = []
    poll = threading.Thread(target=lambda: got.append(
        reader.read_last_add_confirmed_and_entry(timeout=600)))
    poll.start()
    time.sleep(0.1)
    assert poll.is_alive()  # nothing new yet: it waits
    lh.add_entry(payload(1))
    poll.join(120)  # far less than the poll's timeout, which it must not wait for
    assert not poll.is_alive(), "the long poll waited for its timeout"
    lac, entry = got[0]
    assert lac == 1 and entry.data == payload(1)


def test_reader_without_recovery_does_not_disturb_the_writer(cluster_of):
    cluster = cluster_of(3)
    lh = cluster.client().create_ledger(3, 2, 2, password=PASSWORD)
    for i in range(5):
        lh.add_entry(payload(i))
    reader = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    assert reader.last_add_confirmed >= 3
    lh.add_entry(payload(5))  # still writable
    with pytest.raises(NoSuchEntry):
        list(reader.read_entries(0, 10))


def test_delete_ledger_removes_metadata_and_entries(cluster_of):
    cluster = cluster_of(3)
    bk = cluster.client()
    lh = bk.create_ledger(3, 2, 2, password=PASSWORD)
    lh.add_entry(payload(0))
    lh.close()
    bk.delete_ledger(lh.id)
    assert lh.id not in bk.list_ledgers()
    assert cluster.holders(lh.id, 0) == []
    assert not any(cluster.holds_ledger(b, lh.id) for b in cluster.bookie_ids)


def test_entry_format_is_what_the_bookie_expects(cluster_of):
    cluster = cluster_of(3)
    bk = cluster.client()
    lh = bk.create_ledger(3, 2, 2, password=PASSWORD)
    lh.add_entry(b"abc")
    stored = cluster.stored_entry(lh.metadata.write_set(0)[0], lh.id, 0)
    assert stored[:24] == make_entry(lh.id, 0, -1, b"")[:24]
    assert stored.endswith(b"abc")


def test_an_entry_over_the_maximum_is_refused_at_once_and_the_ledger_goes_on(cluster_of):
    """An entry no bookie would take fails the add call itself with EntryTooLarge: no
    bookie is asked, the ensemble stays, and the ledger keeps taking adds."""
    cluster = cluster_of(3)
    bk = cluster.client(dataclasses.replace(FAST, maxEntrySizeBytes=64 * 1024))
    lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
    ensemble = lh.metadata.fragments[0].ensemble
    assert lh.add_entry(payload(0)) == 0
    with pytest.raises(EntryTooLarge, match="maxEntrySizeBytes=65536"):
        lh.add_entry(bytes(64 * 1024))
    with pytest.raises(EntryTooLarge):
        lh.add_entry_then(bytearray(64 * 1024), lambda entry_id, error: None)
    largest = bytes(64 * 1024 - lh._digest.overhead)
    assert lh.add_entry(largest) == 1
    assert lh.add_entry(payload(2)) == 2
    assert lh.metadata.fragments[-1].ensemble == ensemble
    assert [e.data for e in lh.read_entries(0, 2)] == [payload(0), largest, payload(2)]


def test_the_throttle_bounds_outstanding_adds_and_gives_permits_back(cluster_of):
    """At most ``throttle`` adds of a client are outstanding: with every reply held, the
    next add waits until a reply comes (blocking), or fails at once with TooManyRequests
    (not blocking); answered adds give their permits back."""
    cluster = cluster_of(3)
    settings = dataclasses.replace(FAST, throttle=4, addEntryTimeout=10.0)
    for blocking in (True, False):
        bk = cluster.client(dataclasses.replace(settings, throttleBlocking=blocking))
        lh = bk.create_ledger(3, 3, 3, password=PASSWORD)
        for faults in cluster.faults.values():
            faults.hold = {"add"}
        futures = [lh.add_entry_async(payload(i)) for i in range(4)]
        if blocking:
            fifth: list = []
            waiting = threading.Thread(target=lambda fifth=fifth, lh=lh: fifth.append(
                lh.add_entry_async(payload(4))))
            waiting.start()
            waiting.join(0.3)
            assert waiting.is_alive() and not fifth  # no permit: the caller waits
        else:
            with pytest.raises(TooManyRequests, match="4 adds .* outstanding"):
                lh.add_entry_async(payload(4))
        for faults in cluster.faults.values():
            faults.hold = set()
            faults.release()
        if blocking:
            waiting.join(30)
            futures += fifth
        assert [f.result(timeout=30) for f in futures] == list(range(len(futures)))
        assert lh.add_entry_async(payload(9)).result(timeout=30) == len(futures)
        lh.close()


def test_a_throttled_add_waits_at_most_add_entry_timeout(cluster_of):
    """With no permit coming back, a blocked add fails with TooManyRequests after
    addEntryTimeout (the permits are held here directly: held replies would time out
    and give theirs back at that same moment)."""
    cluster = cluster_of(3)
    bk = cluster.client(dataclasses.replace(FAST, throttle=2, addEntryTimeout=0.3))
    lh = bk.create_ledger(3, 3, 3, password=PASSWORD)
    for _ in range(2):
        assert bk._add_permits.acquire(timeout=1)
    try:
        with pytest.raises(TooManyRequests, match="none finished for 0.3 s"):
            lh.add_entry(payload(0))
    finally:
        bk._add_permits.release(2)
    assert lh.add_entry(payload(0)) == 0


def test_the_throttle_setting_is_checked():
    with pytest.raises(InvalidConfiguration, match="throttle"):
        dataclasses.replace(FAST, throttle=-1)
