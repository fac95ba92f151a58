"""Configuration: presets from the repository, and start-up errors that name the setting."""

from __future__ import annotations

import pytest

from services.asr.config import AsrConfig, preset_names
from voiceagent.serving.config import load_config


def test_presets_are_kept_in_the_repository():
    assert {"tiny", "fastconformer-100m", "nemotron-0.6b"} <= set(preset_names())
    assert AsrConfig().port == 50051 and AsrConfig().metrics_port == 9091


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "huge"], "--preset / ASR_PRESET"),
        (["--backend", "magic"], "--backend / ASR_BACKEND"),
        (["--max-streams", "0"], "--max-streams / ASR_MAX_STREAMS"),
        (["--dtype", "float16"], "--dtype / ASR_DTYPE"),
        (["--step-policy", "sometimes"], "--step-policy / ASR_STEP_POLICY"),
        (["--frontends", "2", "--engine-process", "false"], "--frontends / ASR_FRONTENDS"),
        (["--model-path", "/nonexistent.nemo"], "--model-path / ASR_MODEL_PATH"),
    ],
)
def test_bad_settings_stop_start_up_naming_the_setting(argv, message):
    with pytest.raises(SystemExit, match=message):
        load_config(AsrConfig, "ASR", argv=argv, environ={})
