"""Requests whose bytes are not a valid message (bad UTF-8 in a string field, a corrupt wire format) end
INVALID_ARGUMENT naming that, in every service and RPC.

grpc.aio runs the request deserializer itself; what it raises ends the call UNKNOWN ("Unexpected <class
'DecodeError'>"), logs a traceback per request and skips the RPC interceptor's count. Here the deserializer
returns a `MalformedRequest` instead, and the call's behaviour is wrapped: a unary request is refused before the
servicer sees it; in a stream of requests, the malformed one raises InvalidRequest where the servicer reads it,
which every servicer already ends as INVALID_ARGUMENT (a bad piece of audio or text arrives the same way).
"""

from __future__ import annotations

import inspect

import grpc
from google.protobuf.message import DecodeError

from voiceagent.serving.errors import InvalidRequest


class MalformedRequest:
    """Stands in for a request message that did not parse."""

    def __init__(self, error: DecodeError):
        self.reason = f"not a valid message ({error}); check the client's generated code and the text it sends"


async def _well_formed(requests):
    async for request in requests:
        if isinstance(request, MalformedRequest):
            raise InvalidRequest("request", request.reason)
        yield request


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):
    """Put after the RPC metrics interceptor, so that the refusal is counted under its code."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        parse = handler.request_deserializer

        def tolerant(raw: bytes):
            try:
                return parse(raw)
            except DecodeError as error:
                return MalformedRequest(error)

        if handler.request_streaming and inspect.isasyncgenfunction(handler.stream_stream):
            behavior = handler.stream_stream

            async def checked(requests, context):  # an async generator, as grpc.aio needs for yielded responses
                async for response in behavior(_well_formed(requests), context):
                    yield response

            factory = grpc.stream_stream_rpc_method_handler
        elif handler.request_streaming:  # one response, or streamed ones written with context.write
            behavior = handler.stream_unary or handler.stream_stream

            async def checked(requests, context):
                return await behavior(_well_formed(requests), context)

            factory = (
                grpc.stream_stream_rpc_method_handler
                if handler.response_streaming
                else grpc.stream_unary_rpc_method_handler
            )
        elif inspect.isasyncgenfunction(handler.unary_stream):
            behavior = handler.unary_stream

            async def checked(request, context):
                if isinstance(request, MalformedRequest):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: {request.reason}")
                async for response in behavior(request, context):
                    yield response

            factory = grpc.unary_stream_rpc_method_handler
        else:  # one response, or streamed ones written with context.write
            behavior = handler.unary_unary or handler.unary_stream

            async def checked(request, context):
                if isinstance(request, MalformedRequest):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: {request.reason}")
                return await behavior(request, context)

            factory = (
                grpc.unary_stream_rpc_method_handler
                if handler.response_streaming
                else grpc.unary_unary_rpc_method_handler
            )
        return factory(checked, request_deserializer=tolerant, response_serializer=handler.response_serializer)
