"""The load generator's Locust users for the stock `locust` command: web UI, master and worker processes.

    locust -f deploy/docker/loadgen/locustfile.py --class-picker --llm 127.0.0.1:50052 ...

Workload and endpoint flags are the ones `python -m loadgen sweep` takes (`--prompt-tokens`, `--llm`, ...), also
settable in a locust.conf. Locust reports every call (and, for streams, the first chunk) in its UI and CSVs.
The concurrency sweep with regime verdicts and reports is `python -m loadgen sweep`, not this file.
"""

from __future__ import annotations

import argparse
import dataclasses

from locust import events

from loadgen.cli import add_workload_flags, workload_from
from loadgen.users import AsrUser, LlmUser, LoadContext, TtsUser, VoiceTurnUser
from loadgen.workload import Lengths, Workload

__all__ = ["AsrUser", "LlmUser", "TtsUser", "VoiceTurnUser"]  # the classes Locust offers

LENGTH_OPTIONS = {field.name for field in dataclasses.fields(Workload) if isinstance(field.default, Lengths)}


@events.init_command_line_parser.add_listener
def _workload_flags(parser) -> None:
    add_workload_flags(parser)


@events.init.add_listener
def _serialisable_options(environment, **_) -> None:
    # The master sends its custom options to the workers as msgpack, which cannot carry a Lengths: keep specs.
    for name in LENGTH_OPTIONS:
        value = getattr(environment.parsed_options, name, None)
        if isinstance(value, Lengths):
            setattr(environment.parsed_options, name, value.spec)


@events.test_start.add_listener
def _load_context(environment, **_) -> None:
    # On a worker this runs after the master's options arrived, so every worker runs the master's workload.
    options = {
        name: Lengths(value) if name in LENGTH_OPTIONS else value
        for name, value in vars(environment.parsed_options).items()
    }
    if previous := getattr(environment, "loadgen", None):
        previous.close()
    # Per-request records are the sweep's business; here Locust's own statistics are the result.
    context = LoadContext(workload_from(argparse.Namespace(**options)), sink=lambda record: None)
    context.accepting = True
    environment.loadgen = context
