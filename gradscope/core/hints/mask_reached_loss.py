"""Evidence: no op made the Inf: the values reaching the loss op already held it (recorded
min and max), and no model layer made it (``details["propagated"]``)."""

from __future__ import annotations

import math

from gradscope.core.facts import Origin
from gradscope.core.hints.values import fmt, values, where


def hint(origin: Origin) -> str | None:
    if not origin.details.get("propagated"):
        return None
    carried = [v for v in values(origin, "inputs") if v.get("inf") or v.get("nan")]
    shown = carried[0] if carried else {}
    held = "-Inf" if shown.get("min") == -math.inf else "Inf"
    return (
        f"The loss is {origin.kind.upper()} because the values reaching {where(origin)} "
        f"already held {held} (min {fmt(shown.get('min', math.nan))}, max "
        f"{fmt(shown.get('max', math.nan))}) that no model layer made. GradScope did not see "
        "which op made it; a -inf mask or padding value reaching the loss is one way this "
        "happens (a masked logit at the target class gives an infinite loss)."
    )
