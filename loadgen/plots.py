"""The report's PNG plots: throughput, per-request speed, latency percentiles, the roofline, voice-turn stages.

Every plot colours a level by its regime and marks the knee, so the knee and the regime show at a glance.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on a server
import matplotlib.pyplot as plt  # noqa: E402

from loadgen.levels import PRIMARY_LATENCY, SPEED_UNIT  # noqa: E402

REGIME_COLOURS = {
    "overhead-bound": "#7f7f7f",
    "bandwidth-bound": "#1f77b4",
    "compute-bound": "#ff7f0e",
    "queueing": "#d62728",
    "unknown": "#bcbd22",  # no counters and no step model (a peer server)
    "remote: not classified": "#17becf",  # an engine on another server (the LLM's openai backend)
}


def _by_regime(ax, xs, ys, analysis) -> None:
    regimes = [verdict.regime for verdict in analysis.levels] if analysis else ["overhead-bound"] * len(xs)
    ax.plot(xs, ys, "-", color="#bbbbbb", zorder=1)
    for regime, colour in REGIME_COLOURS.items():
        points = [(x, y) for x, y, r in zip(xs, ys, regimes, strict=True) if r == regime]
        if points:
            ax.scatter(*zip(*points, strict=True), color=colour, s=60, zorder=3, label=regime)


def _knee(ax, analysis) -> None:
    if analysis and analysis.knee_concurrency is not None:
        ax.axvline(analysis.knee_concurrency, color="black", linestyle=":", linewidth=1)
        ax.annotate(
            f"knee C={analysis.knee_concurrency}\n({analysis.knee_regime})",
            (analysis.knee_concurrency, 0.97),
            xycoords=("data", "axes fraction"),
            ha="left",
            va="top",
            fontsize=8,
        )


def _concurrency_axis(ax, xs) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("concurrency (users)")
    ax.grid(True, alpha=0.3)


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def throughput(sweep, analysis, out: Path) -> str:
    xs = [level.concurrency for level in sweep.levels]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    _by_regime(ax, xs, [level.throughput for level in sweep.levels], analysis)
    predicted = [(v.concurrency, v.predicted.throughput) for v in analysis.levels if v.predicted] if analysis else []
    if predicted:
        ax.plot(*zip(*predicted, strict=True), "--", color="#2ca02c", label="roofline prediction")
    _knee(ax, analysis)
    _concurrency_axis(ax, xs)
    ax.set_ylabel(sweep.levels[0].throughput_unit)
    ax.set_title(f"{sweep.target}: throughput vs concurrency")
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, out / "throughput.png")


def speed(sweep, analysis, out: Path) -> str:
    xs = [level.concurrency for level in sweep.levels]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    _by_regime(ax, xs, [level.per_request_speed for level in sweep.levels], analysis)
    if sweep.target in ("asr", "tts", "voice"):
        ax.axhline(1.0, color="#d62728", linewidth=1, linestyle="--", label="real time")
    _knee(ax, analysis)
    _concurrency_axis(ax, xs)
    ax.set_ylabel(SPEED_UNIT[sweep.target])
    ax.set_title(f"{sweep.target}: per-request speed vs concurrency")
    ax.legend(fontsize=8)
    return _save(fig, out / "speed.png")


def latency(sweep, analysis, out: Path) -> str:
    xs = [level.concurrency for level in sweep.levels]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    names = [name for name in sweep.levels[0].latency if any(level.latency[name].count for level in sweep.levels)]
    for index, name in enumerate(names):
        colour = f"C{index}"
        for quantile, style in (("p50", "-o"), ("p95", "--^"), ("p99", ":v")):
            ys = [getattr(level.latency[name], quantile) * 1000 for level in sweep.levels]
            ax.plot(xs, ys, style, color=colour, markersize=4, label=f"{name} {quantile}")
    ax.axhline(
        sweep.plan.objective * 1000,
        color="#d62728",
        linewidth=1,
        label=f"objective ({PRIMARY_LATENCY[sweep.target]} p95)",
    )
    _knee(ax, analysis)
    _concurrency_axis(ax, xs)
    ax.set_yscale("log")
    ax.set_ylabel("milliseconds")
    ax.set_title(f"{sweep.target}: latency percentiles")
    ax.legend(fontsize=6, ncol=2)
    return _save(fig, out / "latency.png")


def roofline(sweep, analysis, out: Path) -> str | None:
    data = analysis.roofline if analysis else None
    if not data or not data["peak_flops_per_s"]:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ceiling = data["ceiling"]
    ax.plot(ceiling["intensity"], ceiling["flops_per_s"], color="black", label="measured ceilings")
    ax.axvline(data["ridge_flops_per_byte"], color="black", linestyle=":", linewidth=1)
    ax.annotate(
        f"ridge {data['ridge_flops_per_byte']:.3g} FLOP/B", (data["ridge_flops_per_byte"], 0.03),
        xycoords=("data", "axes fraction"), fontsize=8,
    )  # fmt: skip
    predicted = data["predicted"]
    if predicted["intensity"]:
        ax.plot(predicted["intensity"], predicted["flops_per_s"], "--s", color="#2ca02c", markersize=4,
                label="prediction (roofline bound per level)")  # fmt: skip
    measured = data["measured"]
    for x, y, c, regime, bad in zip(measured["intensity"], measured["flops_per_s"], measured["concurrency"],
                                    measured["regime"], measured["artefact"], strict=True):  # fmt: skip
        if x <= 0 or y <= 0:
            continue
        ax.scatter([x], [y], color=REGIME_COLOURS.get(regime, "grey"), marker="x" if bad else "o", s=60, zorder=3)
        ax.annotate(f"C={c}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    for regime, colour in REGIME_COLOURS.items():
        if regime in measured["regime"]:
            ax.scatter([], [], color=colour, label=f"measured: {regime}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte read)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(f"{sweep.target}: roofline ({analysis.device})", fontsize=9)
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=7, loc="upper left")
    return _save(fig, out / "roofline.png")


def voice_stages(sweep, analysis, out: Path) -> str | None:
    """Where a voice turn's end-of-speech → first-audio time goes, per level (p50 of each stage)."""
    if sweep.target != "voice":
        return None
    xs = [str(level.concurrency) for level in sweep.levels]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    bottom = [0.0] * len(xs)
    for name, label in (("asr_final_s", "ASR final"), ("llm_ttft_s", "LLM first token"),
                        ("tts_first_audio_s", "TTS first audio")):  # fmt: skip
        heights = [level.latency[name].p50 * 1000 for level in sweep.levels]
        ax.bar(xs, heights, bottom=bottom, label=label)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xlabel("concurrency (turns in flight)")
    ax.set_ylabel("ms (p50 of each stage)")
    ax.set_title("voice turn: end of speech → first audio, by stage")
    ax.legend(fontsize=8)
    return _save(fig, out / "voice_stages.png")


def all_plots(sweep, analysis, out: Path) -> dict[str, str]:
    """Every plot that applies, by title; values are file names in `out`."""
    plots = {
        "Throughput vs concurrency": throughput(sweep, analysis, out),
        "Per-request speed vs concurrency": speed(sweep, analysis, out),
        "Latency percentiles": latency(sweep, analysis, out),
        "Roofline: achieved FLOP/s vs arithmetic intensity": roofline(sweep, analysis, out),
        "Voice turn by stage": voice_stages(sweep, analysis, out),
    }
    return {title: name for title, name in plots.items() if name}
