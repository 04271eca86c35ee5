"""Disk usage: which directories may take new data, and when the bookie turns read-only.

A directory is *full* when the used fraction of its file system is over
``diskUsageThreshold``.  Any full directory makes the bookie read-only (adds fail with
BookieReadOnly, reads go on) or, with ``readOnlyModeEnabled=false``, shuts it down.  A
read-only bookie becomes writable again once every directory is under
``diskUsageLwmThreshold``: the gap between the two keeps it from flapping.
"""

from __future__ import annotations

import os
import shutil
from typing import Callable

UsageFunction = Callable[[str], float]


def used_fraction(path: str) -> float:
    """The used fraction of the file system holding ``path``."""
    usage = shutil.disk_usage(path)
    return (usage.total - usage.free) / usage.total if usage.total else 1.0


def free_and_total_bytes(paths: list[str]) -> tuple[int, int]:
    """Free and total bytes of the file systems holding ``paths``, each counted once (two
    ledger directories on one disk do not double its space)."""
    seen: set[int] = set()
    free = total = 0
    for path in paths:
        device = os.stat(path).st_dev
        if device in seen:
            continue
        seen.add(device)
        usage = shutil.disk_usage(path)
        free += usage.free
        total += usage.total
    return free, total


class DiskMonitor:
    """Reads disk usage and decides read-only transitions (it changes no state itself)."""

    def __init__(self, directories: list[str], threshold: float, low_water_mark: float,
                 usage: UsageFunction = used_fraction) -> None:
        self._dirs = directories
        self._threshold = threshold
        self._lwm = low_water_mark
        self._usage = usage
        self.last_usage: dict[str, float] = {}

    def measure(self) -> dict[str, float]:
        self.last_usage = {d: self._usage(d) for d in self._dirs}
        return self.last_usage

    def full_directories(self) -> list[str]:
        return [d for d, used in self.last_usage.items() if used > self._threshold]

    def should_become_read_only(self) -> bool:
        return bool(self.full_directories())

    def may_become_writable(self) -> bool:
        return all(used < self._lwm for used in self.last_usage.values())

    def least_used(self, candidates: list[str]) -> str:
        """The candidate with the most room (by the last measurement)."""
        return min(candidates, key=lambda d: self.last_usage.get(d, 0.0))
