"""`mlxinfer serve`: an OpenAI-compatible server (mlxinfer/server); this command only parses and calls it."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from mlxinfer import defaults

from mlxinfer_cli.common import utf8_stdout
from mlxinfer_cli.options import takes


@takes("model")
def serve(
    host: str = typer.Option(defaults.SERVE_HOST, "--host", help="Address to bind; beyond loopback, set --api-key."),
    port: int = typer.Option(defaults.SERVE_PORT, "--port", help="TCP port."),
    api_key: Optional[str] = typer.Option(
        None,
        "--api-key",
        envvar="MLXINFER_API_KEY",
        help="Require 'Authorization: Bearer KEY' on /v1, /metrics and the explorer's JSON (/health stays open).",
    ),
    max_rows: int = typer.Option(defaults.SERVE_MAX_ROWS, "--max-rows", help="Rows (seeds) decoded together at most."),
    max_queue: int = typer.Option(
        defaults.SERVE_MAX_QUEUE,
        "--max-queue",
        help="Requests waiting for a row at most; past it: 429 + Retry-After (0: none wait).",
    ),
    cors: Optional[list[str]] = typer.Option(
        None, "--cors", help="An origin allowed by CORS (repeat); none by default."
    ),
    model_name: Optional[str] = typer.Option(None, "--served-model-name", help="The id clients send as `model`."),
    max_body_bytes: int = typer.Option(
        defaults.SERVE_MAX_BODY_BYTES, "--max-body-bytes", help="Largest request body; past it: 413."
    ),
    default_max_tokens: Optional[int] = typer.Option(
        None, "--default-max-tokens", help="Token budget when a request sets none (default: up to the context)."
    ),
    prompt_cache_mb: int = typer.Option(
        defaults.SERVE_PROMPT_CACHE_BYTES // 2**20,
        "--prompt-cache-mb",
        min=0,
        help="MiB of prefilled prompts kept for requests that repeat them; 0: none.",
    ),
    log_level: str = typer.Option(
        "info", "--log-level", help="uvicorn's log level: critical, error, warning, info, debug, trace."
    ),
    json_out: bool = typer.Option(
        False, "--json", help="Print where it listens as one JSON line on stdout (the log goes to stderr)."
    ),
    **options,
):
    """Serve the model over OpenAI's HTTP API: every request's seed is its own random stream."""
    import mlxinfer

    mlxinfer.serve(
        options["model"],
        compute_dtype=options["compute_dtype"],
        host=host,
        port=port,
        api_key=api_key,
        max_rows=max_rows,
        max_queue=max_queue,
        cors=cors,
        model_name=model_name,
        max_body_bytes=max_body_bytes,
        default_max_tokens=default_max_tokens,
        prompt_cache_bytes=prompt_cache_mb * 2**20,
        log_level=log_level,
        announce=_announce if json_out else None,
    )


def _announce(info: dict) -> None:
    """--json: where it serves, as one line of JSON on stdout, flushed (a script reading the pipe
    reads one line while the server runs on)."""
    sys.stdout.write(json.dumps(info, ensure_ascii=not utf8_stdout()) + "\n")
    sys.stdout.flush()
