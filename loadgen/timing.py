"""Client-side clocks of a streamed answer, as pure bookkeeping: per-token timing and audio playback.

Kept apart from the users (which import Locust and gevent) so the rules can be checked on known inputs.
"""

from __future__ import annotations

import dataclasses

from loadgen.results import RequestRecord


@dataclasses.dataclass
class Playback:
    """A listener playing audio as it arrives: an underrun is a chunk that arrives after the audio delivered
    before it has finished playing (the gap was longer than the buffer ahead of playback)."""

    started: float | None = None
    delivered_s: float = 0.0
    stalled_s: float = 0.0  # playback time lost waiting in underruns
    underruns: int = 0

    def arrive(self, now: float, duration_s: float) -> None:
        if self.started is None:
            self.started = now
        else:
            ahead_s = self.delivered_s - (now - self.started - self.stalled_s)
            if ahead_s < 0:
                self.underruns += 1
                self.stalled_s += -ahead_s
        self.delivered_s += duration_s


@dataclasses.dataclass
class TokenClock:
    """Times a token stream: TTFT as the record's `first_s`, one inter-token latency per token in `gaps_s`.

    A message carrying k tokens after a gap g counts as k tokens each g/k apart (the engine produced them in
    one step).
    """

    record: RequestRecord
    started: float
    last: float = 0.0
    tokens: int = 0

    def arrived(self, now: float, new_tokens: int) -> None:
        if not new_tokens:
            return
        if self.record.first_s is None:
            self.record.first_s = now - self.started
            new_gaps = new_tokens - 1
        else:
            new_gaps = new_tokens
        self.record.gaps_s.extend([(now - (self.last or now)) / new_tokens] * new_gaps)
        self.tokens += new_tokens
        self.last = now

    def finish(self, completion_tokens: int = 0) -> None:
        """`completion_tokens`: the server's usage count when it reports one (it counts what it generated)."""
        record = self.record
        record.units = float(completion_tokens or self.tokens)
        decode_s = self.last - self.started - (record.first_s or 0.0)
        if record.units > 1 and record.first_s is not None and decode_s > 0:
            record.extra["decode_tokens_per_s"] = (record.units - 1) / decode_s
