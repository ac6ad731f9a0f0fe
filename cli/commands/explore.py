"""`mlxinfer explore`: the server on a free loopback port, and its explorer page opened in the browser."""

from __future__ import annotations

import json
import sys
import threading
import webbrowser
from typing import Optional
from urllib.parse import quote

import typer

from mlxinfer_cli.options import takes


@takes("model")
def explore(
    port: int = typer.Option(0, "--port", help="TCP port on 127.0.0.1 (0: any free port)."),
    api_key: Optional[str] = typer.Option(
        None, "--api-key", envvar="MLXINFER_API_KEY", help="Require this key; the page opened is given it."
    ),
    open_page: bool = typer.Option(True, "--open/--no-open", help="Open the page in the default web browser."),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn's log level (see `mlxinfer serve`)."),
    json_out: bool = typer.Option(
        False, "--json", help="Print the page's address as one JSON line on stdout (the log goes to stderr)."
    ),
    **options,
):
    """Explore the model in the browser: the next-token table, the sampler's cut, seeded draws, generation.

    Serves the model as `mlxinfer serve` does, on 127.0.0.1 only, and opens its page at / (python's
    webbrowser: set BROWSER to choose one). Ctrl+C stops it."""
    import mlxinfer

    def announce(info: dict) -> None:
        page = info["page"]
        if json_out:
            sys.stdout.write(json.dumps({"page": page, "url": info["url"], "model": info["model"]}) + "\n")
        else:
            sys.stdout.write(f"mlxinfer explore: {info['model']} ({info['compute_dtype']}) at {page}\n")
        sys.stdout.flush()
        if open_page:  # the key rides in the fragment, which the browser keeps to itself
            target = page + (f"#key={quote(api_key, safe='')}" if api_key else "")
            threading.Thread(target=_open, args=(target, page), daemon=True).start()

    mlxinfer.serve(
        options["model"],
        compute_dtype=options["compute_dtype"],
        host="127.0.0.1",
        port=port,
        api_key=api_key,
        log_level=log_level,
        announce=announce,
    )


def _open(target: str, page: str) -> None:
    """webbrowser.open off the server's thread: a browser command that waits (a text browser) must not
    hold the server back."""
    if not webbrowser.open(target):
        print(f"no web browser found here; open {page} yourself", file=sys.stderr)
