"""Record batches of version 1, as pybk wrote them before version 2 (keys, timestamps and
headers): the bytes of one, and a log writer that writes them, to make logs an older
pybk left (:mod:`pybk.log.batch` specifies both versions)."""

from __future__ import annotations

import struct
from typing import Sequence

import pytest

from pybk.log import writer


def version_1_batch(values: Sequence[bytes]) -> bytes:
    """The version 1 batch of ``values``."""
    return struct.pack(f">BI{len(values)}I", 1, len(values), *map(len, values)) \
        + b"".join(values)


def write_version_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make log writers write version 1 batches (values only), as an older pybk did,
    until ``monkeypatch`` undoes it."""
    monkeypatch.setattr(writer._Batch, "encode", lambda batch: version_1_batch(batch.records))
