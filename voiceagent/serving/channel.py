"""A message channel between a service's gRPC process and its engine process, over a Unix socket pair.

Messages are tuples of picklable values. `send` never blocks and may be called from any thread: messages
are queued and flushed once per event loop iteration as one length-prefixed pickle frame, so a step that
yields an update for each of 64 streams costs the receiving process one read and one unpickle, not 64.
The receiver gets each frame's messages in order; `receive` returns None once the other side is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import socket
import threading

_LENGTH_BYTES = 8


class Channel:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self.outbox: list[tuple] = []
        self.outbox_lock = threading.Lock()  # a worker thread's send must not land in a list already pickled
        self.flush_scheduled = False

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 26)
        return cls(reader, writer)

    def send(self, message: tuple) -> None:
        with self.outbox_lock:
            self.outbox.append(message)
            if self.flush_scheduled:
                return
            self.flush_scheduled = True
        if threading.get_ident() == self.loop_thread:
            self.loop.call_soon(self._flush)
        else:
            self.loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        with self.outbox_lock:
            self.flush_scheduled = False
            messages, self.outbox = self.outbox, []
        if messages and not self.writer.is_closing():
            frame = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
            self.writer.write(len(frame).to_bytes(_LENGTH_BYTES, "little") + frame)

    async def receive(self) -> list[tuple] | None:
        """The next frame's messages, or None when the other process closed its end (or died)."""
        try:
            length = int.from_bytes(await self.reader.readexactly(_LENGTH_BYTES), "little")
            return pickle.loads(await self.reader.readexactly(length))
        except (asyncio.IncompleteReadError, ConnectionError):
            return None

    async def close(self) -> None:
        self._flush()
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()
