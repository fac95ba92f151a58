"""Regime labels, knee and artefacts on synthetic curves whose answers are known by construction."""

import json

import pytest

from loadgen.analysis import analyse, render_markdown
from loadgen.analysis.regimes import find_knee
from tests.loadgen.analysis_curves import facts, level, pct, roofline_llm_curve


def regimes(analysis):
    return [verdict.regime for verdict in analysis.levels]


def test_pure_bandwidth_bound_curve_has_no_knee():
    # Below the crossover (batch 20) throughput doubles with concurrency at 80% of the bandwidth roof.
    analysis = analyse(facts(), roofline_llm_curve([1, 2, 4, 8, 16]), "llm")
    assert regimes(analysis) == ["bandwidth-bound"] * 5
    assert [round(v.bandwidth_utilisation, 3) for v in analysis.levels] == [0.8] * 5
    assert analysis.knee_index is None and analysis.knee_concurrency is None
    assert "No knee up to C=16" in analysis.knee_sentence
    assert all(not v.artefact for v in analysis.levels)
    assert "not reached" not in analysis.crossover_sentence and "consistent" in analysis.crossover_sentence


def test_ridge_crossing_turns_compute_bound_and_the_knee_sits_there():
    analysis = analyse(facts(), roofline_llm_curve([1, 2, 4, 8, 16, 32, 64]), "llm")
    assert regimes(analysis) == ["bandwidth-bound"] * 5 + ["compute-bound", "queueing"]
    assert analysis.knee_concurrency == 32 and analysis.knee_regime == "compute-bound"
    assert analysis.crossover_concurrency == pytest.approx(20.0)  # ridge 20 × 200 MB ÷ (2 × 100 M params)
    assert "agrees within a factor of two" in analysis.crossover_sentence
    assert "ttft_s p50 grew 2.0×" in analysis.levels[-1].reasons[0]


def test_queueing_collapse_after_an_overhead_bound_knee():
    ttft = [0.1, 0.105, 0.11, 0.22, 0.5]
    throughput = [100, 190, 360, 370, 340]
    levels = [
        level(c, t, latency={"ttft_s": pct(lat)}, bandwidth_util=0.2 + 0.02 * i, flop_util=0.01, errors=5 * (c == 16))
        for i, (c, t, lat) in enumerate(zip([1, 2, 4, 8, 16], throughput, ttft, strict=True))
    ]
    analysis = analyse(facts(), levels, "llm")
    assert regimes(analysis) == ["overhead-bound"] * 3 + ["queueing", "queueing"]
    assert analysis.knee_concurrency == 4 and analysis.knee_regime == "overhead-bound"
    assert "failed" in analysis.levels[-1].reasons[0]
    assert "earlier" in analysis.crossover_sentence and "overhead" in analysis.crossover_sentence


def test_flat_throughput_without_latency_growth_is_not_queueing():
    # A paced load whose latency stays put is not waiting anywhere, however flat its throughput.
    levels = [level(c, 100, latency={"ttft_s": pct(0.1)}, bandwidth_util=0.7) for c in (1, 2)]
    assert regimes(analyse(facts(), levels, "llm")) == ["bandwidth-bound", "bandwidth-bound"]


def test_artefacts_above_the_ceilings_name_a_likely_cause():
    cpu = facts(device="cpu", weight_bytes=50 << 20, parameter_count=25 << 20, bandwidth=10e9, peak=200e9)
    levels = [
        level(1, 50, bandwidth_util=0.6, flop_util=0.01, ceilings=cpu),
        level(2, 100, bandwidth_util=1.6, flop_util=0.02, ceilings=cpu),
        level(4, 200, bandwidth_util=0.5, flop_util=1.3, ceilings=cpu),
    ]
    analysis = analyse(cpu, levels, "llm")
    assert analysis.levels[0].artefact == ""
    assert "160%" in analysis.levels[1].artefact and "cache" in analysis.levels[1].artefact
    assert "130% of the measured peak" in analysis.levels[2].artefact
    assert "Artefacts at C=2, 4" in analysis.summary


def test_just_above_the_ceiling_is_flagged_as_probe_noise():
    analysis = analyse(facts(), [level(1, 400, bandwidth_util=1.04, flop_util=0.05)], "llm")
    assert "104% of the measured ceiling" in analysis.levels[0].artefact
    assert "noise of the ceiling probe" in analysis.levels[0].artefact


def test_throughput_above_the_roofline_prediction_is_an_artefact():
    # The roofline allows 500 tok/s at batch 1; 750 measured cannot be real.
    analysis = analyse(facts(), [level(1, 750, bandwidth_util=0.9, flop_util=0.05)], "llm")
    assert analysis.levels[0].predicted.ratio == pytest.approx(1.5)
    assert "150% of the roofline bound" in analysis.levels[0].artefact


def test_knee_is_not_fooled_by_one_noisy_dip():
    levels = [level(c, t) for c, t in zip([1, 2, 4, 8, 16], [100, 200, 180, 400, 420], strict=True)]
    assert find_knee(levels) == 3


def test_realtime_limit_is_part_of_the_tts_verdict():
    tts = facts("tts", shape={"patch_ms": 160}, limits={"workers": 4})
    levels = [
        level(c, 1.9, realtime_ok=ok, latency={"first_audio_s": pct(0.1 * c)}, bandwidth_util=0.6, ceilings=tts)
        for c, ok in ((1, True), (2, True), (4, False))
    ]
    analysis = analyse(tts, levels, "tts")
    assert analysis.realtime_limit == 2
    assert "fell behind real time" in analysis.levels[-1].reasons[-1]
    assert "Real-time up to C=2" in analysis.summary
    assert "no crossover" in analysis.crossover_sentence.lower()


def test_without_counters_utilisation_is_estimated_from_throughput():
    levels = roofline_llm_curve([1, 2])
    for lv in levels:
        lv.server.read_bytes_per_s = lv.server.flops_per_s = lv.server.steps_per_s = 0.0
    analysis = analyse(facts(), levels, "llm")
    first = analysis.levels[0]
    assert first.utilisation_source == "estimated"
    assert first.bandwidth_utilisation == pytest.approx(0.8) and first.regime == "bandwidth-bound"


def test_a_peer_without_facts_or_counters_is_judged_on_queueing_only():
    peer = facts(parameter_count=0, weight_bytes=0, bandwidth=0.0, peak=0.0, shape={})
    levels = [level(1, 100, latency={"ttft_s": pct(0.1)}), level(2, 101, latency={"ttft_s": pct(0.2)})]
    analysis = analyse(peer, levels, "openai")
    assert regimes(analysis) == ["unknown", "queueing"]
    assert analysis.work is None and analysis.levels[0].predicted is None
    assert "No roofline prediction" in render_markdown(analysis)


def test_a_remote_engine_is_not_classified_but_its_knee_is_still_found():
    # The LLM service on its openai backend: GetInfo says device "remote", no weights, shape or ceilings.
    remote = facts(parameter_count=0, weight_bytes=0, bandwidth=0.0, peak=0.0, shape={}, device="remote")
    throughput, ttft = [100, 200, 390, 420, 430], [0.05, 0.05, 0.06, 0.11, 0.22]
    levels = [
        level(c, t, latency={"ttft_s": pct(lat)}) for c, t, lat in zip([1, 2, 4, 8, 16], throughput, ttft, strict=True)
    ]
    analysis = analyse(remote, levels, "llm", {"prompt_tokens": 64, "output_tokens": 64})
    assert regimes(analysis) == ["remote: not classified"] * 5
    assert "remote" in analysis.levels[0].reasons[0]
    assert "queueing" in analysis.levels[-1].reasons[-1], "latency growth is still reported, as a reason"
    assert analysis.knee_concurrency == 4 and analysis.work is None
    assert all(v.predicted is None and v.utilisation_source == "none" for v in analysis.levels)
    rendered = render_markdown(analysis)
    assert "remote: not classified" in rendered and "the engine is remote" in rendered
    json.dumps(analysis.to_dict())


def test_voice_turn_is_judged_on_the_shared_device_counters():
    voice = facts("voice", shape={})
    levels = [level(c, c * 0.5, latency={"voice_to_voice_s": pct(0.8)}, bandwidth_util=0.7) for c in (1, 2)]
    analysis = analyse(voice, levels, "voice")
    assert regimes(analysis) == ["bandwidth-bound", "bandwidth-bound"]
    json.dumps(analysis.to_dict())


def test_report_sections_render_every_level_and_rule():
    analysis = analyse(facts(), roofline_llm_curve([1, 2, 4, 8, 16, 32, 64]), "llm")
    markdown = render_markdown(analysis)
    assert "| component | what determines its time | predicted | measured | agreement |" in markdown
    assert "| decode, C=1 (batch 1) | bytes ÷ bandwidth: 200 MB ÷ 100 GB/s | 500 tok/s (2 ms per step) |" in markdown
    assert markdown.count("**bandwidth-bound**") == 5 and "**compute-bound**" in markdown
    assert all(rule in markdown for rule in analysis.rules)
    roofline = analysis.to_dict()["roofline"]
    assert roofline["measured"]["regime"][-1] == "queueing"
    assert max(roofline["ceiling"]["flops_per_s"]) == pytest.approx(2e12)
    json.dumps(analysis.to_dict())


def test_asr_falling_behind_real_time_is_queueing():
    asr = facts("asr", shape={"right_context_frames": 1}, backend="nemo-cache-aware")
    levels = [
        level(c, c * 0.9, realtime_ok=ok, bandwidth_util=0.6, ceilings=asr, unit="audio s/s")
        for c, ok in ((8, True), (16, True), (32, False))
    ]
    analysis = analyse(asr, levels, "asr")
    assert regimes(analysis) == ["bandwidth-bound", "bandwidth-bound", "queueing"]
    assert "fell behind real time while C=16 kept up" in analysis.levels[-1].reasons[0]
    assert analysis.realtime_limit == 16
