"""Synthetic sweeps with known answers, for the analysis and plan tests: facts of a known model on known ceilings,
and levels built from stated throughputs, latencies and utilisations."""

from __future__ import annotations

from loadgen.results import LevelResult, Percentiles, ServerCounters, ServiceFacts

# A 100 M-parameter bf16 LLM on a device with 100 GB/s and 2 TFLOP/s: ridge 20 FLOP/byte.
LLM_SHAPE = {"layers": 4, "hidden_size": 512, "heads": 8, "kv_heads": 2, "head_dim": 64, "vocab_size": 8192}


def facts(
    service: str = "llm",
    *,
    parameter_count: int = 100_000_000,
    weight_bytes: int = 200_000_000,
    bandwidth: float = 100e9,
    peak: float = 2e12,
    shape: dict | None = None,
    limits: dict | None = None,
    device: str = "cuda:0",
    backend: str = "vllm",
    dtype: str = "bfloat16",
) -> ServiceFacts:
    return ServiceFacts(
        service=service,
        backend=backend,
        preset="test",
        dtype=dtype,
        device=device,
        device_name="test device",
        parameter_count=parameter_count,
        weight_bytes=weight_bytes,
        memory_bandwidth_bytes_per_s=bandwidth,
        peak_flops_per_s=peak,
        shape=dict(LLM_SHAPE if shape is None and service == "llm" else shape or {}),
        limits=dict(limits or {}),
    )


def pct(p50: float, p95: float | None = None) -> Percentiles:
    p95 = p50 * 1.5 if p95 is None else p95
    return Percentiles(p50=p50, p90=p95 * 0.95, p95=p95, p99=p95 * 1.2, mean=p50, count=100)


def level(
    concurrency: int,
    throughput: float,
    *,
    latency: dict[str, Percentiles] | None = None,
    bandwidth_util: float = 0.0,
    flop_util: float = 0.0,
    ceilings: ServiceFacts | None = None,
    steps_per_s: float = 0.0,
    errors: int = 0,
    realtime_ok: bool | None = None,
    per_request_speed: float = 0.0,
    unit: str = "tokens/s",
) -> LevelResult:
    """A level whose service counters sit at the given shares of `ceilings`' bandwidth and peak."""
    ceilings = ceilings or facts()
    return LevelResult(
        concurrency=concurrency,
        duration_s=10.0,
        requests=100,
        errors=errors,
        throughput=throughput,
        throughput_unit=unit,
        per_request_speed=per_request_speed or throughput / concurrency,
        latency=latency or {},
        server=ServerCounters(
            flops_per_s=flop_util * ceilings.peak_flops_per_s,
            read_bytes_per_s=bandwidth_util * ceilings.memory_bandwidth_bytes_per_s,
            steps_per_s=steps_per_s,
        ),
        realtime_ok=realtime_ok,
    )


def roofline_llm_curve(concurrencies, efficiency: float = 0.8, output_tokens: int = 64) -> list[LevelResult]:
    """LLM levels that run at `efficiency` of the weights-only roofline of `facts()`.

    Step time = max(W/bw, 2·P·B/peak) = max(2 ms, 0.1 ms·B): bandwidth-bound below B = 20, compute-bound above.
    Latency follows Little's law for a closed loop: a request of `output_tokens` takes C·tokens ÷ throughput.
    """
    f = facts()
    levels = []
    for c in concurrencies:
        step = max(f.weight_bytes / f.memory_bandwidth_bytes_per_s, 2 * f.parameter_count * c / f.peak_flops_per_s)
        throughput = efficiency * c / step
        steps_per_s = efficiency / step
        read = f.weight_bytes * steps_per_s / f.memory_bandwidth_bytes_per_s
        compute = 2 * f.parameter_count * c * steps_per_s / f.peak_flops_per_s
        request_s = c * output_tokens / throughput
        levels.append(
            level(
                c,
                throughput,
                latency={"ttft_s": pct(request_s / output_tokens), "e2e_s": pct(request_s)},
                bandwidth_util=read,
                flop_util=compute,
                steps_per_s=steps_per_s,
                ceilings=f,
            )
        )
    return levels
