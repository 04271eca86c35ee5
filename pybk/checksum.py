"""The checksum of every pybk format: CRC-32C (Castagnoli).

A bottom module (it imports nothing of pybk): the storage engine's files, the client's
entry digests and the metadata records all checksum with it.

CRC-32C is what BookKeeper uses for entry digests, and CPUs compute it in hardware
(SSE 4.2, ARMv8): the ``crc32c`` package does so at about 10 GB/s where ``zlib.crc32``
manages under 2 GB/s, which matters on the write path (every entry is checksummed once,
and the same value serves its journal record and its entry log record).

``crc32c(data, seed=0)`` returns the CRC-32C of ``data``, continuing from ``seed`` (the
CRC of the bytes before it).  It is the package's C function itself, bound without a
Python wrapper because it runs once per add.
"""

from __future__ import annotations

from crc32c import crc32c

__all__ = ["crc32c"]
