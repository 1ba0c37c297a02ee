"""Length-prefixed pickled messages over a stream socket: how the training process, its writer and
the launcher talk. Light on purpose: the launcher imports it before anything else."""

from __future__ import annotations

import pickle
import select
import socket
import struct
import time
from typing import Any

_LEN = struct.Struct("<Q")


class Channel:
    """Length-prefixed pickled messages over a stream socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def send(self, msg: Any) -> None:
        data = pickle.dumps(msg, protocol=5)
        self.sock.sendall(_LEN.pack(len(data)) + data)

    def recv(self, timeout: float | None) -> Any:
        """The next message; None if none arrives within ``timeout`` (0: poll). Raises
        :class:`EOFError` when the other end is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if len(self.buf) >= 8:
                (n,) = _LEN.unpack_from(self.buf)
                if len(self.buf) >= 8 + n:
                    msg = pickle.loads(bytes(self.buf[8 : 8 + n]))
                    del self.buf[: 8 + n]
                    return msg
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                return None
            try:
                chunk = self.sock.recv(1 << 20)
            except OSError as e:
                raise EOFError(str(e)) from None
            if not chunk:
                raise EOFError("closed")
            self.buf += chunk


#: In the training process: its channel to the launcher (None: there is no launcher). Set by
#: :func:`flortrain.process.launcher.launch`; read by the materializer, which hands the launcher
#: its last keys. Kept here, at the bottom of the layers, so the runtime needs nothing above it.
to_launcher: Channel | None = None
#: In the training process: the socket its writer, forked from it, sends its results on.
writer_end: socket.socket | None = None
