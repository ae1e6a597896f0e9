"""Evidence: the op ran in float16, and its epsilon (its ``eps`` argument or its module's
``eps``/``variance_epsilon``) rounds to 0 in float16, while its input reached 0 or it made
a NaN: a zero-variance row then gives 1/0."""

from __future__ import annotations

import torch

from gradscope.core.facts import Origin
from gradscope.core.hints.values import evidence, min_input, values, where


def _eps_underflow(origin: Origin) -> tuple[str, float] | None:
    stats = values(origin, "inputs") + values(origin, "outputs")
    if not any(v.get("dtype") == "float16" for v in stats):
        return None
    candidates = []
    found = evidence(origin, "module_eps")
    if found:
        candidates.append((f"{found['module']}.{found['attribute']}", found["value"]))
    eps = evidence(origin, "eps")
    if eps is not None:
        candidates.append(("eps", eps))
    for label, value in candidates:
        if value > 0 and float(torch.tensor(value, dtype=torch.float16)) == 0.0:
            return label, value
    return None


def hint(origin: Origin) -> str | None:
    if origin.phase not in ("forward", "loss"):
        return None
    underflow = _eps_underflow(origin)
    low = min_input(origin)
    if underflow is None or not (low is None or low <= 0 or origin.kind == "nan"):
        return None
    label, value = underflow
    return (
        f"{where(origin)} divided by (or took the root of) zero in float16: {label} = {value:g} "
        "rounds to 0 in float16 (its smallest positive value is 6e-8), so a row with zero "
        "variance (constant or all-zero, e.g. padding) gives 1/0. Use eps >= 1e-5 with "
        "float16, or normalise in float32 (x.float()) and cast back."
    )
