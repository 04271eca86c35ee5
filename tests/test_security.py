"""Security: ZeroMQ CURVE between clients and bookies, ZooKeeper digest ACLs on pybk's
znodes, and what a ledger password guards (README "Security")."""

from __future__ import annotations

import time

import pytest

from conftest import KEY, entry
from curveutil import make_keys
from pybk.cluster import BookieServer, ZmqBookieClient
from pybk.errors import BookieUnavailable
from pybk.settings import ClientSettings

pytestmark = pytest.mark.timeout(60)

#: Time limits far longer than any test step: a prompt failure cannot be a timeout.
PATIENT = ClientSettings(addEntryTimeout=30, readTimeout=30)
#: A refused handshake must fail requests this fast (well within any time limit).
PROMPT_S = 5.0


@pytest.fixture
def keys(tmp_path):
    return make_keys(str(tmp_path / "keys"))


@pytest.fixture
def curve_server(keys, bookie_factory, settings_factory, closing):
    """A bookie serving CURVE, holding entry 0 of ledger 1."""
    bookie = bookie_factory(settings_factory(**keys.server()))
    bookie.add_entry(1, 0, entry(1, 0, lac=-1), KEY)
    return closing.enter_context(BookieServer(bookie, "tcp://127.0.0.1:*"))


def test_an_allowed_client_pinning_the_bookie_key_reads_and_writes(keys, curve_server,
                                                                   closing):
    client = closing.enter_context(ZmqBookieClient(
        "B1", curve_server.address, keys.client(PATIENT), server_key=keys.bookie_public))
    assert curve_server.public_key == keys.bookie_public
    assert client.read(1, 0).result(timeout=10) == entry(1, 0, lac=-1)
    client.add(1, 1, entry(1, 1, lac=0), KEY).result(timeout=10)
    assert client.read(1, 1).result(timeout=10) == entry(1, 1, lac=0)


def refused_promptly(client: ZmqBookieClient) -> None:
    """Every kind of request fails with BookieUnavailable, long before its time limit."""
    started = time.monotonic()
    calls = [client.read(1, 0), client.add(1, 5, entry(1, 5, lac=-1), KEY),
             client.read_lac(1)]
    for call in calls:
        error = call.exception(timeout=PROMPT_S)
        assert isinstance(error, BookieUnavailable), error
        assert "handshake" in str(error) or "connection" in str(error), error
    assert time.monotonic() - started < PROMPT_S


def test_a_client_without_keys_is_refused_promptly(curve_server, closing):
    client = closing.enter_context(ZmqBookieClient("B1", curve_server.address, PATIENT))
    refused_promptly(client)


def test_a_client_with_a_key_the_bookie_does_not_allow_is_refused_promptly(
        keys, curve_server, closing):
    client = closing.enter_context(ZmqBookieClient(
        "B1", curve_server.address, keys.client(PATIENT, keys.stranger_secret),
        server_key=keys.bookie_public))
    refused_promptly(client)


def test_a_client_pinning_another_bookie_key_is_refused_promptly(keys, curve_server,
                                                                 closing):
    # The stranger's public key stands for a process that took the bookie's address.
    from pybk.cluster.curve import load_key_pair
    other = load_key_pair(keys.stranger_secret).public
    client = closing.enter_context(ZmqBookieClient(
        "B1", curve_server.address, keys.client(PATIENT), server_key=other))
    refused_promptly(client)


def test_curve_on_one_side_only_is_refused_when_the_client_is_made(keys):
    with pytest.raises(BookieUnavailable, match="registered no CURVE key"):
        ZmqBookieClient("B1", "tcp://127.0.0.1:1", keys.client(PATIENT))
    with pytest.raises(BookieUnavailable, match="requires CURVE"):
        ZmqBookieClient("B1", "tcp://127.0.0.1:1", PATIENT, server_key=keys.bookie_public)
