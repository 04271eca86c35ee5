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

The function is taken from the package's C extension (``crc32c._crc32c``) without
running the package's ``__init__``, which looks its own version up in the installed
distributions' metadata (``importlib.metadata``, and the ``email`` package with it):
some 75 ms of CPU at every start of a process that imports pybk (each ``pybk`` command,
bookie process and Spark worker), more than all of pybk's own modules take to import
bar one.  If the extension is not where the package's directory says (an unusual
installation), the package is imported as usual.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from typing import Callable

_EXTENSION = "crc32c._crc32c"


def _extension_crc32c() -> Callable[..., int]:
    module = sys.modules.get(_EXTENSION)
    if module is None:
        package = importlib.util.find_spec("crc32c")  # finds it, runs nothing
        for directory in (package.submodule_search_locations or ()) if package else ():
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = os.path.join(directory, "_crc32c" + suffix)
                if os.path.exists(path):
                    loader = importlib.machinery.ExtensionFileLoader(_EXTENSION, path)
                    spec = importlib.util.spec_from_file_location(_EXTENSION, path,
                                                                  loader=loader)
                    assert spec is not None
                    module = importlib.util.module_from_spec(spec)
                    loader.exec_module(module)
                    # The package, if something imports it later, finds it loaded.
                    sys.modules[_EXTENSION] = module
                    break
            if module is not None:
                break
    if module is None:
        from crc32c import crc32c as function
        return function
    return module.crc32c


crc32c = _extension_crc32c()

__all__ = ["crc32c"]
