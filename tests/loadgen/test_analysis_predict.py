"""Roofline predictions against values computed by hand for known model shapes on known ceilings."""

import pytest

from loadgen.analysis import analyse, render_markdown
from loadgen.analysis.predict import crossover_batch, predict_level, realtime_streams
from loadgen.analysis.work import asr_step_work, llm_step_work, tts_step_work
from tests.loadgen.analysis_curves import facts, level, pct

# LLM: 100 M params, 200 MB bf16 weights, 4 layers × 8 heads (2 KV heads) × 64; 100 GB/s, 2 TFLOP/s, ridge 20.
# Context = 936 prompt + 128/2 output = 1,000 tokens.
#   KV bytes per sequence = 2·4·2·64·2 B·1000 = 2,048,000     attention per token = 4·4·8·64·1000 = 8,192,000 FLOPs
WORKLOAD = {"prompt_tokens": 936, "output_tokens": 128}


def test_llm_decode_step_at_batch_8():
    f = facts()
    work = llm_step_work(f, [], WORKLOAD)
    predicted = predict_level(work, f, level(8, 3000.0))
    # bytes = 200e6 + 8·2.048e6 = 216.384e6 → 2.16384 ms;  FLOPs = 8·(200e6 + 8.192e6) = 1.665536e9 → 0.832768 ms
    assert predicted.read_bytes_per_step == pytest.approx(216.384e6)
    assert predicted.flops_per_step == pytest.approx(1.665536e9)
    assert predicted.bytes_time_s == pytest.approx(2.16384e-3)
    assert predicted.flops_time_s == pytest.approx(0.832768e-3)
    assert predicted.bound == "bandwidth"
    assert predicted.throughput == pytest.approx(3697.131, rel=1e-6)  # 8 ÷ 2.16384 ms
    assert predicted.per_stream_speed == pytest.approx(462.141, rel=1e-5)
    assert predicted.ratio == pytest.approx(3000 / 3697.131, rel=1e-6)


def test_measured_step_is_the_inter_token_latency():
    f = facts()
    measured = level(1, 400.0, latency={"itl_s": pct(0.0025)})
    assert predict_level(llm_step_work(f, []), f, measured, target="llm").measured_step_s == 0.0025
    assert "| 1 | bandwidth | 2 ms | 2.5 ms | 500 tok/s | 400 tok/s | 80% |" in render_markdown(
        analyse(f, [measured], "llm")
    )


def test_llm_crossover_and_prefill():
    f = facts()
    work = llm_step_work(f, [], WORKLOAD)
    # B* = 20·200e6 ÷ (208.192e6 − 20·2.048e6) = 4e9 ÷ 167.232e6
    assert crossover_batch(work, f) == pytest.approx(23.9189, rel=1e-5)
    # Weights only: B* = ridge × bytes per param ÷ 2 = 20 × 2 ÷ 2
    assert crossover_batch(llm_step_work(f, []), f) == pytest.approx(20.0)
    # Prefill: (2·100e6 + 4·4·8·64·468) FLOPs per prompt token × 936 tokens ÷ 2 TFLOP/s = 95.39 ms
    predicted = predict_level(work, f, level(1, 400.0), prompt_tokens=936)
    assert predicted.first_latency_s == pytest.approx(203_833_856 * 936 / 2e12)


def test_llm_uses_the_services_published_per_step_terms():
    f = facts()
    f.shape = {
        "step_weight_bytes": 180e6,  # matmul weights (the embedding is gathered, not read whole)
        "embedding_bytes_per_token": 1024,
        "kv_bytes_per_token": 2048,
        "flops_per_token": 180e6,
        "attention_flops_per_pair": 8192,
        "logits_flops_per_row": 8e6,
    }
    work = llm_step_work(f, [], {"prompt_tokens": 100, "output_tokens": 200})  # context 100 + 200/2 = 200
    # batch 4: 180e6 + 4·(1024 + 2048·200) bytes;  4·(180e6 + 8e6 + 8192·200) FLOPs
    assert work.read_bytes(4) == pytest.approx(181_642_496)
    assert work.flops(4) == pytest.approx(758_553_600)
    assert work.prefill_flops_per_token == pytest.approx(180e6 + 8192 * 50)


def test_llm_admission_limit_caps_the_batch():
    f = facts(limits={"max_num_seqs": 16})
    predicted = predict_level(llm_step_work(f, []), f, level(64, 5000.0))
    # batch 16: max(2 ms, 16·0.1 ms) = 2 ms → 8,000 tok/s, however many users wait
    assert predicted.batch == 16 and predicted.throughput == pytest.approx(8000.0)


def test_llm_falls_back_to_the_services_counters_without_model_facts():
    f = facts(parameter_count=0, weight_bytes=0)
    # 250 steps/s of 2 tokens: 200 MB and 800 MFLOP per step → weights 200 MB, 2·params = 400 MFLOP per token
    measured = level(2, 500.0, bandwidth_util=0.5, flop_util=0.1, steps_per_s=250.0, ceilings=f)
    work = llm_step_work(f, [measured])
    assert work.source == "service's counters"
    assert work.bytes_fixed == pytest.approx(200e6) and work.flops_per_stream == pytest.approx(400e6)


ASR_SHAPE = {"layers": 4, "d_model": 256, "left_context_frames": 56, "right_context_frames": 3, "conv_kernel_size": 9}


def asr_facts(**shape):
    return facts(
        "asr",
        parameter_count=10_000_000,
        weight_bytes=40_000_000,
        bandwidth=10e9,
        peak=100e9,
        shape={**ASR_SHAPE, **shape},
        backend="nemo-cache-aware",
        dtype="float32",
    )


def test_asr_cache_aware_step_and_realtime_streams():
    f = asr_facts()
    work = asr_step_work(f, [])
    # chunk = (3 + 1) × 80 ms; cache per stream = 4·256·(56 + 9 − 1)·4 B; FLOPs = 2·10e6·4 + 4·4·256·(56+4)·4
    assert work.units_per_stream_step == pytest.approx(0.32)
    assert work.bytes_per_stream == pytest.approx(262_144)
    assert work.flops_per_stream == pytest.approx(80_983_040)
    one = predict_level(work, f, level(1, 1.0, unit="audio s/s"))
    assert one.step_time_s == pytest.approx(4.0262144e-3) and one.bound == "bandwidth"
    assert one.throughput == pytest.approx(1.0)  # paced: one stream offers one audio second per second
    many = predict_level(work, f, level(64, 64.0, unit="audio s/s"))
    assert many.bound == "compute" and many.step_time_s == pytest.approx(64 * 80_983_040 / 100e9)
    # min((0.32·10e9 − 40e6) ÷ 262,144, 0.32·100e9 ÷ 80,983,040) = min(12,054.6, 395.1)
    assert realtime_streams(work, f) == 395
    assert crossover_batch(work, f) == pytest.approx(4e8 / 78_361_600)


def test_analyse_takes_the_sweeps_workload_as_it_is():
    from loadgen.workload import Lengths, Workload

    levels = [level(4, 4.0, unit="audio s/s")]
    analysis = analyse(asr_facts(), levels, "asr", Workload(chunk_ms=560))
    assert analysis.work.units_per_stream_step == pytest.approx(0.56)
    llm = analyse(
        facts(), [level(1, 400.0)], "llm", Workload(prompt_tokens=Lengths("32-96"), output_tokens=Lengths("64"))
    )
    assert llm.levels[0].predicted.first_latency_s == pytest.approx((2 * 100e6 + 4 * 4 * 8 * 64 * 32) * 64 / 2e12)


def test_asr_chunk_size_follows_the_right_context():
    assert asr_step_work(asr_facts(right_context_frames=0), []).units_per_stream_step == pytest.approx(0.08)
    assert asr_step_work(asr_facts(right_context_frames=13), []).units_per_stream_step == pytest.approx(1.12)


def test_asr_buffered_reencodes_its_window():
    f = asr_facts(buffer_window_frames=50)
    f.backend = "nemo-buffered"
    work = asr_step_work(f, [])
    # 50 frames per chunk instead of 4, attention over the window only, no caches kept
    assert work.flops_per_stream == pytest.approx(2 * 10e6 * 50 + 4 * 4 * 256 * 50 * 50)
    assert work.bytes_per_stream == 0


TTS_SHAPE = {"dit_parameter_count": 100e6, "inference_timesteps": 10, "patch_size": 4, "patch_ms": 160}


def tts_facts():
    f = facts("tts", parameter_count=500_000_000, weight_bytes=1_000_000_000, peak=1e12, shape=TTS_SHAPE)
    f.limits = {"workers": 4}
    return f


def test_tts_patch_time_rtf_and_workers():
    f = tts_facts()
    work = tts_step_work(f, [])
    # 10 steps → 9 DiT calls (the solver skips the first); the DiT sees 2·4 + 3 = 11 tokens, twice (guidance).
    # bytes = 1e9 + (9 − 1)·100e6·2 B = 2.6e9 → 26 ms;  FLOPs = 2·400e6 + 9·2·100e6·11·2 = 40.4e9 → 40.4 ms
    assert work.bytes_per_stream == pytest.approx(2.6e9) and work.flops_per_stream == pytest.approx(40.4e9)
    one = predict_level(work, f, level(1, 1.5, unit="audio s/s"))
    assert one.step_time_s == pytest.approx(0.0404) and one.bound == "compute"
    assert one.per_stream_speed == pytest.approx(0.16 / 0.0404)  # RTF 0.2525
    eight = predict_level(work, f, level(8, 1.5, unit="audio s/s"))
    # 4 workers side by side share the device: each patch takes 4 × 40.4 ms; audio s/s does not grow
    assert eight.batch == 4 and eight.step_time_s == pytest.approx(0.1616)
    assert eight.throughput == pytest.approx(0.16 / 0.0404)
    assert realtime_streams(work, f) == 3  # ⌊160 ÷ 40.4⌋
    assert crossover_batch(work, f) is None


def test_tts_diffusion_steps_from_the_workload():
    work = tts_step_work(tts_facts(), [], {"inference_timesteps": 4})
    # 4 steps → 3 calls: bytes 1e9 + 2·100e6·2 = 1.4e9; FLOPs 0.8e9 + 3·2·100e6·11·2 = 14e9
    assert work.bytes_per_stream == pytest.approx(1.4e9) and work.flops_per_stream == pytest.approx(14e9)


def test_tts_prefers_the_services_own_patch_work():
    f = tts_facts()
    counted = level(1, 1.0, bandwidth_util=0.3, flop_util=0.01, steps_per_s=10.0, ceilings=f, unit="audio s/s")
    work = tts_step_work(f, [counted])
    # 30 GB/s ÷ 10 patches/s and 10 GFLOP/s ÷ 10 patches/s
    assert work.source == "service's counters"
    assert work.bytes_per_stream == pytest.approx(3e9) and work.flops_per_stream == pytest.approx(1e9)
    # Published per-patch FLOPs at the default 9 calls; 4 steps → 3 calls: 6 calls × 4.4 GFLOP fewer
    f.shape = {**TTS_SHAPE, "flops_per_patch_at_context_0": 40.4e9, "dit_calls_per_patch": 9}
    assert tts_step_work(f, [], {"inference_timesteps": 4}).flops_per_stream == pytest.approx(14e9)


def test_tts_predictions_table_compares_rtf_and_first_audio():
    levels = [level(1, 3.0, per_request_speed=3.0, latency={"first_audio_s": pct(0.05)}, unit="audio s/s")]
    table = {row["component"]: row for row in analyse(tts_facts(), levels, "tts").predictions_table}
    rtf = table["real-time factor, C=1"]
    assert rtf["predicted"].startswith("0.25") and rtf["measured"] == "0.333" and rtf["agreement"] == "76% of the bound"
    assert table["first audio p50, C=1"]["predicted"] == "40.4 ms"
    assert table["first audio p50, C=1"]["agreement"] == "81% of the bound"
    assert table["real-time streams"]["predicted"] == "3"


def test_asr_uses_the_services_published_work_and_the_workloads_chunk():
    shape = {"layers": 4, "hidden_size": 256, "left_context_frames": 56, "encoder_frame_ms": 80}
    f = asr_facts()
    f.shape = {**shape, "encoder_flops_per_frame": 5e6, "decoder_params": 1e6, "cache_bytes_per_stream": 300_000}
    work = asr_step_work(f, [], {"chunk_ms": 560})
    # 560 ms = 7 frames; (5e6 + 2·1e6) FLOPs per frame
    assert work.units_per_stream_step == pytest.approx(0.56)
    assert work.flops_per_stream == pytest.approx(7 * 7e6) and work.bytes_per_stream == 300_000
    unknown = asr_step_work(f, [])
    assert unknown.units_per_stream_step == pytest.approx(0.16) and "assumed 160 ms" in unknown.notes[0]
