"""An OpenAI-compatible upstream that fails on demand, for the openai backend's failure tests: a real HTTP
server (aiohttp) on loopback, run as its own process. It is the edge we do not own, not the thing under test.

The prompt (or the last chat message) picks the behaviour:
  "status NNN"  answer HTTP NNN with an OpenAI-style error body naming the status
  "slow"        stream three one-token chunks, PACE_S apart, then the finish and usage chunks
  "silent"      send the event-stream headers, then nothing
  "hang up"     stream one chunk, then drop the connection
  "error event" stream one chunk, then an error event (as vLLM sends errors after the stream started)
  "whoami"      stream the request's Authorization header back
  token ids     stream max_tokens one-token chunks, TOKEN_PACE_S apart (what the load generator sends)
  anything else stream "ok" and finish

    python -m tests.llm.upstream_server [--certfile CERT --keyfile KEY]   # prints "listening on HOST:PORT"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl

from aiohttp import web

MODEL = "fake-upstream"
PACE_S = 0.3
TOKEN_PACE_S = 0.005


def event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def chunk(text: str, token_ids: list[int], finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "token_ids": token_ids, "finish_reason": finish}
    return event({"choices": [choice], "model": MODEL})


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 1024}]})


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    prompt = body.get("prompt") or body["messages"][-1]["content"]
    if not isinstance(prompt, str):
        return await stream_tokens(request, body["max_tokens"])
    if prompt.startswith("status "):
        status = int(prompt.split()[1])
        error = {"message": f"synthetic failure {status} for this request", "type": "TestError", "code": status}
        return web.json_response({"error": error}, status=status)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if prompt == "silent":
        await asyncio.sleep(3600)
    if prompt == "hang up":
        await response.write(chunk("one", [1]))
        request.transport.close()
        return response
    if prompt == "error event":
        await response.write(chunk("one", [1]))
        error = {"message": "synthetic engine failure mid-stream", "type": "InternalServerError", "code": 500}
        await response.write(event({"error": error}))
        await response.write(b"data: [DONE]\n\n")
        return response
    replies = {"slow": ["one", " two", " three"], "whoami": [request.headers.get("Authorization", "")]}
    words = replies.get(prompt, ["ok"])
    for index, word in enumerate(words):
        if index and prompt == "slow":
            await asyncio.sleep(PACE_S)
        await response.write(chunk(word, [index + 1]))
    await response.write(chunk("", [], finish="length"))
    usage = {"prompt_tokens": 5, "completion_tokens": len(words), "total_tokens": 5 + len(words)}
    await response.write(event({"choices": [], "usage": usage}))
    await response.write(b"data: [DONE]\n\n")
    return response


async def stream_tokens(request: web.Request, count: int) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for index in range(count):
        await asyncio.sleep(TOKEN_PACE_S)
        await response.write(chunk(" ok", [index + 1], finish="length" if index == count - 1 else None))
    usage = {"prompt_tokens": 5, "completion_tokens": count, "total_tokens": 5 + count}
    await response.write(event({"choices": [], "usage": usage}))
    await response.write(b"data: [DONE]\n\n")
    return response


async def serve(certfile: str, keyfile: str) -> None:
    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    tls = None
    if certfile:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(certfile, keyfile)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    host, port = site._server.sockets[0].getsockname()[:2]
    print(f"listening on {host}:{port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--certfile", default="")
    parser.add_argument("--keyfile", default="")
    args = parser.parse_args()
    asyncio.run(serve(args.certfile, args.keyfile))
