"""What the tests use to start services: the project's one launcher (voiceagent/serving/launcher.py), re-exported
so every test reads `from tests.harness import ...`. Every test that needs a server uses it: a real process, a
real port chosen by the OS, a real channel."""

from voiceagent.serving.launcher import (
    REPO,
    ServiceProcess,
    child_processes,
    proc_stat,
    read_metrics,
    running_service,
    sample_sum,
    scrape_samples,
    start_service,
    venv_python,
)

__all__ = [
    "REPO",
    "ServiceProcess",
    "child_processes",
    "proc_stat",
    "read_metrics",
    "running_service",
    "sample_sum",
    "scrape_samples",
    "start_service",
    "venv_python",
]
