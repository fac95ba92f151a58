"""The batched engine's step loop with a step still on the device (CUDA's case, which CI has no GPU for): a
segment that arrives while the step runs is prefilled before that step is read back and joins the next one; with a
prefill stream (CUDA) segments waiting at a boundary are prefilled beside the next step, not before it; with a step
done at launch (the CPU's case) a joiner waits for the boundary as before. The model is replaced by a recording one
whose launched step stays "on the device" until the test lets it finish; the real-model check (same audio, no host
sync in prefill) is results/h200/tts_overlap_check.py."""

from __future__ import annotations

import asyncio
import threading

import torch

from services.tts.backends.batched_engine import (
    EngineSpec,
    Join,
    Leave,
    Patch,
    Patches,
    SegmentDone,
    Speak,
    Stepped,
    _Scheduler,
)
from services.tts.backends.voxcpm import WorkerSpec
from services.tts.config import TtsConfig


class _Launched:
    """A step launched on a device the test controls: `ready()` is False until `finish` is set."""

    def __init__(self, rows: int, on_device: bool):
        self.rows, self.finish = rows, threading.Event()
        if not on_device:
            self.finish.set()

    def ready(self) -> bool:
        return self.finish.is_set()

    def wait(self) -> None:
        assert self.finish.wait(10), "the test never finished this step"

    def result(self):
        self.wait()
        return torch.zeros(self.rows, 4), [False] * self.rows


class _RecordingModel:
    """What the scheduler calls on BatchedVoxCPM, recorded in order: ("prefill", slots), ("launch", slots)."""

    def __init__(self, on_device: bool):
        self.on_device, self.calls, self.launched = on_device, [], []

    def text_tokens(self, text: str) -> list[int]:
        return list(range(len(text.split())))

    def patch_limit(self, tokens: int, cap: int) -> int:
        return 50

    def noise(self, generator) -> torch.Tensor:
        return torch.zeros(2, 2)

    def prefill(self, slots, token_lists) -> None:
        self.calls.append(("prefill", list(slots)))

    def launch(self, slots, timesteps, cfg_values, noise) -> _Launched:
        self.calls.append(("launch", list(slots)))
        self.launched.append(_Launched(len(slots), self.on_device))
        return self.launched[-1]


class _Work:
    def per_step(self, contexts, timesteps):
        return 0.0, 0.0


class _Outbox:
    def __init__(self):
        self.messages = []

    def send(self, message) -> None:
        self.messages.append(message)


def _spec() -> EngineSpec:
    return EngineSpec(WorkerSpec.from_config(TtsConfig()), max_batch=4)


async def _until(condition, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


async def _next_step(model: _RecordingModel) -> None:
    """Let the step on the device finish and wait for the next launch."""
    count = len(model.launched)
    model.launched[-1].finish.set()
    await _until(lambda: len(model.launched) == count + 1)


def _patches(outbox) -> list[Patch]:
    return [patch for m in outbox.messages if isinstance(m, Patches) for patch in m.split()]


def _join(scheduler: _Scheduler, request_id: int) -> None:
    scheduler.dispatch(Join(request_id, seed=request_id, timesteps=10, cfg_value=2.0))
    scheduler.dispatch(Speak(request_id, 0, f"request number {request_id} speaks"))


async def test_a_segment_arriving_during_a_step_on_the_device_is_prefilled_behind_it_and_joins_the_next():
    model, outbox = _RecordingModel(on_device=True), _Outbox()
    scheduler = _Scheduler(model, _Work(), [outbox], _spec())
    loop = asyncio.create_task(scheduler.run())
    try:
        _join(scheduler, 1)
        await _until(lambda: len(model.launched) == 1)
        assert model.calls == [("prefill", [0]), ("launch", [0])]
        _join(scheduler, 2)  # the first step is still on the device
        await _until(lambda: len(model.calls) == 3)
        assert model.calls[2] == ("prefill", [1])  # beside the running step, before it was read back
        await _until(lambda: scheduler.prefilling is None)  # the pass is done (it may also outlast a step)
        assert not _patches(outbox)
        model.launched[0].finish.set()
        await _until(lambda: len(model.launched) == 2)
        assert model.calls[3] == ("launch", [0, 1])  # no prefill in between: the joiner is in the next step
        first = [m for m in outbox.messages if isinstance(m, Stepped)][0]
        assert first.requests == 1 and first.hidden_prefill_seconds > 0
        patches = _patches(outbox)
        assert [(p.request_id, p.waited_steps) for p in patches] == [(1, 1)]
        model.launched[1].finish.set()
        await _until(lambda: len(_patches(outbox)) == 3)
        joiner = [p for p in _patches(outbox) if p.request_id == 2]
        assert joiner[0].waited_steps == 2  # it waited for the step in flight, then spoke in its own
    finally:
        loop.cancel()
        for launched in model.launched:
            launched.finish.set()
        await asyncio.gather(loop, return_exceptions=True)


async def test_with_the_step_done_at_launch_a_joiner_is_prefilled_at_the_next_boundary():
    model, outbox = _RecordingModel(on_device=False), _Outbox()
    scheduler = _Scheduler(model, _Work(), [outbox], _spec())
    gate = threading.Event()
    launch = model.launch

    def slow_launch(*args):  # a CPU step: the work happens inside launch
        gate.wait(10)
        return launch(*args)

    model.launch = slow_launch
    loop = asyncio.create_task(scheduler.run())
    try:
        _join(scheduler, 1)
        await _until(lambda: model.calls == [("prefill", [0])])
        await asyncio.sleep(0.05)  # the first step is being computed
        _join(scheduler, 2)
        gate.set()
        await _until(lambda: len(model.launched) >= 2)
        assert model.calls[:4] == [("prefill", [0]), ("launch", [0]), ("prefill", [1]), ("launch", [0, 1])]
        assert all(m.hidden_prefill_seconds == 0 for m in outbox.messages if isinstance(m, Stepped))
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_with_a_prefill_stream_a_pass_runs_beside_the_step_and_its_requests_join_the_next_launch():
    model, outbox = _RecordingModel(on_device=True), _Outbox()
    model.prefill_stream = object()  # prefills run beside the steps (CUDA)
    gate, prefill = threading.Event(), model.prefill

    def slow_prefill(slots, token_lists):  # an eager pass whose host work outlasts the step beside it
        prefill(slots, token_lists)
        if slots != [0]:
            assert gate.wait(10)

    model.prefill = slow_prefill
    scheduler = _Scheduler(model, _Work(), [outbox], _spec())
    loop = asyncio.create_task(scheduler.run())
    try:
        _join(scheduler, 1)
        await _until(lambda: len(model.launched) == 1)
        assert model.calls == [("prefill", [0]), ("launch", [0])]  # nothing ran yet: the first prefill goes first
        _join(scheduler, 2)
        await _until(lambda: ("prefill", [1]) in model.calls)  # beside step 1, not waiting for its end
        model.launched[0].finish.set()  # step 1 is done while the pass is still on the host
        await asyncio.sleep(0.1)
        assert len(model.launched) == 1  # the step waits for the pass rather than leave its request behind
        gate.set()
        await _until(lambda: len(model.launched) == 2)
        assert model.calls[-1] == ("launch", [0, 1])  # the joiner is in the very next step
        _join(scheduler, 3)  # arrives during step 2: prefilled beside it, in step 3
        await _until(lambda: ("prefill", [2]) in model.calls)
        await _until(lambda: scheduler.prefilling is None)
        await _next_step(model)
        assert model.calls[-1] == ("launch", [0, 1, 2])
        # no prefill ever ran between a step's read-back and the next launch: each came right after a launch
        for before, call in zip(model.calls[1:], model.calls[2:], strict=False):
            assert call[0] != "prefill" or before[0] == "launch", model.calls
    finally:
        loop.cancel()
        gate.set()
        for launched in model.launched:
            launched.finish.set()
        await asyncio.gather(loop, return_exceptions=True)


async def test_a_slot_given_up_during_a_step_takes_a_waiting_join_into_the_next_launch():
    """Every slot is held (max_batch 4): one by a request done with its segment whose end the gRPC process has not
    reported yet. Its Leave comes while a step is on the device: the slot is freed at once, the waiting segment is
    prefilled into it beside that step and joins the next launch (freed at the boundary, the join waited a step more).
    A request still in the step keeps its slot until the boundary."""
    model, outbox = _RecordingModel(on_device=True), _Outbox()
    model.prefill_stream = object()  # prefills run beside the steps (CUDA)
    model.patch_limit = lambda tokens, cap: 1 if tokens == 1 else 50  # a one-word text is one patch long
    scheduler = _Scheduler(model, _Work(), [outbox], _spec())
    loop = asyncio.create_task(scheduler.run())
    try:
        scheduler.dispatch(Join(1, seed=1, timesteps=10, cfg_value=2.0))
        scheduler.dispatch(Speak(1, 0, "short"))
        await _until(lambda: len(model.launched) == 1)
        for request_id in (2, 3, 4):
            _join(scheduler, request_id)
        await _until(lambda: sum(len(c[1]) for c in model.calls if c[0] == "prefill") == 4)
        await _until(lambda: scheduler.prefilling is None)
        await _next_step(model)  # request 1 spoke its one patch; the others are in the step now on the device
        assert model.calls[-1] == ("launch", [1, 2, 3])
        assert any(isinstance(m, SegmentDone) and m.request_id == 1 for m in outbox.messages)
        _join(scheduler, 5)  # no free slot: it waits
        await asyncio.sleep(0.05)
        assert model.calls[-1] == ("launch", [1, 2, 3])
        scheduler.dispatch(Leave(2))  # in the step on the device: its slot stays held until the boundary
        scheduler.dispatch(Leave(1))  # done with its segment: its slot is free now
        await _until(lambda: model.calls[-1] == ("prefill", [0]))  # beside the step still on the device
        assert len(model.launched) == 2 and not model.launched[-1].ready()
        await _until(lambda: scheduler.prefilling is None)
        await _next_step(model)
        assert model.calls[-1] == ("launch", [2, 3, 0])  # request 5 joined; request 2 left at the boundary
        assert (0, 1) not in scheduler.requests and (0, 2) not in scheduler.requests
    finally:
        loop.cancel()
        for launched in model.launched:
            launched.finish.set()
        await asyncio.gather(loop, return_exceptions=True)
