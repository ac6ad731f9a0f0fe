"""The compute dtype: keep the weights as loaded, or dequantize/upcast them to float32 for BLAS.

On a CPU, MLX's quantized and bfloat16 matmuls are its own kernels, while float32
matmuls go to `cblas_sgemm`. With a fast BLAS loaded (see blas.py) a float32 copy
of a small model runs many times faster than its 4-bit original, at 8x the memory
of 4-bit weights (2x that of bf16).

  float32   dequantize every quantized Linear/Embedding once and upcast the rest
  bfloat16  keep the weights exactly as loaded (bf16, or quantized): today's path
  auto      float32 when all of: the default device is the CPU, a fast BLAS is
            active, and the float32 model takes under a third of physical RAM;
            otherwise as loaded. On a GPU (Metal, CUDA) auto changes nothing.
"""

from __future__ import annotations

import os
from dataclasses import replace

CHOICES = ("float32", "bfloat16", "auto")
RAM_FRACTION = 3  # float32 weights must fit in under 1/RAM_FRACTION of physical memory
AUTO_RULE = (
    "auto: float32 if the default device is the CPU, a fast BLAS is active and the float32 "
    f"weights take under 1/{RAM_FRACTION} of physical RAM; otherwise the weights stay as loaded "
    "(GPU: always as loaded)"
)


def physical_ram_bytes() -> int | None:
    """Physical memory from os.sysconf; None where the platform does not say."""
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return pages * page if pages > 0 and page > 0 else None


def auto_rule(*, device: str, fast_blas: bool, model_bytes_float32: int, ram_bytes: int | None) -> tuple[str, str]:
    """The `auto` decision from explicit facts: (dtype, why). Pure, for tests and `mlxinfer info`.

    device: "cpu" or "gpu"; fast_blas: blas.status()["active"]; ram_bytes None = unknown.
    """
    if device != "cpu":
        return "bfloat16", f"default device is {device}: weights stay as loaded"
    if not fast_blas:
        return "bfloat16", "no fast BLAS active: float32 matmuls would use MLX's reference BLAS"
    if not ram_bytes:
        return "bfloat16", "physical RAM unknown: weights stay as loaded"
    limit = ram_bytes // RAM_FRACTION
    if model_bytes_float32 >= limit:
        return "bfloat16", (
            f"float32 weights ({_gib(model_bytes_float32)}) would not fit in 1/{RAM_FRACTION} of RAM "
            f"({_gib(limit)}): weights stay as loaded"
        )
    return "float32", (
        f"CPU with a fast BLAS; float32 weights ({_gib(model_bytes_float32)}) fit in 1/{RAM_FRACTION} of RAM "
        f"({_gib(limit)})"
    )


def current_facts() -> dict:
    """The facts `auto` reads here: device, fast_blas, ram_bytes (imports mlx)."""
    import mlx.core as mx

    from ..cpu import blas

    return {
        "device": "cpu" if mx.default_device().type == mx.DeviceType.cpu else "gpu",
        "fast_blas": bool(blas.status()["active"]),
        "ram_bytes": physical_ram_bytes(),
    }


def check_compute_dtype(requested: str) -> None:
    if requested not in CHOICES:
        from ..errors import MlxinferError

        raise MlxinferError(f"compute_dtype '{requested}' is not one of {', '.join(CHOICES)}", "compute_dtype")


def choose_compute_dtype(requested: str, model_bytes_float32: int) -> str:
    """ "float32" or "bfloat16" ("bfloat16" = keep the weights as loaded) for a request of float32|bfloat16|auto."""
    check_compute_dtype(requested)
    if requested != "auto":
        return requested
    return auto_rule(model_bytes_float32=model_bytes_float32, **current_facts())[0]


def is_quantized(module) -> bool:
    """An MLX-quantized leaf: QuantizedLinear/Embedding, mlx-lm's QuantizedSwitchLinear, our QuantizedExperts."""
    return hasattr(module, "bits") and hasattr(module, "group_size") and "scales" in module


def experts_to_float32_on_cpu(model) -> bool:
    """MLX's CPU back end multiplies stacked experts (gather_mm) only in float32: there, stacked float
    experts stored in bf16/f16 are upcast (exactly) so that the model runs at all. True if any were."""
    import mlx.core as mx

    if mx.default_device().type != mx.DeviceType.cpu:
        return False
    upcast = False
    for _, m in model.named_modules():
        if type(m).__name__ in ("Experts", "SwitchLinear") and m.weight.dtype != mx.float32:
            m.weight = m.weight.astype(mx.float32)
            upcast = True
    return upcast


def unpacked_parameter_count(model) -> int:
    """Unique parameters, quantized weights counted unpacked (scales and biases not counted)."""
    from mlx.utils import tree_flatten

    total = 0
    quantized = set()
    for path, module in model.named_modules():
        if is_quantized(module):
            total += module.weight.size * 32 // module.bits  # packed uint32 words hold 32 / bits values
            quantized.add(path)
    for name, p in tree_flatten(model.parameters()):
        owner, _, part = name.rpartition(".")
        if owner in quantized and part in ("weight", "scales", "biases"):
            continue
        total += p.size
    return total


def float32_nbytes(model) -> int:
    """Bytes the model's parameters take once every weight is float32 (quantized weights unpacked)."""
    return 4 * unpacked_parameter_count(model)


def to_float32(model):
    """In place: every quantized module -> its float32 counterpart (nn.Linear, nn.Embedding, stacked
    experts), other floats upcast; evaluated.

    Returns the model. Every matmul of the forward pass then goes through `cblas_sgemm`
    (the tied output table too: nn.Embedding.as_linear is a plain matmul). On a CPU device
    the model also switches to cpu/kernels.py's RoPE and SwiGLU, which cost less there than
    MLX's own once the matmuls are fast. The model's info says so.
    """
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten, tree_map, tree_map_with_path

    from . import shard

    for path, m in model.named_modules():
        quantized = (nn.QuantizedLinear, nn.QuantizedEmbedding, *shard.QUANTIZED)
        if is_quantized(m) and not isinstance(m, quantized):
            if not hasattr(m, "dequantized") and type(m).__name__ != "QuantizedSwitchLinear":
                from ..errors import MlxinferError

                raise MlxinferError(
                    f"the float32 path cannot dequantize {path} ({type(m).__name__}); use compute_dtype='bfloat16'",
                    "compute_dtype",
                )

    def convert(_path, m):
        if isinstance(m, shard.QUANTIZED):  # a rank's slice of a split layer (model/shard.py)
            return shard.float32_twin(m, dequantize_module(m))
        if isinstance(m, nn.QuantizedLinear):
            new = nn.Linear(1, 1, bias="bias" in m)
            new.weight = dequantize_module(m)
            if "bias" in m:
                new.bias = m.bias.astype(mx.float32)
            return new
        if isinstance(m, nn.QuantizedEmbedding):
            new = nn.Embedding(1, 1)
            new.weight = dequantize_module(m)
            return new
        if is_quantized(m) and hasattr(m, "dequantized"):  # our stacked experts (moe.py)
            return m.dequantized()
        if is_quantized(m):  # mlx-lm's stacked experts
            from mlx_lm.models.switch_layers import SwitchLinear

            new = SwitchLinear(1, 1, 1, bias="bias" in m)
            new.weight = dequantize_module(m)
            if "bias" in m:
                new.bias = m.bias.astype(mx.float32)
            return new
        return m

    leaves = tree_map_with_path(convert, model.leaf_modules(), is_leaf=nn.Module.is_module)
    model.update_modules(leaves)

    def upcast(p):
        return p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) and p.dtype != mx.float32 else p

    model.update(tree_map(upcast, model.parameters()))
    mx.eval(model.parameters())
    # nothing quantized or half-precision may be left, or some matmuls would bypass BLAS
    left = [n for n, p in tree_flatten(model.parameters()) if p.dtype != mx.float32]
    assert not left, f"to_float32 left {left[:3]} unconverted"
    kernels = mx.default_device().type == mx.DeviceType.cpu and hasattr(model, "use_cpu_kernels")
    if kernels:
        model.use_cpu_kernels()
    model.info = replace(model.info, compute_dtype="float32", weights=weights_kind(model), cpu_kernels=kernels)
    return model


def apply(model, dtype: str):
    """Apply a choose_compute_dtype result in place: float32 converts, bfloat16 leaves the weights as loaded
    (on the CPU, bf16 stacked experts excepted: see experts_to_float32_on_cpu)."""
    if dtype == "float32":
        return to_float32(model)
    kind = weights_kind(model)
    if experts_to_float32_on_cpu(model):
        kind += " (stacked experts float32: MLX's CPU gather matmul computes only in float32)"
    model.info = replace(model.info, compute_dtype="bfloat16", weights=kind)
    return model


def dequantize(packed, scales, biases, group_size: int, bits: int, dtype=None, mode: str = "affine"):
    """s * q + b computed in float32 from the stored scales and biases (float16 arithmetic would round
    them; for GGUF Q4_0/Q4_1/Q8_0 this equals llama.cpp's own dequantization), rounded once to `dtype`
    (default float32)."""
    import mlx.core as mx

    kwargs = {"group_size": group_size, "bits": bits}
    if mode != "affine":
        kwargs["mode"] = mode
    scales = scales.astype(mx.float32) if mode == "affine" else scales
    biases = None if biases is None else biases.astype(mx.float32)  # None for modes without biases
    return mx.dequantize(packed, scales, biases, **kwargs).astype(dtype or mx.float32)


def dequantize_module(m, dtype=None):
    """A QuantizedLinear/QuantizedEmbedding's weight, dequantized as `dequantize` does."""
    return dequantize(m.weight, m.scales, m.get("biases"), m.group_size, m.bits, dtype, getattr(m, "mode", "affine"))


def weights_kind(model) -> str:
    """How the model's weights are stored now: 'float32', 'bfloat16', '4-bit (scales float16)', ..."""
    from mlx.utils import tree_flatten

    for _, module in model.named_modules():
        if is_quantized(module):
            return f"{module.bits}-bit quantized (activations {str(module.scales.dtype).split('.')[-1]})"
    dtypes = sorted({str(p.dtype).split(".")[-1] for _, p in tree_flatten(model.parameters())})
    return "/".join(dtypes)


def describe() -> str:
    """One line for reports: the BLAS that serves float32 matmuls here."""
    from ..cpu import blas

    s = blas.status()
    if s["active"]:
        layer = f", threading {s['threading_layer']}" if s["threading_layer"] else ""
        return f"BLAS: {s['library']} ({os.path.basename(s['path'] or '')}{layer})"
    return f"BLAS: {s['library']} ({s['reason']})"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def system_info() -> dict:
    """The platform, MLX and its default device, which BLAS serves float32 matmuls (checked against
    numpy), and the `auto` compute-dtype rule applied here. Never raises for a BLAS problem: this is
    what you look at when something is wrong."""
    import platform
    import sys

    import mlx.core as mx

    from ..cpu import blas  # preload ran at `import mlxinfer`, before mlx

    status = blas.status()
    try:
        err = blas.verify()
        check = {"ok": err < 1e-4, "max_relative_error": err}
    except Exception as e:
        check = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    try:
        from ..cpu import draw

        draw_status = draw.status()  # the seeded batch's draw: one kernel call, or one MLX call per row
    except Exception as e:
        draw_status = {"active": False, "path": None, "reason": f"{type(e).__name__}: {e}"}
    facts = current_facts()
    ram = facts["ram_bytes"]
    return {
        "platform": {
            "system": platform.system(),
            "machine": platform.machine(),
            "release": platform.release(),
            "python": platform.python_version(),
            "executable": sys.executable,
        },
        "mlx": {"version": mx.__version__, "default_device": str(mx.default_device())},
        "blas": {**status, "float32_matmul_check": check},
        "batched_draw": draw_status,
        "compute_dtype": {
            "choices": list(CHOICES),
            "auto_rule": AUTO_RULE,
            "device": facts["device"],
            "fast_blas": facts["fast_blas"],
            "ram_bytes": ram,
            "float32_limit_bytes": ram // RAM_FRACTION if ram else None,
            # what auto would pick here for a 1 GiB float32 model, to show the rule applied
            "auto_for_1gib_float32": auto_rule(model_bytes_float32=2**30, **facts)[0],
        },
    }
