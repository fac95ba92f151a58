"""The three services on their tiny presets, started once for the load-generator tests, each in its own
virtualenv and process, on ports the OS picks."""

from __future__ import annotations

import contextlib

import pytest

from tests.harness import start_service, venv_python

TINY = {"asr": ["--preset", "tiny"], "llm": ["--preset", "tiny"], "tts": ["--preset", "tiny"]}


@pytest.fixture(scope="session")
def services():
    """{name: ServiceProcess}, all SERVING; started together so their slow engine loads overlap."""
    with contextlib.ExitStack() as stack:
        started = {}
        for name, args in TINY.items():
            service = start_service(f"services.{name}", venv_python(name), args)
            stack.callback(service.terminate)
            started[name] = service
        for service in started.values():
            service.wait_serving(300)
        yield started


@pytest.fixture(scope="session")
def endpoint_flags(services) -> list[str]:
    """The `python -m loadgen` flags that point every user at the test services."""
    flags = []
    for name, service in services.items():
        flags += [f"--{name}", service.address, f"--{name}-metrics", service.metrics_url]
    return flags
