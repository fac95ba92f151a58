"""Several gRPC front ends on one vLLM engine core (`--frontends N`), the way `vllm serve --api-server-count N`
does it, with vLLM's own pieces: the supervisor launches the engine core once (`launch_core_engines`) with one
pair of ZMQ addresses per client, and each front-end process builds an `AsyncLLM` on its pair as client `index`
of `count` (`client_addresses`, `client_index`, `client_count`). Requests, outputs and aborts then travel
between each front end and the engine core as they do in `vllm serve`; nothing new crosses a process boundary.

The spawning, supervision, shared port, health and metrics are the service-neutral part
(voiceagent/serving/frontends.py). This module is the vLLM-specific part: launch the core, attach a front end.
Versions: vLLM 0.32 binds the client sockets in the supervisor and hands them over (`bind_engine_zmq_listeners`);
older ones (the H200 route's 0.26) hand over addresses that each client binds. Both are handled below.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import threading
from typing import Any

from services.llm.backends.vllm import VllmGenerator, engine_args, stage_model_dir, yield_to_front_end
from services.llm.config import LlmConfig
from services.llm.servicer import LlmService
from voiceagent.serving.admission import Admission, shared_counter
from voiceagent.serving.frontends import run_pod
from voiceagent.serving.lifeline import children_die_with_us

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EngineAttachment:
    """What a front end needs to be one of the engine core's clients."""

    client: dict[str, Any]  # vLLM's client_addresses: addresses (and on 0.32 the bound listener sockets)
    index: int
    count: int
    admitted: Any = None  # the pod's requests in flight, one counter for every front end (serving/admission.py)


def _engine_config(config: LlmConfig, count: int, rank: int):
    from vllm.usage.usage_lib import UsageContext

    args = engine_args(config, stage_model_dir(config))
    # What `vllm serve` sets on the arguments of each API server (-1: the process that launches the core).
    if hasattr(args, "_api_process_count"):
        args._api_process_count = count
        args._api_process_rank = rank
    return args.create_engine_config(UsageContext.OPENAI_API_SERVER)


class VllmEngineCore:
    """The EngineLauncher of the LLM service: vLLM's engine core, launched once in the supervisor."""

    def __init__(self, config: LlmConfig):
        self.config = config
        self.manager = None
        self.listeners = None
        self.lock = threading.Lock()  # stop() waits for a start() under way
        self.stopped = False

    def start(self, frontends: int) -> list[EngineAttachment]:
        from vllm.v1.engine import utils as engine_utils

        try:
            from vllm.v1.executor import Executor
        except ImportError:  # older layout
            from vllm.v1.executor.abstract import Executor

        children_die_with_us()  # the engine core dies with the supervisor, whatever kills it
        with self.lock:
            if self.stopped:
                raise RuntimeError("stopped before the engine started")
            vllm_config = _engine_config(self.config, frontends, -1)
            executor = Executor.get_class(vllm_config)
            launch = engine_utils.launch_core_engines
            if hasattr(engine_utils, "bind_engine_zmq_listeners"):  # vLLM 0.32: sockets bound here, handed over
                self.listeners = engine_utils.bind_engine_zmq_listeners(vllm_config, frontends)
                with launch(vllm_config, executor, True, self.listeners.addresses) as launched:
                    self.manager = launched.engine_manager
                clients = [
                    {
                        "input_address": i.address,
                        "output_address": o.address,
                        "input_listener": i.socket,
                        "output_listener": o.socket,
                    }  # fmt: skip
                    for i, o in zip(self.listeners.inputs, self.listeners.outputs, strict=True)
                ]
            else:  # older: addresses that each client binds itself
                if "addresses" in inspect.signature(launch).parameters:
                    addresses = engine_utils.get_engine_zmq_addresses(vllm_config, frontends)
                    context = launch(vllm_config, executor, True, addresses, frontends)
                else:
                    context = launch(vllm_config, executor, True, frontends)
                with context as launched:
                    self.manager, _coordinator, addresses = launched[:3]
                clients = [
                    {"input_address": i, "output_address": o}
                    for i, o in zip(addresses.inputs, addresses.outputs, strict=True)
                ]
        if self.config.device == "cpu" and self.config.cpu_engine_core_nice:
            yield_to_front_end(self.config.cpu_engine_core_nice)
        log.info("engine core up (pids %s) for %d front ends", [p.pid for p in self.processes()], frontends)
        admitted = shared_counter()  # max_in_flight holds for the pod, whichever front end took a request
        return [
            EngineAttachment({**client, "client_count": frontends, "client_index": index}, index, frontends, admitted)
            for index, client in enumerate(clients)
        ]

    def processes(self) -> list:
        return list(getattr(self.manager, "processes", []) or [])

    def failure(self) -> str:
        dead = [p for p in self.processes() if p.exitcode is not None]
        return ", ".join(f"{p.name} exited with {p.exitcode}" for p in dead)

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            if self.manager is not None:
                self.manager.shutdown()
                self.manager = None
            if self.listeners is not None:
                with contextlib.suppress(Exception):
                    self.listeners.cleanup()
                self.listeners = None


def attach(config: LlmConfig, attachment: EngineAttachment, step_logger):
    """In a front-end process: an AsyncLLM on the engine core the supervisor launched (blocks; run in a thread)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_vllm_config(
        _engine_config(config, attachment.count, attachment.index),
        stat_loggers=[step_logger],
        disable_log_stats=False,
        client_addresses=attachment.client,
        client_count=attachment.count,
        client_index=attachment.index,
    )


def frontend_service(config: LlmConfig, attachment: EngineAttachment, index: int, count: int) -> LlmService:
    """A front end's service (voiceagent.serving.frontends calls it in the spawned process)."""
    return LlmService(config, VllmGenerator(config, attachment), Admission(config.max_in_flight, attachment.admitted))


def serve_frontends(config: LlmConfig) -> None:
    """Entry point of `python -m services.llm --frontends N` (N > 1)."""
    run_pod("llm", config, config.frontends, VllmEngineCore(config), frontend_service, config.resolved_dtype)
