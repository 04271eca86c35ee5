"""Clients that connect to bookie processes (``pybk bookie``), flood them with adds and
reads, and vanish mid-traffic: closed, killed with SIGKILL, stopped half-open (neither
reading nor closing), or reset by a bare ZMTP peer whose bytes the bookie had not
processed yet.  Whatever a client does, every bookie process lives on and serves."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import wait

import pytest
import zkutil
from clusterutil import (  # noqa: F401
    PASSWORD,
    BookieProcess,
    address,
    bookies,
    child_env,
    payload,
)
from conftest import KEY, entry
from zmqutil import flood_and_reset

import pybk
from pybk.net import ZmqBookieClient, wire
from pybk.settings import ClientSettings

pytestmark = pytest.mark.timeout(120)

ROUNDS = 2
#: How long each client floods before it vanishes.
FLOOD_S = 0.3
PATIENT = ClientSettings(addEntryTimeout=10, readTimeout=10)
#: Adds and reads of one ledger, in rounds of ``BURST`` each, until the client goes.
BURST = 200
#: The flooders' ledger ids: far above the cluster's id generator, so that the ledger
#: the test makes at the end is not one they made on a bookie with another key.
FLOOD_LEDGERS = 1 << 40

#: A client process that floods the bookie at ``argv[1]`` from three threads, once the
#: bookie answered it (it says "flooding" then).
FLOODING_CLIENT = f"""
import sys, threading
from concurrent.futures import wait
from pybk.net import ZmqBookieClient
from pybk.settings import ClientSettings
from pybk.storage import make_entry

client = ZmqBookieClient("B", sys.argv[1], ClientSettings(addEntryTimeout=30,
                                                          readTimeout=30))
def flood(ledger_id):
    first = 0
    while True:
        futures = [client.add(ledger_id, e, make_entry(ledger_id, e, e - 1, b"x" * 100),
                              b"key") for e in range(first, first + {BURST})]
        futures += [client.read(ledger_id, first) for _ in range({BURST})]
        wait(futures, 30)
        first += {BURST}

client.bookie_info().result(30)
for ledger_id in ({FLOOD_LEDGERS + 1}, {FLOOD_LEDGERS + 2}, {FLOOD_LEDGERS + 3}):
    threading.Thread(target=flood, args=(ledger_id,), daemon=True).start()
print("flooding", flush=True)
threading.Event().wait()
"""


def flooding_client(stack: contextlib.ExitStack, endpoint: str) -> subprocess.Popen:
    """A :data:`FLOODING_CLIENT` of ``endpoint``, SIGKILLed and reaped when ``stack``
    closes."""
    child = subprocess.Popen([sys.executable, "-c", FLOODING_CLIENT, endpoint],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                             env=child_env())
    stack.callback(reap, child)
    return child


def reap(child: subprocess.Popen) -> None:
    child.kill()  # also ends a stopped process
    child.wait(30)
    child.stdout.close()


def flooding(child: subprocess.Popen) -> bool:
    """Wait until ``child`` floods its bookie (it exits if the bookie does not answer
    its first request within 30 s)."""
    return child.stdout.readline() == "flooding\n"


def flood_and_close(endpoint: str, first_ledger_id: int) -> None:
    """Three threads of this process add and read through one client, which is closed
    while they do."""
    client = ZmqBookieClient("B", endpoint, PATIENT)
    stop = threading.Event()

    def flood(ledger_id: int) -> None:
        first = 0
        while not stop.is_set():
            futures = [client.add(ledger_id, e, entry(ledger_id, e), KEY)
                       for e in range(first, first + BURST)]
            futures += [client.read(ledger_id, first) for _ in range(BURST)]
            wait(futures, 30)
            first += BURST

    threads = [threading.Thread(target=flood, args=(first_ledger_id + i,))
               for i in range(3)]
    try:
        for thread in threads:
            thread.start()
        stop.wait(FLOOD_S)
    finally:
        client.close()  # fails what is outstanding and what comes after at once
        stop.set()
        for thread in threads:
            thread.join(60)


def check_serving(bookie: BookieProcess, client: ZmqBookieClient) -> None:
    """``bookie`` answers a request from ``client``; if not, say what became of it."""
    error = client.bookie_info().exception(timeout=30)
    if error is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            bookie.process.wait(10)  # one that is going down gives its exit status
    assert error is None, f"bookie {bookie.name} (exit status " \
        f"{bookie.process.returncode}) did not answer: {error!r}\n{bookie.output}"


def test_clients_that_flood_and_vanish_never_stop_a_bookie(bookies, address, closing):
    serving = bookies.start_serving(2)
    checkers = {bookie.name: closing.enter_context(ZmqBookieClient(
        bookie.bookie_id, bookie.endpoint, PATIENT)) for bookie in serving}
    request = wire.encode_request(wire.Request(wire.Op.READ_LAC, 1, ledger_id=1), 1 << 20)
    vanished = closing.enter_context(contextlib.ExitStack())
    for round_ in range(ROUNDS):
        for bookie in serving:
            killed, half_open = (flooding_client(vanished, bookie.endpoint)
                                 for _ in range(2))
            flood_and_reset(bookie.endpoint, request, FLOOD_S)
            check_serving(bookie, checkers[bookie.name])
            flood_and_close(bookie.endpoint, FLOOD_LEDGERS + 10 * round_ + 11)
            if not (flooding(killed) and flooding(half_open)):
                check_serving(bookie, checkers[bookie.name])  # says what became of it
                pytest.fail(f"a client got no answer from bookie {bookie.name} in 30 s")
            time.sleep(FLOOD_S)
            killed.send_signal(signal.SIGKILL)
            half_open.send_signal(signal.SIGSTOP)  # neither reads nor closes
        for bookie in serving:
            check_serving(bookie, checkers[bookie.name])
    # Every bookie takes an add and answers a read of it, with the half-open clients
    # still connected.
    bk = closing.enter_context(pybk.connect(address, PATIENT,
                                            zk_settings=zkutil.settings()))
    with bk.create_ledger(2, 2, 2, password=PASSWORD) as ledger:
        assert ledger.add_entry(payload(0)) == 0
        for bookie in serving:
            assert checkers[bookie.name].read(ledger.id, 0).result(timeout=30) \
                .endswith(payload(0))
