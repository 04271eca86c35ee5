"""A metadata store that loses the answer to a compare-and-set of a log's head, for tests
of pybk.log.commit and pybk.log.writer.

:class:`LosesHeadAnswer` wraps a real store and passes every call through, except the
first compare-and-set of the head of log ``name`` that writes a head ``which`` picks (a
job's commit CAS: :class:`LosesCommitAnswer`; a writer's opening, roll or truncation
CAS): that one reaches the store and lands, then ``meanwhile()`` runs (another client
acting on the log: a writer opening it, another commit, an orphan cleaner), then the
call raises what the ZooKeeper store raises when the answer was lost with its
connection: BadVersion (its retry found the head moved on, past the version it had
written) or MetadataUnavailable (no answer within ``zkOperationTimeoutMs``).  With
``unreachable_calls`` the next that many calls raise MetadataUnavailable too (a store
that stays unreachable).  Only the first such CAS is hit; :attr:`LosesHeadAnswer.written`
is the head it wrote.
"""

from __future__ import annotations

from typing import Any, Callable

from pybk.errors import MetadataUnavailable
from pybk.log.metadata import LogMetadata, log_path
from pybk.meta.interface import MetadataStore


class LosesHeadAnswer:
    """Wraps ``store``; see the module docstring."""

    def __init__(self, store: MetadataStore, name: str, which: Callable[[LogMetadata], bool],
                 meanwhile: Callable[[], Any], error: type[Exception],
                 unreachable_calls: int = 0) -> None:
        self._store, self._head, self._which = store, log_path(name), which
        self._meanwhile, self._error = meanwhile, error
        self._unreachable_calls = unreachable_calls
        self.written: LogMetadata | None = None

    @property
    def hit(self) -> bool:
        """Whether the CAS whose answer is lost was made."""
        return self.written is not None

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            self._unreachable()
            return attribute(*args, **kwargs)

        return call

    def _unreachable(self) -> None:
        if self.hit and self._unreachable_calls > 0:
            self._unreachable_calls -= 1
            raise MetadataUnavailable("the metadata store is unreachable (a test's fault)")

    def set(self, path: str, data: bytes, expected_version: int) -> int:
        self._unreachable()
        version = self._store.set(path, data, expected_version)
        if not self.hit and path == self._head and self._which(LogMetadata.from_bytes(data)):
            self.written = LogMetadata.from_bytes(data)
            self._meanwhile()
            raise self._error(f"{path}: the answer to the CAS was lost (a test's fault)")
        return version


class LosesCommitAnswer(LosesHeadAnswer):
    """Loses the answer to the commit CAS of job ``job_id`` (the head's CAS that lists
    it in ``committing``)."""

    def __init__(self, store: MetadataStore, name: str, job_id: str,
                 meanwhile: Callable[[], Any], error: type[Exception],
                 unreachable_calls: int = 0) -> None:
        super().__init__(store, name, lambda head: job_id in head.committing, meanwhile,
                         error, unreachable_calls)
