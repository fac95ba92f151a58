# device call 2026-12-03 18:12 UTC (nvidia-h200, warm), carry [".stage/tts", ".whl"], .stage/tts = git archive of
# commit "TTS batched: reset the scratch slot's position with a kernel ..." plus voiceagent/v1:
cd .stage/tts && OUT=$OUT WHL=../../.whl CHECK_S=45 BENCH_S=160 LEVELS=1,8,32,64,128,256 timeout 230 bash -c \
  'sed -i "s/--skip pool,direct/--skip pool,direct,engine/" results/h200/tts_batched.sh; bash results/h200/tts_batched.sh'
