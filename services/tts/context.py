"""Whether the model can hold a text segment, decided in the gRPC process before the segment waits for a slot.

A VoxCPM2 generation keeps its text tokens, the audio-start token and every patch it speaks in the LM's K/V
cache: a segment needs `tokens + 1 + patches` positions, where `patches` is the most the engine lets it speak
(VoxCPM2's own cap of 6 patches per text token + 10, and `segment_max_len`: `max_patches`, or the synthetic
speaking rate). The positions are the batched engine's `cache_positions` per slot, or the model's `max_length`
for the worker pool. A segment that does not fit would fail inside the engine or be cut short; here it is refused
with the numbers and the limit's name (INVALID_ARGUMENT), before any synthesis.

The engine sends its tokenizer (tokenizer.json) in its ready payload; counting here uses the `tokenizers`
library alone (no torch), the way VoxCPM's tokenizer wrapper counts: a multi-character token of CJK ideographs
in the vocabulary is split into its characters.
"""

from __future__ import annotations

from collections.abc import Callable

BADCASE_RATIO = 6.0  # VoxCPM2 caps a generation at 6 patches per text token + 10
BADCASE_EXTRA = 10


def _ideographs(token: str) -> bool:
    return len(token) >= 2 and all("\u4e00" <= char <= "\u9fff" for char in token)


class SegmentBudget:
    """Counts a segment's text tokens and the cache positions its generation may take."""

    def __init__(self, tokenizer_json: str, positions: int, limit_name: str, patch_cap: Callable[[str], int]):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        self.positions = positions
        self.limit_name = limit_name  # e.g. "cache_positions 2048"
        self.patch_cap = patch_cap  # the engine's cap on patches for this text (segment_max_len)
        self.split_tokens = {token for token in self.tokenizer.get_vocab() if _ideographs(token)}

    def tokens(self, text: str) -> int:
        pieces = [piece.replace("▁", "") for piece in self.tokenizer.encode(text, add_special_tokens=False).tokens]
        return sum(len(piece) if piece in self.split_tokens else 1 for piece in pieces)

    def needed(self, text: str) -> tuple[int, int]:
        """(text tokens, patches the engine may speak): the segment takes tokens + 1 + patches positions."""
        tokens = self.tokens(text)
        return tokens, min(int(tokens * BADCASE_RATIO + BADCASE_EXTRA), self.patch_cap(text))

    def problem(self, text: str) -> str:
        """Why the model cannot hold `text` as one segment, or "" when it can."""
        tokens, patches = self.needed(text)
        if tokens + 1 + patches <= self.positions:
            return ""
        return (
            f"{len(text)} characters are {tokens} text tokens; with the audio-start token and up to {patches} "
            f"patches of speech they need {tokens + 1 + patches} positions, more than the model's context "
            f"({self.limit_name}): send shorter text"
        )
