"""Evidence: the op is the user's own ``torch.autograd.Function``: its backward returned a
non-finite gradient from a finite incoming one, or its forward made the value from finite
inputs (with the op inside it, when the tracer saw one)."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import where


def hint(origin: Origin) -> str | None:
    if not origin.details.get("custom_function"):
        return None
    if origin.phase == "backward":
        return (
            f"The backward of the custom autograd.Function {where(origin)} returned a "
            "non-finite gradient from a finite incoming one (its forward was finite). Check "
            "its backward formula: a division by a saved value that can be 0, a log or sqrt "
            "of one; torch.autograd.gradcheck on small inputs finds a wrong formula."
        )
    if origin.phase not in ("forward", "loss"):
        return None
    inside = origin.details.get("inside") or {}
    return (
        f"The forward of the custom autograd.Function {where(origin)} made the first "
        "non-finite value from finite inputs"
        + (f" (in its {inside['op']} at line {inside['line']})" if inside.get("line") else "")
        + ". Guard that computation (epsilon, clamp) inside the Function's forward."
    )
