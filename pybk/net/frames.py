"""Non-blocking multipart sends and receives, at a third of pyzmq's generic cost.

``send_multipart``/``recv_multipart`` cost about 20 µs per three-frame message here,
mostly in flag enums and per-call checks; these helpers cost about 6-8 µs, which is most
of a small request's budget on the server thread.  Frames of 1 MiB and more are sent
without a copy (pyzmq's ``copy=False``: ZeroMQ keeps a reference until the bytes are
out, and pyzmq's garbage-collector thread releases it, a thread wake-up per frame);
smaller ones are copied, which costs less than that wake-up.  Received frames are copied
once into ``bytes``, except, for a receiver that asks (``view_min_bytes``), the frames
after the first of at least that size: those are read-only memoryviews of the ZeroMQ
message itself, which lives as long as they do (a bookie server keeps an ADD body's
entries as they arrived, from the socket to its journal and write cache: about 6 µs of
copying saved per 48 KiB message).
"""

from __future__ import annotations

from typing import Any, Iterator, overload

import zmq

ZERO_COPY_MIN_BYTES = 1024 * 1024

_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
# Plain ints: an enum operand makes every test build a flag object in Python.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


def send_message(socket: zmq.Socket, frames: list[bytes]) -> None:
    """Send ``frames`` as one message; raises ``zmq.Again`` (nothing sent) if the socket
    cannot take it now.  ZeroMQ accepts the later frames of a message whose first frame
    it took, so a message is never sent in part."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        socket.send(frame, _NOBLOCK if i == last else _NOBLOCK_MORE,
                    copy=len(frame) < ZERO_COPY_MIN_BYTES)


@overload
def received(socket: zmq.Socket, limit: int) -> Iterator[list[bytes]]: ...


@overload
def received(socket: zmq.Socket, limit: int,
             view_min_bytes: int) -> Iterator[list[bytes | memoryview]]: ...


def received(socket: zmq.Socket, limit: int,
             view_min_bytes: int | None = None) -> Iterator[list[Any]]:
    """The messages waiting on ``socket``, at most ``limit`` of them (a bound so that one
    busy socket does not starve the rest of an event loop); stop early by breaking.
    ``view_min_bytes``: see :func:`recv_message`."""
    for _ in range(limit):
        try:
            yield recv_message(socket, view_min_bytes)
        except zmq.Again:
            return
        # Asking costs a third of a failed receive (whose exception pyzmq builds).
        events: int = socket.getsockopt(_EVENTS)  # type: ignore[assignment]  # an int
        if not events & _POLLIN:
            return


def recv_message(socket: zmq.Socket,
                 view_min_bytes: int | None = None) -> list[bytes | memoryview]:
    """The next message's frames; raises ``zmq.Again`` if none is waiting.  The first
    frame is always ``bytes``; with ``view_min_bytes``, a later frame of at least that
    many bytes comes as a read-only memoryview of the message instead of a copy."""
    frame = socket.recv(_NOBLOCK, copy=False)
    frames: list[bytes | memoryview] = [frame.bytes]
    while frame.more:
        frame = socket.recv(_NOBLOCK, copy=False)
        if view_min_bytes is not None and len(frame) >= view_min_bytes:
            frames.append(frame.buffer.toreadonly())
        else:
            frames.append(frame.bytes)
    return frames
