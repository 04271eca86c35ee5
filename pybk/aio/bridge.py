"""How pybk's threads and an asyncio event loop meet, without either waiting for the other.

One :class:`Bridge` belongs to each top-level async object (an :class:`~pybk.aio.AsyncWAL`,
an :class:`~pybk.aio.AsyncBookKeeper`) and to the loop it was made on.  It has four parts:

* **Room** (a semaphore of ``max_pending`` on the loop): one unit per append or add
  that was queued and has not completed underneath.  A caller without room awaits it
  (no spinning, the loop runs on).  A unit comes back when the append *completes
  underneath*, not when its awaiting task is cancelled, so cancelled appends still count
  while they are in flight: the bound holds.
* **The submitter** (thread ``pybk-aio-submit``): calls that may block in the thread-based
  client (a full journal queue, the client's ``throttle``) run there, in the order the
  loop queued them.  The loop gathers what it queues in one turn and hands it over as one
  piece of work (one wake-up of the thread per turn, not per append); consecutive
  appends to one log start together.
* **The inbox**: completions arrive on pybk's threads (the callback thread, a bookie's
  journal thread, a ZeroMQ loop) and are appended to it; the first one after the loop
  last emptied it wakes the loop (``loop.call_soon_threadsafe``), so many completions
  cost one wake-up.  A log's appends complete in position order, so one done-callback
  per run of appends posts the run (:meth:`Bridge.land`).  The loop then sets the
  asyncio futures, skipping those whose task was cancelled.  Posting never blocks a
  pybk thread.
* **Blocking calls** (open, close, metadata, a ledger read) run on a bounded executor of
  ``pybk-aio`` threads; record streams run on a :class:`Feed` thread each.

Nothing here reimplements the protocol: the async objects call the thread-based ones.
Every thread is named ``pybk-aio...`` and joined by :meth:`Bridge.close`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import queue
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import (
    Any,
    AsyncIterator,
    Callable,
    Generic,
    Iterator,
    Protocol,
    Self,
    Sequence,
    TypeVar,
)

from pybk.log.futures import wait_for_callbacks

T = TypeVar("T")


class Closeable(Protocol):
    """What :meth:`Bridge.open` opens: closed by its own ``close()``."""

    def close(self) -> object: ...


C = TypeVar("C", bound=Closeable)

#: Appends (or adds) queued or in flight at once, by default; more wait for room.
MAX_PENDING_DEFAULT = 10_000
#: Threads for blocking calls (open, close, metadata, single reads) of one bridge.
BLOCKING_THREADS_MAX = 4
#: Records a stream's thread reads ahead of its consumer, at most.
FEED_BUFFER_RECORDS = 1024
#: Appends whose completions are posted together, at most (see Bridge.land).
LAND_RUN_MAX = 256
#: Seconds a closing bridge waits for its threads (a feed blocked in a read included).
CLOSE_TIMEOUT_S = 30.0
#: How often the loop looks whether a thread that is returning has ended, in seconds.
THREAD_END_POLL_S = 0.001

_END = object()  # a feed's last item

#: Starts a run of queued appends on the submitter: ``start(items)``, ``items`` being the
#: ``(item, future)`` pairs in the order they were queued (``item`` is the data, or the
#: ``(entry_id, data)`` pair of a ledger whose caller gives entry ids).  It must see to it that each
#: outcome is posted (:meth:`Bridge.post`, :meth:`Bridge.land`) and raise nothing.
Start = Callable[[list[tuple[Any, asyncio.Future]]], None]


class AsyncClosing:
    """``async with`` for a handle whose ``close()`` is a coroutine: the block's end
    awaits it, also when the block raised."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Bridge:
    """The loop-side and thread-side plumbing of one async object (see the module)."""

    def __init__(self, closed_error: Callable[[], Exception],
                 max_pending: int = MAX_PENDING_DEFAULT) -> None:
        """``closed_error()`` is what calls after :meth:`close` raise."""
        if max_pending < 1:
            raise ValueError(f"max_pending must be 1 or more, not {max_pending}")
        self.loop = asyncio.get_running_loop()
        self.max_pending = max_pending
        self._room = _Room(self.loop, max_pending)
        self._inbox: collections.deque[tuple[asyncio.Future, Any, BaseException | None]] = \
            collections.deque()
        self._inbox_lock = threading.Lock()
        self._inbox_scheduled = False
        # Queued this turn, for the submitter: (start, data, future).
        self._outbox: list[tuple[Start, Any, asyncio.Future]] = []
        self._work: queue.SimpleQueue[list[tuple[Start, Any, asyncio.Future]] | None] = \
            queue.SimpleQueue()
        self._submitter = threading.Thread(target=self._submit_loop, name="pybk-aio-submit",
                                           daemon=True)
        self._executor = ThreadPoolExecutor(max_workers=BLOCKING_THREADS_MAX,
                                            thread_name_prefix="pybk-aio")
        self._feeds: weakref.WeakSet[Feed] = weakref.WeakSet()
        self._closed = False
        self._closed_error = closed_error
        self._submitter.start()

    # -- blocking calls -----------------------------------------------------------------

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on one of the bridge's threads; the loop runs meanwhile.  A
        cancelled caller stops waiting; the call itself runs to its end."""
        self.check_open()
        return await self.loop.run_in_executor(self._executor, fn, *args)

    async def open(self, fn: Callable[[], C]) -> C:
        """``fn()`` on one of the bridge's threads, returning what it opened.  If the
        caller is cancelled meanwhile, what ``fn`` opens is closed (its own ``close()``,
        whatever its class, on a thread) instead of being left open with no owner."""
        handoff = _Handoff(fn)
        try:
            return await self.call(handoff.run)
        except asyncio.CancelledError:
            opened = handoff.abandon()
            if opened is not None:
                self._executor.submit(opened.close)
            raise

    # -- appends: room, submitter, inbox -----------------------------------------------------

    def try_take_room(self) -> bool:
        """Take room for one more append if there is some, at once."""
        return self._room.try_take()

    async def take_room(self) -> None:
        """Wait for room for one more append (cancelling this wait takes none)."""
        await self._room.take()

    def give_room(self) -> None:
        """Give back room taken for an append that was not queued after all."""
        self._room.give()

    def queue(self, start: Start, item: Any) -> asyncio.Future:
        """Queue ``item`` for ``start`` on the submitter (room taken already); return the
        future its outcome will complete."""
        future = self.loop.create_future()
        if not self._outbox:
            self.loop.call_soon(self._hand_over)
        self._outbox.append((start, item, future))
        return future

    async def barrier(self) -> None:
        """Return once the submitter has started every append queued before the call
        (a sync or a close then covers them)."""
        self.check_open()
        done = self.loop.create_future()
        if not self._outbox:
            self.loop.call_soon(self._hand_over)
        self._outbox.append((self._reached, None, done))
        await done

    def _reached(self, items: list[tuple[bytes, asyncio.Future]]) -> None:
        for _, done in items:
            self.loop.call_soon_threadsafe(_settle, done, None)

    def _hand_over(self) -> None:
        outbox, self._outbox = self._outbox, []
        self._work.put(outbox)

    def _submit_loop(self) -> None:
        while (batch := self._work.get()) is not None:
            # Consecutive appends of one object start together (see land()).
            for start, run in itertools.groupby(batch, key=lambda item: item[0]):
                start([(data, future) for _, data, future in run])

    def post(self, future: asyncio.Future, result: Any, error: BaseException | None) -> None:
        """From any thread: complete ``future`` on the loop and give back its room."""
        self.post_many([(future, result, error)])

    def post_many(self, outcomes: list[tuple[asyncio.Future, Any, BaseException | None]]
                  ) -> None:
        """:meth:`post` of several ``(future, result, error)``, with one wake-up."""
        with self._inbox_lock:
            self._inbox.extend(outcomes)
            if self._inbox_scheduled:
                return
            self._inbox_scheduled = True
        try:
            self.loop.call_soon_threadsafe(self.deliver)
        except RuntimeError:  # the loop is closed: nobody awaits these any more
            pass

    def land(self, started: list[tuple[Future, asyncio.Future]]) -> None:
        """Post the outcomes of ``(underneath, future)`` pairs, ``underneath`` being the
        ``concurrent.futures.Future`` of an append started in this order.

        A log completes its appends in position order, so once the last is done so are
        the others: one done-callback posts them all (a callback per record costs more
        than the append), for every :data:`LAND_RUN_MAX` of them (so that the first of
        many need not wait for the last).  Any found not done yet is posted by a
        callback of its own."""
        for first in range(0, len(started), LAND_RUN_MAX):
            run = started[first:first + LAND_RUN_MAX]
            run[-1][0].add_done_callback(functools.partial(self._land_run, run))

    def _land_run(self, run: list[tuple[Future, asyncio.Future]], _: Future) -> None:
        finished = []
        for underneath, future in run:
            if underneath.done():
                finished.append((future, *_outcome(underneath)))
            else:
                underneath.add_done_callback(functools.partial(self._land_one, future))
        self.post_many(finished)

    def _land_one(self, future: asyncio.Future, underneath: Future) -> None:
        self.post(future, *_outcome(underneath))

    def deliver(self) -> None:
        """On the loop: complete what the inbox holds (cancelled futures are skipped)."""
        with self._inbox_lock:
            items = list(self._inbox)
            self._inbox.clear()
            self._inbox_scheduled = False
        self._room.give(len(items))
        for future, result, error in items:
            if future.done():  # its task was cancelled; the append happened anyway
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    # -- streams ------------------------------------------------------------------------

    def feed(self, source: Callable[[threading.Event], Iterator[T]],
             buffer: int = FEED_BUFFER_RECORDS) -> "Feed[T]":
        """An async iterator over ``source(stop)``, run on a thread of its own."""
        self.check_open()
        feed: Feed[T] = Feed(self, source, buffer)
        self._feeds.add(feed)
        return feed

    # -- closing ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        if self._closed:
            raise self._closed_error()

    async def close(self, underneath: Callable[[], None] | None = None) -> None:
        """Stop the streams, let the submitter finish what was queued, run
        ``underneath()`` (the thread-based object's close), then stop the threads; the
        loop runs meanwhile.  Completions posted by then are delivered before it returns.
        Closing again does nothing."""
        if self._closed:
            return
        self._closed = True
        for feed in list(self._feeds):
            await feed.aclose()
        if self._outbox:
            self._hand_over()
        done = self.loop.create_future()

        def close_all() -> None:
            error: BaseException | None = None
            try:
                self._work.put(None)
                self._submitter.join()
                if underneath is not None:
                    underneath()
            except BaseException as e:  # handed to the awaiting closer
                error = e
            finally:
                self._executor.shutdown(wait=True)
                # Completions of futures reach the inbox through pybk's callback thread.
                wait_for_callbacks(CLOSE_TIMEOUT_S)
                # After every post() of the completions: the loop delivers them first.
                self.loop.call_soon_threadsafe(_settle, done, error)

        closer = threading.Thread(target=close_all, name="pybk-aio-close", daemon=True)
        closer.start()
        try:
            await asyncio.shield(done)
        finally:
            # A cancelled closer stops waiting; the close goes on, and its thread is
            # joined once it is done (at once when awaited to the end).
            if done.done():
                await _ended(closer)
            else:
                done.add_done_callback(lambda _: closer.join())
        self.deliver()


async def _ended(thread: threading.Thread) -> None:
    """Once ``thread``, which has posted its last item and is returning, has ended: the
    loop turns meanwhile instead of joining it (a busy machine may take a while to run
    those last steps of the thread's)."""
    while thread.is_alive():
        await asyncio.sleep(THREAD_END_POLL_S)
    thread.join()  # ended: returns at once


def _outcome(done: Future) -> tuple[Any, BaseException | None]:
    """``(result, None)`` or ``(None, error)`` of a finished future."""
    error = done.exception()
    return (None, error) if error is not None else (done.result(), None)


class _Room:
    """A counting semaphore of the loop, first come first served, whose uncontended
    take costs a comparison (asyncio.Semaphore's costs several µs, once per append)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self._loop = loop
        self._free = size
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    def try_take(self) -> bool:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        if self.try_take():
            return
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # set: a unit was handed to this waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed over as the task was cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def give(self, count: int = 1) -> None:
        waiters = self._waiters
        for _ in range(count):
            while waiters:
                waiter = waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    break
            else:
                self._free += 1


class Admission(Generic[T]):
    """What is queued through a bridge takes room first, then ``start`` (see
    :data:`Start`) starts it on the submitter.  After :meth:`refuse`, ``closed()`` is
    raised to callers."""

    def __init__(self, bridge: Bridge, start: Start,
                 closed: Callable[[], Exception]) -> None:
        self._bridge = bridge
        self._start = start
        self._closed_error = closed
        self._refused = False

    async def admit(self, data: bytes) -> bytes:
        """Take room for ``data`` (waiting for it); return the bytes to queue (a copy
        of a buffer the caller may reuse once this returns)."""
        return (await self.admit_many((data,)))[0]

    async def admit_many(self, buffers: Sequence[bytes]) -> list[bytes]:
        """:meth:`admit` for ``buffers`` that go out as one item: room for one, and the
        bytes of each."""
        for data in buffers:
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise TypeError(f"data must be bytes, not {type(data).__name__}")
        self.check_open()
        if not self._bridge.try_take_room():
            await self._bridge.take_room()
            try:
                self.check_open()  # it may have closed while this waited for room
            except BaseException:
                self._bridge.give_room()
                raise
        return [data if type(data) is bytes else bytes(data) for data in buffers]

    def queue(self, item: object) -> "asyncio.Future[T]":
        """Queue ``item`` (room taken: :meth:`admit`) for ``start``; the future gives
        the outcome."""
        return self._bridge.queue(self._start, item)

    def refuse(self) -> None:
        """Queue nothing more (what was queued still goes out)."""
        self._refused = True

    def check_open(self) -> None:
        if self._refused:
            raise self._closed_error()
        self._bridge.check_open()


class Submissions(Admission[T]):
    """Entries queued through a bridge (see :class:`Admission`)."""

    async def submit(self, data: bytes, entry_id: int | None = None) -> "asyncio.Future[T]":
        """Queue ``data`` once there is room (with ``entry_id``: as that entry of a ledger
        whose caller gives ids); the future gives the outcome."""
        copy = await self.admit(data)
        return self.queue(copy if entry_id is None else (entry_id, copy))

    async def wait(self, data: bytes, entry_id: int | None = None) -> T:
        """:meth:`submit`, then the outcome."""
        return await (await self.submit(data, entry_id))


class Feed(Generic[T]):
    """Items of ``source(stop)`` read on a thread ``pybk-aio-read``, at most ``buffer``
    ahead of the consumer.  ``source`` should return soon after ``stop`` is set.

    Use ``async for``; stop early with :meth:`aclose` (or ``async with``), from the
    consumer or another task (a consumer waiting then sees the end).  A feed dropped
    without aclose stops its thread when it is garbage collected; the bridge's close
    stops every feed it made."""

    def __init__(self, bridge: Bridge, source: Callable[[threading.Event], Iterator[T]],
                 buffer: int) -> None:
        self._items: asyncio.Queue[Any] = asyncio.Queue()
        self._ended = bridge.loop.create_future()  # the thread posted its last item
        self._stop = threading.Event()
        self._space = threading.Semaphore(buffer)
        self._finished = False
        self._thread = threading.Thread(
            target=_read_into, args=(bridge.loop, self._items, self._ended, source,
                                     self._stop, self._space),
            name="pybk-aio-read", daemon=True)
        weakref.finalize(self, _stop_feed, self._stop, self._space)
        self._thread.start()

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        if self._finished:
            raise StopAsyncIteration
        item = await self._items.get()
        if self._finished or item is _END:  # closed meanwhile, or the end
            await self.aclose()
            raise StopAsyncIteration
        if isinstance(item, _Failed):
            await self.aclose()
            raise item.error
        self._space.release()
        return item

    async def aclose(self) -> None:
        """Stop the thread and wait (without blocking the loop) until it has ended."""
        self._finished = True
        _stop_feed(self._stop, self._space)
        await asyncio.shield(self._ended)
        await _ended(self._thread)  # it posted its last item: it is ending now

    async def __aenter__(self) -> "Feed[T]":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(None)


class _Handoff(Generic[C]):
    """What a blocking open made, handed to its caller, or closed if the caller left."""

    def __init__(self, fn: Callable[[], C]) -> None:
        self._fn = fn
        self._lock = threading.Lock()
        self._opened: C | None = None
        self._abandoned = False

    def run(self) -> C:
        opened = self._fn()
        with self._lock:
            if not self._abandoned:
                self._opened = opened
                return opened
        opened.close()
        return opened

    def abandon(self) -> C | None:
        """The caller is gone: what was opened already, for the caller to close."""
        with self._lock:
            self._abandoned = True
            opened, self._opened = self._opened, None
            return opened


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _stop_feed(stop: threading.Event, space: threading.Semaphore) -> None:
    stop.set()
    space.release()  # wakes the thread if it waits for the consumer


def _read_into(loop: asyncio.AbstractEventLoop, items: asyncio.Queue,
               ended: asyncio.Future, source: Callable[[threading.Event], Iterator[Any]],
               stop: threading.Event, space: threading.Semaphore) -> None:
    """A feed's thread: put items on the loop's queue while the consumer makes space."""
    last: Any = _END
    try:
        produced = source(stop)
        try:
            for item in produced:
                space.acquire()
                if stop.is_set():
                    break
                loop.call_soon_threadsafe(items.put_nowait, item)
        finally:
            # Before the last item is posted, so that what the source's end does (a
            # generator's cleanup: a reader's close) is done when the consumer learns
            # that the feed ended, not after.
            close = getattr(produced, "close", None)
            if close is not None:
                close()
    except Exception as e:  # raised to the consumer (a bug underneath too, not a hang)
        last = _Failed(e)
    try:
        loop.call_soon_threadsafe(_end_feed, items, ended, last)
    except RuntimeError:  # the loop is closed: nobody reads any more
        pass


def _end_feed(items: asyncio.Queue, ended: asyncio.Future, last: Any) -> None:
    items.put_nowait(last)
    if not ended.done():
        ended.set_result(None)
