"""Numbers from numpy are numbers: the public functions take np.int64(2) where they take 2.

A notebook's values often come from numpy (`np.arange`, `np.linspace`, a reduction), and numpy's
scalars are not Python's int (np.float32 is not even a float), so every check written for `int` or
`float` would refuse them, and JSON could not hold them in a report. The public API (mlxinfer's lazy
names) turns each numpy scalar among a call's arguments, and inside its lists, tuples and dicts, into
the Python number it equals before the call; arrays are left as they are.
"""

from __future__ import annotations

import functools


def plain(value, depth: int = 3):
    """value with numpy scalars as Python numbers (bool, int, float, str), through lists, tuples and dicts."""
    if _numpy(value) and getattr(value, "shape", None) == ():  # the type first: other objects' attributes
        return value.item()  # are never asked for (a lazy tokenizer would build itself to answer)
    if depth and type(value) in (list, tuple):
        return type(value)(plain(v, depth - 1) for v in value)
    if depth and type(value) is dict:
        return {plain(k, 0): plain(v, depth - 1) for k, v in value.items()}
    return value


def _numpy(value) -> bool:
    return type(value).__module__ == "numpy"  # a numpy scalar: never an mx.array (0-d ones included)


def plain_numbers(fn):
    """fn, taking numpy scalars among its arguments as the Python numbers they equal."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return fn(*(plain(a) for a in args), **{k: plain(v) for k, v in kwargs.items()})

    return call
