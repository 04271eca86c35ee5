"""Full disks turn the bookie read-only (or stop it); it becomes writable again below the
low-water mark.  Disk usage is injected (a fault hook); everything else is real."""

from __future__ import annotations

import errno
import time

import pytest
from conftest import KEY, entry
from storageutil import JournalWriteFailure

from pybk.errors import BookieClosed, BookieReadOnly, DiskFull
from pybk.testing import WAIT_S

pytestmark = pytest.mark.timeout(60)


class Usage:
    """A settable used fraction for every directory."""

    def __init__(self, fraction: float = 0.5) -> None:
        self.fraction = fraction

    def __call__(self, _path: str) -> float:
        return self.fraction


def test_read_only_over_threshold_then_writable_under_low_water_mark(bookie_factory):
    usage = Usage(0.5)
    bookie = bookie_factory(disk_usage=usage)
    bookie.add_entry(1, 0, entry(1, 0), KEY)
    usage.fraction = 0.97
    bookie.check_disks()
    assert bookie.is_read_only
    with pytest.raises(BookieReadOnly, match="read-only"):
        bookie.add_entry(1, 1, entry(1, 1), KEY)
    assert bookie.read_entry(1, 0) == entry(1, 0)  # reads go on
    usage.fraction = 0.93  # under the threshold but above the low-water mark: still read-only
    bookie.check_disks()
    assert bookie.is_read_only
    usage.fraction = 0.85
    bookie.check_disks()
    assert not bookie.is_read_only
    bookie.add_entry(1, 1, entry(1, 1), KEY)


def test_set_read_only_combines_with_the_disks_and_listeners_hear_every_change(
        bookie_factory):
    usage = Usage(0.5)
    bookie = bookie_factory(disk_usage=usage)
    changes = []
    bookie.add_state_listener(lambda: changes.append((bookie.is_read_only,
                                                      bookie.disks_full)))
    bookie.set_read_only("not registered in the cluster")
    with pytest.raises(BookieReadOnly, match="not registered in the cluster"):
        bookie.add_entry(1, 0, entry(1, 0), KEY)
    bookie.fence(1, KEY).result()  # recovery still reaches a read-only bookie
    usage.fraction = 0.99
    bookie.check_disks()
    bookie.set_writable()  # the disks still refuse adds
    with pytest.raises(BookieReadOnly, match="diskUsageThreshold"):
        bookie.add_entry(2, 0, entry(2, 0), KEY)
    usage.fraction = 0.5
    bookie.check_disks()
    bookie.add_entry(2, 0, entry(2, 0), KEY)
    bookie.close()
    assert changes == [(True, False), (True, True), (True, True), (False, False),
                       (False, False)]


def test_full_at_start_means_read_only_from_the_start(bookie_factory):
    bookie = bookie_factory(disk_usage=Usage(0.99))
    assert bookie.is_read_only


def test_background_disk_checker_notices(bookie_factory, settings_factory):
    usage = Usage(0.5)
    bookie = bookie_factory(settings_factory(diskCheckInterval=50, gcWaitTime=50),
                            disk_usage=usage)
    usage.fraction = 0.99
    deadline = time.monotonic() + WAIT_S
    while not bookie.is_read_only and time.monotonic() < deadline:
        time.sleep(0.02)
    assert bookie.is_read_only


def test_shuts_down_when_read_only_mode_is_disabled(bookie_factory, settings_factory):
    usage = Usage(0.5)
    bookie = bookie_factory(settings_factory(readOnlyModeEnabled=False), disk_usage=usage)
    usage.fraction = 0.99
    bookie.check_disks()
    deadline = time.monotonic() + WAIT_S
    while not bookie.is_closed and time.monotonic() < deadline:
        time.sleep(0.02)
    assert bookie.is_closed
    with pytest.raises((BookieClosed, BookieReadOnly)):
        bookie.add_entry(1, 0, entry(1, 0), KEY)


def test_enospc_in_the_journal_fails_adds_with_disk_full_and_keeps_acknowledged_data(
        bookie_factory, settings_factory):
    io = JournalWriteFailure(errno.ENOSPC)
    settings = settings_factory()
    bookie = bookie_factory(settings, io=io)
    bookie.add_entry(1, 0, entry(1, 0), KEY)
    io.armed = True
    with pytest.raises(DiskFull):
        bookie.add_entry(1, 1, entry(1, 1), KEY)
    with pytest.raises(DiskFull):
        bookie.add_entry(1, 2, entry(1, 2), KEY)
    assert bookie.read_entry(1, 0) == entry(1, 0)
    bookie.close()
    reopened = bookie_factory(settings)
    assert reopened.read_entry(1, 0) == entry(1, 0)
    reopened.add_entry(1, 1, entry(1, 1), KEY)
