"""The device-ceiling probe, run in-process on this machine's CPU."""

import subprocess
import sys
import time

from voiceagent.serving.ceilings import measure_ceilings


def test_probe_is_fast_and_its_numbers_are_physical():
    ceilings = measure_ceilings("cpu", "float32", budget_s=2.0)
    assert ceilings.probe_s < 10
    assert 1e9 < ceilings.memory_bandwidth_bytes_per_s < 1e12
    assert 1e9 < ceilings.peak_flops_per_s < 1e14
    assert ceilings.threads >= 1
    proto = ceilings.to_proto()
    assert proto.ridge_flops_per_byte == ceilings.ridge_flops_per_byte > 0


def test_probe_measures_the_serving_dtype():
    bf16 = measure_ceilings("cpu", "bfloat16", budget_s=1.0)
    assert bf16.dtype == "bfloat16" and bf16.peak_flops_per_s > 0


def test_probe_records_when_and_how_and_flags_a_busy_machine():
    quiet = measure_ceilings("cpu", "float32", budget_s=1.0)
    assert quiet.measured_at_unix_s > 0 and "matmul" in quiet.method and quiet.background_cores >= 0
    proto = quiet.to_proto()
    assert proto.measured_at_unix_s == quiet.measured_at_unix_s and proto.method == quiet.method

    # Another process spinning on a core while the probe runs: the probe must see it and flag itself.
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        busy = measure_ceilings("cpu", "float32", budget_s=1.0)
    finally:
        spinner.kill()
        spinner.wait()
    assert busy.background_cores >= 0.4 and not busy.quiet, busy
