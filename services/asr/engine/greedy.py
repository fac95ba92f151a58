"""Batched greedy RNN-T decoding with the decoder state of every stream in pooled tensors, one row per slot.

NeMo's `rnnt_decoder_predictions_tensor(partial_hypotheses=...)` carries state in one `Hypothesis` per stream:
every step it stacks B per-stream states into a batch, splits the result back into B items, builds B new
Hypothesis objects, concatenates each stream's whole token history (`merge_`) and re-detokenizes each whole
transcript (`decode_hypothesis`) — Python work per stream per step that grows with the transcript, and
small tensor ops that each cost a kernel launch on a GPU. Here the label-looping computer NeMo's greedy_batch
decoder runs (the same algorithm, the same tokens) gets its state gathered from the pool by slot (a view when
the slots are consecutive) and scattered back, and the step's new tokens of all streams come to the host in
one copy. Per-stream work is then O(new tokens).
"""

from __future__ import annotations

import torch
from nemo.collections.asr.parts.submodules.transducer_decoding.label_looping_base import BatchedLabelLoopingState

from services.asr.engine.slots import gather, rows, scatter


class GreedyDecoder:
    """Decoder state per slot: predictor LSTM (h, c) [layers, slots, hidden], predictor output, last label and
    decoded length; a new stream's slot starts from the state after <SOS>, as NeMo starts an empty one."""

    def __init__(self, model, slots: int, device):
        self.computer = getattr(model.decoding.decoding, "decoding_computer", None)
        if self.computer is None:
            raise ValueError("the ASR service needs greedy_batch RNN-T decoding with loop_labels (NeMo's default)")
        with torch.no_grad():  # plain tensors (not inference tensors): slots are reset outside inference mode
            start = self.computer._get_batched_decoding_state_after_sos(device=device, batch_size=1)
        if start.fusion_states_list or not isinstance(start.predictor_states, (tuple, list)):
            raise ValueError("the ASR service supports an LSTM prediction network without fusion models")
        self.start = start
        self.device = device
        # Predictor states are [layers, batch, hidden]; the others have batch first.
        self.states = [state.repeat(1, slots, 1) for state in start.predictor_states]
        self.outputs = start.predictor_outputs.repeat(slots, *[1] * (start.predictor_outputs.dim() - 1))
        self.labels = start.labels.repeat(slots)
        self.lengths = start.decoded_lengths.repeat(slots)
        self._without_nemo_graphs()

    def _without_nemo_graphs(self) -> None:
        """Decode with plain kernels, never NeMo's own CUDA graphs of this loop (every service, with or without
        graphs of its own).

        With the service's graphs, the steady and first steps decode inside them (engine/step_graphs.py), and what
        comes here is the eager steps (a short last chunk, 80 ms's second step, the offline lane), in groups of any
        size. NeMo recaptures its graphs, compiling their loop kernels with NVRTC on the step thread, for each batch
        larger than any before: in the middle of serving, as load grows (py-spy at 80 ms on an H100,
        results/h200/README.md v7). Capturing them once at start-up at the largest batch instead made every 80 ms
        step fail with an illegal memory access, most likely because the cuBLAS workspace their capture embedded
        was released by the service's own captures; NeMo's graphs captured and destroyed beside ours are also what
        crashed the main job (README, "The graph crash"), and NeMo's own loop with them crashed once the benchmark
        emptied the allocator's cache (v9). Without graphs of its own (`--cuda-graphs false`) a service kept NeMo's
        graphs until session 23, and only those services, on a GPU, ever recorded a corrupted archive (null bytes in
        host memory: results/h200/README.md v9-v11); they decode on plain kernels too now. Plain kernels cost
        launches, but they neither recompile while serving nor hold memory another capture may free."""
        self.computer.allow_cuda_graphs = False  # NeMo's maybe_enable_cuda_graphs (on eval) must not turn them on
        self.computer.disable_cuda_graphs()

    def reset(self, slots: list[int]) -> None:
        """Start `slots` from the state after <SOS>: a few kernels for all of them (one set per slot was a few
        hundred microseconds of launches per new stream on an H200)."""
        at = rows(sorted(slots), self.device)
        for pool, state in zip(self.states, self.start.predictor_states, strict=True):
            pool[:, at] = state[:, :1]
        self.outputs[at] = self.start.predictor_outputs[:1]
        self.labels[at] = self.start.labels[0]
        self.lengths[at] = self.start.decoded_lengths[0]

    def decode(self, encoded: torch.Tensor, lengths: torch.Tensor, slots: list[int]) -> list[list[int]]:
        """The new token ids of each stream for encoder output [B, D, T] with valid `lengths` [B]."""
        at = rows(slots, self.device)
        previous = BatchedLabelLoopingState(
            # contiguous: a slice of the pool along its batch dimension is not, and cuDNN's LSTM refuses that hx
            predictor_states=[gather(pool, 1, at).contiguous() for pool in self.states],
            predictor_outputs=gather(self.outputs, 0, at),
            labels=gather(self.labels, 0, at),
            decoded_lengths=gather(self.lengths, 0, at),
        )
        hyps, state = self.computer(x=encoded.transpose(1, 2), out_len=lengths, prev_batched_state=previous)
        batch = len(slots)  # with CUDA graphs NeMo returns the state padded to its graphs' batch size
        for pool, value in zip(self.states, state.predictor_states, strict=True):
            scatter(pool, 1, at, value[:, :batch])
        scatter(self.outputs, 0, at, state.predictor_outputs[:batch])
        scatter(self.labels, 0, at, state.labels[:batch])
        scatter(self.lengths, 0, at, state.decoded_lengths[:batch])
        counts, tokens, *_ = hyps.get_data_without_blank()
        # One device-to-host copy for every stream's count and tokens (the only sync of the decode).
        table = torch.cat((counts[:batch, None], tokens[:batch]), dim=1).cpu().tolist()
        return [row[1 : 1 + row[0]] for row in table]
