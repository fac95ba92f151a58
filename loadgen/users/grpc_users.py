"""The Locust users that speak our gRPC contracts: ASR, LLM, TTS, and a whole voice turn through all three."""

from __future__ import annotations

import dataclasses
import time

import gevent
import gevent.queue

from loadgen.results import RequestRecord
from loadgen.timing import Playback
from loadgen.users.base import StreamingUser
from loadgen.users.calls import generate, receive_audio, recognise, synthesis_config, synthesize
from voiceagent.v1 import llm_pb2, tts_pb2, tts_pb2_grpc


def generate_request(workload, rng, max_tokens: int, prompt: str | None = None) -> llm_pb2.GenerateRequest:
    """Random distinct token ids (benchmark traffic), or a chat turn when `prompt` is given (the voice turn)."""
    sampling = llm_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=workload.ignore_eos)
    if prompt is None:
        return llm_pb2.GenerateRequest(token_ids=llm_pb2.TokenIds(ids=workload.prompt_ids(rng)), sampling=sampling)
    chat = llm_pb2.Chat(
        messages=[
            llm_pb2.ChatMessage(role="system", content="You are a voice assistant. Answer in one short sentence."),
            llm_pb2.ChatMessage(role="user", content=prompt),
        ]
    )
    return llm_pb2.GenerateRequest(chat=chat, sampling=sampling)


class AsrUser(StreamingUser):
    """One live microphone: an utterance streamed in real time, then the next."""

    abstract = False
    target, method = "asr", "StreamingRecognize"

    def request(self) -> RequestRecord:
        audio = self.workload.utterance(self.rng)
        channel = self.context.channel(self.workload.endpoints.asr)
        return self.timed(lambda record, started: recognise(channel, audio, self.workload, record, started))


class LlmUser(StreamingUser):
    abstract = False
    target, method = "llm", "Generate"

    def request(self) -> RequestRecord:
        request = generate_request(self.workload, self.rng, self.workload.output_tokens.sample(self.rng))
        channel = self.context.channel(self.workload.endpoints.llm)
        return self.timed(lambda record, started: generate(channel, request, self.workload, record, started))


class TtsUser(StreamingUser):
    abstract = False
    target, method = "tts", "Synthesize"

    def request(self) -> RequestRecord:
        text = self.workload.text(self.rng, self.workload.text_words.sample(self.rng))
        channel = self.context.channel(self.workload.endpoints.tts)
        return self.timed(lambda record, started: synthesize(channel, text, self.workload, record, started))


class VoiceTurnUser(StreamingUser):
    """A whole turn: speech to ASR; at the final transcript the LLM starts; its text streams into TTS
    text-in synthesis as it is generated. `first_s` is end of speech → first reply audio (voice-to-voice)."""

    abstract = False
    target, method = "voice", "VoiceTurn"

    def request(self) -> RequestRecord:
        return self.timed(self._turn)

    def _turn(self, record: RequestRecord, started: float) -> None:
        workload, endpoints = self.workload, self.workload.endpoints
        scratch = dataclasses.replace(record, extra={})
        asr = dataclasses.replace(scratch, gaps_s=[], extra={})
        transcript, end_of_speech, final_at = recognise(
            self.context.channel(endpoints.asr), workload.utterance(self.rng), workload, asr, started
        )
        # Synthetic-weight recognisers often hear nothing; the turn must still exercise the LLM and TTS.
        prompt = transcript.strip() or "What is the weather like today?"

        text_pieces: gevent.queue.Queue = gevent.queue.Queue()
        tts = dataclasses.replace(scratch, gaps_s=[], extra={})
        playback = Playback()
        stream = tts_pb2_grpc.SpeechSynthesizerStub(self.context.channel(endpoints.tts)).StreamingSynthesize(
            _text_requests(text_pieces, workload), timeout=workload.timeout_s
        )
        listener = gevent.spawn(receive_audio, stream, tts, final_at, playback)

        llm = dataclasses.replace(scratch, gaps_s=[], extra={})
        request = generate_request(workload, self.rng, workload.reply_tokens.sample(self.rng), prompt)
        llm_started = time.perf_counter()
        try:
            generate(self.context.channel(endpoints.llm), request, workload, llm, llm_started, text_pieces.put)
        finally:
            text_pieces.put(None)  # half-close the text stream whatever happened
        listener.get()  # re-raises a TTS error
        if tts.first_s is None:
            raise RuntimeError("the reply produced no audio")

        first_audio_at = final_at + tts.first_s
        first_token_at = llm_started + (llm.first_s or 0.0)
        record.first_s = first_audio_at - end_of_speech
        record.units = 1.0
        record.gaps_s = tts.gaps_s
        record.extra.update(
            asr_final_s=final_at - end_of_speech,
            llm_ttft_s=first_token_at - final_at,
            tts_first_audio_s=first_audio_at - first_token_at,
            reply_tokens=llm.units,
            reply_audio_s=playback.delivered_s,
            underruns=float(playback.underruns),
            underrun_s=playback.stalled_s,
            utterance_s=asr.extra["audio_s"],
            asr_kept_up=asr.extra["kept_up"],
            transcript_words=float(len(transcript.split())),
        )


def _text_requests(pieces: gevent.queue.Queue, workload):
    """Config, then the LLM's text as it arrives; the first `flush_words` words are flushed at once so the
    first phrase is synthesised without waiting for a sentence end. None ends the stream."""
    yield tts_pb2.StreamingSynthesizeRequest(config=synthesis_config(workload))
    words, flushed = 0, False
    while (piece := pieces.get()) is not None:
        words += len(piece.split())
        flush = not flushed and words >= workload.flush_words
        flushed = flushed or flush
        yield tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextPiece(text=piece, flush=flush))
    yield tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextPiece(text="", flush=True))
