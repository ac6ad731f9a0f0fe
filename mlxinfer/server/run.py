"""`serve(...)`: load a model and run the app with uvicorn; what `mlxinfer serve` calls."""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
from typing import Callable, Optional

from .. import defaults
from ..errors import MlxinferError, is_whole

log = logging.getLogger("mlxinfer.server")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere: treat as beyond loopback


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound and listening before the model loads: a bad address or a port in
    use is one line at once (uvicorn would log it over several lines after the load), and a second
    server on the same port is refused while this one loads. A name that resolves to both takes
    IPv4 first, as uvicorn does (macOS lists ::1 first for localhost)."""
    if not isinstance(host, str) or not host.strip():
        raise MlxinferError("host must be an address to bind, e.g. 127.0.0.1 (or 0.0.0.0, with an API key)", "host")
    if not is_whole(port) or not 0 <= port <= 65535:
        raise MlxinferError(f"port must be 0-65535 (0: any free port), got {port!r}", "port")
    sock = None
    try:
        found = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = min(found, key=lambda a: a[0] != socket.AF_INET)
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        sock.bind(address)
        sock.listen(2048)  # uvicorn's backlog
    except (OSError, UnicodeError) as e:  # UnicodeError: a host name IDNA cannot encode (a label over 63)
        if sock is not None:
            sock.close()
        why = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise MlxinferError(
            f"cannot listen on {address_text(host, port)} ({why}); pick another port or address", "port"
        ) from None
    return sock


def address_text(host: str, port: int) -> str:
    """host:port, with an IPv6 address in brackets ([::1]:8080)."""
    return f"[{host.strip('[]')}]:{port}" if ":" in host else f"{host}:{port}"


def open_files_limit(start: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """This process's open-file limits (soft, hard); given the ones it started with, raise them back where
    they were lowered (mlxinfer/open_files.py keeps mlx-lm's import from lowering them, where mlxinfer was
    imported first), and the soft one to the hard one, at most 65,536: each connection is a file. None where
    the platform has no such limit."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    kind, unlimited = resource.RLIMIT_NOFILE, resource.RLIM_INFINITY
    soft, hard = resource.getrlimit(kind)
    if start is None or soft == unlimited:
        return soft, hard

    def finite(n: int) -> int:
        return 1 << 16 if n == unlimited else n

    for new_hard in sorted({start[1], hard}, key=finite, reverse=True):
        new_soft = min(max(finite(soft), finite(start[0]), min(finite(new_hard), 1 << 16)), finite(new_hard))
        try:
            resource.setrlimit(kind, (new_soft, new_hard))
            break
        except (ValueError, OSError):  # a hard limit only a privileged process may raise: the one there is
            continue
    return resource.getrlimit(kind)


GRACE_SECONDS = 5  # from a stop signal, for the requests in flight to end
DRAIN_SECONDS = 2.5  # then the engine stops: what still runs hears 503 and ends, within the grace
ENGINE_STOP_SECONDS = 10.0  # at most, for the engine to end its step or prefill chunk once stopped


def uvicorn_config(app, **options):
    """uvicorn's Config for `app`, as serve runs it: the h11 protocol whose own 400s are OpenAI's shape
    (protocol.py), a graceful shutdown of 5 s, and every log line on stderr (uvicorn writes its access
    log to stdout, where `serve --json` prints the one line a script reads). options: the rest of
    uvicorn.Config's (host, port, ...)."""
    import copy

    import uvicorn
    from uvicorn.config import LOG_LEVELS, LOGGING_CONFIG

    from .protocol import OpenAIShapedH11

    logging = copy.deepcopy(LOGGING_CONFIG)
    logging["handlers"]["access"]["stream"] = "ext://sys.stderr"
    # the engine's and the handlers' own lines, in uvicorn's format and at its level (was: Python's last resort)
    level = LOG_LEVELS.get(str(options.get("log_level", "info")).lower(), 20)
    logging["loggers"]["mlxinfer"] = {"handlers": ["default"], "level": level, "propagate": False}  # as uvicorn's
    options.setdefault("log_config", logging)
    return uvicorn.Config(app, http=OpenAIShapedH11, timeout_graceful_shutdown=GRACE_SECONDS, **options)


def draining_server(config, batcher):
    """uvicorn's Server, whose graceful shutdown stops the engine DRAIN_SECONDS in: the short requests in
    flight have ended by then, and a long one (a long prompt's prefill, many tokens) gets a 503 error (an
    error event in a stream) and ends cleanly, where uvicorn would cut its connection at the grace's end."""
    import asyncio
    import contextlib

    import uvicorn

    class Draining(uvicorn.Server):
        async def shutdown(self, sockets=None):
            loop = asyncio.get_running_loop()
            stop = loop.call_later(DRAIN_SECONDS, batcher.stop)
            try:
                await super().shutdown(sockets=sockets)
            finally:
                stop.cancel()
                # A second Ctrl-C (force_exit) skips the lifespan's close and uvicorn's wait for the requests: the
                # engine is stopped and waited for here (a process that exits while it computes aborts in MLX's
                # teardown: exit 134), and the requests it ended send their 503 before the loop is torn down
                # (else they were cancelled: a 500 and a traceback each).
                batcher.stop()  # at once: close() stops it too, but only once the executor gives it a thread
                ended = await loop.run_in_executor(None, batcher.close, ENGINE_STOP_SECONDS)
                if self.force_exit:
                    if self.server_state.tasks:
                        await asyncio.wait(list(self.server_state.tasks), timeout=1.0)
                    # its task, left waiting, was cancelled: a traceback (not where the engine still runs: its close
                    # would wait again)
                    if getattr(self, "lifespan", None) is not None and ended:
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(self.lifespan.shutdown(), timeout=1.0)

    return Draining(config)


def serve(
    model=None,
    *,
    tokenizer=None,
    host: str = defaults.SERVE_HOST,
    port: int = defaults.SERVE_PORT,
    compute_dtype: str = "auto",
    log_level: str = "info",
    announce: Optional[Callable[[dict], None]] = None,
    **options,
) -> None:
    """Serve `model` (a loaded model with `tokenizer`, or anything mlxinfer.load takes) on host:port
    until interrupted. `options`: the app's (app.ServerOptions: api_key, max_rows, max_queue, cors,
    model_name, max_body_bytes, default_max_tokens, prompt_cache_bytes). Binds 127.0.0.1 unless told
    otherwise; beyond loopback without an api_key it warns, since anyone who can reach the port can
    then use the model. Every option is checked, and the port bound, before the model loads.
    `announce`: called with where it serves, once listening (default: one line on stderr)."""
    from uvicorn.config import LOG_LEVELS

    from ..model.loading import load
    from .app import ServerOptions, create_app

    checked = ServerOptions.of(options)
    if not isinstance(log_level, str) or log_level.lower() not in LOG_LEVELS:
        raise MlxinferError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}", "log_level")
    sock = listen(host, port)
    port = sock.getsockname()[1]
    try:
        limit = open_files_limit()
        if tokenizer is None:
            model, tokenizer = load(model, compute_dtype)
        if not is_loopback(host) and checked.api_key is None:
            print(
                f"warning: serving on {host}, beyond loopback, without an API key: anyone who reaches port {port} "
                "can use this model (pass --api-key)",
                file=sys.stderr,
            )
        app = create_app(model, tokenizer, checked)
        open_files_limit(limit)  # after the app, whose grammar's token table imports mlx-lm: the last import here
        url = f"http://{address_text(host, port)}/v1"
        info = {"url": url, "page": f"http://{address_text(host, port)}/", "model": model.info.name}
        info["definition"] = model.info.definition
        info["compute_dtype"] = model.info.compute_dtype
        if announce is None:
            print(
                f"mlxinfer serve: {info['model']} ({info['definition']}, {info['compute_dtype']}) on {url}",
                file=sys.stderr,
            )
        else:
            announce(info)
        draining_server(uvicorn_config(app, log_level=log_level.lower()), app.engine.batcher).run(sockets=[sock])
    finally:
        sock.close()
