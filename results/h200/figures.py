"""The H200 figures as JSON and PNG plots, parsed from the raw outputs in results/h200/raw/.

Run from the repository root with the dev venv: `python results/h200/figures.py`. Writes figures.json and plots/*.png
next to this script; every figure keeps the name of the raw file it came from.
"""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on a server
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

HERE = Path(__file__).resolve().parent
RAW = HERE / "raw"
PLOTS = HERE / "plots"

# variant -> (raw file, column or progress-line name in that file)
ASR_VARIANTS = {
    "engine-direct fp32": ("asr_engine.txt", "engine-direct"),
    "engine-direct bf16": ("asr_engine_bf16.txt", "engine-direct"),
    "service cache-aware v1": ("asr_cache_aware.txt", "service cache-aware"),
    "service buffered v1": ("asr_buffered.txt", "service buffered"),
    "service cache-aware v2": ("asr_cache_aware_v2.txt", "service cache-aware"),
    "service cache-aware v2, 80 ms messages": ("asr_cache_aware_v2_80ms_piece80.txt", "service cache-aware"),
    # issue 17 (2026-12-03): NeMo's own loop, then the service with its steady step in CUDA graphs
    "engine-direct bf16, issue 17": ("asr_graphs_bench_320_search_bug.txt", "engine-direct"),
    "service cache-aware v4 graphs, power-of-two buckets": (
        "asr_graphs_service_320_pow2_buckets.txt",
        "service cache-aware",
    ),
    "service cache-aware v4 graphs": ("asr_graphs_service_320.txt", "service cache-aware"),
}
ASR_PLOTTED = list(ASR_VARIANTS)[:5]
ASR_PROGRESS = re.compile(r"^\s+(engine-direct|service cache-aware|service buffered)\s+(\d+) ms: (\d+) streams$", re.M)
ASR_CELL = re.compile(r"^\s*(\d+) \(RTF ([\d.]+|nan)\)\s*$")
TTS_CONCURRENCY_1 = re.compile(r"^(VoxCPM direct|service \(gRPC\))\s+([\d.]+)\s+([\d.]+)$", re.M)
TTS_THROUGHPUT = re.compile(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+[\d.]+x$", re.M)
LLM_PRESET = re.compile(r"^LLM benchmark: preset (\S+) ", re.M)
LLM_ROW = re.compile(
    r"^\s+(\d+)\s+(engine-direct|grpc-service)\s+(\d+)\s+(\d+)"  # concurrency, path, requests, failed
    r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)[ \t]*([\d.]+)?$",  # TTFT p50, p99, tokens/s, CPU, servicer
    re.M,
)
LLM_PATHS = ("engine-direct", "grpc-service")
LLM_FRONTENDS = re.compile(r"service front ends (\d+)")


def device_ceilings() -> dict:
    """Per dtype, every probe's read bandwidth (TB/s) and matmul peak (TFLOP/s)."""
    ceilings: dict = {}
    for probe in json.loads((RAW / "ceilings.json").read_text()):
        entry = ceilings.setdefault(
            probe["dtype"], {"read_bandwidth_tb_s": [], "matmul_peak_tflop_s": [], "source": "ceilings.json"}
        )
        entry["read_bandwidth_tb_s"].append(round(probe["memory_bandwidth_bytes_per_s"] / 1e12, 3))
        entry["matmul_peak_tflop_s"].append(round(probe["peak_flops_per_s"] / 1e12, 1))
    return ceilings


def asr_capacity(source: str, column: str) -> list[dict]:
    """Streams carried per chunk size from the capacity table; without a table, from the progress lines (no RTF)."""
    text = (RAW / source).read_text()
    lines = text.splitlines()
    header = next((line for line in lines if line.startswith("chunk_ms |")), None)
    if header is None:
        return [
            {"chunk_ms": int(chunk), "streams": int(streams), "rtf": None}
            for name, chunk, streams in ASR_PROGRESS.findall(text)
            if name == column
        ]
    index = [name.strip() for name in header.split("|")].index(column)
    points = []
    for line in lines[lines.index(header) + 1 :]:
        cells = line.split("|")
        if len(cells) <= index or not cells[0].strip().isdigit():
            continue
        streams, rtf = ASR_CELL.match(cells[index]).groups()
        if rtf != "nan":  # 0 with RTF nan = not measured
            points.append({"chunk_ms": int(cells[0]), "streams": int(streams), "rtf": float(rtf)})
    return points


def asr_figures() -> dict:
    return {
        variant: {"source": source, "points": sorted(asr_capacity(source, column), key=lambda p: p["chunk_ms"])}
        for variant, (source, column) in ASR_VARIANTS.items()
    }


ASR_SERVICE_FLAGS = re.compile(r"service flags (.+?); clips")
ASR_SPLIT_LEVEL = re.compile(
    r"^\s*(\d+) \|\s+(\d+) \| ([\d.]+) \|\s+([\d.]+) \|.*\|\s+([\d.]+) \| ([\d.]+) \|\s+(\d+) \|\s+([\d.]+) "
    r"\|\s+(\d+) \| ([\d.]+)$",
    re.M,
)
ASR_SPLIT_PROCESS = re.compile(r"^    pid (\d+) \(.*\): ([\d.]+) CPU-s/s, busiest thread \d+ (\S+) ([\d.]+)$", re.M)


PY_SPY_MARKS = {  # where the README's py-spy figures come from: samples whose stack holds the function
    "waiting_on_the_graph": "PaddedStep.run (asr/engine/step_graphs.py:246)",
    "new_streams": "BatchingBackend._new_stream",
    "slot_resets": "CacheAwareBackend.reset_slot",
    "decoder_resets": "GreedyDecoder.reset",
    "next_segment": "FeatureStream.next_segment",
    "mel_frames": "mel_frames",
}


def py_spy_summary(path: Path, functions: dict[str, str] = PY_SPY_MARKS) -> dict:
    """A py-spy raw record (folded stacks, --threads, 200 Hz): active samples per thread, and per mark of `functions`
    (the samples whose stack holds that function)."""
    threads: dict[str, int] = {}
    marks = dict.fromkeys(functions, 0)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        name = frames[0].split(": ", 1)[-1]
        threads[name] = threads.get(name, 0) + int(count)
        for mark, function in functions.items():
            if any(frame.startswith(function) for frame in frames[1:]):
                marks[mark] += int(count)
    return {"source": path.relative_to(RAW).as_posix(), "rate_hz": 200, "samples_per_thread": threads, **marks}


def split_levels(text: str, value: str) -> list[dict]:
    """asr_cpu_split.py's level rows; `value` names its third column (rtf, or p95_over_chunk with --paced)."""
    return [
        {"streams": int(n), "clients": int(k), value: float(v), "wall_s": float(wall),
         "engine_processes_cpu_s_per_s": float(engine), "clients_cpu_s_per_s": float(clients), "steps": int(steps),
         "streams_per_step": float(per_step), "ms_per_step": int(ms), "stepping_share_of_wall": float(share)}
        for n, k, v, wall, engine, clients, steps, per_step, ms, share in ASR_SPLIT_LEVEL.findall(text)
    ]  # fmt: skip


def asr_clocked_figures() -> dict:
    """Issue 17, session 14: capacity through gRPC at 320/80 ms with the clocked policy and front ends (one trial
    each), and where the engine process's time goes at 704 streams (asr_cpu_split.py)."""
    folder = RAW / "asr_clocked"
    runs = {}
    for path in sorted(folder.glob("asr_graphs_service_*.txt")):
        text = path.read_text()
        runs[path.stem.removeprefix("asr_graphs_service_")] = {
            "source": path.relative_to(RAW).as_posix(),
            "service_flags": ASR_SERVICE_FLAGS.search(text).group(1),
            "points": asr_capacity(path.relative_to(RAW).as_posix(), "service cache-aware"),
        }
    split = folder / "asr_cpu_split_clocked_fe4.txt"
    text = split.read_text()
    levels = split_levels(text, "rtf")
    processes = [
        {"pid": int(pid), "cpu_s_per_s": float(cpu), "busiest_thread": name, "busiest_thread_cpu_s_per_s": float(top)}
        for pid, cpu, name, top in ASR_SPLIT_PROCESS.findall(text)
    ]
    return {
        "capacity": runs,
        "cpu_split": {
            "source": split.relative_to(RAW).as_posix(),
            "levels": levels,
            "processes_at_first_level": processes,
        },  # fmt: skip
        "engine_py_spy": py_spy_summary(folder / "spy" / "704_521.txt"),
    }


ASR_PROBE = re.compile(r"^    probe: (\d+) streams, (\S+) \((\w+)\) ([\d.]+)$", re.M)
ASR_FOUND = re.compile(r"^  (\w+) (\d+) ms: (\d+) streams \(\S+ ([\d.]+)\)$", re.M)
ASR_COMPARE_FLAGS = re.compile(r"; flags (.*?); base")
ASR_PROFILE_SERVED = re.compile(
    r"^===== B = (\d+), (\w+) attention: a\) step as served ([\d.]+) ms \(graph replay alone ([\d.]+) ms\).*?"
    r"counted ([\d.]+) TFLOP and ([\d.]+) GB per step",
    re.M,
)
ASR_PROFILE_VARIANTS = re.compile(
    r"^  B = (\d+): manual ([\d.]+) \(replay ([\d.]+)\); sdpa ([\d.]+) \(replay ([\d.]+)\)$", re.M
)
ASR_PROFILE_PHASES = (
    "cache gather|encoder|pre-encode|feed-forward|self-attention|convolution|norms|positions|cache scatter|decoder|"
    "outside phases|total"
)
ASR_PROFILE_ROW = re.compile(rf"^({ASR_PROFILE_PHASES})\s+([\d.\s]+)$", re.M)
ASR_PROFILE_CLASSES = ("bf16 GEMM", "fp32 GEMM/conv", "attention", "copies", "elementwise/reduction", "other", "total")
ASR_ENGINE_MARKS = {  # the engine process's py-spy at 1,024 paced streams (session 15): samples per stack function
    "waiting_on_the_step": "TokenTable.tokens",
    "launch": "Stepping._launch",
    "collect": "Stepping._collect",
    "gather_ready": "BatchingBackend._gather_ready",
    "ready_checks": "BatchingBackend._ready",
    "channel_flush": "Channel._flush",
    "channel_receive": "Channel.receive",
}


def asr_paced_figures() -> dict:
    """Issue 17, session 15, on an H100 (the lent machine that came): paced real-time capacity at 320 ms of the tree
    against session 14's measured code (1a5b88e, the base), each alone on the GPU; the steady step profiled by
    phase x kernel class at 1,024 and 2,048 rows, with NeMo's SDPA attention timed beside; where the engine
    process's time goes at 1,024 paced streams."""
    folder = RAW / "asr_session15"
    capacity = {}
    for path in sorted(folder.glob("paced_320_*.txt")):
        text = path.read_text()
        ((build, chunk, streams, value),) = ASR_FOUND.findall(text)
        capacity[path.stem.removeprefix("paced_320_")] = {
            "source": path.relative_to(RAW).as_posix(), "build": build, "chunk_ms": int(chunk),
            "service_flags": ASR_COMPARE_FLAGS.search(text).group(1), "real_time_streams": int(streams),
            "p95_over_chunk": float(value),
            "probes": [{"streams": int(n), "p95_over_chunk": float(v)} for n, _, _, v in ASR_PROBE.findall(text)],
        }  # fmt: skip
    profile = folder / "profile_320_manual.txt"
    text = profile.read_text()
    served = {
        int(b): {
            "served_ms": float(ms),
            "replay_ms": float(replay),
            "counted_tflop": float(tf),
            "counted_gb": float(gb),
        }
        for b, _, ms, replay, tf, gb in ASR_PROFILE_SERVED.findall(text)
    }
    tables = text.split("===== B = ")[1:]
    for batch, table in zip(sorted(served), tables, strict=True):
        served[batch]["eager_device_ms_by_phase"] = {
            phase: dict(zip(ASR_PROFILE_CLASSES, map(float, values.split()), strict=True))
            for phase, values in ASR_PROFILE_ROW.findall(table)
        }
    variants = folder / "profile_320_variants.txt"
    return {
        "device": "H100 80GB HBM3",
        "paced_capacity_320": capacity,
        "step_profile_320": {"source": profile.relative_to(RAW).as_posix(), "by_batch": served},
        "attention_variants_320": {
            "source": variants.relative_to(RAW).as_posix(),
            "by_batch": {
                int(b): {
                    "manual_ms": float(m),
                    "manual_replay_ms": float(mr),
                    "sdpa_ms": float(sd),
                    "sdpa_replay_ms": float(sr),
                }
                for b, m, mr, sd, sr in ASR_PROFILE_VARIANTS.findall(variants.read_text())
            },
        },  # fmt: skip
        "cpu_split_1024": {
            "source": (folder / "split_320_1024.txt").relative_to(RAW).as_posix(),
            "levels": split_levels((folder / "split_320_1024.txt").read_text(), "p95_over_chunk"),
        },
        "engine_py_spy_1024": py_spy_summary(folder / "spy" / "1024_4108.txt", ASR_ENGINE_MARKS),
        "frontend_py_spy_1024": py_spy_summary(folder / "spy" / "1024_4070.txt", {}),
    }


ASR_PROBE_FAILED = re.compile(r"^    (\d+) of (\d+) streams failed, the first with (\w+): (.*)$", re.M)
ASR_PROFILE_FUSED = re.compile(
    r"^  B = (\d+): manual ([\d.]+) \(replay ([\d.]+)\);(?: sdpa ([\d.]+) \(replay ([\d.]+)\);)? fused ([\d.]+) "
    r"\(replay ([\d.]+)\)$",
    re.M,
)
WITHDRAWN = "b42f7d9 + NeMo decoder sized at start-up (withdrawn)"
ASR_SESSION17_CALLS = {  # call -> the code it ran (results/h200/README.md, v7)
    "call1": "b42f7d9", "call2": "b42f7d9", "call4": "b42f7d9", "call5": "b42f7d9",
    "call6": WITHDRAWN, "call7": WITHDRAWN, "call8": WITHDRAWN, "call9": WITHDRAWN,
}  # fmt: skip


def paced_search(path: Path, code: str) -> dict:
    """One asr_compare.py search (paced real-time streams): what it found, each probe and any failed streams."""
    text = path.read_text()
    found = ASR_FOUND.findall(text)
    (build, chunk, streams, value) = found[0] if found else (None, None, 0, "nan")
    return {
        "source": path.relative_to(RAW).as_posix(), "code": code, "build": build,
        "chunk_ms": int(chunk) if chunk else None,
        "service_flags": (m.group(1) if (m := ASR_COMPARE_FLAGS.search(text)) else None),
        "real_time_streams": int(streams), "p95_over_chunk": float(value),
        "probes": [{"streams": int(n), "p95_over_chunk": float(v)} for n, _, _, v in ASR_PROBE.findall(text)],
        "failed_streams": [
            {"failed": int(f), "of": int(n), "first_status": code, "first_details": why[:160]}
            for f, n, code, why in ASR_PROBE_FAILED.findall(text)
        ],
    }  # fmt: skip


def asr_session17_figures() -> dict:
    """Issue 17, session 17, on an H100: paced capacity searches at 320 and 80 ms (the tree, its base b9936ba, the
    fused encoder), with each probe's value and the streams that failed; the steady step of manual, SDPA and fused
    attention at 320 ms (1,024 and 2,048 rows) and 80 ms (64 and 256 rows)."""
    folder = RAW / "asr_session17"
    searches = {
        path.stem: paced_search(path, ASR_SESSION17_CALLS[path.name.split("_")[0]])
        for path in sorted(folder.glob("call*_asr_compare_*.txt"))
    }
    profiles = {}
    for name in ("call2_asr_profile_fused.txt", "call5_asr_profile_80.txt"):
        path = folder / name
        profiles[path.stem] = {
            "source": path.relative_to(RAW).as_posix(),
            "by_batch": {
                int(b): {"manual_ms": float(m), "manual_replay_ms": float(mr),
                         "sdpa_ms": float(sd) if sd else None, "sdpa_replay_ms": float(sr) if sr else None,
                         "fused_ms": float(f), "fused_replay_ms": float(fr)}
                for b, m, mr, sd, sr, f, fr in ASR_PROFILE_FUSED.findall(path.read_text())
            },
        }  # fmt: skip
    return {
        "device": "H100 80GB HBM3",
        "paced_searches": searches,
        "step_by_attention": profiles,
        "cpu_split_80_96": {
            "source": (folder / "call5_asr_split_80_96.txt").relative_to(RAW).as_posix(),
            "levels": split_levels((folder / "call5_asr_split_80_96.txt").read_text(), "p95_over_chunk"),
        },
    }


ASR_SESSION18_CALLS = {  # call -> the code it ran (results/h200/README.md, v8); the device's env.txt names 294f345,
    # the commit its copy of .git had, but the tree it ran was the working tree with these commits
    "call7": "1201e43", "call8": "eb4581a", "call9": "eb4581a", "call10": "eb4581a", "call11": "eb4581a",
    "call12": "eb4581a", "call16": "eb4581a",
}  # fmt: skip
ASR_FEATURE_MARKS = {  # the host mel front end in the step thread (session 18's split at 1,536 paced streams)
    "next_segment": "FeatureStream.next_segment",
    "mel_batch": "mel_batch",
    "upload": "upload",
    "stft": "stft",
    "graph_replay": "CUDAGraph.replay",
    "event_loop_select": "EpollSelector.select",
}
ASR_RTF_PROBE = re.compile(r"^    probe: (\d+) streams, RTF ([\d.]+)$", re.M)
ASR_RTF_FOUND = re.compile(r"^  (engine-direct|service cache-aware)\s+(\d+) ms: (\d+) streams", re.M)


def asr_session18_figures() -> dict:
    """Issue 17, session 18, on an H100: paced capacity searches at 320 and 80 ms of the tree with the fused encoder
    and four front ends (and at its defaults), NeMo's own loop and the service under bench-asr's throughput
    definition (per-stream RTF < 1, 1.6 s clips), and where the engine process's time went at 1,536 paced streams."""
    folder = RAW / "asr_session18"
    searches = {
        path.stem: paced_search(path, ASR_SESSION18_CALLS[path.name.split("_")[0]])
        for path in sorted(folder.glob("call*_asr_compare_*.txt"))
        if ASR_FOUND.search(path.read_text())  # call 7's service did not start, call 9's 4,096 graphs did not fit
    }
    throughput = {}
    for name in ("call11_asr_engine_320.txt", "call12_asr_service_320_throughput.txt"):
        text = (folder / name).read_text()
        ((path_name, chunk, streams),) = ASR_RTF_FOUND.findall(text)
        throughput[path_name] = {
            "source": (folder / name).relative_to(RAW).as_posix(), "code": "eb4581a", "chunk_ms": int(chunk),
            "real_time_streams": int(streams),
            "probes": [{"streams": int(n), "rtf": float(v)} for n, v in ASR_RTF_PROBE.findall(text)],
        }  # fmt: skip
    split = folder / "call8_asr_split_320_fused_fe4_1536.txt"
    spy = folder / "spy" / "engine_1536_12099.txt"  # the engine process's record, from call8_asr_spy_*.tgz
    return {
        "device": "H100 80GB HBM3",
        "paced_searches": searches,
        "throughput_320": throughput,
        "cpu_split_320_1536": {
            "source": split.relative_to(RAW).as_posix(),
            "levels": split_levels(split.read_text(), "p95_over_chunk"),
        },
        "engine_py_spy_1536": py_spy_summary(spy, {**ASR_ENGINE_MARKS, **ASR_FEATURE_MARKS}),
    }


ASR_PROBE = re.compile(r"^    probe: (\d+) streams, (RTF|p95/chunk) ([\d.]+)$", re.M)
ASR_SEARCH_END = re.compile(r"^  (engine-direct|service cache-aware|service buffered)\s+(\d+) ms: (\d+) streams", re.M)


def bench_searches(path: Path, code: str, chunk_ms: int | None = None) -> list[dict]:
    """The searches of one bench-asr output (paced: engine-direct by RTF, services by p95/chunk), in order: each
    one's probes and what it found. A search cut short (a crash, its stage's time limit) has found None; its passing
    and failing probes still bound it."""
    cut_short = {
        "RTF": "engine-direct",
        "p95/chunk": "service " + ("buffered" if "buffered" in path.name else "cache-aware"),
    }
    searches = []
    for part in path.read_text(errors="replace").split("Traceback"):  # a crashed run, then the next one
        start = 0
        for end in ASR_SEARCH_END.finditer(part):
            probes = ASR_PROBE.findall(part, start, end.start())
            searches.append((end.group(1), int(end.group(2)), int(end.group(3)), probes))
            start = end.end()
        rest = ASR_PROBE.findall(part, start)
        for measure in dict.fromkeys(m for _, m, _ in rest):  # interleaved searches cut short, one per measure
            searches.append((cut_short[measure], chunk_ms, None, [probe for probe in rest if probe[1] == measure]))
    out = []
    for path_name, chunk, streams, probes in searches:
        values = [{"streams": int(n), "measure": m, "value": float(v)} for n, m, v in probes]
        # a value printed as 1.00 passed if the search found it (it was below 1 before rounding)
        passed = [p["streams"] for p in values if p["value"] < 1 or p["streams"] == streams]
        failed = [p["streams"] for p in values if p["streams"] not in passed]
        out.append(
            {
                "source": path.relative_to(RAW).as_posix(),
                "code": code,
                "path": path_name,
                "chunk_ms": chunk,
                "real_time_streams": streams,
                "largest_passing_probe": max(passed, default=0),
                "smallest_failing_probe": min(failed, default=None),
                "probes": values,
            }
        )
    return out


def asr_session19_figures() -> dict:
    """Issue 17, session 19, on an H100: the rows of the issue's table that were measured (NeMo's own loop at every
    chunk size, per-stream RTF < 1; the service, `--fused-encoder true --frontends 4 --features-in-step false`, and
    the buffered service, paced real-time streams, per-chunk latency p95 < the chunk), and one paced compare at
    320 ms. Code: ea878ad's tree plus 91e4fc5 (bench-asr's empty_cache between engine probes, reverted since: it
    broke NeMo's loop) in calls 3 and 4; 1d2240d's bench-asr in calls 5 and 6."""
    folder = RAW / "asr_session19"
    codes = {"call3": "91e4fc5", "call4": "91e4fc5", "call5": "1d2240d", "call6": "1d2240d"}
    searches = []
    for name in (
        "call3_asr_table_80.txt", "call4_asr_graphs_service_160_service.txt", "call4_asr_graphs_bench_160_buffered.txt",
        "call4_asr_graphs_service_320_service.txt", "call4_asr_graphs_bench_320_buffered.txt",
        "call5_asr_graphs_service_560_service.txt", "call6_asr_engine_5chunks.txt",
    ):  # fmt: skip
        chunk = int(re.search(r"_(\d+)(?:_|\.)", name.split("_asr_")[1]).group(1)) if "5chunks" not in name else None
        searches += bench_searches(folder / name, codes[name.split("_")[0]], chunk)
    compare = folder / "call5_asr_compare_320_320_host.txt"
    return {
        "device": "H100 80GB HBM3",
        "searches": searches,
        "paced_compare_320": paced_search(compare, codes["call5"]),
    }


def asr_session23_figures() -> dict:
    """Issue 17, session 23, on an H100 (tree 46684ef, base eb4581a = v8's code, one machine): paced searches at 320
    and 80 ms of both (`--fused-encoder true --frontends 4`), and NeMo's own loop (per-stream RTF < 1) at both."""
    folder = RAW / "asr_session23"
    codes = {"here": "46684ef", "base": "eb4581a"}
    searches = {}
    for path in sorted(folder.glob("call*_asr_compare_*.txt")):
        search = paced_search(path, "")
        search["code"] = codes[search["build"]]
        searches[path.stem] = search
    nemo = []
    for name, chunk in (("call6_asr_graphs_bench_320_nemo320.txt", 320), ("call7_asr_graphs_bench_80_nemo80.txt", 80)):
        nemo += bench_searches(folder / name, codes["here"], chunk)
    return {"device": "H100 80GB HBM3", "paced_searches": searches, "nemo_loop": nemo}


TTS_COUNTERS_FIRST_AT = re.compile(  # the counters with the "1st at" column (16e14c1 on)
    r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+$",
    re.M,
)


def _tts_level(row: tuple, code: str, **run) -> dict:
    """A row of bench-tts's batched table (TTS_BATCHED_ROW): what the clients measured at one concurrency (`run`: how
    the service ran, e.g. frontends=4)."""
    c, _, fa50, fa95, rtf50, rtf95, audio, sustained = row
    return {"concurrency": int(c), "code": code, **run, "first_audio_ms_p50": float(fa50),
            "first_audio_ms_p95": float(fa95), "rtf_p50": float(rtf50), "rtf_p95": float(rtf95),
            "audio_s_per_s": float(audio), "sustained_audio_s_per_s": float(sustained)}  # fmt: skip


def _tts_counters(row: tuple) -> dict:
    """The engine's own counters at one concurrency (TTS_COUNTERS_FIRST_AT, TTS_JOIN_STEPS or TTS_COUNTERS_SLOT)."""
    _, count, per_step, step_ms, _, hidden, first_at, *slot = row
    counters = {"steps": int(count), "requests_per_step": float(per_step), "step_ms": float(step_ms),
                "hidden_prefill_ms_per_step": float(hidden),
                "first_patch_at_step": float(first_at) if first_at else None}  # fmt: skip
    if slot:
        counters.update(slot_wait_ms_mean=float(slot[0]), service_first_audio_ms_mean=float(slot[1]))
    return counters


def tts_session23_figures() -> dict:
    """Issue 16, session 23, on an H100: the batched service at C = 256 and 320 (ramped clients), this tree (46684ef,
    twice) and 5485570 (before the prefill stopped encoding the prefix's zero patches) interleaved on one machine,
    with the engine's own counters ("1st at": steps from a segment's text reaching the engine to its first patch)."""
    folder = RAW / "tts_session23"
    runs = {"call4_tts_batched_here.txt": "46684ef", "call8_tts_batched_base.txt": "5485570",
            "call9_tts_batched_here2.txt": "46684ef"}  # fmt: skip
    levels = []
    for name, code in runs.items():
        text = (folder / name).read_text()
        table = text[text.rfind("fa = first audio") :]
        counters = table[table.find("its own counters") :]
        steps = {int(r[0]): r for r in TTS_COUNTERS_FIRST_AT.findall(counters)}
        steps = steps or {int(r[0]): (*r, None) for r in TTS_JOIN_STEPS.findall(counters)}  # before "1st at"
        for row in TTS_BATCHED_ROW.findall(table):
            source = (folder / name).relative_to(RAW).as_posix()
            levels.append({**_tts_level(row, code), **_tts_counters(steps[int(row[0])]), "source": source})
    return {"device": "H100 80GB HBM3", "preset": "voxcpm2", "levels": levels}


ASR_TEST_PAIR = re.compile(
    r"(?:^|\] )(\d+) ms, (\S+) vs (\S+): max \|encoder difference\| (\S+), transcripts equal (\w+)", re.M
)


def asr_session24_figures() -> dict:
    """Issue 17, session 24, on an H100 (tree 2c8357e; base eb4581a = v8's code, one machine): the GPU tests' encoder
    comparisons (the first run whose archives all parsed), paced searches at 320 and 80 ms and NeMo's own loop."""
    folder = RAW / "asr_session24"
    codes = {"here": "2c8357e", "base": "eb4581a"}
    searches = {}
    for name in ("call6_asr_compare_80_80.txt", "call9_asr_compare_320_320c.txt", "call12_asr_compare_320_base320.txt"):
        search = paced_search(folder / name, "")
        search["code"] = codes[search["build"]]
        searches[Path(name).stem] = search
    nemo = []
    for name, chunk in (
        ("call10_asr_graphs_bench_320_nemo320.txt", 320),
        ("call11_asr_graphs_bench_80_nemo80.txt", 80),
    ):
        nemo += bench_searches(folder / name, codes["here"], chunk)
    tests = folder / "call1_asr_cuda_graph_tests.txt"
    found = ASR_TEST_PAIR.findall(tests.read_text())
    pairs = [{"chunk_ms": int(c), "one": one, "other": other, "max_encoder_difference": float(d),
              "transcripts_equal": equal == "True"} for c, one, other, d, equal in found]  # fmt: skip
    return {"device": "H100 80GB HBM3", "paced_searches": searches, "nemo_loop": nemo,
            "gpu_test_pairs": {"source": tests.relative_to(RAW).as_posix(), "pairs": pairs}}  # fmt: skip


TTS_COUNTERS_SLOT = re.compile(  # the counters with "slot ms" and "svc fa" after "1st at" (828fbb0 on)
    r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
    r"\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+$",
    re.M,
)


def tts_session24_figures() -> dict:
    """Issue 16, session 24, on an H100: the batched service at C = 256 and 320 (ramped clients), tree 2c8357e (a
    request that left frees its slot beside the step), with the mean wait for a slot and the service's first audio."""
    folder = RAW / "tts_session24"
    name = "call2_tts_batched_here.txt"
    text = (folder / name).read_text()
    table = text[text.rfind("fa = first audio") :]
    counters = {int(r[0]): r for r in TTS_COUNTERS_SLOT.findall(table[table.find("its own counters") :])}
    levels = []
    source = (folder / name).relative_to(RAW).as_posix()
    for row in TTS_BATCHED_ROW.findall(table):
        levels.append({**_tts_level(row, "2c8357e"), **_tts_counters(counters[int(row[0])]), "source": source})
    return {"device": "H100 80GB HBM3", "preset": "voxcpm2", "levels": levels}


TTS_DELIVERY = re.compile(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", re.M)


def tts_session26_figures() -> dict:
    """Issue 16, session 26, on an H100 (tree 7fc26b1): the batched service at C = 256, 320 (and 384) with four gRPC
    front ends and with one, one machine, with the delivery table (ms between steps over the level, ms per patch as a
    client heard it, the gRPC processes' CPU); and the step as served at 176 and 256 rows, speed-ups applied one after
    another (the LMs' glue compiled by region last)."""
    folder = RAW / "tts_session26"
    levels = []
    for name, frontends in (("tts_batched_fe4.txt", 4), ("tts_batched_fe1.txt", 1)):
        text = (folder / name).read_text()
        table = text[text.rfind("fa = first audio") :]
        counters = {int(r[0]): r for r in TTS_COUNTERS_SLOT.findall(table[table.find("its own counters") :])}
        delivery = {int(r[0]): r for r in TTS_DELIVERY.findall(table[table.find("delivery per level") :])}
        for row in TTS_BATCHED_ROW.findall(table):
            level = _tts_level(row, "7fc26b1", frontends=frontends)
            _, every, patch50, patch95, cpu = delivery[level["concurrency"]]
            levels.append({**level, **_tts_counters(counters[level["concurrency"]]),
                           "ms_between_steps_over_level": float(every), "ms_per_patch_heard_p50": float(patch50),
                           "ms_per_patch_heard_p95": float(patch95), "grpc_cpu_cores": float(cpu),
                           "source": (folder / name).relative_to(RAW).as_posix()})  # fmt: skip
    sweeps = {}
    for rows in (176, 256):
        path = folder / f"tts_profile_b{rows}.txt"
        variants = [{"variant": name, "step_ms": float(ms), "audio_s_per_s": float(rate)}
                    for name, ms, rate, _ in TTS_VARIANT.findall(path.read_text()) if ms]  # fmt: skip
        sweeps[str(rows)] = {"source": path.relative_to(RAW).as_posix(), "rows": rows, "cumulative": variants}
    return {"device": "H100 80GB HBM3", "preset": "voxcpm2", "levels": levels, "step_sweeps": sweeps}


TTS_DELIVERY_STEADY = re.compile(  # the delivery table with the steady window's columns (d7b041f on)
    r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", re.M
)


def tts_session27_figures() -> dict:
    """Issue 16, session 27, on an H100: the batched service at C = 256 and 320 with four front ends, 886ae4a (the
    channel and scheduler before ab93c50 and f9366ff) against 5eda55b on one machine, with the steady window's step
    interval, rows and step time (the service's counters sampled every 0.25 s while every client was busy)."""
    folder = RAW / "tts_session27"
    levels = []
    for name, code in (("tts_batched_base.txt", "886ae4a"), ("tts_batched_here.txt", "5eda55b")):
        text = (folder / name).read_text()
        table = text[text.rfind("fa = first audio") :]
        counters = {int(r[0]): r for r in TTS_COUNTERS_SLOT.findall(table[table.find("its own counters") :])}
        delivery = {int(r[0]): r for r in TTS_DELIVERY_STEADY.findall(table[table.find("delivery per level") :])}
        for row in TTS_BATCHED_ROW.findall(table):
            level = _tts_level(row, code, frontends=4)
            _, every, patch50, patch95, cpu, steady_every, rows, steady_step = delivery[level["concurrency"]]
            levels.append({**level, **_tts_counters(counters[level["concurrency"]]),
                           "ms_between_steps_over_level": float(every), "ms_per_patch_heard_p50": float(patch50),
                           "ms_per_patch_heard_p95": float(patch95), "grpc_cpu_cores": float(cpu),
                           "steady_ms_between_steps": float(steady_every), "steady_rows_per_step": float(rows),
                           "steady_step_ms": float(steady_step),
                           "source": (folder / name).relative_to(RAW).as_posix()})  # fmt: skip
    return {"device": "H100 80GB HBM3", "preset": "voxcpm2", "levels": levels}


ASR_TEST_PAIR_SPREAD = re.compile(  # session 26's test output: the spread between two streams after the difference
    r"(?:^|\] )(\d+) ms, (\S+) vs (\S+): max \|encoder difference\| (\S+) \(two streams differ by (\S+)\), "
    r"transcripts equal (\w+)",
    re.M,
)
ASR_TEST_PADDED = re.compile(
    r"(?:^|\] )(\d+) ms, (\S+) vs (\S+), stream (\d+): (\d+) of (\d+) steps in the same buckets .*?, "
    r"max \|encoder difference\| there (\S+)$",
    re.M,
)


def asr_session26_figures() -> dict:
    """Issue 17, session 26, on an H100 (tree 7fc26b1): the GPU tests (tests/asr/test_cuda_graphs.py), all passed."""
    tests = RAW / "asr_session26" / "asr_cuda_graph_tests.txt"
    text = tests.read_text()
    pairs = [{"chunk_ms": int(c), "one": one, "other": other, "max_encoder_difference": float(d),
              "streams_differ_by": float(spread), "transcripts_equal": equal == "True"}
             for c, one, other, d, spread, equal in ASR_TEST_PAIR_SPREAD.findall(text)]  # fmt: skip
    padded = [{"chunk_ms": int(c), "one": one, "other": other, "stream": int(stream), "same_bucket_steps": int(same),
               "steps": int(steps), "max_encoder_difference_there": float(d)}
              for c, one, other, stream, same, steps, d in ASR_TEST_PADDED.findall(text)]  # fmt: skip
    summary = re.search(r"=+ (\d+) passed(?:, (\d+) failed)? in", text)
    return {"device": "H100 80GB HBM3", "code": "7fc26b1", "source": tests.relative_to(RAW).as_posix(),
            "passed": int(summary.group(1)) if summary else 0,
            "failed": int(summary.group(2) or 0) if summary else None, "pairs": pairs,
            "padded_vs_unpadded": padded}  # fmt: skip


ASR_STEP = re.compile(
    r"^bucket\s+(\d+) rows\s+(\d+): max \|graph - eager\| encoder (\S+), state (\S+), tokens equal (\w+)"
    r".*?(?:; step ([\d.]+) ms graph vs ([\d.]+) ms eager)?$",
    re.M,
)


def asr_step_figures() -> dict:
    """One steady 320 ms step of nemotron-0.6b per batch-size bucket: CUDA graph replay vs eager."""
    source = "asr_graph_check_320.txt"
    rows = []
    for bucket, streams, encoder, state, equal, graph_ms, eager_ms in ASR_STEP.findall((RAW / source).read_text()):
        rows.append(
            {
                "bucket": int(bucket),
                "streams": int(streams),
                "max_abs_diff_encoder": float(encoder),
                "max_abs_diff_state": float(state),
                "tokens_equal": equal == "True",
                "step_ms_graph": float(graph_ms) if graph_ms else None,
                "step_ms_eager": float(eager_ms) if eager_ms else None,
            }
        )
    return {"source": source, "chunk_ms": 320, "buckets": rows}


ASR_LEVEL = re.compile(
    r"^LEVEL\s+(\d+) streams (\w+)\s*: RTF ([\d.]+|nan), (\d+) steps of ([\d.]+) streams, "
    r"mean step ([\d.]+) ms(, FAILED.*)?$",
    re.M,
)
ASR_BISECT = re.compile(r"^RESULT (\S+) (ok|failed)", re.M)


def asr_graph_fix_figures() -> dict:
    """The graph crash of the main job (issue 17): capture set-ups run side by side (ok / failed per run), and
    the service with graphs vs eager at fixed stream counts (320 ms, nemotron-0.6b, bf16)."""
    folder = RAW / "asr_graph_fix"
    runs: dict = {}
    for name in ("asr_graph_bisect.txt", "asr_graph_bisect_2.txt", "asr_graph_bisect_3.txt"):
        summary = (folder / name).read_text().split("\n---", 1)[0]  # the RESULT lines; the tails repeat them
        for line in summary.splitlines():
            if match := ASR_BISECT.match(line):
                variant, outcome = match.groups()
                if variant == "fixed-steady" and "'first': 7" in line:  # call 2: the flag was not applied yet
                    variant = "fixed"
                runs.setdefault(variant, {"ok": 0, "failed": 0})[outcome] += 1
    levels = [
        {
            "streams": int(streams), "path": path, "rtf": None if rtf == "nan" else float(rtf), "steps": int(steps),
            "streams_per_step": float(per_step), "mean_step_ms": float(step_ms), "failed": bool(failed),
        }
        for streams, path, rtf, steps, per_step, step_ms, failed in ASR_LEVEL.findall(
            (folder / "asr_graph_levels.txt").read_text()
        )
    ]  # fmt: skip
    return {
        "source": "asr_graph_fix/",
        "bisect_runs": runs,
        "levels_source": "asr_graph_fix/asr_graph_levels.txt",
        "chunk_ms": 320,
        "levels": levels,
    }


def tts_figures() -> dict:
    """Per mode: concurrency-1 first audio and RTF (one entry per run) and throughput rows by workers."""
    figures = {}
    for mode in ("eager", "compiled"):
        concurrency_1, throughput = [], []
        for path in sorted(RAW.glob(f"tts_{mode}*.txt")):
            text = path.read_text()
            paths = {
                name: {"first_audio_ms": float(ms), "rtf": float(rtf)}
                for name, ms, rtf in TTS_CONCURRENCY_1.findall(text)
            }
            concurrency_1.append(
                {"direct": paths["VoxCPM direct"], "service": paths["service (gRPC)"], "source": path.name}
            )
            throughput += [
                {"workers": int(workers), "service": float(service), "direct": float(direct), "source": path.name}
                for workers, service, direct in TTS_THROUGHPUT.findall(text)
            ]
        figures[mode] = {
            "concurrency_1": concurrency_1,
            "throughput_audio_s_per_s": sorted(throughput, key=lambda r: r["workers"]),
        }
    return figures


TTS_BATCHED_ROW = re.compile(
    r"^\s*(\d+) (batched service|batched engine direct)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
    r"(?:\s+([\d.]+|-))?$",  # sustained audio s/s, printed since session 11
    re.M,
)
TTS_BATCHED_STEPS = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", re.M
)


def tts_batched_figures() -> dict:
    """The batched TTS engine (services/tts/benchmark.py): per path and concurrency, the final table's row,
    and the service's own step counters."""
    figures = {}
    for path in sorted([*RAW.glob("tts_batched_*.txt"), *(RAW / "tts_fused").glob("bench_*.txt")]):
        text = path.read_text()
        table = text[text.rfind("fa = first audio") :]
        if not TTS_BATCHED_ROW.search(table):
            continue
        levels: dict[str, list[dict]] = {}
        for c, name, fa50, fa95, rtf50, rtf95, audio, sustained in TTS_BATCHED_ROW.findall(table):
            level = {"concurrency": int(c), "first_audio_p50_ms": float(fa50), "first_audio_p95_ms": float(fa95),
                     "rtf_p50": float(rtf50), "rtf_p95": float(rtf95), "audio_s_per_s": float(audio)}  # fmt: skip
            if sustained not in ("", "-"):
                level["sustained_audio_s_per_s"] = float(sustained)
            levels.setdefault(name, []).append(level)
        steps = [
            {"concurrency": int(c), "steps": int(n), "requests_per_step": float(r), "step_ms": float(ms),
             "prefill_ms_per_step": float(p), "gflop_per_step": float(g), "mb_per_step": float(mb),
             "gflop_per_s": float(gs), "gb_per_s": float(bs)}
            for c, n, r, ms, p, g, mb, gs, bs in TTS_BATCHED_STEPS.findall(table[table.find("its own counters") :])
        ]  # fmt: skip
        source = path.relative_to(RAW).as_posix()
        figures[source.removesuffix(".txt")] = {"source": source, "paths": levels, "service_steps": steps}
    return figures


def _llm_bench(path: Path) -> tuple[str, dict]:
    """One services/llm/benchmark.py output: its preset and the final table's engine-direct and grpc-service rows."""
    text = path.read_text()
    levels: dict[int, dict] = {}
    for concurrency, name, requests, failed, p50, p99, tokens, cpu, servicer in LLM_ROW.findall(text):
        levels.setdefault(int(concurrency), {"concurrency": int(concurrency)})[name] = {
            "requests": int(requests),
            "failed": int(failed),
            "ttft_p50_ms": float(p50),
            "ttft_p99_ms": float(p99),
            "tokens_per_s": float(tokens),
            "front_end_cpu_us_per_token": int(cpu),
            "ttft_in_grpc_servicer_p50_ms": float(servicer) if servicer else None,
        }
    for concurrency, number, name, tokens, ttft, decode, core in LLM_ROUND.findall(text):
        level = levels.setdefault(int(concurrency), {"concurrency": int(concurrency)})
        level.setdefault("rounds", []).append({
            "round": int(number), "path": name, "tokens_per_s": float(tokens), "ttft_p50_ms": float(ttft),
            "decode_p50_ms": float(decode), "engine_core_decode_p50_ms": float(core) if core else None,
        })  # fmt: skip
    frontends = LLM_FRONTENDS.search(text)
    return LLM_PRESET.search(text).group(1), {
        "source": path.relative_to(RAW).as_posix(),
        "frontends": int(frontends.group(1)) if frontends else 1,
        "levels": sorted(levels.values(), key=lambda lv: lv["concurrency"]),
    }


LLM_ROUND = re.compile(  # a round's line (session 24 on: "(… in the engine core)" since the engine's own timings)
    r"^  concurrency (\d+) round (\d+) (engine-direct|grpc-service)\s+([\d.]+) tokens/s, TTFT p50\s+([\d.]+) ms, "
    r"decode p50\s+([\d.]+) ms.*?(?:\(([\d.]+) in the engine core\))?, client",
    re.M,
)


def llm_figures() -> dict:
    """Per preset and concurrency, the final table's engine-direct and grpc-service rows (one front end)."""
    return dict(_llm_bench(path) for path in sorted(RAW.glob("llm_bench_*.txt")))


def vllm_serve_levels(path: Path) -> list[dict]:
    """`vllm bench serve` against `vllm serve --api-server-count N`: per max concurrency, tokens/s and TTFT."""
    levels = []
    for block in path.read_text().split("== vllm serve")[1:]:
        concurrency = re.search(r"max concurrency (\d+)", block)
        tokens = re.search(r"^Output token throughput \(tok/s\):\s+([\d.]+)", block, re.M)
        ttft = re.search(r"^Median TTFT \(ms\):\s+([\d.]+)", block, re.M)
        if concurrency and tokens and ttft:
            levels.append({"concurrency": int(concurrency.group(1)), "tokens_per_s": float(tokens.group(1)),
                           "ttft_p50_ms": float(ttft.group(1))})  # fmt: skip
    return levels


def llm_frontends_figures() -> dict:
    """Issue 18: the service with several gRPC front ends vs engine-direct, and `vllm serve --api-server-count 4`."""
    folder = RAW / "llm_frontends"
    figures = {}
    # session 10's runs, then session 11's (s11_*: both engines on one step budget, named in the file)
    paths = sorted(folder.glob("llm_frontends_bench_*.txt")) + sorted(folder.glob("s1[178]_*_bench_*.txt"))
    for path in paths + sorted(folder.glob("s2[467]_*_bench_*.txt")):
        preset, bench = _llm_bench(path)
        budget = re.search(r"_budget(\d+)", path.name)
        bench["step_budget_tokens"] = int(budget.group(1)) if budget else None
        session = " budget " + budget.group(1) + " (session 11)" if budget else ""
        if path.name.startswith("s17_"):  # 6 rounds at 64 and 256, the default budget (8,192), on an H100
            bench["step_budget_tokens"] = 8192
            session = " 6 rounds at 64 and 256 (session 17, H100)"
        if path.name.startswith(("s18_", "s24_", "s26_", "s27_")):  # --client-processes 4, budget 8,192, on an H100
            bench["step_budget_tokens"] = 8192
            bench["client_processes"] = 4
            session = f" 4 client processes (session {path.name[1:3]}, H100)"
            if variant := re.search(
                r"_(pin2|nopin|si2)\.txt$", path.name
            ):  # session 27: pinned engine core, stream interval
                session += f", {variant.group(1)}"
        figures[f"{preset} service fe{bench['frontends']}{session}"] = bench
    for path in sorted(folder.glob("llm_frontends_vllm_serve_*.txt")) + sorted(folder.glob("s11_*_serve_*.txt")):
        preset = re.match(r"(s11_)?llm_frontends_vllm_serve_(.+?)(_cut_short)?\.txt", path.name).group(2)
        session = " (session 11)" if path.name.startswith("s11_") else ""
        figures[f"{preset} vllm serve api-server-count 4{session}"] = {
            "source": path.relative_to(RAW).as_posix(),
            "levels": vllm_serve_levels(path),
        }
    return figures


TTS_JOIN_STEPS = re.compile(  # the counters with the "hidden ms" column (prefill beside the step, session 12 on)
    r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+$", re.M
)
TTS_JOIN_RUNS = {  # issue 16's join work (README 3f, 3g): folder or file -> variant
    "tts_overlap/": "v1 (ea1c776)",
    "tts_overlap2/": "v2 (c179d39)",
    "tts_overlap3/": "v3 (4e95cc4)",
    "tts_prefill_graphs/bench_v4_eager_prefill": "v4 (bd8456f), eager prefill",
    "tts_prefill_graphs/bench_v4_prefill_graphs": "v4 + --prefill-graphs",
}
TTS_OVERLAP_CHECK = re.compile(
    r"^voxcpm2: prefill(, then step| behind the step), (\d+) running \+ (\d+) joining: median ([\d.]+) ms", re.M
)
TTS_PREFILL_CHECK = re.compile(r"prefill of (\d+) segments, (eager|graph): host ([\d.]+) ms, to done ([\d.]+) ms")


def tts_join_figures() -> dict:
    """Issue 16: how requests join the batch (prefill beside the step, then prefill graphs), per variant and load."""
    levels = []
    for path in sorted([*RAW.glob("tts_overlap*/bench_*.txt"), *RAW.glob("tts_prefill_graphs/bench_*.txt")]):
        source = path.relative_to(RAW).as_posix()
        variant = next(v for key, v in TTS_JOIN_RUNS.items() if source.startswith(key))
        text = path.read_text()
        load = f"ramp {m.group(1)} s" if (m := re.search(r"clients ramped over ([\d.]+) s", text)) else "burst"
        table = text[text.rfind("fa = first audio") :]
        steps = {int(row[0]): row for row in TTS_JOIN_STEPS.findall(table[table.find("its own counters") :])}
        for c, _, fa50, fa95, rtf50, rtf95, audio, sustained in TTS_BATCHED_ROW.findall(table):
            _, _, per_step, step_ms, blocking, hidden = steps[int(c)]
            levels.append({"concurrency": int(c), "load": load, "variant": variant,
                           "first_audio_ms_p50": float(fa50), "first_audio_ms_p95": float(fa95),
                           "rtf_p50": float(rtf50), "rtf_p95": float(rtf95), "audio_s_per_s": float(audio),
                           "sustained_audio_s_per_s": float(sustained), "requests_per_step": float(per_step),
                           "step_ms": float(step_ms), "blocking_prefill_ms_per_step": float(blocking),
                           "hidden_prefill_ms_per_step": float(hidden), "source": source})  # fmt: skip
    check = RAW / "tts_prefill_graphs" / "prefill_graph_check.txt"
    passes = [{"segments": int(n), "path": how, "host_ms": float(host), "to_done_ms": float(done)}
              for n, how, host, done in TTS_PREFILL_CHECK.findall(check.read_text())]  # fmt: skip
    overlap = RAW / "tts_overlap2" / "overlap_check.txt"
    timed = {how: (int(running), int(joining), float(ms)) for how, running, joining, ms in
             TTS_OVERLAP_CHECK.findall(overlap.read_text())}  # fmt: skip
    return {
        "overlap_check": {
            "source": overlap.relative_to(RAW).as_posix(),
            "preset": "voxcpm2",
            "running": timed[", then step"][0],
            "joining": timed[", then step"][1],
            "prefill_then_step_ms": timed[", then step"][2],
            "prefill_beside_step_ms": timed[" behind the step"][2],
        },  # fmt: skip
        "note": "issue 16: v1-v3 prefill beside the launched step (README 3f); v4 and prefill graphs (README 3g)",
        "prefill_graph_check": {"source": check.relative_to(RAW).as_posix(), "passes": passes},
        "levels": levels,
    }


TTS_SERVED = re.compile(r"^a\) step as served \(CUDA graph[^)]*\): ([\d.]+) ms.*-> ([\d.]+) audio-s/s", re.M)
TTS_PHASE_HEADER = re.compile(r"^b\) eager step, device time by phase x class.*\n\s+(.+)$", re.M)
TTS_IDLE = re.compile(r"^step \d+: (\d+) kernels, span ([\d.]+) ms, idle between kernels ([\d.]+) ms", re.M)


def tts_profile_figures() -> dict:
    """Issue 16: the batched TTS step at B requests, as served (graph replay) and eagerly by phase x kernel class
    (results/h200/tts_profile.py); device ms per step."""
    figures = {}
    for path in sorted([*(RAW / "tts_profile").glob("tts_profile_b*.txt"), *(RAW / "tts_fused").glob("sweep_*.txt")]):
        text = path.read_text()
        served, header = TTS_SERVED.search(text), TTS_PHASE_HEADER.search(text)
        if not (served and header):
            continue  # a run that failed before its profile (kept as raw for the record)
        # the table's layout (tts_profile.py): a 22-character row name, then columns 14 characters wide
        line = text[text.rindex("\n", 0, header.start(1)) + 1 : header.end(1)]
        classes = [line[at : at + 14].strip() for at in range(22, len(line), 14)]
        body = text[header.end() :].split("\ntotal")[0]
        phases = {}
        for row in body.strip("\n").splitlines():
            values = [float(row[at : at + 14]) for at in range(22, len(row), 14)]
            phases[row[:22].strip()] = dict(zip(classes, values, strict=True))
        idle = TTS_IDLE.findall(text)
        figures[path.stem] = {
            "source": path.relative_to(RAW).as_posix(),
            "served_step_ms": float(served.group(1)),
            "served_audio_s_per_s": float(served.group(2)),
            "eager_ms_by_phase_and_class": phases,
            "eager_kernels_per_step": int(idle[0][0]) if idle else None,
            "eager_idle_ms_per_step": [float(i[2]) for i in idle],
        }
    return figures


TTS_VARIANT = re.compile(r"^  (\S+)\s+(?:([\d.]+) ms ->\s+([\d.]+) audio-s/s.*|FAILED: (.*))$", re.M)


def tts_fused_figures() -> dict:
    """Issue 16, session 11: the batched step's speed-ups applied one after another, each timed as served at 128
    rows (results/h200/tts_profile.py --variants): ms per step and audio-s/s, or why it failed."""
    figures = {}
    for path in sorted((RAW / "tts_fused").glob("sweep_*.txt")):
        variants = [
            {"variant": name, "step_ms": float(ms), "audio_s_per_s": float(rate)}
            if ms
            else {"variant": name, "failed": why.strip()}
            for name, ms, rate, why in TTS_VARIANT.findall(path.read_text())
        ]
        figures[path.stem] = {"source": path.relative_to(RAW).as_posix(), "rows": 128, "cumulative": variants}
    return figures


# The main job on the H200 (issue 19): one tarball per stage (results/h200/main_job.sh), its results.json per target.
MAIN_JOB_STAGES = {"llm": "llm.tar.gz", "asr": "asr-eager.tar.gz", "tts": "tts.tar.gz"}
PRIMARY = {"llm": "ttft_s", "asr": "final_latency_s", "tts": "first_audio_s"}


def _stage_member(tarball: str, name: str) -> dict | list:
    with tarfile.open(RAW / "main_job" / tarball) as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith(name))
        return json.load(archive.extractfile(member))


def main_job_figures() -> dict:
    """Per target, every level of `python -m loadgen run --device cuda` as recorded on the device (the regime is
    the one the device-side analysis gave; results/h200/run/ holds the re-analysed reports), and the side by side."""
    figures: dict = {}
    for target, tarball in MAIN_JOB_STAGES.items():
        data = _stage_member(tarball, f"{target}/results.json")
        verdicts = {v["concurrency"]: v for v in (data["analysis"] or {}).get("levels", [])}
        figures[target] = {"source": f"main_job/{tarball}", "preset": data["facts"]["preset"], "levels": [{
            "concurrency": level["concurrency"],
            "throughput": round(level["throughput"], 2),
            "unit": level["throughput_unit"],
            f"{PRIMARY[target]}_p50_ms": round(level["latency"][PRIMARY[target]]["p50"] * 1000, 1),
            f"{PRIMARY[target]}_p95_ms": round(level["latency"][PRIMARY[target]]["p95"] * 1000, 1),
            "realtime": level["realtime_ok"],
            "regime": verdicts.get(level["concurrency"], {}).get("regime"),
            "bandwidth_utilisation": round(verdicts.get(level["concurrency"], {}).get("bandwidth_utilisation", 0), 3),
            "flop_utilisation": round(verdicts.get(level["concurrency"], {}).get("flop_utilisation", 0), 3),
            "intensity_flop_per_byte": round(verdicts.get(level["concurrency"], {}).get("arithmetic_intensity", 0), 1),
            "in_flight": round(level["extra"].get("achieved_concurrency", 0), 1),
            "loadgen_busiest_process_cores": round(level["extra"].get("loadgen_busiest_process_cores", 0), 2),
        } for level in data["levels"]]}  # fmt: skip
        analysis = data["analysis"] or {}
        figures[target].update(ridge=round(analysis.get("ridge_flops_per_byte", 0), 1),
                               predicted_crossover_batch=analysis.get("crossover_concurrency"))  # fmt: skip
    figures["side_by_side"] = {
        "source": "main_job/peer.tar.gz",
        "rows": _stage_member("peer.tar.gz", "comparison.json"),
    }
    return figures


def _log2_axis(ax, xs, label: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(label)
    ax.grid(True, alpha=0.3)


def _save(fig, name: str) -> None:
    fig.tight_layout()
    fig.savefig(PLOTS / name, dpi=110)
    plt.close(fig)


def plot_asr_streams(asr: dict) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    chunks = sorted({p["chunk_ms"] for variant in ASR_PLOTTED for p in asr[variant]["points"]})
    for variant in ASR_PLOTTED:
        points = asr[variant]["points"]
        ax.plot([p["chunk_ms"] for p in points], [p["streams"] for p in points], "o-", label=variant)
    _log2_axis(ax, chunks, "chunk (ms)")
    ax.set_ylabel("real-time streams carried (RTF < 1)")
    ax.set_title("ASR nemotron-0.6b on H200: stream capacity vs chunk")
    ax.legend(fontsize=8)
    _save(fig, "asr_streams.png")


def plot_tts_throughput(tts: dict) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    workers = sorted({row["workers"] for mode in tts.values() for row in mode["throughput_audio_s_per_s"]})
    for mode, colour in (("eager", "#1f77b4"), ("compiled", "#ff7f0e")):
        rows = tts[mode]["throughput_audio_s_per_s"]
        for path, style in (("service", "o-"), ("direct", "s--")):
            ax.plot([r["workers"] for r in rows], [r[path] for r in rows], style, color=colour, label=f"{mode} {path}")
    _log2_axis(ax, workers, "workers (one VoxCPM2 per process)")
    ax.set_ylabel("audio seconds per second")
    ax.set_title("TTS voxcpm2 on H200: throughput vs workers")
    ax.legend(fontsize=8)
    _save(fig, "tts_throughput.png")


def plot_llm(llm: dict, metric: str, ylabel: str, title: str, name: str) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    concurrencies = sorted({lv["concurrency"] for preset in llm.values() for lv in preset["levels"]})
    for (preset, figures), colour in zip(llm.items(), ("#1f77b4", "#ff7f0e"), strict=True):
        levels = figures["levels"]
        for path, style in zip(LLM_PATHS, ("s--", "o-"), strict=True):
            xs, ys = [lv["concurrency"] for lv in levels], [lv[path][metric] for lv in levels]
            ax.plot(xs, ys, style, color=colour, label=f"{preset} {path}")
    _log2_axis(ax, concurrencies, "concurrency (requests)")
    ax.set_yscale("log")  # the levels span one to two decades
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    _save(fig, name)


def main() -> None:
    figures = {
        "ceilings": device_ceilings(),
        "asr": asr_figures(),
        "asr_step_graphs": asr_step_figures(),
        "asr_graph_fix": asr_graph_fix_figures(),
        "asr_clocked": asr_clocked_figures(),
        "asr_paced": asr_paced_figures(),
        "asr_session17": asr_session17_figures(),
        "asr_session18": asr_session18_figures(),
        "asr_session19": asr_session19_figures(),
        "asr_session23": asr_session23_figures(),
        "asr_session24": asr_session24_figures(),
        "asr_session26": asr_session26_figures(),
        "tts": tts_figures(),
        "tts_batched": tts_batched_figures(),
        "tts_profile": tts_profile_figures(),
        "tts_fused": tts_fused_figures(),
        "tts_joins": tts_join_figures(),
        "tts_session23": tts_session23_figures(),
        "tts_session24": tts_session24_figures(),
        "tts_session26": tts_session26_figures(),
        "tts_session27": tts_session27_figures(),
        "llm": llm_figures(),
        "llm_frontends": llm_frontends_figures(),
        "main_job": main_job_figures(),
    }
    (HERE / "figures.json").write_text(json.dumps(figures, indent=1) + "\n")
    PLOTS.mkdir(exist_ok=True)
    plot_asr_streams(figures["asr"])
    plot_tts_throughput(figures["tts"])
    plot_llm(figures["llm"], "tokens_per_s", "tokens/s", "LLM on H200 (vLLM 0.26.0): tokens/s", "llm_tokens.png")
    plot_llm(figures["llm"], "ttft_p50_ms", "TTFT p50 (ms)", "LLM on H200 (vLLM 0.26.0): TTFT p50", "llm_ttft.png")


if __name__ == "__main__":
    main()
