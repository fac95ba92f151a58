import pytest

from tests.harness import running_service, venv_python


@pytest.fixture(scope="module")
def paced():
    """The runtime's test service, SERVING, in its own process (dev environment)."""
    with running_service("tests.runtime.paced_service", venv_python("dev"), ["--load-s", "0"]) as service:
        yield service
