"""Which bookies a force counts (:mod:`pybk.client.deferred`): only those that
acknowledged the entries forced and still hold them.  Real bookies served over ZeroMQ; the
fault hooks only hold replies back, so that each answer reaches the writer at a chosen
moment."""

from __future__ import annotations

import dataclasses

import pytest
from clientutil import FAST
from zmqutil import LOOPBACK, RawDealer

from pybk import WriteFlag
from pybk.cluster import BookieServer, wire
from pybk.cluster.wire import Op, Request
from pybk.storage import make_entry

pytestmark = pytest.mark.timeout(120)
PASSWORD = b"secret"
KEY = b"k" * 20
MAX_ENTRY_BYTES = 1 << 20
DEFERRED = {WriteFlag.DEFERRED_SYNC}
#: No explicit LAC: it is a durable journal record, which would sync the deferred adds.
QUIET = dataclasses.replace(FAST, explicitLacInterval=0)


def test_a_force_answers_the_highest_entry_held_only_to_a_client_that_asks(bookie):
    """With the flag HELD the reply's LAC is the highest entry the bookie holds for the
    ledger; a client of before the flag sends none and gets the reply it knows (LAC 0)."""
    for entry_id in range(3):
        bookie.add_entry(7, entry_id, make_entry(7, entry_id, -1, b"x"), KEY)
    with BookieServer(bookie, LOOPBACK) as server, RawDealer(server.address) as dealer:
        for request_id, flags in ((1, wire.HELD), (2, 0)):
            dealer.send(wire.encode_request(Request(Op.FORCE_LEDGER, request_id, 7,
                                                    flags=flags), MAX_ENTRY_BYTES))
            frames = dealer.receive(timeout_s=10)
            assert frames is not None, "no answer to the force"
            reply = wire.decode_reply(frames, MAX_ENTRY_BYTES)
            assert (reply.request_id, reply.status, reply.lac) == (
                request_id, 0, 2 if flags else 0)
