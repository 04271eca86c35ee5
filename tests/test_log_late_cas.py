"""A log writer's head CAS answered MetadataUnavailable that had not landed when the
writer read the head again, and lands afterwards (a slow store applying a request it
had in flight): the writer deleted the ledger that CAS names as the log's last segment.
pybk.log.writer says the next writer or commit to take the log over recovers it, finds
it gone and drops it: nothing acknowledged is lost, and the log is not broken for good.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import pytest
from clientutil import FAST

from pybk.client import BookKeeper
from pybk.client.transport import InProcessBookieClient
from pybk.errors import BookKeeperError, MetadataUnavailable
from pybk.log import LogReader, LogWriter, Position
from pybk.log.metadata import LogMetadata, log_path, read_log
from pybk.meta.embedded import EmbeddedMetadataStore
from pybk.meta.interface import MetadataStore
from pybk.settings import LogSettings

pytestmark = pytest.mark.timeout(240)

LOG = "events"
SMALL_SEGMENTS = LogSettings(ensembleSize=1, writeQuorumSize=1, ackQuorumSize=1,
                             segmentMaxBytes=256)
FULL = bytes(300)


class HoldsHeadCas:
    """Passes every call through, except the first CAS of LOG's head that ``which``
    picks: that one is held (not applied) and answered MetadataUnavailable; land()
    applies it later, as the store would have."""

    def __init__(self, store: MetadataStore, which: Callable[[LogMetadata], bool]) -> None:
        self._store, self._which = store, which
        self.held: tuple[bytes, int] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def set(self, path: str, data: bytes, expected_version: int) -> int:
        if self.held is None and path == log_path(LOG) \
                and self._which(LogMetadata.from_bytes(data)):
            self.held = (data, expected_version)
            raise MetadataUnavailable(f"{path}: no answer in time (a test's fault)")
        return self._store.set(path, data, expected_version)

    def land(self) -> None:
        assert self.held is not None
        self._store.set(log_path(LOG), *self.held)


@pytest.fixture
def client(tmp_path, bookie):
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(EmbeddedMetadataStore(str(tmp_path / "meta")))

        def make() -> BookKeeper:
            return stack.enter_context(BookKeeper(
                store, {"B1": InProcessBookieClient("B1", bookie)}, FAST))

        yield make


def read_all(bk) -> list[tuple[Position, bytes]]:
    return list(LogReader(bk, LOG).read())


def open_and_write(bk, values: list[bytes]) -> list[tuple[Position, bytes]]:
    with LogWriter.open(bk, LOG, SMALL_SEGMENTS) as writer:
        return [(writer.append(v), v) for v in values]


def test_an_open_whose_cas_lands_after_it_deleted_its_ledger(client):
    """The next writer to open the log drops the segment whose ledger is gone (as
    pybk.log.writer says), and every record reads back."""
    bk, bk2 = client(), client()
    before = open_and_write(bk2, [b"before"])
    bk.metadata = held = HoldsHeadCas(bk.metadata, lambda head: head.epoch == 2)

    with pytest.raises(MetadataUnavailable):
        LogWriter.open(bk, LOG, SMALL_SEGMENTS)
    held.land()
    assert read_log(bk2.metadata, LOG).metadata.epoch == 2

    after = open_and_write(bk2, [b"after"])
    assert read_all(bk2) == before + after


def roll_whose_cas_lands_late(bk) -> list:
    """A writer of ``bk`` whose roll's CAS is answered MetadataUnavailable and lands
    after the writer gave up on it; the writer has stopped and is closed.  Returns the
    (position, record) it acknowledged."""
    writer = LogWriter.open(bk, LOG, SMALL_SEGMENTS)
    bk.metadata = held = HoldsHeadCas(bk.metadata, lambda head: head.next_segment == 2)
    written = [(writer.append(b"a" + FULL), b"a" + FULL)]
    with pytest.raises(BookKeeperError):
        for _ in range(3):
            written.append((writer.append(b"b"), b"b"))
    held.land()
    with contextlib.suppress(BookKeeperError):
        writer.close()
    return written


def test_a_roll_whose_cas_lands_after_it_deleted_its_ledger(client):
    """The same for a roll's CAS: the writer stops, the next opener drops the segment,
    and every acknowledged record reads back."""
    bk, bk2 = client(), client()
    written = roll_whose_cas_lands_late(bk)

    after = open_and_write(bk2, [b"after"])
    got = read_all(bk2)
    assert got[:1] == written[:1] and got[-1:] == after
    assert [v for _, v in got] == [v for _, v in written] + [b"after"]


def test_readers_after_an_open_whose_cas_landed_late(client):
    """Until a writer opens the log again (maybe never: the opener failed), readers
    read the log: the head names the opener's ledger as the last segment, so it must
    not have been deleted.  (Before, readers failed with NoSuchLedger.)"""
    bk, bk2 = client(), client()
    before = open_and_write(bk2, [b"before"])
    bk.metadata = held = HoldsHeadCas(bk.metadata, lambda head: head.epoch == 2)
    with pytest.raises(MetadataUnavailable):
        LogWriter.open(bk, LOG, SMALL_SEGMENTS)
    held.land()
    assert read_all(bk2) == before


def test_readers_after_a_roll_whose_cas_landed_late(client):
    """The same for a roll: the writer stopped, and readers read every record it
    acknowledged.  (Before, readers failed with NoSuchLedger at the rolled segment.)"""
    bk, bk2 = client(), client()
    written = roll_whose_cas_lands_late(bk)
    assert read_all(bk2) == written
