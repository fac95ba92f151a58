# device call 2026-12-03 18:06 UTC (nvidia-h200, warm), carry [".stage/tts", ".whl"], .stage/tts = git archive of
# commit "TTS batched engine on CUDA: the step captured as CUDA graphs ..." plus voiceagent/v1. Graph capture
# failed on a host->device scalar copy (fixed in the next commit), so the service stepped eagerly; the
# in-process engine path crashed on the same error.
cd .stage/tts && OUT=$OUT WHL=../../.whl CHECK_S=60 BENCH_S=290 timeout 390 bash results/h200/tts_batched.sh
