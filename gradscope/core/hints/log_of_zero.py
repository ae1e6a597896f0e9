"""Evidence: a log op whose input minimum is exactly 0: log(0) is -Inf. When the op that
made its input is recorded (``inputs_made_by``) and is a softmax or a sigmoid (or 1 minus a
sigmoid), the exact log-space op is the usual fix."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.backward_divide_by_zero import LOGS
from gradscope.core.hints.values import base_op, evidence, min_input, where

# log1p's edge is -1; lgamma and digamma have poles, not a log's zero (forward_domain_edge)
NOT_LOGS = {"log1p", "lgamma", "digamma"}
SELECTIONS = {"gather", "__getitem__", "index_select", "take_along_dim", "masked_select"}
EXACT = {
    "softmax": "log_softmax",
    "_softmax": "log_softmax",
    "sigmoid": "F.logsigmoid",
}


def hint(origin: Origin) -> str | None:
    if origin.phase == "backward" or base_op(origin.op) not in LOGS - NOT_LOGS:
        return None
    if min_input(origin) != 0:
        return None
    made = [m for m in evidence(origin, "inputs_made_by") or [] if m]
    maker = base_op(made[0]["op"]) if made else ""
    before = {base_op(op) for op in made[0].get("from", [])} if made else set()
    if maker in ("rsub", "__rsub__", "sub", "__sub__") and "sigmoid" in before:
        return (
            f"{where(origin)} got zeros (input minimum 0) from 1 - sigmoid(x), which rounds to "
            "0 once sigmoid(x) rounds to 1 (x above about 17 in float32): log of 0 is -Inf. "
            "log(1 - sigmoid(x)) is F.logsigmoid(-x), exact for every x: the usual fix (or "
            "F.binary_cross_entropy_with_logits for the whole loss)."
        )
    picked = maker in SELECTIONS and len(before & set(EXACT)) == 1
    source = made[0]["op"] if made else ""
    if picked:
        # p[target] or p.gather(...) of a softmax: the softmax is what underflowed
        inner = next(op for op in made[0]["from"] if base_op(op) in EXACT)
        maker, source = base_op(inner), f"{inner} (picked by {source})"
    if maker in EXACT:
        return (
            f"{where(origin)} got zeros (input minimum 0) from {source}, whose "
            f"output underflowed to 0: log of 0 is -Inf. Use {EXACT[maker]} on the "
            "logits instead of the log of its output: the usual fix, exact and without an "
            "epsilon's bias (F.cross_entropy / F.nll_loss take log-probabilities)."
        )
    return (
        f"{where(origin)} got zeros (input minimum 0): log of 0 is -Inf. Clamp the input to "
        "a floor (x.clamp_min(1e-8)): the usual fix, which changes only values below the "
        "floor; or add an epsilon (log(x + 1e-8)), which shifts every value a little. If the "
        "input is a softmax's or sigmoid's output, log_softmax / logsigmoid on the logits "
        "is exact."
    )
