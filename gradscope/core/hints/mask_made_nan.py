"""Evidence: the op made NaN from inputs whose Inf is a -inf written on purpose in the
traced step (``masked_fill(mask, -inf)``, ``torch.full(..., -inf)``), followed from the op
that wrote it (its line recorded as ``inf_from``): Inf * 0 or Inf - Inf here made the NaN.
The origin stays this op; the hint says where the -inf came from."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import holds_inf, holds_nan, origin_of_inf, values, where


def hint(origin: Origin) -> str | None:
    inputs = values(origin, "inputs")
    if origin.phase == "backward" or origin.kind != "nan":
        return None
    source = origin_of_inf(origin)
    if not source or not holds_inf(inputs) or holds_nan(inputs):
        return None
    return (
        f"{where(origin)} made NaN from a -inf that your code wrote on purpose: {source} set "
        "it, and Inf * 0 or Inf - Inf here is NaN. The mask is by design; this op is the "
        "first that should not see the masked entries. Either fill with a large finite value "
        "instead of -inf (-1e9 in float32, -1e4 in float16/bfloat16: softmax still gives "
        "those entries 0 weight, and products with 0 stay 0; the usual fix when the mask only "
        "feeds a softmax), or keep -inf and drop those entries here (torch.where(keep, x, 0) "
        "before this op, or a loss weight/mask that leaves them out)."
    )
