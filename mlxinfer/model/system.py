"""What `mlxinfer info` shows: the platform, MLX and its default device, which BLAS serves float32
matmuls (checked against numpy), each native part and whether it is in use, and the compute-path
rule applied here. Never raises for a BLAS or kernel problem: this is what you look at when
something is wrong."""

from __future__ import annotations

import os

from .dtype_rule import AUTO_RULE, CHOICES, RAM_FRACTION, auto_rule, current_facts


def describe() -> str:
    """One line for reports: the BLAS that serves float32 matmuls here."""
    from ..cpu import blas

    s = blas.status()
    if s["active"]:
        layer = f", threading {s['threading_layer']}" if s["threading_layer"] else ""
        return f"BLAS: {s['library']} ({os.path.basename(s['path'] or '')}{layer})"
    return f"BLAS: {s['library']} ({s['reason']})"


def _status(module: str) -> dict:
    import importlib

    try:
        return importlib.import_module(f"..cpu.{module}", __package__).status()
    except Exception as e:
        return {"active": False, "path": None, "reason": f"{type(e).__name__}: {e}"}


def system_info() -> dict:
    """The platform, MLX, the BLAS, the batched draw, the quantized matmul kernel and the `auto` rule."""
    import platform
    import sys

    import mlx.core as mx

    from ..cpu import blas, heap  # preload ran at `import mlxinfer`, before mlx

    status = blas.status()
    try:
        err = blas.verify()
        check = {"ok": err < 1e-4, "max_relative_error": err}
    except Exception as e:
        check = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    facts = current_facts()
    ram = facts["ram_bytes"]
    rule_facts = {k: facts[k] for k in ("device", "fast_blas", "ram_bytes", "quantized_kernel")}
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
        "heap": heap.state(),  # glibc's thresholds for large buffers (cpu/heap.py), set when a model loads
        "batched_draw": _status("draw"),  # the seeded batch's draw: one kernel call, or one MLX call per row
        "quantized_matmul": _status("qmm"),  # the quantized path's kernel: built and agreeing with MLX, or why not
        "compute_dtype": {
            "choices": list(CHOICES),
            "auto_rule": AUTO_RULE,
            "device": facts["device"],
            "fast_blas": facts["fast_blas"],
            "quantized_kernel": facts["quantized_kernel"],
            "ram_bytes": ram,
            "float32_limit_bytes": ram // RAM_FRACTION if ram else None,
            # what auto would pick here for a 1 GiB float32 model, to show the rule applied
            "auto_for_1gib_float32": auto_rule(model_bytes_float32=2**30, **rule_facts)[0],
            "auto_for_quantized_weights": auto_rule(model_bytes_float32=2**30, quantized_weights=True, **rule_facts)[0],
        },
    }
