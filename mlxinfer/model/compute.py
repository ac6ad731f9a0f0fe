"""Which ops the forward pass runs: one object a model, shared by its layers, chosen once at load.

  mlx     MLX's own ops (the weights as loaded: bit for bit mlx-lm's)
  cpu     float32 on a CPU: RoPE from a cos/sin table and SwiGLU with a polynomial exp (cpu/kernels.py),
          where MLX's own cost more than the matmuls around them
  native  the quantized CPU path: those two as single primitives of the extension (cpu/qlinear.py); the
          loader (convert.py) then puts each block in three nodes where its layout allows (native_block.py)

model/convert.py chooses, once, after the weights are converted; nothing else changes it.
"""

from __future__ import annotations

from functools import partial

import mlx.core as mx
import mlx.nn as nn

KINDS = ("mlx", "cpu", "native")


@partial(mx.compile, shapeless=True)
def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    return nn.silu(gate) * up


class Kernels:
    def __init__(self):
        self.kind = "mlx"
        self.rope_table = None  # (x, offset) -> x rotated, from a cos/sin table; None: mx.fast.rope
        self.swiglu = swiglu

    def choose(self, kind: str, model) -> None:
        """Switch `model` (whose layers hold this object) to `kind`'s ops."""
        from ..cpu import kernels

        assert kind in KINDS, kind
        self.kind, self.rope_table, self.swiglu = kind, None, swiglu
        for layer in model.layers:
            layer.native = None
        if kind != "mlx":  # every layer rotates alike: one table
            self.rope_table = model.layers[0].self_attn.rope.make_table()
            self.swiglu = kernels.swiglu
        if kind == "native":  # the loader then puts native_block.py's blocks where the layout allows
            from ..cpu import qlinear

            self.rope_table, self.swiglu = qlinear.RopeTableF32(self.rope_table), qlinear.swiglu
