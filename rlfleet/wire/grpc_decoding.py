"""Undecodable gRPC requests: answered INVALID_ARGUMENT and counted, instead of INTERNAL and unseen.

When a request's bytes are not a valid protobuf, gRPC's own deserializer fails before any
servicer code runs and the call ends with INTERNAL ("Exception deserializing request!"),
which looks like a server bug and is counted nowhere. `add_servicer` registers a generated
servicer with each method's deserializer moved inside the handler, so such a request is
rejected like any other bad input: INVALID_ARGUMENT with the parser's message, counted by
the role's rejection counter. The servicer code itself is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import grpc
from google.protobuf.message import DecodeError

UNDECODABLE = "undecodable"


class UndecodableRequest(Exception):
    """Raised inside a request stream when a message cannot be parsed."""


class _Capture:
    """Stands in for a grpc.Server while a generated add_*_to_server call registers its handlers."""

    def __init__(self) -> None:
        self.services: list[tuple[str, dict]] = []

    def add_generic_rpc_handlers(self, handlers) -> None:  # the registered form below carries the same
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self.services.append((service, handlers))


def _parse(deserialize: Callable[[bytes], object], raw: bytes, context, on_reject: Callable[[str], None]):
    try:
        return deserialize(raw)
    except (DecodeError, ValueError, TypeError) as exc:
        on_reject(UNDECODABLE)
        message = f"undecodable request message ({len(raw)} bytes): {exc}"
        context.set_code(grpc.StatusCode.INVALID_ARGUMENT)  # kept if the servicer swallows the raise below
        context.set_details(message)
        raise UndecodableRequest(message) from exc


def _parsed_stream(requests: Iterator[bytes], deserialize, context, on_reject) -> Iterator[object]:
    for raw in requests:
        yield _parse(deserialize, raw, context, on_reject)


def _wrap(handler, on_reject: Callable[[str], None]):
    deserialize = handler.request_deserializer
    if deserialize is None:
        return handler
    kind = (
        ("stream" if handler.request_streaming else "unary")
        + "_"
        + ("stream" if handler.response_streaming else "unary")
    )
    behavior = getattr(handler, kind)

    def requests(request, context):
        if handler.request_streaming:
            return _parsed_stream(request, deserialize, context, on_reject)
        return _parse(deserialize, request, context, on_reject)

    if handler.response_streaming:

        def call(request, context):
            try:
                yield from behavior(requests(request, context), context)
            except UndecodableRequest as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    else:

        def call(request, context):
            try:
                return behavior(requests(request, context), context)
            except UndecodableRequest as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    return handler._replace(request_deserializer=None, **{kind: call})


def add_servicer(
    add_to_server: Callable,
    servicer,
    server: grpc.Server,
    on_reject: Callable[[str], None],
    per_method: Mapping[str, Callable[[str], None]] | None = None,
) -> None:
    """`add_XServicer_to_server(servicer, server)`, but undecodable requests go to `on_reject(reason)`,
    or to `per_method[name]` for the methods it names (e.g. pushes counted as rejected segments)."""
    capture = _Capture()
    add_to_server(servicer, capture)
    per_method = per_method or {}
    for service, handlers in capture.services:
        wrapped = {name: _wrap(h, per_method.get(name, on_reject)) for name, h in handlers.items()}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))
        server.add_registered_method_handlers(service, wrapped)
