"""What a captured step may rely on, checked on its CPU twin: a CUDA graph replays raw addresses, so every
tensor the padded step reads but did not create must stay alive, in place, for as long as the service runs,
and every slot index it uses must be inside the tensors it indexes. Configured as the H200 run plan
configures the service (max streams = max batch streams, offline lanes beside them, padded first and steady
steps), then served: streams of every chunk size, a short Recognize (one offline pass) and a long one
(stepped in its offline lane). The GPU-side counterpart is tests/asr/test_cuda_graphs.py."""

from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the asr environment always has it; the import is only slow

from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

from services.asr.backend import StreamSettings  # noqa: E402
from services.asr.backends.in_process import load_in_process  # noqa: E402
from services.asr.config import AsrConfig  # noqa: E402
from services.asr.engine.offline import OFFLINE_LANES  # noqa: E402

MAX_STREAMS = 4


class ExternalInputs(TorchDispatchMode):
    """Records the storages that the ops run under it read without having created them."""

    def __init__(self):
        super().__init__()
        self.read: dict[int, tuple[StorageWeakRef, str, tuple]] = {}
        self.created: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for tensor in tree_leaves((args, kwargs or {})):
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().nbytes():
                address = tensor.untyped_storage().data_ptr()
                if address not in self.created and address not in self.read:
                    self.read[address] = (StorageWeakRef(tensor.untyped_storage()), str(func), tuple(tensor.shape))
        output = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(output):
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in self.read:
                self.created.add(tensor.untyped_storage().data_ptr())
        return output


def _serve(backend) -> None:
    """Streams of every chunk size, a short and a long Recognize, as the engine runs them (minus the loop)."""
    rng = np.random.default_rng(0)
    for chunk_ms in backend.chunk_ms_choices:
        streams = [backend._new_stream(StreamSettings(f"s{i}", chunk_ms, False)) for i in range(MAX_STREAMS)]
        for index, stream in enumerate(streams):
            stream.append(rng.standard_normal(16_000 + 4_000 * index).astype(np.float32) * 0.1, time.perf_counter())
            stream.closed = True
        while live := [s for s in streams if s.mel_consumed < s.mel_available()]:
            backend._step(sorted(live, key=lambda stream: stream.slot))
        for stream in streams:
            backend._release(stream)
        backend._offline(StreamSettings("short", chunk_ms), rng.standard_normal(8_000).astype(np.float32))
        lane = backend._new_stream(StreamSettings("long", chunk_ms), MAX_STREAMS)  # the offline lane's slot
        clip, fed = rng.standard_normal(16_000 * 3).astype(np.float32) * 0.1, 0
        while not lane.closed or lane.mel_consumed < lane.mel_available():
            fed = backend._offline_slice(lane, clip, fed)


@pytest.fixture(scope="module")
def backend():
    config = AsrConfig(
        preset="tiny", max_streams=MAX_STREAMS, max_batch_streams=MAX_STREAMS, padded_steps=True, threads=1,
        offline_pass_s=0.5,
    )  # fmt: skip
    backend = load_in_process(config)
    backend.warm_up()
    return backend


def test_every_slot_a_padded_step_uses_is_inside_its_pools(backend):
    assert backend.padded, "no padded steps were built"
    rows = {
        "encoder caches": [pool.shape[1] for pool in backend.pools.values() for pool in pool[:2]],
        "cache lengths": [pool[2].shape[0] for pool in backend.pools.values()],
        "decoder states": [state.shape[1] for state in backend.decoder.states],
        "decoder outputs": [backend.decoder.outputs.shape[0], backend.decoder.labels.shape[0]],
    }
    for step in backend.padded.values():
        # live slots 0..max_streams-1, the offline lanes after them, then the scratch slot of padding rows
        assert step.scratch_slot == MAX_STREAMS + OFFLINE_LANES
        assert step.buckets[-1] == MAX_STREAMS and step.slots.shape == (MAX_STREAMS,)
        for name, sizes in rows.items():
            assert all(step.scratch_slot < size for size in sizes), f"scratch slot {step.scratch_slot} past {name}"


def test_what_a_padded_step_reads_stays_alive_and_in_place(backend):
    reads = {}
    with torch.inference_mode():
        for key, step in backend.padded.items():
            step.slots.fill_(step.scratch_slot)
            with ExternalInputs() as inputs:
                step._forward(step.buckets[-1])
            reads[key] = inputs.read
            assert step.encoder.pos_enc.pe is step.positions
    statics = {_inputs(step)[0].data_ptr() for step in backend.padded.values()}
    assert statics <= {address for read in reads.values() for address in read}, "the static input is not read"
    _serve(backend)
    for key, read in reads.items():
        dead = [(op, shape) for ref, op, shape in read.values() if ref.expired()]
        assert not dead, f"the {key} padded step read tensors that were freed since: {dead[:5]}"
        assert backend.padded[key].encoder.pos_enc.pe is backend.padded[key].positions
    for step in backend.padded.values():  # the buffers the steps hold are the ones they read at set-up
        held = {tensor.data_ptr() for tensor in (*_inputs(step), step.slots, step.signal_length)}
        assert held <= set(reads[step.chunk_ms, step.history])


def _inputs(step) -> tuple:
    """A padded step's static inputs: its streams' audio (features computed in the step: with their lengths, the
    front end's DFT basis and filterbank, the slots' pre-encode history), else their mel frames."""
    if step.features_in_step:
        return step.audio, step.audio_length, step.mel.basis, step.mel.filterbank, step.history_pool
    return (step.signal,)
