"""The device-ceiling probe, run in-process on this machine's CPU."""

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
