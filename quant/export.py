"""`quantize` (any source -> MLX affine or float directory) and `convert_gguf` (GGUF -> directory, exactly).

Both write the layout mlx-community publishes and both loaders read: our `mlxinfer.load` and
mlx-lm's `load`. Tensor names are Hugging Face's (`model.layers.0.self_attn.q_proj.weight`).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from mlxinfer.errors import MlxinferError
from mlxinfer.formats import ggml_types, gguf
from mlxinfer.formats.config import ModelConfig
from mlxinfer.formats.sources import is_embedded, resolve
from mlxinfer.model.params import unpacked_parameter_count
from mlxinfer.model.loading import load as _load

from . import affine, writer
from .policy import Policy, check_divides, config_block

_DROP = ("quantization", "quantization_config", "_name_or_path")


def quantize(
    source=None,
    out=None,
    *,
    bits: int = 4,
    group_size: int = 64,
    head_bits: int | None = None,
    embed_bits: int | None = None,
    dtype: str = "bfloat16",
    force: bool = False,
    max_shard_bytes: int | str = writer.DEFAULT_SHARD_BYTES,
) -> dict:
    """Quantize (bits 2-8) or dequantize (bits 16) a model from any source into directory `out`.

    The weights are first brought to `dtype` (quantized sources dequantized in float32, then rounded
    once), exactly as mlx-lm's convert casts before it quantizes, then each Linear/Embedding weight
    goes through `mx.quantize(w, group_size, bits, mode="affine")` with its module's setting.
    Returns a summary (see `_summary`).
    """
    policy = Policy(bits, group_size, head_bits, embed_bits)  # bad options fail before any work
    dt = getattr(mx, affine.dtype_name(dtype))
    max_shard_bytes = writer.parse_size(max_shard_bytes)
    out = _check_out(out, force)
    model, tokenizer = load(source)
    _not_the_source(model, out)
    cfg = model.config
    tables = affine.tables(model)
    modules = {p: affine.input_size(m) for p, m in tables.items()}
    settings = policy.settings(modules, cfg.tie_word_embeddings)  # group sizes checked here, still nothing written
    if policy.quantized and hasattr(model, "quant_predicate"):
        settings = _architecture_settings(settings, model.quant_predicate, tables)

    floats = affine.float_tensors(model, dt)
    _check_finite(floats, f"; or they do not fit {affine.dtype_name(dtype)}: choose another dtype")
    tensors = {}
    for name, value in floats.items():
        module = name.rpartition(".")[0]
        setting = settings.get(module) if name.endswith(".weight") and module in tables else None
        if setting is None:
            tensors[name] = value
            continue
        q, s, b = affine.quantize_tensor(value, *setting)
        stem = name.removesuffix(".weight")
        tensors.update({f"{stem}.weight": q, f"{stem}.scales": s, f"{stem}.biases": b})
    mx.eval(tensors)
    block = config_block(settings, (policy.group_size, policy.bits)) if policy.quantized else None
    config = _hf_config(model, affine.dtype_name(dtype), block)
    before = source_bytes(model)  # before OUT is written: OUT may be the folder a relative source is read from
    parameters, files = _write(model, tokenizer, out, tensors, config, force, max_shard_bytes)
    return _summary(
        "quantize", model, out, config, tensors, parameters, files, policy.describe(cfg.tie_word_embeddings), before
    )


def convert_gguf(path, out, *, force: bool = False, max_shard_bytes: int | str = writer.DEFAULT_SHARD_BYTES) -> dict:
    """A GGUF file to a model directory of the MLX affine weights (group 32) the loader keeps: Q4_0/Q4_1/
    Q8_0 as `mx.load` reads them, K-quants and i-quants by model/gguf_tensors.py's rule (exactly where the
    block allows, else re-fit to 8 bits), F32/F16/BF16 as stored (norms in float32); q/k rows llama.cpp permuted
    (`Architecture.gguf_permuted_qk`: llama's) are put back in Hugging Face order, as the loader does."""
    max_shard_bytes = writer.parse_size(max_shard_bytes)
    _check_gguf_path(path)
    src = resolve(path)
    if src.kind != "gguf":
        raise MlxinferError(f"{src.name} is not a GGUF file; convert reads .gguf files (use quantize for a directory)")
    if src.dequantized:  # load(src.path) would read the file's own weights, and the summary would say so
        raise MlxinferError(
            f"{path}: convert writes a GGUF's weights as the file stores them; drop '@float32' (quantize --bits 16 "
            "dequantizes the converted folder)",
            "source",
        )
    out = _check_out(out, force)
    model, tokenizer = load(src.path)
    _not_the_source(model, out)
    kinds = sorted({t.type_name for t in gguf.read_header(src.path).tensors})  # read before OUT is written
    tables = affine.tables(model)
    settings = {p: affine.setting_of(m) for p, m in tables.items()}
    check_divides(settings, {p: affine.input_size(m) for p, m in tables.items()})
    from mlx.utils import tree_flatten

    tensors = {k: v for k, v in tree_flatten(model.parameters())}
    scales = [v.dtype for k, v in tensors.items() if k.endswith(".scales")]
    floats = [v.dtype for k, v in tensors.items() if k.endswith(".weight") and v.dtype != mx.uint32]
    dtype = str((scales or floats)[0]).split(".")[-1]
    config = _hf_config(model, dtype, config_block(settings))
    _check_finite(tensors)
    before = source_bytes(model)  # before OUT is written: was re-read after, and OUT '.' replaced the folder
    parameters, files = _write(model, tokenizer, out, tensors, config, force, max_shard_bytes)
    policy = ", ".join(f"{k} {ggml_types.loads_as(k)}" for k in kinds)
    return _summary("convert", model, out, config, tensors, parameters, files, policy, before)


# ---- pieces --------------------------------------------------------------------------------------------
def _check_gguf_path(path) -> None:
    """A local path that is no .gguf file, said as convert's own mistake (the loader's messages point at a
    model directory, which convert does not read)."""
    if (
        not isinstance(path, (str, Path))
        or not str(path).strip()
        or is_embedded(path)
        or str(path).endswith("@float32")
    ):
        return  # the loader's own messages: none given, blank, the embedded model
    p, text = Path(path).expanduser(), str(path)
    if p.is_dir() and not any(p.glob("*.gguf")):  # a folder holding .gguf files: the loader picks or says
        raise MlxinferError(f"{text} is a directory; convert reads a .gguf file (quantize reads a model directory)")
    if p.is_file() and p.suffix != ".gguf":
        raise MlxinferError(f"{text} is not a .gguf file; convert reads .gguf files (quantize reads a model directory)")
    repo_like = text.count("/") == 1 and not text.startswith((".", "/", "~"))
    if not p.exists() and not repo_like:
        raise MlxinferError(f"no file at {text}; convert reads a .gguf file, or 'embedded' for the embedded model")


def _write(model, tokenizer, out, tensors: dict, config: dict, force: bool, max_shard_bytes: int):
    """The model directory (weights, config, tokenizer, generation config): (parameters, files written)."""
    parameters = unpacked_parameter_count(model)
    files = writer.write_model_dir(
        out,
        tensors=tensors,
        config=config,
        parameters=parameters,
        write_tokenizer=lambda d: _write_tokenizer(model, tokenizer, d),
        generation_config=_generation_config(model),
        force=force,
        max_shard_bytes=max_shard_bytes,
    )
    return parameters, files


def load(source):
    """mlxinfer.load with the weights exactly as stored (quantized stays quantized): never a compute-dtype
    conversion. None or 'embedded' is the embedded default model."""
    return _load(None if is_embedded(source) else source, compute_dtype="bfloat16")


def _architecture_settings(settings: dict, predicate, tables: dict) -> dict:
    """What the architecture's class asks beyond the policy, as mlx-lm's convert applies it (Qwen3-MoE:
    routers at 8 bits, group 64): a dict is that module's setting, False leaves it in float."""
    out = dict(settings)
    for path, module in tables.items():
        said = predicate(path, module)
        if isinstance(said, dict):
            out[path] = (said.get("group_size", 64), said.get("bits", 4))
        elif said is False:
            out[path] = None
    check_divides(out, {p: affine.input_size(m) for p, m in tables.items()})
    return out


def _check_out(out, force: bool) -> Path:
    if out is None or str(out) == "":
        raise MlxinferError("out is empty; give an output directory", "out")
    name, there = Path(out).name, Path(out).expanduser().exists()
    if name.lower().endswith(".gguf") or (ggml_types.QUANT_NAME.fullmatch(name) and not there):
        # llama-quantize's `model.gguf out.gguf Q4_K_M` habits: was a folder named out.gguf, or Q8_0
        raise MlxinferError(
            f"out {out} reads as a GGUF {'file' if '.' in name else 'type'}; what is written here is a folder of MLX "
            "weights (as mlx-community's): name the folder (a GGUF of any type loads with --model as it is)",
            "out",
        )
    out = Path(out).expanduser().absolute()
    writer.check_output(out, force)
    return out


def _check_finite(tensors: dict, also: str = "") -> None:
    """Every float tensor finite, checked in one evaluation before anything is written: a model with NaN
    or inf weights (a corrupt download) would load and then only give NaN scores."""
    bad = {k: mx.any(mx.logical_not(mx.isfinite(v))) for k, v in tensors.items() if mx.issubdtype(v.dtype, mx.floating)}
    mx.eval(bad)
    name = next((k for k, flag in bad.items() if flag.item()), None)
    if name is not None:
        raise MlxinferError(
            f"{name} holds NaN or inf values: the source's weights are corrupt, re-download or re-convert it{also}"
        )


def _not_the_source(model, out: Path) -> None:
    src = model.info.source.path.resolve()
    if out.exists() and (src == out.resolve() or out.resolve() in src.parents):
        raise MlxinferError(f"{out} holds the source model; write to another directory")


def _hf_config(model, dtype: str, block: dict | None) -> dict:
    """The source's config.json (a directory) or one written from GGUF metadata, with our dtype and block."""
    cfg: ModelConfig = model.config
    if model.info.source.kind == "dir":
        config = {k: v for k, v in cfg.raw.items() if k not in _DROP}
    else:
        config = {k: v for k, v in cfg.raw.items() if v is not None}
        config.update(_gguf_extras(model))
    config.update(tie_word_embeddings=cfg.tie_word_embeddings, torch_dtype=dtype)
    if "dtype" in config:
        config["dtype"] = dtype
    if block:
        config["quantization"] = block
    return config


def _gguf_extras(model) -> dict:
    cfg: ModelConfig = model.config
    m = gguf.read_header(model.info.source.path).metadata
    extras = {
        "architectures": [cfg.architecture.hf_class],
        "head_dim": cfg.head_dim,
        "num_key_value_heads": cfg.num_key_value_heads,
        "attention_bias": cfg.o_bias,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
    }
    for key in ("bos", "eos"):
        if f"tokenizer.ggml.{key}_token_id" in m:
            extras[f"{key}_token_id"] = m[f"tokenizer.ggml.{key}_token_id"]
    return extras


def _generation_config(model) -> dict | None:
    if model.info.source.kind == "dir":
        return model.info.generation_config
    m = gguf.read_header(model.info.source.path).metadata
    eos = [m[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in m]
    gen = {}
    if "tokenizer.ggml.bos_token_id" in m:
        gen["bos_token_id"] = m["tokenizer.ggml.bos_token_id"]
    if eos:
        gen["eos_token_id"] = eos[0] if len(set(eos)) == 1 else sorted(set(eos))
    if "tokenizer.ggml.padding_token_id" in m:
        gen["pad_token_id"] = m["tokenizer.ggml.padding_token_id"]
    return gen or None


def _write_tokenizer(model, tokenizer, directory: Path) -> None:
    if model.info.source.kind == "dir":
        writer.copy_tokenizer_files(model.info.source.path, directory)
    else:
        writer.save_gguf_tokenizer(tokenizer, directory, model.config.max_position_embeddings)


def source_bytes(model) -> int:
    """Bytes of the source's tensors as stored: the GGUF tensor table, or the loaded safetensors (and a
    GGUF read as float32, `model.gguf@float32`: the float32 tensors it became)."""
    if model.info.source.kind == "gguf" and not model.info.source.dequantized:
        return sum(t.nbytes for t in gguf.read_header(model.info.source.path).tensors)
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def _summary(
    kind: str, model, out: Path, config: dict, tensors: dict, parameters: int, files: list[dict], policy: str,
    before: int,
) -> dict:  # fmt: skip
    tensor_bytes = sum(v.nbytes for v in tensors.values())
    before_bits, after_bits = 8 * before / parameters, 8 * tensor_bytes / parameters
    notes = []
    if kind == "quantize" and before_bits < 16 and after_bits > before_bits + 0.5:  # a quantized source, in more bits
        if config.get("quantization") is None:  # written as floats on purpose (a reference, a bf16 copy)
            notes.append(
                f"the source holds {before_bits:.2f} bits a weight: these {config['torch_dtype']} weights are its "
                "values dequantized, no more accurate than the source"
            )
        else:
            notes.append(
                f"the source holds {before_bits:.2f} bits a weight, fewer than these {after_bits:.2f}: its weights "
                "were dequantized and quantized again, which adds bytes and no accuracy; quantize the float checkpoint"
            )
    return {
        "command": kind,
        "source": model.info.source.name,
        "source_kind": model.info.source.kind,
        "out": str(out),
        "policy": policy,
        "dtype": config["torch_dtype"],
        "quantization": config.get("quantization"),
        "parameters": parameters,
        "source_bytes": before,
        "source_bits_per_weight": before_bits,
        "tensor_bytes": tensor_bytes,
        "bits_per_weight": after_bits,
        "file_bytes": sum(f["bytes"] for f in files),
        "files": files,
        "notes": notes,
    }
