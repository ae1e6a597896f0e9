"""Evidence: a sqrt/rsqrt (or a fractional power) made NaN from a negative input that a
subtraction of averages made (the ops behind its input, recorded as ``inputs_made_by``: a
subtraction of a mean or sum and a square, or of two means): a difference of two nearly
equal quantities, E(x^2) - E(x)^2, rounds below 0. Its dtype says how much
precision the subtraction had (8 significant bits in bfloat16, 11 in float16), and the
autocast dtype in force is recorded with it."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import (
    base_op,
    dtype_of,
    evidence,
    fmt,
    min_input,
    values,
    where,
)

ROOTS = {"sqrt", "rsqrt", "pow", "__pow__", "float_power"}
SUBTRACTIONS = {"sub", "__sub__", "__rsub__", "subtract", "rsub"}
AVERAGES = {"mean", "sum", "nanmean", "nansum", "avg_pool1d", "avg_pool2d"}
SQUARES = {"pow", "__pow__", "square", "mul", "__mul__"}


def _difference_of_averages(made: dict | None) -> bool:
    """E(x^2) - E(x)^2: a subtraction of an average and a square (or of two averages)."""
    if not made or base_op(made.get("op")) not in SUBTRACTIONS:
        return False
    sides = [base_op(op) for op in made.get("from", [])]
    averages = sum(side in AVERAGES for side in sides)
    return averages >= 2 or (averages == 1 and any(side in SQUARES for side in sides))


BITS = {"bfloat16": 8, "float16": 11, "float32": 24, "float64": 53}


def hint(origin: Origin) -> str | None:
    if origin.phase == "backward" or origin.kind != "nan" or base_op(origin.op) not in ROOTS:
        return None
    low = min_input(origin)
    made_by = evidence(origin, "inputs_made_by") or []
    if low is None or low >= 0 or not any(_difference_of_averages(m) for m in made_by):
        return None
    dtype = dtype_of(values(origin, "inputs")) or "float32"
    # The least precise operand of the subtraction sets its error: under CUDA autocast a
    # float32 subtraction (pow runs in float32 there) can take a bfloat16 E(x^2).
    operands = [d for m in made_by if _difference_of_averages(m) for d in m.get("dtypes", []) if d]
    coarsest = min([dtype, *operands], key=lambda d: BITS.get(d, 53))
    ran = "ran in" if coarsest == dtype else "took an operand computed in"
    dtype = coarsest
    autocast = evidence(origin, "autocast")
    under = f" under {autocast} autocast" if autocast else ""
    half = dtype in ("bfloat16", "float16")
    cause = (
        f"The subtraction {ran} {dtype}{under}, which keeps {BITS[dtype]} significant bits: "
        "the rounding error of E(x^2) alone is larger than a small variance, so the "
        "difference goes negative. The dtype is the cause, not the data. "
        if half
        else f"In {dtype} the rounding error of E(x^2) can still exceed a small variance. "
    )
    return (
        f"{where(origin)} got a negative input (minimum {fmt(low)}) that a subtraction made: "
        "a variance written as E(x^2) - E(x)^2 (or any difference of two nearly equal "
        "quantities) cancels, and rounding pushes it below 0. " + cause + "Compute it in two "
        "passes, ((x - x.mean()) ** 2).mean() or torch.var(x, unbiased=False), which cannot "
        "go negative"
        + (", and in float32 (x.float()) for this statistic" if half else "")
        + ". Clamping at 0 only hides the rounding error (and sqrt(0) has an infinite "
        "gradient)."
    )
