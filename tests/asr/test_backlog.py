"""A stream that sends audio faster than the engine steps it is held back (services/asr/servicer.py `Backlog`): the
service reads its next message only while its unprocessed audio is within --max-stream-backlog-s, so the rest waits
in the client (gRPC flow control), and one message longer than that is INVALID_ARGUMENT. Before, the service kept
whatever a stream sent: a probe's 16 MB messages took the gRPC process to 1.4 GB. Real server, real channel."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from tests.harness import running_service, sample_sum, scrape_samples, venv_python
from voiceagent.v1 import asr_pb2, asr_pb2_grpc, common_pb2

BACKLOG_S = 2.0
PIECE_S = 0.5
CLIP_S = 24.0


@pytest.fixture(scope="module")
def asr():
    args = ["--preset", "tiny", "--max-streams", "4", "--max-stream-backlog-s", str(BACKLOG_S), "--threads", "1"]
    with running_service("services.asr", venv_python("asr"), [*args, "--probe-ceilings", "false"]) as service:
        yield service


def _config(interim: bool) -> asr_pb2.StreamingRecognizeRequest:
    config = asr_pb2.RecognitionConfig(
        sample_rate_hz=16000, encoding=common_pb2.AUDIO_ENCODING_PCM16, chunk_ms=160, interim_results=interim
    )
    return asr_pb2.StreamingRecognizeRequest(config=config)


@pytest.mark.parametrize("interim", [True, False])
def test_a_stream_sent_at_once_is_read_as_the_engine_steps_it_and_served_whole(asr, interim):
    """24 s of audio offered at once in 0.5 s messages: the service takes the next message only while less than
    2 s is unprocessed (what it has not read waits in gRPC's flow-control window and then in the client), and the
    time it held the stream back is counted; every second is processed and the stream ends with its final result
    (the backlog learns progress from interim updates even when the client asked for none of them)."""
    samples = (np.random.default_rng(1).standard_normal(int(CLIP_S * 16000)) * 3000).astype("<i2")
    pieces = np.split(samples, int(CLIP_S / PIECE_S))

    def requests():
        yield _config(interim)
        for piece in pieces:
            yield asr_pb2.StreamingRecognizeRequest(audio=piece.tobytes())

    before = sample_sum(scrape_samples(asr.metrics_url), "voiceagent_asr_stream_backpressure_seconds_total", 0.0)
    with grpc.insecure_channel(asr.address) as channel:
        responses = list(asr_pb2_grpc.SpeechRecognizerStub(channel).StreamingRecognize(requests(), timeout=300))
    assert responses[-1].is_final and responses[-1].audio_processed_s == pytest.approx(CLIP_S, abs=0.02)
    assert all(response.is_final for response in responses) == (not interim)
    held = sample_sum(scrape_samples(asr.metrics_url), "voiceagent_asr_stream_backpressure_seconds_total") - before
    assert held > 0, "the service never held the stream back"


def test_one_message_longer_than_the_backlog_is_invalid_argument(asr):
    too_long = np.zeros(int((BACKLOG_S + 1) * 16000), "<i2").tobytes()
    with grpc.insecure_channel(asr.address) as channel:
        call = asr_pb2_grpc.SpeechRecognizerStub(channel).StreamingRecognize(
            iter([_config(True), asr_pb2.StreamingRecognizeRequest(audio=too_long)]), timeout=30
        )
        with pytest.raises(grpc.RpcError) as refused:
            list(call)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_stream_backlog_s" in refused.value.details(), refused.value.details()
