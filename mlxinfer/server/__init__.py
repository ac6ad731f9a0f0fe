"""The OpenAI-compatible HTTP server (`mlxinfer serve`): every request's seed is its own stream.

    import mlxinfer
    app = mlxinfer.create_app(model, tokenizer)   # an ASGI app (tests run it in-process)
    mlxinfer.serve(host="127.0.0.1", port=8080)   # load the model and run it with uvicorn

Stands on the engine's one request path (engine/request.py) and its continuous batcher
(engine/batcher.py); the rest of mlxinfer never imports this package.
"""

from ..errors import MlxinferError

try:
    import pydantic  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as e:  # one line for the CLI, not a traceback
    raise MlxinferError(f"mlxinfer serve needs the package '{e.name}': pip install '{e.name}'") from None

from .app import create_app, model_id_for  # noqa: E402
from .run import serve  # noqa: E402

__all__ = ["create_app", "model_id_for", "serve"]
