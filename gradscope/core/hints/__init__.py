"""Hints from evidence: each rule is a small module that states, in its docstring, the
evidence it needs (what the values at the origin show) and returns a hint only when that
evidence is there. :func:`hint_for` asks them in order, most specific first; the last rule
(``unsure``) always answers and says only what it knows.

A rule reads only the origin's phase, op and ``details`` (``values``: the tensors' summaries;
``evidence``: what the op's arguments showed; flags the watch sets, like ``loss_scaler``),
through :mod:`gradscope.core.hints.values`, so anything that fills those fields can be
hinted by the same rules.
"""

from __future__ import annotations

from collections.abc import Callable

from gradscope.core.facts import Origin
from gradscope.core.hints import (
    backward_divide_by_subnormal,
    backward_divide_by_zero,
    backward_domain_edge,
    backward_half_overflow,
    backward_half_underflow,
    backward_large_derivative,
    backward_of_discarded_nonfinite,
    backward_overflow,
    backward_overflow_of_large_values,
    backward_root_at_zero,
    bad_batch,
    cast_overflow,
    cross_entropy_empty_mean,
    cross_entropy_masked_target,
    cross_entropy_smoothing_over_mask,
    ctc_no_alignment,
    custom_function,
    default_loss,
    division,
    division_by_empty_count,
    epsilon_rounds_to_zero,
    exp_overflow,
    forward_domain_edge,
    fractional_power_of_negative,
    half_overflow,
    log_of_negative,
    log_of_zero,
    loss_outside_torch,
    loss_overflow,
    mask_aggregated,
    mask_made_nan,
    mask_reached_loss,
    mask_value_overflow,
    nonfinite_input_to_nan,
    outside_domain,
    overflow,
    reciprocal_of_zero,
    reduction_of_too_few,
    root_of_cancellation,
    root_of_negative,
    softmax_fully_masked,
    softmax_of_inf,
    unsure,
    weights_broken_by_update,
    weights_never_initialised,
    zero_times_inf,
)

Rule = Callable[[Origin], "str | None"]

# Most specific first: the data, the weights, the user's own Function; then the rules
# whose evidence is an op's arguments or recorded values; overflows; the unsure last.
RULES: tuple[Rule, ...] = (
    bad_batch.hint,
    weights_never_initialised.hint,
    weights_broken_by_update.hint,
    custom_function.hint,
    backward_of_discarded_nonfinite.hint,
    backward_root_at_zero.hint,
    backward_divide_by_zero.hint,
    backward_half_underflow.hint,
    backward_divide_by_subnormal.hint,
    backward_overflow_of_large_values.hint,
    backward_large_derivative.hint,
    backward_domain_edge.hint,
    backward_half_overflow.hint,
    backward_overflow.hint,
    ctc_no_alignment.hint,
    cross_entropy_empty_mean.hint,
    cross_entropy_masked_target.hint,
    cross_entropy_smoothing_over_mask.hint,
    mask_aggregated.hint,
    mask_reached_loss.hint,
    loss_outside_torch.hint,
    default_loss.hint,
    epsilon_rounds_to_zero.hint,
    reduction_of_too_few.hint,
    forward_domain_edge.hint,
    log_of_zero.hint,
    log_of_negative.hint,
    root_of_cancellation.hint,
    root_of_negative.hint,
    fractional_power_of_negative.hint,
    outside_domain.hint,
    reciprocal_of_zero.hint,
    division_by_empty_count.hint,
    division.hint,
    softmax_fully_masked.hint,
    softmax_of_inf.hint,
    zero_times_inf.hint,
    mask_made_nan.hint,
    nonfinite_input_to_nan.hint,
    exp_overflow.hint,
    mask_value_overflow.hint,
    cast_overflow.hint,
    half_overflow.hint,
    loss_overflow.hint,
    overflow.hint,
)


def hint_for(origin: Origin) -> str:
    """The first rule whose evidence the origin holds; the unsure rule otherwise."""
    for rule in RULES:
        found = rule(origin)
        if found:
            return found
    return unsure.hint(origin)
