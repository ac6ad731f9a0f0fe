"""`serve(...)`: load a model and run the app with uvicorn; what `mlxinfer serve` calls."""

from __future__ import annotations

import ipaddress
import logging
import sys
from typing import Optional

from .. import defaults

log = logging.getLogger("mlxinfer.server")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere: treat as beyond loopback


def serve(
    model=None,
    *,
    tokenizer=None,
    host: str = defaults.SERVE_HOST,
    port: int = defaults.SERVE_PORT,
    api_key: Optional[str] = None,
    compute_dtype: str = "auto",
    max_rows: int = defaults.SERVE_MAX_ROWS,
    max_queue: int = defaults.SERVE_MAX_QUEUE,
    cors: Optional[list[str]] = None,
    model_name: Optional[str] = None,
    max_body_bytes: int = defaults.SERVE_MAX_BODY_BYTES,
    default_max_tokens: Optional[int] = None,
    prompt_cache_bytes: int = defaults.SERVE_PROMPT_CACHE_BYTES,
    log_level: str = "info",
) -> None:
    """Serve `model` (a loaded model with `tokenizer`, or anything mlxinfer.load takes) on host:port
    until interrupted. Binds 127.0.0.1 unless told otherwise; beyond loopback without an api_key it
    warns, since anyone who can reach the port can then use the model."""
    import uvicorn

    from ..model.loading import load
    from .app import create_app

    if tokenizer is None:
        model, tokenizer = load(model, compute_dtype)
    if not is_loopback(host) and api_key is None:
        print(
            f"warning: serving on {host}, beyond loopback, without an API key: anyone who reaches port {port} "
            "can use this model (pass --api-key)",
            file=sys.stderr,
        )
    app = create_app(
        model,
        tokenizer,
        api_key=api_key,
        max_rows=max_rows,
        max_queue=max_queue,
        cors=cors,
        model_name=model_name,
        max_body_bytes=max_body_bytes,
        default_max_tokens=default_max_tokens,
        prompt_cache_bytes=prompt_cache_bytes,
    )
    print(
        f"mlxinfer serve: {model.info.name} ({model.info.definition}, {model.info.compute_dtype}) on http://{host}:{port}/v1",
        file=sys.stderr,
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
