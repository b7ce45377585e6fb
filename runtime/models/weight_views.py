"""Linear layers that reuse one evaluated view of their transposed weight.

mlx-lm's `nn.Linear` computes `x @ weight.T`, which adds a transpose node to the graph at every
call: 112 of the ~930 nodes of a 1B llama's decode step, and MLX spends host time on each node.
An evaluated `weight.T` is a leaf that shares the weight's buffer, so the matmul reads the very
same memory with the very same strides (bit-identical results) and the graph loses those nodes.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


class TransposedWeightLinear(nn.Linear):
    """`nn.Linear` reading a transposed view of its weight made once (`cache_weight_views`).
    The view follows the weight it was made from: load weights before making it."""

    def __call__(self, x: mx.array) -> mx.array:
        weight_t = self.__dict__["_weight_t"]
        if "bias" in self:
            return mx.addmm(self["bias"], x, weight_t)
        return x @ weight_t


def cache_weight_views(model: nn.Module) -> int:
    """Turn every plain `nn.Linear` of `model` into a `TransposedWeightLinear`; returns how many
    (quantized and other linear kinds keep their own call)."""
    linears = [m for _, m in model.named_modules() if type(m) is nn.Linear]
    for linear in linears:
        weight_t = linear["weight"].T
        mx.eval(weight_t)
        # Kept outside the module's parameter dict, so parameters() and saving are unchanged.
        object.__setattr__(linear, "_weight_t", weight_t)
        linear.__class__ = TransposedWeightLinear
    return len(linears)
