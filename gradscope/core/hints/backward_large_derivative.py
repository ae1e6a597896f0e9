"""Evidence: a root, log or division backward whose saved forward values hold no zero
(smallest |value| recorded), fed a finite incoming gradient of recorded size: a large but
finite derivative times a large gradient overflowed."""

from __future__ import annotations

import math

from gradscope.core.facts import Origin
from gradscope.core.hints.backward_divide_by_zero import DIVISIONS, LOGS
from gradscope.core.hints.backward_root_at_zero import ROOTS
from gradscope.core.hints.values import base_op, divisor, max_abs, saved, values, where


def hint(origin: Origin) -> str | None:
    op = base_op(origin.op)
    if origin.phase != "backward" or origin.kind != "inf" or op not in ROOTS | LOGS | DIVISIONS:
        return None
    found = divisor(origin) if op in LOGS | DIVISIONS else None
    forward = found[1] if found else saved(origin, "result", "self")
    if forward is None or forward.get("zeros"):
        return None
    incoming = max_abs(values(origin, "grad_in"))
    # clipping acts after backward, too late for an overflow inside it; a smaller loss
    # helps only when the gradient arriving is itself large
    smaller = (
        " The gradient arriving is large too: a smaller loss (or loss scale) also helps."
        if incoming >= 1e3
        else ""
    )
    return (
        f"The gradient of {where(origin)} overflowed: no forward value it saved is 0 (smallest "
        f"|value| {forward.get('abs_min', math.nan):.3g}, in its saved "
        f"{forward.get('name', 'input')}), but its derivative there is large "
        f"and the gradient arriving was up to {incoming:.3g}. Keep the input away from tiny "
        "values: a floor (clamp_min) or an epsilon sized for its scale." + smaller
    )
