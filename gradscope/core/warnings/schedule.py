"""When the early warnings' forward statistics are measured: at every step of the first
``DENSE_STEPS``, then at the watch's ``detail_every`` schedule (every 10th step by default).

Why dense early: the failures the warnings are for often come early (a warm-up that ends too
high diverges within its first hundred steps) and a drift is judged only after a baseline of
``drift.BASELINE`` steps plus a window, so one sample in ten would see its first drift after
some 300 steps. Why sparse later: a due step costs a forward hook per watched module; one
step in ``detail_every`` keeps the amortised cost of a long run at that share of a due step's
extra. A drift in the sparse part is judged on fewer samples spanning more steps (see
``drift``)."""

DENSE_STEPS = 100


def due(step: int, detail_every: int) -> bool:
    """Whether the warnings' forward statistics are measured at ``step``."""
    return step < DENSE_STEPS or step % detail_every == 0
