"""The batched VoxCPM2 engine in its own process: requests join and leave between patch steps.

One model per device (`BatchedVoxCPM`), one step loop. Between two steps the loop reaps requests that left,
prefills the segments waiting (one pass, so a join delays the running requests by about one step at most),
and then steps every generating request by one patch. On a CUDA device a step is launched and read back
later, and prefills run on a stream of their own beside it: segments waiting at a boundary or arriving while the
step runs are prefilled then and join the next step; the running requests wait for a pass only where its host
work outlasts the step it runs beside.
The torch work runs on a worker thread, so messages from the gRPC process (joins, texts, leaves) are read
while a step runs; they take effect at the next boundary. All segments waiting at a boundary are prefilled
together in one right-padded pass (one eager pass costs about a step whatever its rows, so prefilling one
request per boundary would admit one request per step and cap the batch at a request's patch count).

Why a process: the step is many small torch calls that drop and retake the GIL around each one; next to
the gRPC server's event loop in one interpreter it would lose the GIL on every message (see the ASR
service's engine process). Messages both ways are the typed dataclasses below, over the shared Channel.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import heapq
import logging
import signal
import socket
import time

import numpy as np

from services.tts.backends.voxcpm import WorkerSpec
from services.tts.config import COMPILED_PARTS
from voiceagent.serving.channel import Channel
from voiceagent.serving.device_fault import end_process_after

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    model: WorkerSpec
    max_batch: int
    cache_positions: int = 2048
    cuda_graphs: bool = True  # on a CUDA device: capture the step per batch bucket at start-up
    vae_dtype: str = "float32"  # the audio VAE's decode: float32 as VoxCPM2 runs it, or bfloat16
    solver_attention: str = "default"  # with compile: the attention kernels of the LocDiT solve
    prefill_graphs: bool = False  # CUDA: capture the prefill per (rows, tokens) bucket too (PREFILL_ROWS, _TOKENS)
    compile_parts: tuple[str, ...] = COMPILED_PARTS  # with the model's compile: the step's parts compiled


BUCKET_STRIDE = 32  # graph buckets past 64 rows: a step's cost grows with its rows, padding is paid in full
# prefill graph buckets: segments joining together, and their text tokens (+ the audio-start token); a 49-character
# sentence is ~15 tokens; a prefill past the largest bucket runs eagerly
PREFILL_ROWS = (1, 2, 4, 8, 16, 32)
PREFILL_TOKENS = (16, 32, 64, 128)


def graph_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, ... 64, then every BUCKET_STRIDE rows, and max_batch itself: a batch replays the smallest bucket
    holding it (power-of-two buckets padded 178 rows to 256 on the H200: a 102 ms step where 192 rows cost ~80)."""
    small = {2**i for i in range(7) if 2**i <= max_batch}
    return sorted({*small, *range(64 + BUCKET_STRIDE, max_batch, BUCKET_STRIDE), max_batch})


# -- gRPC process → engine ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Join:
    request_id: int
    seed: int
    timesteps: int
    cfg_value: float


@dataclasses.dataclass(frozen=True)
class Speak:
    """The next text segment of a joined request; spoken once the previous one is done."""

    request_id: int
    segment_index: int
    text: str


@dataclasses.dataclass(frozen=True)
class Leave:
    request_id: int


@dataclasses.dataclass(frozen=True)
class Shutdown:
    pass


# -- engine → gRPC process ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Ready:
    payload: dict


@dataclasses.dataclass(frozen=True)
class StartFailed:
    message: str


@dataclasses.dataclass(frozen=True)
class Patch:
    request_id: int
    segment_index: int
    audio: np.ndarray  # float32 at the native rate, one patch
    # on a segment's first patch: steps finished since its text reached the engine, its own included
    # (1: it started at the next step boundary; 2: it also waited for the step in flight)
    waited_steps: int = 0


@dataclasses.dataclass(frozen=True)
class Patches:
    """One step's patches in one message: a row of `audio` per entry, pickled as one array (at 256 rows, 1.3 ms of
    the engine loop's time per step as 256 Patch messages, 0.3 ms as one: results/cpu/tts_patches_2026-12-04)."""

    audio: np.ndarray  # [rows, samples] float32
    entries: tuple[tuple[int, int, int], ...]  # per row: request_id, segment_index, waited_steps

    def split(self) -> list[Patch]:
        return [Patch(request, segment, self.audio[row], waited) for row, (request, segment, waited) in
                enumerate(self.entries)]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class SegmentDone:
    request_id: int
    segment_index: int
    patches: int


@dataclasses.dataclass(frozen=True)
class Failed:
    request_id: int
    message: str
    invalid: bool = False  # the request's own input (INVALID_ARGUMENT), not the engine


@dataclasses.dataclass(frozen=True)
class Stepped:
    """One batched step: how many requests it advanced, its wall time (launch to done), its model work, the prefill
    time before it (which the running requests waited for) and the prefill launched while it ran on the device
    (hidden). Of its wall time: the launch's host time (inputs into the graph's buffers, the replay issued), and the
    wait, after the device was done, for a prefill pass started beside it; the rest is the device's."""

    requests: int
    seconds: float
    flops: float
    read_bytes: float
    prefill_seconds: float
    hidden_prefill_seconds: float = 0.0
    launch_seconds: float = 0.0
    pass_wait_seconds: float = 0.0


# -- the engine process ------------------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class _Request:
    join: Join
    generator: object  # torch.Generator, seeded once per request: noise continues across its segments
    channel: int = 0  # the gRPC process it came through (several with --frontends): its messages go back there
    texts: collections.deque = dataclasses.field(default_factory=collections.deque)
    slot: int | None = None
    segment_index: int = -1
    patches: int = 0
    limit: int = 0
    context: int = 0  # tokens the LMs have cached for this segment
    queued_at_step: int = 0  # the engine's step count when the segment's text was ready to prefill
    left: bool = False
    prefilling: bool = False  # in a prefill pass now (beside a step: neither waiting nor running meanwhile)
    noise: object = None  # its next patch's noise, drawn from its generator while the device ran its last step


class _Scheduler:
    """The step loop over every request of the pod. Requests are known by (channel, their id there): each gRPC
    process numbers its own. A request's messages go back on its channel; the engine's step counters (Stepped) go to
    the first channel only, since the front ends' metrics are merged into one /metrics (frontends.py)."""

    def __init__(self, engine, work, channels: list[Channel], spec: EngineSpec):
        self.engine, self.work, self.channels, self.spec = engine, work, channels, spec
        self.free_slots = list(range(spec.max_batch))  # a min-heap: low slots first keeps the batch compact
        self.requests: dict[tuple[int, int], _Request] = {}
        self.waiting: collections.deque[_Request] = collections.deque()  # a segment to prefill
        self.running: list[_Request] = []
        self.wake = asyncio.Event()
        self.last_step_s = 0.0
        self.steps = 0
        self.prefilling: asyncio.Task | None = None  # a prefill pass beside the running steps (CUDA)
        self.next_pass = 0.0  # when the next such pass may start
        self.hidden_s = 0.0  # host seconds of those passes since the last step was reported
        self.pass_wait_s = 0.0  # the step in flight's wait for a pass, once the device was done

    def dispatch(self, message, channel: int = 0) -> None:
        import torch

        key = (channel, getattr(message, "request_id", -1))
        if isinstance(message, Join):
            generator = torch.Generator().manual_seed(message.seed)
            self.requests[key] = _Request(message, generator, channel)
        elif isinstance(message, Speak):
            if (request := self.requests.get(key)) is not None:
                request.texts.append((message.segment_index, message.text))
                if request not in self.waiting and request not in self.running:
                    self._queue(request)
        elif isinstance(message, Leave) and (request := self.requests.get(key)) is not None:
            request.left = True
        self.wake.set()

    def drop_channel(self, channel: int) -> None:
        """Its gRPC process stopped or went away: its requests leave (their slots are freed as any leaver's)."""
        for (source, _), request in self.requests.items():
            if source == channel:
                request.left = True
        self.wake.set()

    def _send(self, request: _Request, message) -> None:
        self.channels[request.channel].send(message)

    def _queue(self, request: _Request) -> None:
        request.queued_at_step = self.steps
        self.waiting.append(request)

    def _reap(self, stepping: bool = False) -> None:
        """Free the slots of requests that left. Between steps, every one; while a step is on the device
        (`stepping`), those neither it nor a prefill pass writes: requests between segments or done with their last.
        Such a slot is given up as soon as the gRPC process says the request is over, so a waiting segment can be
        prefilled into it beside the step and join the next launch; freed at the boundary instead, a join into a full
        batch waited one step more (results/h200/README.md §3h)."""
        for request in [r for r in self.requests.values() if r.left]:
            if stepping and (request.prefilling or request in self.running):
                continue
            del self.requests[request.channel, request.join.request_id]
            if request.slot is not None:
                heapq.heappush(self.free_slots, request.slot)
            if request in self.running:
                self.running.remove(request)
            if request in self.waiting:
                self.waiting.remove(request)

    def _admit(self) -> list[tuple[_Request, list[int]]]:
        """Waiting segments that get a slot now, with their text tokens (a request keeps its slot across its
        segments; one whose text cannot fit the cache fails here)."""
        from services.tts.backends.voxcpm import segment_max_len

        admitted = []
        for request in list(self.waiting):
            if request.left:
                continue  # reaped at the next boundary
            if request.slot is None:
                if not self.free_slots:
                    break  # it waits for a request to leave
                request.slot = heapq.heappop(self.free_slots)
            self.waiting.remove(request)
            request.segment_index, text = request.texts.popleft()
            tokens = self.engine.text_tokens(text)
            request.limit = self.engine.patch_limit(len(tokens), segment_max_len(self.spec.model, text))
            if request.limit < 1:
                # The gRPC process refuses such text up front (services/tts/context.py); this is the backstop.
                why = f"{len(tokens)} text tokens leave no room to speak in cache_positions {self.engine.max_length}"
                self._send(request, Failed(request.join.request_id, f"text: {why}", invalid=True))
                request.left = True
                continue
            request.patches, request.context = 0, len(tokens) + 1
            admitted.append((request, tokens))
        return admitted

    async def run(self) -> None:
        while True:
            self._reap()
            if not self.running and not self.waiting:
                self.wake.clear()
                await self.wake.wait()  # also woken when a pass beside the steps is done
                continue
            batch = self._batch()
            started = time.perf_counter()
            if not batch or not self.beside:  # the step follows this prefill: the running requests wait for it
                if self.prefilling is not None:
                    await self.prefilling
                await self._prefill(self._admit())
                batch = self._batch()
            prefill_s = time.perf_counter() - started
            if not batch:
                if self.waiting and not self.free_slots:
                    self.wake.clear()
                    await self.wake.wait()  # every slot is held by a request between segments
                continue
            await self._step(batch, prefill_s)

    def _batch(self) -> list[_Request]:
        """The next step's requests, grouped by front end (stable): each front end's rows of the step's audio are
        then one contiguous slice, sent without a copy (voiceagent/serving/channel.py)."""
        return sorted((r for r in self.running if not r.left), key=lambda r: r.channel)

    @property
    def beside(self) -> bool:
        """Whether prefills run beside a launched step (the model has a prefill stream: CUDA), so segments
        waiting at a step boundary are prefilled after the next launch rather than before it."""
        return getattr(self.engine, "prefill_stream", None) is not None

    def _admittable(self) -> bool:
        return any(not r.left and (r.slot is not None or self.free_slots) for r in self.waiting)

    async def _prefill(self, admitted: list[tuple[_Request, list[int]]]) -> None:
        """Every admitted segment in one prefill pass (about a step's time eagerly, whatever its rows)."""
        if not admitted:
            return
        slots, tokens = [r.slot for r, _ in admitted], [t for _, t in admitted]
        for request, _ in admitted:
            request.prefilling = True
        try:
            await asyncio.to_thread(self.engine.prefill, slots, tokens)
        except Exception as exc:  # these requests fail (their slots are freed at the next boundary); the rest go on
            log.exception("prefill failed")
            for request, _ in admitted:
                self._send(request, Failed(request.join.request_id, f"{type(exc).__name__}: {exc}"))
                request.left = True
            end_process_after(exc, log)  # a CUDA fault: every later step would fail too
            return
        finally:
            for request, _ in admitted:
                request.prefilling = False
        self.running += [request for request, _ in admitted if not request.left]  # one that left is reaped

    def _start_pass(self) -> None:
        """Start a prefill pass beside the running steps if one may start now: none in progress, a waiting segment
        with a slot, and half a step since the last pass started (an eager pass costs its host ~15-20 ms whatever
        its rows, so passes are spaced to gather joins; the host stays ahead of the device)."""
        if self.prefilling is not None or not self._admittable() or time.perf_counter() < self.next_pass:
            return
        admitted = self._admit()
        if not admitted:
            return
        self.next_pass = time.perf_counter() + self.last_step_s / 2

        async def prefill() -> None:
            started = time.perf_counter()
            try:
                await self._prefill(admitted)
            finally:
                self.hidden_s += time.perf_counter() - started
                self.prefilling = None
                self.wake.set()  # its requests join the next launch; the idle loop wakes for them

        self.prefilling = asyncio.ensure_future(prefill())

    async def _prefill_while_stepping(self, pending) -> None:
        """While a launched step is on the device (CUDA), start prefill passes for the segments waiting: they run
        beside it, and their requests join the next launch (a pass in flight when the step is done is waited
        for). On a CPU the step is done at launch."""
        if pending.ready():
            return
        done = asyncio.ensure_future(asyncio.to_thread(pending.wait))
        try:
            while not done.done():
                self._reap(stepping=True)
                self._start_pass()
                self.wake.clear()  # no await since the checks above: no message can have slipped in between
                woken = asyncio.ensure_future(self.wake.wait())
                timeout = None
                if self.prefilling is None and self._admittable():
                    timeout = max(0.0, self.next_pass - time.perf_counter())
                await asyncio.wait({done, woken}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
        finally:
            await done  # the step's outputs are read only once the device is done with it
            if self.prefilling is not None:  # its requests join the next launch; a pass never outlasts a step by
                waited = time.perf_counter()  # more than its own host time (results/h200 README §3f)
                await self.prefilling
                self.pass_wait_s = time.perf_counter() - waited

    async def _step(self, batch: list[_Request], prefill_s: float) -> None:
        import torch

        slots = [r.slot for r in batch]
        timesteps = [r.join.timesteps for r in batch]
        noise = torch.stack([r.noise if r.noise is not None else self.engine.noise(r.generator) for r in batch])
        started = time.perf_counter()
        self.pass_wait_s = 0.0
        try:
            pending = await asyncio.to_thread(
                self.engine.launch, slots, timesteps, [r.join.cfg_value for r in batch], noise
            )
            launch_s = time.perf_counter() - started
            for request in batch:  # the next patch's noise while the device runs this one (~10 us a row on the host);
                request.noise = self.engine.noise(request.generator)  # its draws stay in order, whatever the batch
            await self._prefill_while_stepping(pending)
            audio, stops = pending.result()  # ready: waited for above, or done at launch
        except Exception as exc:  # reported to every request of the step; the engine lives on
            log.exception("batched step failed")
            for request in batch:
                self._send(request, Failed(request.join.request_id, f"{type(exc).__name__}: {exc}"))
                request.left = True
            end_process_after(exc, log)  # a CUDA fault: every later step would fail too
            return
        self.last_step_s = time.perf_counter() - started
        self.steps += 1
        flops, read_bytes = self.work.per_step([r.context for r in batch], timesteps)
        step = Stepped(
            len(batch), self.last_step_s, flops, read_bytes, prefill_s, self.hidden_s, launch_s, self.pass_wait_s
        )
        self.channels[0].send(step)
        self.hidden_s = 0.0
        rows: dict[int, tuple[list[int], list]] = {}  # per channel: the step's rows and their entries
        done = []
        for row, (request, stop) in enumerate(zip(batch, stops, strict=True)):
            index = request.patches
            request.patches += 1
            request.context += 1
            if request.left:
                continue
            mine, entries = rows.setdefault(request.channel, ([], []))
            mine.append(row)
            entries.append((request.join.request_id, request.segment_index, self.steps - request.queued_at_step
                            if index == 0 else 0))  # fmt: skip
            if (stop and index > 2) or request.patches >= request.limit:
                done.append(request)
        audio = audio.numpy() if rows else audio
        for channel, (mine, entries) in rows.items():  # a request's patch goes before its SegmentDone
            together = mine[-1] - mine[0] + 1 == len(mine)  # the batch is grouped by channel: a slice, unless one left
            rows_audio = audio[mine[0] : mine[-1] + 1] if together else audio[mine]
            self.channels[channel].send(Patches(rows_audio, tuple(entries)))
        for request in done:
            self.running.remove(request)
            self._send(request, SegmentDone(request.join.request_id, request.segment_index, request.patches))
            if request.texts:
                self._queue(request)


def engine_main(spec: EngineSpec, socks: list[socket.socket]) -> None:
    """Entry point of the engine process: one model for the gRPC processes at the other ends of `socks` (one, or
    one per front end with `--frontends`)."""
    # The gRPC process drains its streams on SIGINT/SIGTERM and then stops this one.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s (tts engine): %(message)s")
    asyncio.run(_serve(spec, socks))


def build_engine(spec: EngineSpec):
    """The model loaded, driven in batches (BatchedVoxCPM) with the speed-ups `spec` asks for, warmed up and, on a
    CUDA device, captured per batch bucket: (engine, its PatchWork, the ready payload)."""
    import torch

    from services.tts.backends import voxcpm_model
    from services.tts.backends.batched_model import BatchedVoxCPM
    from services.tts.backends.voxcpm import load_model, ready_payload

    torch.set_num_threads(spec.model.threads)
    model = load_model(dataclasses.replace(spec.model, compile=False))  # its compiled steps are batch-1 only
    work = voxcpm_model.PatchWork(model.config, *voxcpm_model.vae_patch_work(model))
    payload = ready_payload(model, spec.model, work)  # before the engine replaces the VAE's streaming hooks
    engine = BatchedVoxCPM(model, spec.max_batch, spec.cache_positions)
    engine.fold_weight_norm()  # exact: the weights its hooks would compute at every call
    if spec.vae_dtype != "float32":
        engine.set_vae_dtype(getattr(torch, spec.vae_dtype))
    if spec.model.compile:  # CUDA only (TtsConfig.validate); compiled as the warm-up and the capture run it
        engine.compile(spec.compile_parts, spec.solver_attention)

    def warm_up() -> None:  # first calls allocate (and compile)
        for rows in sorted({1, spec.max_batch}):
            engine.prefill(list(range(rows)), [engine.text_tokens("Warm up.")] * rows)
            noise = torch.zeros(rows, engine.feat_dim, engine.patch_size)
            engine.step(list(range(rows)), [spec.model.timesteps] * rows, [spec.model.cfg_value] * rows, noise)

    try:
        warm_up()
    except Exception:
        if not engine.compiled:
            raise
        # serve uncompiled rather than not at all (Triton needs a C compiler at run time, for one); the log says why
        log.exception("the compiled step failed in its warm-up; the engine runs it uncompiled")
        engine.uncompile()
        warm_up()
    payload["shape"] |= {
        "cache_positions": engine.max_length,
        "graph_buckets": 0,
        "graph_capture_s": 0.0,
        "vae_bits": torch.finfo(engine.vae_dtype).bits,
        "solver_compiled": int(engine.compiled),
    }
    if spec.cuda_graphs and engine.device.type == "cuda":
        started = time.perf_counter()
        buckets = graph_buckets(spec.max_batch)
        try:
            engine.capture_graphs(buckets, spec.model.timesteps, spec.model.cfg_value)
        except Exception:  # serve eagerly rather than not at all; the log says why
            log.exception("CUDA graph capture failed; the engine steps eagerly")
            engine.graphs.clear()
        capture_s = time.perf_counter() - started
        log.info("captured %d CUDA graphs (buckets %s) in %.1f s", len(engine.graphs), buckets, capture_s)
        payload["shape"] |= {"graph_buckets": len(engine.graphs), "graph_capture_s": round(capture_s, 2)}
    payload["shape"]["prefill_graphs"] = 0
    if spec.prefill_graphs and engine.device.type == "cuda":
        started = time.perf_counter()
        rows = [r for r in PREFILL_ROWS if r <= spec.max_batch]
        tokens = [t for t in PREFILL_TOKENS if t < engine.max_length]
        try:
            engine.capture_prefill_graphs(rows, tokens)
        except Exception:  # prefill eagerly rather than not at all; the log says why
            log.exception("CUDA graph capture of the prefill failed; prefills run eagerly")
            engine.prefill_graphs.clear()
        log.info("captured %d prefill graphs in %.1f s", len(engine.prefill_graphs), time.perf_counter() - started)
        payload["shape"]["prefill_graphs"] = len(engine.prefill_graphs)
    return engine, work, payload


async def _serve(spec: EngineSpec, socks: list[socket.socket]) -> None:
    channels = [await Channel.open(sock) for sock in socks]
    try:
        engine, work, payload = await asyncio.to_thread(build_engine, spec)
    except Exception as exc:
        log.exception("the TTS engine failed to start")
        for channel in channels:
            channel.send(StartFailed(f"{type(exc).__name__}: {exc}"))
            await channel.close()
        return
    for channel in channels:
        channel.send(Ready(payload | {"max_batch": spec.max_batch}))
    scheduler = _Scheduler(engine, work, channels, spec)
    stepping = asyncio.create_task(scheduler.run())

    async def serve_channel(index: int) -> None:
        """One gRPC process's messages, until it shuts the engine down or goes away."""
        try:
            while (messages := await channels[index].receive()) is not None:
                for message in messages:
                    if isinstance(message, Shutdown):
                        return
                    scheduler.dispatch(message, index)
        finally:
            scheduler.drop_channel(index)

    try:
        await asyncio.gather(*(serve_channel(index) for index in range(len(channels))))
    finally:  # every gRPC process has stopped the engine or is gone
        stepping.cancel()
        for channel in channels:
            await channel.close()
