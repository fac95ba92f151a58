"""Request bytes that are not a valid message end INVALID_ARGUMENT (not UNKNOWN), counted by the RPC metrics, and
the server serves the next call: the shared runtime's interceptor, over a real channel to the runtime's test
service. Streamed requests are checked against the ASR and TTS services in their own suites."""

from __future__ import annotations

import grpc
import pytest

from tests.harness import sample_sum, scrape_samples
from voiceagent.v1 import tts_pb2, tts_pb2_grpc

TEXT = tts_pb2.SynthesizeRequest.DESCRIPTOR.fields_by_name["text"].number
BAD_UTF8 = bytes([TEXT << 3 | 2, 2, 0xFF, 0xFE])  # the text field, two bytes that are not UTF-8
CORRUPT = b"\x0a\xff\xff\xff\xff\x0f"  # a length far past the message's end


def _raw(channel: grpc.Channel, method: str, streaming: bool):
    """The method called with bytes as they are (no serializer)."""
    kind = channel.unary_stream if streaming else channel.unary_unary
    return kind(f"/voiceagent.v1.SpeechSynthesizer/{method}")


@pytest.mark.parametrize(
    ("method", "payload"),
    [("Synthesize", BAD_UTF8), ("Synthesize", CORRUPT), ("GetInfo", CORRUPT)],  # InfoRequest has no text field
    ids=["stream-bad_utf8", "stream-corrupt", "unary-corrupt"],
)
def test_a_request_that_does_not_parse_is_invalid_argument(paced, method, payload):
    streaming = method == "Synthesize"
    before = sample_sum(scrape_samples(paced.metrics_url), "voiceagent_paced_rpc_requests_total", method=method,
                        code="INVALID_ARGUMENT")  # fmt: skip
    with grpc.insecure_channel(paced.address) as channel:
        call = _raw(channel, method, streaming)
        with pytest.raises(grpc.RpcError) as refused:
            list(call(payload, timeout=10)) if streaming else call(payload, timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
        assert refused.value.details().startswith("request: not a valid message"), refused.value.details()
        chunks = list(tts_pb2_grpc.SpeechSynthesizerStub(channel).Synthesize(tts_pb2.SynthesizeRequest(text="ab")))
        assert len(chunks) == 2  # the next call is served
    after = sample_sum(scrape_samples(paced.metrics_url), "voiceagent_paced_rpc_requests_total", method=method,
                       code="INVALID_ARGUMENT")  # fmt: skip
    assert after == before + 1
