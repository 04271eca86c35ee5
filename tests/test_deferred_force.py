"""Which bookies a force counts (:mod:`pybk.client.deferred`): only those that
acknowledged the entries forced and still hold them.  Real bookies served over ZeroMQ; the
fault hooks only hold replies back, so that each answer reaches the writer at a chosen
moment."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import random
import threading

import pytest
from clientutil import FAST, clusters
from crashutil import restore_image, take_image
from test_client import payload
from zmqutil import LOOPBACK, RawDealer

from pybk import WriteFlag
from pybk.errors import BookKeeperError, MalformedMessage, NoSuchLedger
from pybk.meta.ledger_metadata import LedgerState
from pybk.net import BookieServer, wire
from pybk.net.wire import Op, Request
from pybk.settings import ServerSettings
from pybk.storage import Bookie, format_bookie, make_entry
from pybk.testing import WAIT_S, wait_until
from pybk.testing.faultyio import FaultyFileIO, lose_unsynced

pytestmark = pytest.mark.timeout(120)
PASSWORD = b"secret"
KEY = b"k" * 20
MAX_ENTRY_BYTES = 1 << 20
DEFERRED = {WriteFlag.DEFERRED_SYNC}
#: No explicit LAC: it is a durable journal record, which would sync the deferred adds.
QUIET = dataclasses.replace(FAST, explicitLacInterval=0)


def last_stored(bookie: Bookie, ledger_id: int) -> int | None:
    """The highest entry ``bookie`` stored of the ledger; None while it stored none (an
    add Qa other bookies acknowledged may reach it later)."""
    try:
        return bookie.last_entry_id(ledger_id)
    except NoSuchLedger:
        return None


def force_held(cluster, lh, counted: tuple[str, ...], last: str):
    """Force with every FORCE_LEDGER reply held back; deliver those of ``counted`` (the
    bookies answered by then), check the force is still undecided, then deliver
    ``last``'s and return the force's outcome."""
    bookies = (*counted, last)
    for bookie_id in bookies:
        cluster.faults[bookie_id].hold.add("force_ledger")
    forced = lh.force_async()
    for bookie_id in bookies:
        faults = cluster.faults[bookie_id]
        wait_until(lambda faults=faults: ("force_ledger", None) in faults.held(),
                   "the force held")
        faults.wait_answered()
    for bookie_id in counted:
        cluster.faults[bookie_id].release(entries={None})  # the force, not a held add
    assert not forced.done(), "the force was decided before the bookie that holds it"
    cluster.faults[last].release(entries={None})
    return forced.result(timeout=WAIT_S)


def test_a_bookie_that_refused_an_add_does_not_count_for_it_in_a_force(tmp_path):
    """Qw=3, Qa=2: the third bookie turns read-only and refuses entry 5, which the other
    two acknowledge.  It still syncs its journal and answers the force OK, but it holds
    no entry 5: the force waits for the second bookie that does."""
    with clusters(tmp_path, "zmq") as make:
        cluster = make(3)
        bk = cluster.client()
        lh = bk.create_ledger(3, 3, 2, password=PASSWORD, write_flags=DEFERRED)
        first, second, refusing = lh.metadata.fragments[0].ensemble
        for i in range(5):
            lh.add_entry(payload(i))
        assert lh.force() == 4
        # Its refusal comes late (held back), after the writer forced.  (It took the
        # entries before: read-only must not catch one of them still on its way.)
        wait_until(lambda: last_stored(cluster.bookies[refusing], lh.id) == 4,
                   "entry 4 stored on the refusing bookie")
        cluster.faults[refusing].hold.add("add")
        cluster.bookies[refusing].set_read_only("test: refuses entry 5")
        assert lh.add_entry(payload(5)) == 5
        assert force_held(cluster, lh, (first, refusing), second) == 5
        assert lh.last_add_forced == 5
        # The refusal arrives: no ensemble change for DEFERRED_SYNC, the writer closes at
        # the durable LAC, which entry 5 is part of.
        cluster.faults[refusing].release()
        wait_until(lambda: bk.ledger_manager.read(lh.id).metadata.state
                   is LedgerState.CLOSED, "the ledger closed")
        assert bk.ledger_manager.read(lh.id).metadata.last_entry_id == 5
        assert sorted(cluster.holders(lh.id, 5)) == sorted([first, second])


@pytest.mark.parametrize("later", [0, 3], ids=["force-next", "adds-before-force"])
def test_a_bookie_that_lost_acknowledged_adds_in_a_power_cut_does_not_count_for_them(
        tmp_path, later):
    """The third bookie acknowledges entries 5..9 as written, then a power cut takes them
    (they were never synced) and it restarts at the same address while the writer lives,
    which may add ``later`` entries more (the restarted bookie takes them) before it
    forces.  The bookie's answer says it holds fewer entries of the range than it should:
    the force waits for the second bookie."""
    with clusters(tmp_path, "zmq") as make, contextlib.ExitStack() as stack:
        cluster = make(3)
        cut = "B3"
        address = cluster.servers[cut].address
        cluster.stop_bookie(cut)
        # B3 again, on files whose unsynced writes are tracked, never checkpointed (a
        # checkpoint would sync the deferred adds into its entry logs).
        settings = ServerSettings(journalDirectory=str(tmp_path / "cut" / "journal"),
                                  ledgerDirectories=(str(tmp_path / "cut" / "ledgers"),),
                                  journalPreAllocSizeMB=1, flushInterval=3_600_000)
        format_bookie(settings)
        io = FaultyFileIO()
        bookie = stack.enter_context(Bookie(settings, io=io))
        server = stack.enter_context(BookieServer(bookie, address))

        # The force's replies are held by the test (force_held): a timeout of its own
        # must not end it first on a loaded machine.
        bk = cluster.client(dataclasses.replace(QUIET, addEntryTimeout=30.0))
        lh = bk.create_ledger(3, 3, 2, password=PASSWORD, write_flags=DEFERRED)
        assert cut in lh.metadata.fragments[0].ensemble
        for i in range(5):
            lh.add_entry(payload(i))
        assert lh.force() == 4
        # The force returned once Qa bookies synced; the cut one's adds and force may
        # still be on their way: once it holds entries 0..4, the cut bookie makes them
        # durable itself before the cut (its other files may keep unsynced writes: no
        # checkpoint runs).
        wait_until(lambda: bookie.force(lh.id, 0, 4).result(30) == 5,
                   "the cut bookie holds entries 0..4, durable")
        # Entries 5..9 acknowledged by the bookie cut among the first two (the second
        # bookie's answers held back till then), so none is in flight when it goes.
        first, second = (b for b in lh.metadata.fragments[0].ensemble if b != cut)
        slow = cluster.faults[second]
        slow.only_entries, slow.hold = set(range(5, 10)), {"add"}
        for i in range(5, 10):
            lh.add_entry(payload(i))
        slow.wait_answered()
        slow.release()
        slow.only_entries, slow.hold = None, set()

        # The power cut: the files as they are now, less their unsynced writes.
        server.close()
        image = take_image(settings, tmp_path / "image")
        journal, ledgers = (os.path.realpath(d) for d in (settings.journalDirectory,
                                                          settings.ledgerDirectories[0]))
        lost = {path.replace(journal, str(image / "0")).replace(ledgers, str(image / "1")):
                writes for path, writes in io.unsynced.items()}
        assert lose_unsynced(lost, "drop", random.Random(1)) > 0
        bookie.close()
        restore_image(image, settings)
        restarted = stack.enter_context(Bookie(settings))
        assert restarted.last_entry_id(lh.id) == 4, "the power cut took entries 5..9"
        stack.enter_context(BookieServer(restarted, address))

        def reconnected() -> bool:
            try:
                bk.bookie_client(cut).read_lac(lh.id).result(timeout=WAIT_S)
            except BookKeeperError:
                return False
            return True

        wait_until(reconnected, "the client reconnected")
        last = 9 + later
        for i in range(10, last + 1):
            lh.add_entry(payload(i))
        # Qa answers can come before a third copy lands (as in the tests above): the
        # force is about the cut bookie's lost adds, so every copy is in first (the cut
        # bookie's last one is the last of the adds after its restart, if any).
        for holder in (cluster.bookies[first], cluster.bookies[second],
                       *([restarted] if later else [])):
            wait_until(lambda holder=holder: last_stored(holder, lh.id) == last,
                       f"entry {last} stored on each bookie")
        assert force_held(cluster, lh, (first, cut), second) == last
        lh.close()
        assert lh.metadata.last_entry_id == last
        assert [e.data for e in lh.read_entries(0, last)] == \
            [payload(i) for i in range(last + 1)]


def test_a_force_fails_when_the_bookies_that_synced_did_not_all_store_the_entry(tmp_path):
    """Qa=2 of three: one refused entry 5 and another does not answer the force: the
    force fails rather than count the bookie that refused."""
    with clusters(tmp_path, "zmq") as make:
        cluster = make(3)
        lh = cluster.client().create_ledger(3, 3, 2, password=PASSWORD,
                                            write_flags=DEFERRED)
        first, second, refusing = lh.metadata.fragments[0].ensemble
        lh.add_entry(payload(0))
        wait_until(lambda: last_stored(cluster.bookies[refusing], lh.id) == 0,
                   "entry 0 stored on the refusing bookie")
        cluster.faults[refusing].hold.add("add")
        cluster.bookies[refusing].set_read_only("test: refuses entry 1")
        assert lh.add_entry(payload(1)) == 1
        cluster.faults[second].fail.add("force_ledger")
        with pytest.raises(BookKeeperError, match="force failed"):
            lh.force()
        assert lh.last_add_forced == -1


def test_a_force_answers_how_many_entries_it_holds_only_to_a_client_that_asks(bookie):
    """With the flag HELD the reply's LAC is how many entries of the range asked about
    the bookie holds; a client of before the flag sends none (and no range) and gets the
    reply it knows (LAC 0)."""
    for entry_id in (0, 1, 3):
        bookie.add_entry(7, entry_id, make_entry(7, entry_id, -1, b"x"), KEY)
    with BookieServer(bookie, LOOPBACK) as server, RawDealer(server.address) as dealer:
        for request_id, flags, first, last, held in ((1, wire.HELD, 1, 4, 2),
                                                     (2, wire.HELD, 2, 1, 0),
                                                     (3, 0, 0, 0, 0)):
            dealer.send(wire.encode_request(Request(Op.FORCE_LEDGER, request_id, 7, first,
                                                    last, flags=flags), MAX_ENTRY_BYTES))
            frames = dealer.receive(timeout_s=10)
            assert frames is not None, "no answer to the force"
            reply = wire.decode_reply(frames, MAX_ENTRY_BYTES)
            assert (reply.request_id, reply.status, reply.lac) == (request_id, 0, held)
    for first, last, flags in ((1, 4, 0), (5, 3, wire.HELD)):  # no HELD, a reversed range
        with pytest.raises(MalformedMessage):
            wire.encode_request(Request(Op.FORCE_LEDGER, 4, 7, first, last, flags=flags),
                                MAX_ENTRY_BYTES)


def test_a_force_that_completes_after_the_close_was_decided_does_not_pass_the_close(
        tmp_path):
    """The application forces (entries 0..4) while two of the three bookies are slow to
    answer forces; meanwhile the ledger is closed, and the close's own force runs out of
    time, so the close lands at the durable LAC of then (-1).  The slow bookies' answers
    to the application's force come after: that force must not report entries durable
    that the closed ledger does not have (nor move the durable LAC past the close)."""
    with clusters(tmp_path, "zmq") as make:
        cluster = make(3)
        bk = cluster.client(dataclasses.replace(QUIET, addEntryTimeout=1.0))
        lh = bk.create_ledger(3, 3, 2, password=PASSWORD, write_flags=DEFERRED)
        fast, *slow = lh.metadata.fragments[0].ensemble
        for i in range(5):
            lh.add_entry(payload(i))
        for bookie_id in slow:
            cluster.faults[bookie_id].hold.add("force_ledger")
        try:
            forced = lh.force_async()
            for bookie_id in slow:
                cluster.faults[bookie_id].wait_held(1)
            lh.close()  # its force is held too, and times out (2 x addEntryTimeout)
            closed = bk.ledger_manager.read(lh.id).metadata
            assert closed.state is LedgerState.CLOSED
        finally:
            for bookie_id in slow:
                cluster.faults[bookie_id].hold.clear()
                cluster.faults[bookie_id].wait_answered()
                cluster.faults[bookie_id].release()
        try:
            durable = forced.result(timeout=WAIT_S)
        except BookKeeperError:
            durable = -1
        assert durable <= closed.last_entry_id, (
            f"the force reported entries up to {durable} durable, the ledger closed at "
            f"{closed.last_entry_id}")
        assert lh.last_add_forced <= closed.last_entry_id


def test_a_force_of_a_range_far_past_what_is_held_costs_per_entry_held(bookie):
    """Any client may send FORCE_LEDGER with HELD and any range (the request carries no
    key).  On a ledger holding entries 0 and 10**12 (a writer's ids are its own: a bookie
    takes any), the count of 0..2**63-1 must cost about the entries held, not a lookup
    per id up to the highest one on the server's thread, which would stop the bookie
    answering anyone for days.  The lookups are counted, and cut short past 10,000."""
    high = 10 ** 12
    for entry_id in (0, high):
        bookie.add_entry(7, entry_id, make_entry(7, entry_id, -1, b"x"), KEY)
    bookie.checkpoint()  # in the index now, as a ledger's older entries are
    index = bookie._index
    location = index.location
    lookups = 0

    def counted(ledger_id: int, entry_id: int):
        nonlocal lookups
        lookups += 1
        if lookups > 10_000:
            raise RuntimeError("over 10,000 index lookups to count 2 entries")
        return location(ledger_id, entry_id)

    index.location = counted
    try:
        with BookieServer(bookie, LOOPBACK) as server, \
                RawDealer(server.address) as dealer:
            dealer.send(wire.encode_request(
                Request(Op.FORCE_LEDGER, 1, 7, 0, 2 ** 63 - 1, flags=wire.HELD),
                MAX_ENTRY_BYTES))
            frames = dealer.receive(timeout_s=10)
            assert frames is not None, "no answer to the force"
            reply = wire.decode_reply(frames, MAX_ENTRY_BYTES)
    finally:
        del index.location
    assert lookups <= 10_000, f"{lookups} index lookups to count 2 entries"
    assert (reply.status, reply.lac) == (0, 2)


def test_a_force_counts_the_entries_held_in_its_range_in_the_index_and_the_cache(bookie):
    """The count of entries held, over entries in the index (checkpointed) and in the
    write cache, for ranges shorter and longer than the cache, and past the highest."""
    held = {0, 2, 5, 9, 10, 11, 13, 10 ** 9}
    for entry_id in sorted(held):
        if entry_id == 10:
            bookie.checkpoint()  # 0..9 in the index, the rest in the cache
        bookie.add_entry(7, entry_id, make_entry(7, entry_id, -1, b"x"), KEY)
    bookie.add_entry(8, 12, make_entry(8, 12, -1, b"x"), KEY)  # another ledger's
    for first, last in ((0, 20), (3, 12), (10, 10), (12, 12), (11, 13), (0, 2 ** 63 - 1),
                        (14, 10 ** 9 - 1), (5, 4), (0, 0)):
        assert bookie.force(7, first, last).result(timeout=WAIT_S) == \
            sum(first <= e <= last for e in held), (first, last)


def test_a_force_waits_for_the_adds_still_being_sent_to_the_other_bookies(tmp_path):
    """E=4, Qw=3, Qa=2, no fault at all: the writer's threads send an add to its write
    set's bookies one after the other, so Qa bookies may acknowledge it before the
    thread sent it to the last one.  Entry 2 (bookies 2, 3, 0) and entry 5 (1, 2, 3)
    are acknowledged so while bookies 0 and 3 have yet to get them, and entries 3 and 4
    go everywhere: the LAC is 5.  A force made then must reach bookies 0 and 3 after
    those adds, not count them short of entries they are about to get, which leaves
    entry 3 (bookies 3, 0, 1) one bookie and fails the force."""
    with clusters(tmp_path) as make:
        cluster = make(4)
        lh = cluster.client(dataclasses.replace(QUIET, addEntryTimeout=30)).create_ledger(
            4, 3, 2, password=PASSWORD, write_flags=DEFERRED)
        ensemble = lh.metadata.fragments[0].ensemble
        for entry_id in range(2):  # every bookie's sender is known from here on
            lh.add_entry(payload(entry_id))
        release = threading.Event()
        reached = {2: threading.Event(), 5: threading.Event()}

        def late(send, stalled: int, entry_id: int, entry: bytes, token) -> bool:
            if entry_id == stalled:  # the adder's thread stalls before the last bookie
                reached[entry_id].set()
                release.wait(30)
            return send(entry_id, entry, token)

        for entry_id in reached:  # the last bookie of entry e's write set
            last = ensemble[(entry_id + 2) % 4]
            lh._senders[last] = functools.partial(late, lh._senders[last], entry_id)
        adders = []
        try:
            for entry_id in range(2, 6):
                if entry_id not in reached:
                    lh.add_entry_async(payload(entry_id))
                    continue
                adder = threading.Thread(target=lh.add_entry_async,
                                         args=(payload(entry_id),))
                adders.append(adder)
                adder.start()
                assert reached[entry_id].wait(10), f"entry {entry_id} not sent"
            wait_until(lambda: lh.last_add_acknowledged == 5, "entries 2..5 acknowledged")
            forced = lh.force_async()
        finally:
            release.set()
            for adder in adders:
                adder.join(10)
        assert forced.result(timeout=WAIT_S) == 5
