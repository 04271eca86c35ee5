"""Races of the ledger writer and of recovery (the protocol contract of issue 13), made
deterministic: in-process bookies, and bookie replies and metadata writes held and then
released in the order a test needs (``Faults.hold``, ``FaultyMetadataStore.hold_writes``).

Covered: a close racing an ensemble change (both orders of their metadata writes); a slow
metadata store during a change; late bookie errors after the writer's close and after a
change; completion order; NotEnoughBookies during a change; recovery's close when someone
changed the fragments; quarantine of replaced bookies.

Every test runs twice: with the bookies in process, and with each bookie behind a ZeroMQ
server with CURVE on both sides (clientutil's ``"zmq-curve"`` transport; the fault hooks
hold and release the replies that come over the encrypted connections)."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable

import pytest
from clientutil import CURVE, FAST, Cluster, clusters

from pybk.errors import (
    BookKeeperError,
    ClientClosed,
    LedgerClosed,
    LedgerRecoveryError,
    NotEnoughBookies,
)
from pybk.meta.ledger_metadata import Fragment, LedgerState
from pybk.meta.ledgers import LedgerManager, Versioned
from pybk.testing import WAIT_S, wait_until

pytestmark = pytest.mark.timeout(60)
PASSWORD = b"race"


def payload(i: int) -> bytes:
    return f"entry-{i}-".encode() * 8


class Background:
    """``fn()`` on a thread of its own; its result or exception is kept."""

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            self.error = e

    def join(self, timeout: float = WAIT_S) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), \
            f"{self.thread.name} has not returned after {timeout} s"


class Completions:
    """Records add callbacks in the order they are delivered, and how many ran at once."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int | None, BaseException | None]] = []
        self.running = 0
        self.running_max = 0
        self._changed = threading.Condition()

    def callback(self, index: int, pause_s: float = 0.0):
        def done(entry_id: int | None, error: BaseException | None) -> None:
            with self._changed:
                self.running += 1
                self.running_max = max(self.running_max, self.running)
                self.calls.append((index, entry_id, error))
            if pause_s:
                time.sleep(pause_s)  # widens the window in which a second call would overlap
            with self._changed:
                self.running -= 1
                self._changed.notify_all()
        return done

    def wait_for(self, count: int, timeout: float = WAIT_S) -> None:
        with self._changed:
            if not self._changed.wait_for(
                    lambda: len(self.calls) >= count and self.running == 0, timeout):
                raise AssertionError(f"{len(self.calls)} of {count} add callbacks arrived "
                                     f"within {timeout} s: {self.calls}")


@pytest.fixture
def started():
    """Threads a test starts; joined after the clusters closed (which releases every held
    reply and write, so nothing stays blocked)."""
    threads: list[Background] = []
    yield threads
    for background in threads:
        background.thread.join(WAIT_S)


@pytest.fixture(params=("inprocess", CURVE))
def cluster_of(request, tmp_path, started):
    with clusters(tmp_path, request.param) as make:
        yield make


@pytest.fixture
def in_background(started):
    def run(fn: Callable[[], Any], name: str) -> Background:
        background = Background(fn, name)
        started.append(background)
        return background
    return run


def stored_metadata(cluster: Cluster, ledger_id: int) -> Versioned:
    """The ledger's metadata as the store holds it (not as any handle believes it is)."""
    return LedgerManager(cluster.store).read(ledger_id)


def outcome(future, timeout: float = WAIT_S) -> BaseException | None:
    """The future's exception, or None if it succeeded; fails the test if it hangs."""
    try:
        return future.exception(timeout=timeout)
    except TimeoutError:
        raise AssertionError(f"an add was neither acknowledged nor failed within "
                             f"{timeout} s") from None


# -- 1. close racing an ensemble change ---------------------------------------------------

def start_close_during_ensemble_change(cluster_of, in_background):
    """Entry 0 acknowledged; one bookie fails entry 1, whose ensemble change's metadata
    write is held; close() then decides (after 2 x addEntryTimeout) and its own CAS is
    held too.  Returns (cluster, handle, entry 1's future, change write, close write,
    close thread, version at creation)."""
    cluster = cluster_of(4)
    bk = cluster.client(dataclasses.replace(FAST, addEntryTimeout=0.5))
    lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
    ensemble = lh.metadata.fragments[0].ensemble
    assert lh.add_entry(payload(0)) == 0
    created = stored_metadata(cluster, lh.id)
    failing = cluster.faults[ensemble[1]]
    failing.only_entries = {1}
    failing.fail.add("add")
    cluster.metadata_faults.hold_writes = True
    entry1 = lh.add_entry_async(payload(1))
    (change_write,) = cluster.metadata_faults.wait_held(1, WAIT_S)
    closing = in_background(lh.close, "close")
    held = cluster.metadata_faults.wait_held(2, WAIT_S)
    assert held[0] is change_write and len(held) == 2, \
        f"expected the change's write then the close's, held: {held}"
    close_write = held[1]
    # What the handle writes after a lost CAS reaches the store directly from here on.
    cluster.metadata_faults.hold_writes = False
    return cluster, lh, entry1, change_write, close_write, closing, created


def check_closed_at_entry_0(cluster: Cluster, lh, entry1, closing) -> Versioned:
    """What must hold once both writes landed, whichever order they landed in."""
    closing.join()
    assert closing.error is None, f"close() raised {closing.error!r}"
    error = outcome(entry1)
    assert error is not None, \
        "entry 1 was acknowledged although close() decided with the LAC at 0"
    assert isinstance(error, LedgerClosed), \
        f"entry 1, pending when close() decided, failed with {error!r}, not LedgerClosed"
    assert lh.last_add_confirmed == 0, f"writer's LAC is {lh.last_add_confirmed}, not 0"
    final = stored_metadata(cluster, lh.id)
    assert final.metadata.state is LedgerState.CLOSED, f"metadata is {final.metadata.state}"
    assert final.metadata.last_entry_id == 0, \
        f"closed at entry {final.metadata.last_entry_id}, not at the LAC 0"
    successes = [0] + ([entry1.result()] if error is None else [])
    assert all(s <= final.metadata.last_entry_id for s in successes), successes
    return final


def test_close_racing_an_ensemble_change_whose_write_lands_first(cluster_of, in_background):
    """The change's metadata write lands first: close()'s CAS loses, finds the ledger
    OPEN, and writes CLOSED at the LAC over that record, keeping the change's fragments.
    Entry 1, pending when close() decided, fails; the LAC stays 0."""
    cluster, lh, entry1, change_write, close_write, closing, created = \
        start_close_during_ensemble_change(cluster_of, in_background)
    cluster.metadata_faults.release(change_write)
    changed = stored_metadata(cluster, lh.id)
    assert changed.version != created.version and \
        changed.metadata.state is LedgerState.OPEN, \
        f"the ensemble change's write did not land: {changed}"
    cluster.metadata_faults.release(close_write)
    final = check_closed_at_entry_0(cluster, lh, entry1, closing)
    assert final.metadata.fragments == changed.metadata.fragments, \
        (f"close() did not keep the fragments of the record it closed over: "
         f"{final.metadata.fragments} != {changed.metadata.fragments}")


def test_close_racing_an_ensemble_change_whose_write_lands_second(cluster_of, in_background):
    """close()'s CAS lands first: the change's CAS loses and the CLOSED record is never
    rewritten (same version, same fragments)."""
    cluster, lh, entry1, change_write, close_write, closing, created = \
        start_close_during_ensemble_change(cluster_of, in_background)
    cluster.metadata_faults.release(close_write)
    closed = stored_metadata(cluster, lh.id)
    assert closed.metadata.state is LedgerState.CLOSED, \
        f"close()'s write did not close the ledger: {closed}"
    assert closed.metadata.fragments == created.metadata.fragments
    cluster.metadata_faults.release(change_write)
    check_closed_at_entry_0(cluster, lh, entry1, closing)
    time.sleep(0.5)  # room for anything the losing change would still write
    after = stored_metadata(cluster, lh.id)
    assert after.version == closed.version, \
        f"the CLOSED record was rewritten after close(): {closed} -> {after}"
    assert after.metadata == closed.metadata


# -- 2. a slow metadata store during an ensemble change --------------------------------

@pytest.mark.parametrize("adds_during_change", [0, 2])
def test_a_slow_metadata_write_during_a_change_evicts_no_healthy_bookie(
        cluster_of, adds_during_change):
    """The change's metadata write takes 2.5 s (over addEntryTimeout = 1 s): the two
    healthy bookies, which answered (adds made during the change are sent to them at
    once), stay; only the failed bookie is replaced, in one change."""
    cluster = cluster_of(4)
    bk = cluster.client(dataclasses.replace(FAST, addEntryTimeout=1.0))
    lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
    ensemble = lh.metadata.fragments[0].ensemble
    (spare,) = set(cluster.bookie_ids) - set(ensemble)
    assert lh.add_entry(payload(0)) == 0
    failing = ensemble[0]
    cluster.faults[failing].fail.add("add")
    cluster.metadata_faults.hold_writes = True
    futures = [lh.add_entry_async(payload(1))]
    cluster.metadata_faults.wait_held(1, WAIT_S)
    futures += [lh.add_entry_async(payload(i)) for i in range(2, 2 + adds_during_change)]
    time.sleep(2.5)
    cluster.metadata_faults.release_all()
    ids = list(range(1, 2 + adds_during_change))
    errors = [outcome(f) for f in futures]
    assert errors == [None] * len(ids), f"adds {ids} failed: {errors}"
    assert [f.result() for f in futures] == ids
    fragments = stored_metadata(cluster, lh.id).metadata.fragments
    healthy = [b for b in ensemble if b != failing]
    assert set(healthy) <= set(fragments[-1].ensemble), \
        f"healthy bookies {healthy} were evicted: fragments {fragments}"
    assert fragments == (Fragment(0, ensemble), Fragment(1, tuple(
        spare if b == failing else b for b in ensemble))), \
        f"expected one change replacing only {failing} by {spare}: {fragments}"
    for entry_id in ids:
        assert lh.read_entry(entry_id).data == payload(entry_id)


# -- 3. late errors after the writer's own close --------------------------------------

def test_a_late_error_after_the_writers_close_does_not_rewrite_the_closed_metadata(
        cluster_of):
    """A bookie's answer to entry 0 arrives as an error after close() wrote CLOSED at 0:
    no ensemble change starts; the record keeps its version and fragments."""
    cluster = cluster_of(4)
    lh = cluster.client().create_ledger(3, 3, 2, password=PASSWORD)
    late = cluster.faults[lh.metadata.fragments[0].ensemble[2]]
    late.only_entries = {0}
    late.hold.add("add")
    assert lh.add_entry(payload(0)) == 0  # the other two bookies acknowledged it
    late.wait_held(1, WAIT_S)
    lh.close()
    closed = stored_metadata(cluster, lh.id)
    assert closed.metadata.state is LedgerState.CLOSED and \
        closed.metadata.last_entry_id == 0, f"close() did not close at 0: {closed}"
    assert late.release(error=BookKeeperError("the bookie failed the add late")) == 1
    time.sleep(0.5)  # room for an ensemble change to (wrongly) run
    after = stored_metadata(cluster, lh.id)
    assert after.version == closed.version, \
        f"the CLOSED record was rewritten after close(): {closed} -> {after}"
    assert after.metadata.fragments == closed.metadata.fragments
    assert after.metadata.state is LedgerState.CLOSED and after.metadata.last_entry_id == 0


# -- 4. completions in entry-id order -------------------------------------------------

def test_completions_come_in_entry_order_across_an_ensemble_change(cluster_of):
    """Entry 3 waits for a held answer, entry 4's failure starts a change whose write is
    held, entry 5 follows.  Nothing completes while the change is in flight (also after
    entry 3 has its quorum); once it lands the callbacks run for 3, 4, 5 in that order."""
    cluster = cluster_of(4)
    lh = cluster.client().create_ledger(3, 2, 2, password=PASSWORD)
    for i in range(3):
        assert lh.add_entry(payload(i)) == i
    ws3, ws4 = lh.metadata.write_set(3), lh.metadata.write_set(4)
    slow = cluster.faults[ws3[0]]
    slow.only_entries = {3}
    slow.hold.add("add")
    (failing_id,) = [b for b in ws4 if b not in ws3]
    failing = cluster.faults[failing_id]
    failing.only_entries = {4}
    failing.fail.add("add")
    cluster.metadata_faults.hold_writes = True
    calls = Completions()
    for i in (3, 4, 5):  # entry 3's callback is slow: the others must wait for it
        lh.add_entry_then(payload(i), calls.callback(i, pause_s=0.2 if i == 3 else 0.0))
    slow.wait_held(1, WAIT_S)
    cluster.metadata_faults.wait_held(1, WAIT_S)
    assert slow.release() == 1
    time.sleep(0.2)  # entry 3 now has Qa answers: it must still wait for the change
    assert calls.calls == [], \
        f"adds completed while an ensemble change was in flight: {calls.calls}"
    cluster.metadata_faults.release_all()
    calls.wait_for(3)
    assert calls.calls == [(3, 3, None), (4, 4, None), (5, 5, None)], \
        f"callbacks (add, entry id, error) in the order delivered: {calls.calls}"
    assert calls.running_max == 1, f"{calls.running_max} callbacks ran at once"
    fragments = stored_metadata(cluster, lh.id).metadata.fragments
    assert fragments[-1].first_entry_id == 3 and failing_id not in fragments[-1].ensemble, \
        f"the new fragment should start at LAC + 1 = 3 without {failing_id}: {fragments}"


@pytest.mark.parametrize("quorums, delayed", [((3, 2, 2), 1), ((3, 3, 1), 0)],
                         ids=["Qa2-one-bookie-on-timer-threads", "Qa1-three-journal-threads"])
def test_completions_from_several_answering_threads_are_in_order_one_at_a_time(
        cluster_of, quorums, delayed):
    """Bookies answer on different threads (each bookie's journal thread; a delayed
    bookie on timer threads), and with Qa = 1 whichever bookie is first completes an
    add: the callbacks of many adds still come strictly in entry-id order and never
    overlap."""
    cluster = cluster_of(3)
    lh = cluster.client().create_ledger(*quorums, password=PASSWORD)
    for bookie_id in lh.metadata.fragments[0].ensemble[:delayed]:
        cluster.faults[bookie_id].delay_s = 0.002
    calls = Completions()
    count = 300
    for i in range(count):
        lh.add_entry_then(payload(i), calls.callback(i, pause_s=0.0005))
    calls.wait_for(count, timeout=30)
    failed = [c for c in calls.calls if c[2] is not None]
    assert not failed, f"adds failed: {failed[:5]}"
    delivered = [entry_id for _, entry_id, _ in calls.calls]
    out_of_order = [(a, b) for a, b in zip(delivered, delivered[1:]) if b != a + 1]
    assert delivered == list(range(count)), \
        f"callbacks out of entry-id order, e.g. {out_of_order[:5]}"
    assert [index for index, _, _ in calls.calls] == delivered
    assert calls.running_max == 1, f"{calls.running_max} callbacks ran at once"


# -- 5a. NotEnoughBookies during an ensemble change -----------------------------------

def lose_a_bookie_with_no_replacement(cluster: Cluster):
    """E3/Qw2/Qa2 on all three bookies, entries 0-4 acknowledged, then one bookie becomes
    unreachable and entry 5 fails with NotEnoughBookies.  Returns (handle, its error)."""
    lh = cluster.client().create_ledger(3, 2, 2, password=PASSWORD)
    for i in range(5):
        assert lh.add_entry(payload(i)) == i
    cluster.faults[lh.metadata.write_set(5)[0]].unreachable = True
    error = outcome(lh.add_entry_async(payload(5)))
    assert isinstance(error, NotEnoughBookies), \
        f"the add pending during the failed change got {error!r}, not NotEnoughBookies"
    return lh, error


def test_not_enough_bookies_during_a_change_closes_the_handle(cluster_of, in_background):
    """The pending add fails with NotEnoughBookies; a later add is refused at once with
    LedgerClosed naming the cause; close() returns; the metadata is CLOSED at the LAC and
    a recovering reader reads every acknowledged entry."""
    cluster = cluster_of(3)
    lh, cause = lose_a_bookie_with_no_replacement(cluster)
    try:
        future = lh.add_entry_async(payload(6))
        at_once = future.done()  # failed before the call returned
        later = outcome(future)
    except BookKeeperError as e:  # refused by the call itself
        at_once, later = True, e
    assert isinstance(later, LedgerClosed), f"a later add got {later!r}, not LedgerClosed"
    assert at_once, "the later add was sent or queued instead of being refused at once"
    text = str(later)
    assert isinstance(later.__cause__, NotEnoughBookies) or "NotEnoughBookies" in text \
        or "enough" in text.lower() or str(cause) in text, \
        f"LedgerClosed does not name its cause (NotEnoughBookies: {cause}): {text!r}"
    closing = in_background(lh.close, "close")
    closing.join()
    assert closing.error is None, f"close() raised {closing.error!r}"
    assert lh.last_add_confirmed == 4
    final = stored_metadata(cluster, lh.id).metadata
    assert final.state is LedgerState.CLOSED and final.last_entry_id == 4, \
        f"expected CLOSED at the LAC 4: {final}"
    reader = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=True)
    assert reader.metadata.last_entry_id == 4
    assert [e.data for e in reader.read_entries(0, 4)] == [payload(i) for i in range(5)]


def test_not_enough_bookies_during_a_change_closes_the_metadata_in_the_background(
        cluster_of, in_background):
    """Without anyone calling close(), the handle closes the metadata at the LAC itself;
    a close() afterwards returns."""
    cluster = cluster_of(3)
    lh, _cause = lose_a_bookie_with_no_replacement(cluster)
    wait_until(lambda: stored_metadata(cluster, lh.id).metadata.state is LedgerState.CLOSED,
               "the handle closing the metadata in the background")
    assert stored_metadata(cluster, lh.id).metadata.last_entry_id == 4
    closing = in_background(lh.close, "close")
    closing.join()
    assert closing.error is None, f"close() raised {closing.error!r}"


# -- 5b. a late error from a bookie already replaced ----------------------------------

def test_a_late_error_from_a_replaced_bookie_starts_no_change(cluster_of):
    """Bookie X's answer to entry 0 is held; X then fails entry 1 and is replaced.  When
    X's held answer arrives as an error, X is no longer in the ensemble: nothing changes."""
    cluster = cluster_of(5)
    lh = cluster.client().create_ledger(3, 3, 2, password=PASSWORD)
    x = lh.metadata.fragments[0].ensemble[1]
    fx = cluster.faults[x]
    fx.only_entries = {0}
    fx.hold.add("add")
    assert lh.add_entry(payload(0)) == 0
    fx.wait_held(1, WAIT_S)
    fx.hold.clear()
    fx.only_entries = {1}
    fx.fail.add("add")
    assert lh.add_entry(payload(1)) == 1
    changed = stored_metadata(cluster, lh.id)
    assert x not in changed.metadata.fragments[-1].ensemble, \
        f"{x} failed entry 1 but was not replaced: {changed.metadata.fragments}"
    fx.fail.clear()
    assert fx.release(error=BookKeeperError("the bookie failed the add late")) == 1
    time.sleep(0.5)  # room for an ensemble change to (wrongly) run
    after = stored_metadata(cluster, lh.id)
    assert after.version == changed.version, \
        f"a late error of replaced {x} changed the metadata: {changed} -> {after}"
    assert len(after.metadata.fragments) == len(changed.metadata.fragments)
    assert lh.add_entry(payload(2)) == 2
    assert stored_metadata(cluster, lh.id).version == changed.version


# -- 5c. recovery's close when the fragments changed meanwhile ------------------------

def test_recovery_fails_when_someone_else_changed_the_fragments(cluster_of, in_background):
    """The recoverer's IN_RECOVERY write lands; its CLOSED write is held while the
    fragments are changed directly in the store.  Its CAS loses, it re-reads IN_RECOVERY
    with fragments it did not start from: LedgerRecoveryError, and the record keeps the
    other writer's fragments (the recoverer writes nothing more)."""
    cluster = cluster_of(4)
    lh = cluster.client().create_ledger(3, 2, 2, password=PASSWORD)
    for i in range(5):
        assert lh.add_entry(payload(i)) == i
    ensemble = lh.metadata.fragments[0].ensemble
    (spare,) = set(cluster.bookie_ids) - set(ensemble)
    store = LedgerManager(cluster.store)
    recoverer = cluster.client()
    cluster.metadata_faults.hold_writes = True
    opening = in_background(
        lambda: recoverer.open_ledger(lh.id, password=PASSWORD, recovery=True), "recover")
    (to_recovery,) = cluster.metadata_faults.wait_held(1, WAIT_S)
    cluster.metadata_faults.release(to_recovery)
    current = store.read(lh.id)
    assert current.metadata.state is LedgerState.IN_RECOVERY, \
        f"the recoverer's first write was not IN_RECOVERY: {current}"
    (to_closed,) = cluster.metadata_faults.wait_held(1, WAIT_S)
    other = dataclasses.replace(current.metadata, fragments=current.metadata.fragments + (
        Fragment(5, tuple(spare if b == ensemble[0] else b for b in ensemble)),))
    other_version = store.update(other, current.version)
    cluster.metadata_faults.hold_writes = False
    cluster.metadata_faults.release(to_closed)
    opening.join()
    assert isinstance(opening.error, LedgerRecoveryError), \
        (f"recovery over changed fragments gave {opening.error!r} "
         f"(result {opening.result!r}), not LedgerRecoveryError")
    final = store.read(lh.id)
    assert final.metadata.fragments == other.fragments, \
        f"the other writer's fragments were lost: {final.metadata.fragments}"
    assert final.version == other_version, \
        f"the recoverer wrote after losing its CAS: {final}"


# -- 5d. quarantine -------------------------------------------------------------------

def replace_a_failing_bookie(cluster: Cluster, lh, entry_id: int) -> str:
    """The first bookie of ``entry_id``'s write set fails it and is replaced; then it
    works again.  Returns its id."""
    x = lh.metadata.write_set(entry_id)[0]
    cluster.faults[x].fail.add("add")
    assert lh.add_entry(payload(entry_id)) == entry_id
    ensemble = stored_metadata(cluster, lh.id).metadata.fragments[-1].ensemble
    assert x not in ensemble, f"{x} failed an add but is still in {ensemble}"
    cluster.faults[x].fail.clear()
    return x


def test_a_replaced_bookie_is_not_chosen_again_while_others_are_writable(cluster_of):
    """X fails and is replaced, then works again; when Y fails, Y's replacement is the
    other spare, not X (X outscores it in placement: it was in the first ensemble)."""
    cluster = cluster_of(5)
    lh = cluster.client(dataclasses.replace(FAST, addEntryTimeout=0.5)).create_ledger(
        3, 2, 2, password=PASSWORD)
    assert lh.add_entry(payload(0)) == 0
    x = replace_a_failing_bookie(cluster, lh, 1)
    y = stored_metadata(cluster, lh.id).metadata.write_set(2)[0]
    cluster.faults[y].fail.add("add")
    assert lh.add_entry(payload(2)) == 2
    final = stored_metadata(cluster, lh.id).metadata
    assert y not in final.fragments[-1].ensemble
    assert x not in final.fragments[-1].ensemble, \
        f"quarantined {x} replaced {y} although another bookie was writable: {final.fragments}"
    assert [e.data for e in lh.read_entries(0, 2)] == [payload(i) for i in range(3)]


def test_a_replaced_bookie_is_chosen_when_it_is_the_only_candidate(cluster_of):
    """With four bookies, after X was replaced only X is left outside the ensemble: when
    Y fails, X replaces it (no NotEnoughBookies)."""
    cluster = cluster_of(4)
    lh = cluster.client(dataclasses.replace(FAST, addEntryTimeout=0.5)).create_ledger(
        3, 2, 2, password=PASSWORD)
    assert lh.add_entry(payload(0)) == 0
    x = replace_a_failing_bookie(cluster, lh, 1)
    y = stored_metadata(cluster, lh.id).metadata.write_set(2)[0]
    cluster.faults[y].fail.add("add")
    error = outcome(lh.add_entry_async(payload(2)))
    assert error is None, f"entry 2 failed with {error!r} although {x} could replace {y}"
    final = stored_metadata(cluster, lh.id).metadata.fragments[-1].ensemble
    assert x in final and y not in final, f"expected {x} to replace {y}: {final}"


def test_new_ledgers_avoid_a_quarantined_bookie(cluster_of):
    """After X was replaced, the same client's new ledgers are placed on the four other
    bookies (enough for E=3)."""
    cluster = cluster_of(5)
    bk = cluster.client(dataclasses.replace(FAST, addEntryTimeout=0.5))
    lh = bk.create_ledger(3, 2, 2, password=PASSWORD)
    assert lh.add_entry(payload(0)) == 0
    x = replace_a_failing_bookie(cluster, lh, 1)
    ensembles = [bk.create_ledger(3, 2, 2, password=PASSWORD).metadata.fragments[0].ensemble
                 for _ in range(6)]
    assert not [e for e in ensembles if x in e], \
        f"new ledgers were placed on quarantined {x}: {ensembles}"


def test_a_ledger_of_a_closed_client_refuses_adds_with_client_closed(cluster_of):
    """As BookKeeper's handles do: adds to a ledger whose client was closed fail at once
    with ClientClosed, not on some later transport error."""
    cluster = cluster_of(3)
    bk = cluster.client()
    lh = bk.create_ledger(3, 2, 2, password=b"pw")
    assert lh.add_entry(b"x") == 0
    bk.close()
    with pytest.raises(ClientClosed, match="client is closed"):
        lh.add_entry(b"y")
    assert lh.last_add_confirmed == 0
