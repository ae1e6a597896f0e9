"""Evidence: a cross-entropy went Inf from logits holding -inf (a mask over classes) with a
``label_smoothing`` argument above 0 (recorded with its ``reduction`` and the number of
classes): smoothing gives every class a share of the target, so the loss sums -log p over
the masked classes too, and -log 0 is +inf."""

from __future__ import annotations

import math

from gradscope.core.facts import Origin
from gradscope.core.hints.values import base_op, evidence, values, where


def hint(origin: Origin) -> str | None:
    if origin.phase == "backward" or origin.kind != "inf" or base_op(origin.op) != "cross_entropy":
        return None
    counted = evidence(origin, "cross_entropy") or {}
    smoothing = counted.get("label_smoothing") or 0.0
    logits = values(origin, "inputs")[:1]
    if smoothing <= 0 or not logits or logits[0].get("min") != -math.inf:
        return None
    shape = logits[0].get("shape") or []
    classes = shape[1] if len(shape) > 1 else (shape[0] if shape else 0)
    of = f" over all {classes} classes" if classes else " over all classes"
    return (
        f"{where(origin)} is Inf because label_smoothing={smoothing:g} gives {smoothing:g} of "
        f"each target{of}, the masked ones too: the smoothing term sums -log p over the "
        f"{logits[0].get('inf', 0)} masked logits (-inf), and -log 0 is +inf "
        f"(reduction={counted.get('reduction', 'mean')!r}). The mask and the targets are "
        "fine; without smoothing this loss would be finite. Usual fix: smooth over the "
        "allowed classes only (pass the loss the allowed logits, logits[..., allowed], with "
        "targets mapped to them, or write the smoothing term as the mean of -log_softmax "
        "over the kept classes). label_smoothing=0 also removes it. Do not replace -inf by "
        "torch.finfo(dtype).min: the smoothing term then adds smoothing/classes * 3.4e38 per "
        "masked class and row, a loss near 1e37, and Inf again once two such terms are "
        "summed; any large finite fill shifts the loss by smoothing/classes times the fill."
    )
