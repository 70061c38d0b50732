"""Who may talk to an rlfleet server: a shared bearer token, optional TLS, the bind rule, size limits.

One `AuthConfig` per process. The CLI builds it from flags and environment and installs it with
`configure()`; everything that opens a server or a channel asks `current()` unless it is handed
one explicitly, so new call sites are covered without threading a parameter through every layer.
Without `configure()`, `current()` reads the environment (RLFLEET_TOKEN, RLFLEET_TLS_*), which is
how the local launcher passes the token to its children (never on the command line, where any
user of the host can read it).

gRPC: every call must carry `authorization: Bearer <token>` when a token is set, except the
standard health service (`grpc.health.v1.Health`), which orchestrators probe without
credentials (Kubernetes' gRPC probes cannot send metadata) and which reveals only
SERVING / NOT_SERVING. Reflection describes every method, so it needs the token like the rest.

ZeroMQ: a request starts with two frames, b"auth" and the token (see `zmq_auth_frames`), which
a server with a token checks on every message; a server without one drops them. ZeroMQ's own
ZAP/PLAIN mechanism was considered: it sends the password in clear as well, and a refused client
only sees a silent handshake failure and waits out its timeout, whereas the frame gets a clear
error reply that the server counts.
"""

from __future__ import annotations

import collections
import dataclasses
import hmac
import ipaddress
import logging
import os
import re
import stat
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
HEALTH_METHOD_PREFIX = "/grpc.health.v1.Health/"
ZMQ_AUTH_KIND = b"auth"

ENV_TOKEN = "RLFLEET_TOKEN"
ENV_TLS_CERT = "RLFLEET_TLS_CERT"
ENV_TLS_KEY = "RLFLEET_TLS_KEY"
ENV_TLS_CA = "RLFLEET_TLS_CA"
ENV_TLS_SERVER_NAME = "RLFLEET_TLS_SERVER_NAME"
ENV_MAX_MESSAGE_BYTES = "RLFLEET_MAX_MESSAGE_BYTES"
ENV_IDENTITIES_FILE = "RLFLEET_IDENTITIES_FILE"
FLEET_IDENTITY = "fleet"  # the identity of the shared token (RLFLEET_TOKEN / --token-file)
_IDENTITY_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class AuthError(ValueError):
    """Settings that cannot work (missing key for a certificate, unreadable token file, ...)."""


@dataclass(frozen=True)
class AuthConfig:
    """Token, TLS file paths and the message size limit shared by every server and client of a process."""

    token: str = ""
    tls_cert: str = ""  # server certificate chain (PEM); with tls_key turns TLS on for this process's servers
    tls_key: str = ""  # server private key (PEM)
    tls_ca: str = ""  # root certificate(s) clients trust (PEM); set on a client to connect over TLS
    tls_server_name: str = ""  # name to check the server certificate against when the address is an IP
    max_message_bytes: int = MAX_MESSAGE_BYTES
    # servers: more tokens, one per identity (`NAME TOKEN` lines); each identity gets its own share
    # of the stream budget and the learner's client table
    identities_file: str = ""

    def __post_init__(self) -> None:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise AuthError("TLS needs both a certificate and its key (--tls-cert and --tls-key)")
        if any(c.isspace() for c in self.token):
            raise AuthError("the token must not contain whitespace")
        if self.max_message_bytes <= 0:
            raise AuthError(f"max_message_bytes must be positive, got {self.max_message_bytes}")

    @property
    def server_tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def client_tls(self) -> bool:
        """Clients speak TLS when given a CA, or when this process serves TLS itself (one fleet, one mode)."""
        return bool(self.tls_ca or self.tls_cert)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AuthConfig:
        env = os.environ if env is None else env
        size = env.get(ENV_MAX_MESSAGE_BYTES, "")
        try:
            max_bytes = int(size) if size else MAX_MESSAGE_BYTES
        except ValueError:
            raise AuthError(f"{ENV_MAX_MESSAGE_BYTES} must be an integer, got {size!r}") from None
        return cls(
            token=env.get(ENV_TOKEN, "").strip(),
            tls_cert=env.get(ENV_TLS_CERT, ""),
            tls_key=env.get(ENV_TLS_KEY, ""),
            tls_ca=env.get(ENV_TLS_CA, ""),
            tls_server_name=env.get(ENV_TLS_SERVER_NAME, ""),
            max_message_bytes=max_bytes,
            identities_file=env.get(ENV_IDENTITIES_FILE, ""),
        )

    def child_env(self) -> dict[str, str]:
        """Environment variables that give a child process these settings (the launcher's channel)."""
        pairs = {
            ENV_TOKEN: self.token,
            ENV_TLS_CERT: self.tls_cert,
            ENV_TLS_KEY: self.tls_key,
            ENV_TLS_CA: self.tls_ca,
            ENV_TLS_SERVER_NAME: self.tls_server_name,
            ENV_MAX_MESSAGE_BYTES: str(self.max_message_bytes),
            ENV_IDENTITIES_FILE: self.identities_file,
        }
        return {k: v for k, v in pairs.items() if v}


def read_token_file(path: str) -> str:
    """The token in a file (surrounding whitespace dropped); warns when others may read it."""
    p = Path(path)
    try:
        token = p.read_text().strip()
    except OSError as exc:
        raise AuthError(f"cannot read the token file {path}: {exc.strerror}") from exc
    if not token:
        raise AuthError(f"the token file {path} is empty")
    if p.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("token file %s is readable by other users; chmod 600 it", path)
    return token


def read_identities(path: str) -> dict[str, str]:
    """`NAME TOKEN` per line (blank lines and `#` comments skipped) -> {name: token}."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise AuthError(f"cannot read the identities file {path}: {exc.strerror}") from exc
    if p.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("identities file %s is readable by other users; chmod 600 it", path)
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split("#", 1)[0].split()
        if not parts:
            continue
        if len(parts) != 2 or not _IDENTITY_NAME.fullmatch(parts[0]):
            raise AuthError(f"{path}:{n}: expected 'NAME TOKEN' (a name of letters, digits, _ . -)")
        if parts[0] in out or parts[0] == FLEET_IDENTITY or parts[1] in out.values():
            raise AuthError(f"{path}:{n}: identity {parts[0]!r} or its token given twice (or named {FLEET_IDENTITY!r})")
        out[parts[0]] = parts[1]
    return out


@lru_cache(maxsize=16)
def identity_table(cfg: AuthConfig) -> dict[bytes, str]:
    """{expected authorization header: identity} for a server with these settings; empty without a token."""
    if not cfg.token:
        return {}
    table = {f"Bearer {cfg.token}".encode(): FLEET_IDENTITY}
    if cfg.identities_file:
        for name, token in read_identities(cfg.identities_file).items():
            table[f"Bearer {token}".encode()] = name
    return table


def identity_of(metadata, auth: AuthConfig | None = None) -> str:
    """The identity a call's token names ("" without a token set, or for a call without a valid token)."""
    return _match(metadata, identity_table(resolve(auth)))


def _match(metadata, table: Mapping[bytes, str]) -> str:
    for key, value in metadata or ():
        if key == "authorization":
            got = value.encode() if isinstance(value, str) else bytes(value)
            found = ""
            for expected, name in table.items():  # every one compared: the time does not say which
                if hmac.compare_digest(got, expected):
                    found = name
            return found
    return ""


def load_auth(token_file: str | None = None, env: Mapping[str, str] | None = None, **flags) -> AuthConfig:
    """Flags over environment: --token-file over RLFLEET_TOKEN, --tls-* over RLFLEET_TLS_* (None: not given)."""
    changes = {k: v for k, v in flags.items() if v is not None}
    if token_file:
        changes["token"] = read_token_file(token_file)
    return dataclasses.replace(AuthConfig.from_env(env), **changes)


_lock = threading.Lock()
_configured: AuthConfig | None = None


def configure(cfg: AuthConfig | None) -> None:
    """Install the process-wide settings (None: go back to reading the environment)."""
    global _configured
    with _lock:
        _configured = cfg


def current() -> AuthConfig:
    with _lock:
        cfg = _configured
    return cfg if cfg is not None else AuthConfig.from_env()


def resolve(auth: AuthConfig | None) -> AuthConfig:
    return auth if auth is not None else current()


# ---- bind rule ---------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_bind_host(host: str, auth: AuthConfig | None = None) -> None:
    """Loopback is always allowed; any other address only with a token (and TLS where configured)."""
    if is_loopback(host):
        return
    cfg = resolve(auth)
    if not cfg.token:
        raise ValueError(
            f"refusing to bind {host!r} without a token: rlfleet servers bind to loopback (127.0.0.1) "
            f"unless every client must authenticate; set {ENV_TOKEN} or pass --token-file"
        )
    if not cfg.server_tls:
        log.warning(
            "binding %s with a token but without TLS: the token and the data cross the network "
            "in clear (see docs/security.md)",
            host,
        )


# ---- gRPC: server side -------------------------------------------------------------------------


def grpc_options(auth: AuthConfig | None = None) -> list[tuple[str, int]]:
    limit = resolve(auth).max_message_bytes
    return [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]


def _deny(request_or_iterator, context: grpc.ServicerContext):
    context.abort(
        grpc.StatusCode.UNAUTHENTICATED,
        f"missing or wrong token: send 'authorization: Bearer <token>' (set {ENV_TOKEN} or --token-file)",
    )


def _deny_handler(handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler:
    """An UNAUTHENTICATED handler of the same shape, so streaming calls are refused before any message."""
    if handler is None or not (handler.request_streaming or handler.response_streaming):
        return grpc.unary_unary_rpc_method_handler(_deny)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_deny)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_deny)
    return grpc.unary_stream_rpc_method_handler(_deny)


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """Lets a call through only with the right bearer token (health checks excepted); counts refusals."""

    def __init__(
        self,
        token: str,
        open_prefixes: Sequence[str] = (HEALTH_METHOD_PREFIX,),
        identities: Mapping[bytes, str] | None = None,
    ):
        if not token:
            raise AuthError("TokenAuthInterceptor needs a non-empty token")
        # {expected header: identity}: the shared token and any named ones
        self._table = dict(identities or {f"Bearer {token}".encode(): FLEET_IDENTITY})
        self._open = tuple(open_prefixes)
        self._lock = threading.Lock()
        self.rejected = 0

    def _authorized(self, metadata) -> bool:
        return bool(_match(metadata, self._table))

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method.startswith(self._open) or self._authorized(handler_call_details.invocation_metadata):
            return continuation(handler_call_details)
        with self._lock:
            self.rejected += 1
            count = self.rejected
        log.warning("refused an unauthenticated call to %s (%d refused so far)", method, count)
        return _deny_handler(continuation(handler_call_details))


def server_interceptors(auth: AuthConfig | None = None) -> list[grpc.ServerInterceptor]:
    cfg = resolve(auth)
    return [TokenAuthInterceptor(cfg.token, identities=identity_table(cfg))] if cfg.token else []


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise AuthError(f"cannot read the TLS {what} {path}: {exc.strerror}") from exc


def add_server_port(server: grpc.Server, address: str, auth: AuthConfig | None = None) -> int:
    """Bind `address` with TLS when this process has a certificate, in clear otherwise; returns the port."""
    cfg = resolve(auth)
    if not cfg.server_tls:
        return server.add_insecure_port(address)
    creds = grpc.ssl_server_credentials([(_read(cfg.tls_key, "key"), _read(cfg.tls_cert, "certificate"))])
    return server.add_secure_port(address, creds)


# ---- gRPC: client side -------------------------------------------------------------------------


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


class BearerTokenClientInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the token to every call on a plain-text channel (call credentials need a secure one)."""

    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, d: grpc.ClientCallDetails) -> _CallDetails:
        return _CallDetails(
            d.method,
            d.timeout,
            [*(d.metadata or ()), self._header],
            d.credentials,
            getattr(d, "wait_for_ready", None),
            getattr(d, "compression", None),
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


def secure_channel(address: str, auth: AuthConfig | None = None) -> grpc.Channel:
    """A channel to `address` that carries this process's token, over TLS when configured."""
    cfg = resolve(auth)
    options: list[tuple[str, object]] = list(grpc_options(cfg))
    if cfg.client_tls:
        root = _read(cfg.tls_ca, "CA certificate") if cfg.tls_ca else None
        creds = grpc.ssl_channel_credentials(root_certificates=root)
        if cfg.token:
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(cfg.token))
        if cfg.tls_server_name:
            options.append(("grpc.ssl_target_name_override", cfg.tls_server_name))
        return grpc.secure_channel(address, creds, options=options)
    channel = grpc.insecure_channel(address, options=options)
    if cfg.token:
        channel = grpc.intercept_channel(channel, BearerTokenClientInterceptor(cfg.token))
    return channel


# ---- ZeroMQ ------------------------------------------------------------------------------------


def zmq_auth_frames(auth: AuthConfig | None = None) -> list[bytes]:
    """Frames a client puts before each request: [b"auth", token], or nothing without a token."""
    token = resolve(auth).token
    return [ZMQ_AUTH_KIND, token.encode()] if token else []


def check_zmq_token(frames: Sequence[bytes], token: str) -> tuple[int, str]:
    """Where the request starts in `frames` (after the auth frames, if any), or an error message.

    Returns (offset, "") when the request may go on, (-1, reason) when it must be refused.
    `frames` are the request's frames as bytes, without the ROUTER identity.
    """
    has_auth = len(frames) >= 2 and frames[0] == ZMQ_AUTH_KIND
    if not token:
        return (2 if has_auth else 0), ""
    if not has_auth:
        return -1, f"this inference server needs a token: send [b'auth', token] first (set {ENV_TOKEN} or --token-file)"
    if not hmac.compare_digest(bytes(frames[1]), token.encode()):
        return -1, "wrong token"
    return 2, ""
