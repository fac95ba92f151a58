"""Configuration: flags over environment over defaults; a bad value fails start-up naming the setting."""

import subprocess

import pytest

from tests.harness import REPO, venv_python
from tests.runtime.paced_service import PacedConfig
from voiceagent.serving.config import load_config


def test_flags_override_environment_which_overrides_defaults():
    env = {"PACED_CHUNK_DELAY_S": "0.5", "PACED_GRACE_S": "3", "PACED_PROBE_CEILINGS": "false"}
    config = load_config(PacedConfig, "PACED", ["--grace-s", "7"], env)
    assert config.grace_s == 7.0  # flag wins
    assert config.chunk_delay_s == 0.5  # from the environment
    assert config.probe_ceilings is False
    assert config.host == "127.0.0.1"  # default


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--port", "70000"], {}, "--port / PACED_PORT"),
        ([], {"PACED_CHUNK_DELAY_S": "-1"}, "--chunk-delay-s / PACED_CHUNK_DELAY_S"),
        ([], {"PACED_GRACE_S": "soon"}, "PACED_GRACE_S='soon'"),
        (["--device", "tpu"], {}, "--device / PACED_DEVICE"),
        (["--probe-ceilings", "maybe"], {}, "--probe-ceilings='maybe'"),
    ],
)
def test_bad_settings_name_the_setting(argv, env, named):
    with pytest.raises(SystemExit) as stopped:
        load_config(PacedConfig, "PACED", argv, env)
    assert named in str(stopped.value)


def test_a_service_with_bad_config_fails_fast_with_the_message():
    result = subprocess.run(
        [venv_python("dev"), "-m", "tests.runtime.paced_service", "--grace-s", "-2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "--grace-s / PACED_GRACE_S must be >= 0, got -2.0" in result.stderr
