"""A message channel between a service's gRPC process and its engine process, over a Unix socket pair.

Messages are tuples of picklable values. `send` never blocks and may be called from any thread: messages
are queued and flushed once per event loop iteration as one frame, so a step that yields an update for each of 64
streams costs the receiving process one read and one unpickle, not 64.
The receiver gets each frame's messages in order; `receive` returns None once the other side is gone.

A frame is pickled with protocol 5, its arrays' memory kept out of band: the event loop pickles only the messages'
structure and hands the frame, with views of the arrays' memory, to a sender thread, which writes it to the socket
(the GIL released while the kernel copies). Before, the loop pickled the arrays into the frame, concatenated it with
its length and wrote it through asyncio's transport, which buffered what the socket did not take at once: a TTS step of
256 patches (7.9 MB) cost the engine's loop 22-63 ms on this project's CPUs, during which it could not launch the next
step; so, 8-11 ms, all of the engine's host work included (results/cpu/tts_step_host_2026-12-07). An array is sent
from its own memory after `send` returns: the sender must not write to it afterwards (every sender here sends arrays
it made for the message). The receiver gets writable arrays, backed by the frame it read.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import queue
import select
import socket
import struct
import threading

_HEAD = struct.Struct("<QI")  # the frame's pickle length, how many out-of-band buffers follow it
_SIZE = struct.Struct("<Q")  # one buffer's length


class Channel:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer  # closes the socket; the transport reads, the sender thread writes
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self.outbox: list[tuple] = []
        self.outbox_lock = threading.Lock()  # a worker thread's send must not land in a list already pickled
        self.flush_scheduled = False
        self.frames: queue.SimpleQueue[list | None] = queue.SimpleQueue()
        self.sock = socket.socket(fileno=os.dup(writer.get_extra_info("socket").fileno()))
        self.sender = threading.Thread(target=self._write_frames, name="channel-sender", daemon=True)
        self.sender.start()

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
            buffers: list[pickle.PickleBuffer] = []
            frame = pickle.dumps(messages, protocol=5, buffer_callback=buffers.append)
            views = [buffer.raw() for buffer in buffers]
            head = _HEAD.pack(len(frame), len(views)) + b"".join(_SIZE.pack(view.nbytes) for view in views)
            self.frames.put([head, frame, *views])

    def _write_frames(self) -> None:
        """The sender thread: each frame's parts in order, until None. The socket is the transport's (a duplicate
        descriptor of it), non-blocking: a full socket buffer is waited for with select. Once the other end is gone,
        later frames are dropped, as a closed transport drops writes."""
        sock, broken = self.sock, False
        try:
            while (parts := self.frames.get()) is not None:
                if broken:
                    continue
                try:
                    for part in parts:
                        view = memoryview(part).cast("B")
                        while view:
                            try:
                                view = view[sock.send(view) :]
                            except BlockingIOError:
                                select.select([], [sock], [])
                except OSError:  # the other process closed its end, or died
                    broken = True
        finally:
            sock.close()

    async def receive(self) -> list[tuple] | None:
        """The next frame's messages, or None when the other process closed its end (or died)."""
        try:
            length, count = _HEAD.unpack(await self.reader.readexactly(_HEAD.size))
            sizes = struct.unpack(f"<{count}Q", await self.reader.readexactly(_SIZE.size * count)) if count else ()
            body = memoryview(bytearray(await self.reader.readexactly(length + sum(sizes))))  # writable arrays
        except (asyncio.IncompleteReadError, ConnectionError):
            self.frames.put(None)  # nothing more to send either: the sender thread ends, its descriptor closed
            return None
        buffers, at = [], length
        for size in sizes:
            buffers.append(body[at : at + size])
            at += size
        return pickle.loads(body[:length], buffers=buffers)

    async def close(self) -> None:
        self._flush()
        self.frames.put(None)
        await asyncio.to_thread(self.sender.join, 10.0)  # every frame sent (or dropped: the other end is gone)
        if self.sender.is_alive():  # the other end is alive but not reading: end the connection, the sender with it
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            await asyncio.to_thread(self.sender.join)
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()
