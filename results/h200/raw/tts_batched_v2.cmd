# 2026-12-03 ~19:24 UTC, main at the merge of the tts, reliability and deploy branches (prefill of every waiting
# request in one pass), device call from the repo root with carry [".whl", "voiceagent/v1"]:
python3 -m services.tts.benchmark --preset voxcpm2 --device cuda --threads 4 --concurrency 1,16,64,128,256 \
    --requests 2 --skip pool,direct,engine --cache-positions 512          # -> tts_batched_v2.txt
python3 -m services.tts.benchmark --preset voxcpm2 --device cuda --threads 4 --concurrency 96,160,192 \
    --requests 2 --skip pool,direct,engine --cache-positions 512          # -> tts_batched_v2_knee.txt
