"""Sending and receiving multipart messages on a zmq socket without pyzmq's
per-frame flag arithmetic (``zmq.SNDMORE | flags`` builds enums: pure Python
in 3.11, a tenth of a relay node's time and of an engine's reply)."""

from __future__ import annotations

import zmq

_MORE, _NOBLOCK = int(zmq.SNDMORE), int(zmq.NOBLOCK)


def send_frames(sock: zmq.Socket, frames, copy: bool = False) -> None:
    """``sock.send_multipart(frames, copy=copy)``."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        sock.send(frame, _MORE if i < last else 0, copy=copy)


def recv_frames(sock: zmq.Socket) -> list:
    """``recv_multipart(NOBLOCK, copy=False)``, reading ``Frame.more`` instead
    of a socket option per frame; raises ``zmq.Again`` if nothing is there."""
    frames = [sock.recv(_NOBLOCK, copy=False)]
    while frames[-1].more:
        frames.append(sock.recv(0, copy=False))
    return frames
