"""Non-blocking multipart sends and receives, at a third of pyzmq's generic cost.

``send_multipart``/``recv_multipart`` cost about 20 µs per three-frame message here,
mostly in flag enums and per-call checks; these helpers cost about 6-8 µs, which is most
of a small request's budget on the server thread.  Frames of 1 MiB and more are sent
without a copy (pyzmq's ``copy=False``: ZeroMQ keeps a reference until the bytes are
out, and pyzmq's garbage-collector thread releases it, a thread wake-up per frame);
smaller ones are copied, which costs less than that wake-up.  Received frames are copied
once into ``bytes``.
"""

from __future__ import annotations

from typing import Iterator

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


def received(socket: zmq.Socket, limit: int) -> Iterator[list[bytes]]:
    """The messages waiting on ``socket``, at most ``limit`` of them (a bound so that one
    busy socket does not starve the rest of an event loop); stop early by breaking."""
    for _ in range(limit):
        try:
            yield recv_message(socket)
        except zmq.Again:
            return
        # Asking costs a third of a failed receive (whose exception pyzmq builds).
        events: int = socket.getsockopt(_EVENTS)  # type: ignore[assignment]  # an int
        if not events & _POLLIN:
            return


def recv_message(socket: zmq.Socket) -> list[bytes]:
    """The next message's frames; raises ``zmq.Again`` if none is waiting."""
    frame = socket.recv(_NOBLOCK, copy=False)
    frames = [frame.bytes]
    while frame.more:
        frame = socket.recv(_NOBLOCK, copy=False)
        frames.append(frame.bytes)
    return frames
