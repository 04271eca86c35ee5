"""``TempDirectoryProcesses``: the base of helpers that run processes in a directory of
their own (a throwaway ZooKeeper, an ensemble of them, a local cluster)."""

from __future__ import annotations

import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from typing import Self


class TempDirectoryProcesses(ABC):
    """Starts on enter and stops on exit (also when the start fails), in ``directory``
    or, if None, a temporary directory that :meth:`_remove_directory` deletes."""

    def __init__(self, directory: str | os.PathLike | None, prefix: str) -> None:
        self._owns_directory = directory is None
        self.directory = (tempfile.mkdtemp(prefix=prefix) if directory is None
                          else os.path.abspath(directory))

    @abstractmethod
    def start(self) -> Self:
        """Start and wait until serving; returns self."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every process and remove what is temporary."""

    def _remove_directory(self) -> None:
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
