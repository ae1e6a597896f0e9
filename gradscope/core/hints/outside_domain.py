"""Evidence: acos/asin (defined on [-1, 1]) or atanh (on (-1, 1)) made NaN and their
input's recorded min or max lies outside that domain."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import base_op, fmt, values, where

DOMAINS = {"acos": "[-1, 1]", "asin": "[-1, 1]", "arccos": "[-1, 1]", "arcsin": "[-1, 1]"}


def hint(origin: Origin) -> str | None:
    op = base_op(origin.op)
    if origin.phase == "backward" or origin.kind != "nan" or op not in DOMAINS:
        return None
    inputs = values(origin, "inputs")
    low = min((v["min"] for v in inputs if "min" in v), default=0.0)
    high = max((v["max"] for v in inputs if "max" in v), default=0.0)
    if -1.0 <= low and high <= 1.0:
        return None
    return (
        f"{where(origin)} got inputs outside its domain {DOMAINS[op]} (min {fmt(low)}, max "
        f"{fmt(high)}), which gives NaN. A cosine or correlation computed by hand drifts "
        "past +-1 by rounding: clamp it to [-1 + 1e-7, 1 - 1e-7] (the clamp also keeps the "
        "gradient finite)."
    )
