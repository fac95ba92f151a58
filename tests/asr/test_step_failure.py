"""An engine step that fails ends its calls with INTERNAL naming the engine's error (gRPC's UNKNOWN, "Unexpected
RuntimeError", before), and the service keeps serving: the failure is not a device fault.

The failure is a real one of the engine: `--record-encoder-dir` (the debug recording of each call's encoder output)
made a file, so that writing the recording fails inside the engine, in a Recognize's step and at a stream's end."""

from __future__ import annotations

import shutil

import grpc
import pytest

from tests.asr.client import clip, config, requests, stub
from tests.harness import running_service, venv_python
from voiceagent.v1 import asr_pb2

ARGS = ["--preset", "tiny", "--threads", "1", "--probe-ceilings", "false"]


@pytest.mark.parametrize("engine_process", ["true", "false"])
def test_a_failed_step_is_internal_and_the_service_serves_on(tmp_path, engine_process):
    folder = tmp_path / "recorded"
    folder.mkdir()
    args = [*ARGS, "--record-encoder-dir", str(folder), "--engine-process", engine_process]
    with running_service("services.asr", venv_python("asr"), args) as service:
        shutil.rmtree(folder)
        folder.write_text("not a folder")  # every recording now fails
        audio = clip(1.0, seed=7)
        with pytest.raises(grpc.RpcError) as offline:
            stub(service).Recognize(asr_pb2.RecognizeRequest(config=config(320), audio=audio.tobytes()), timeout=60)
        with pytest.raises(grpc.RpcError) as streamed:
            list(stub(service).StreamingRecognize(requests(config(320), audio), timeout=60))
        for caught in (offline, streamed):
            assert caught.value.code() == grpc.StatusCode.INTERNAL, caught.value
            assert caught.value.details().startswith("ASR engine: "), caught.value.details()
            assert "Error" in caught.value.details()  # the engine's exception type, e.g. NotADirectoryError
        folder.unlink()
        folder.mkdir()  # the cause gone, the same service serves again
        final = list(stub(service).StreamingRecognize(requests(config(320), audio), timeout=60))[-1]
        assert final.is_final
        assert service.health() == 1  # SERVING: nothing ended the process
