"""What practice does about each early warning, by what it was seen in. Each hint claims only
what the warning shows (where, what grows or sits near which limit) and names the usual
remedies with where they come from."""

from __future__ import annotations

from gradscope.core.facts import EarlyWarning


def hint_for(warning: EarlyWarning, module_type: str | None = None) -> str:
    """A hint for ``warning``; ``module_type`` is its module's class name, if known."""
    name = (warning.module or "").lower() + " " + (module_type or "").lower()
    if warning.quantity == "log-partition":
        return (
            "the output logits' log-partition grows: z-loss (add 1e-4 * logsumexp(logits)**2 "
            "to the loss, as PaLM does) keeps it near 0; compute the softmax/cross-entropy "
            "in float32"
        )
    if warning.quantity == "loss":
        return (
            "loss spikes after a quiet stretch: clip the gradient norm, lower the peak "
            "learning rate or lengthen the warm-up; look at the batch of this step"
        )
    if warning.quantity == "gradient norm":
        return (
            "the gradient norm spikes or grows: clip it (clip_grad_norm_), lower the "
            "learning rate; with Adam, a larger eps or a lower beta2 damps such spikes"
        )
    if warning.quantity == "max |g|":
        if warning.limit is not None and warning.limit < 1:
            return (
                "gradients near float16's smallest normal lose precision: use a loss "
                "scaler (torch.amp.GradScaler), bfloat16, or float32 master weights"
            )
        return "gradients near their dtype's overflow: use a loss scaler or clip them"
    if warning.quantity == "exp input max":
        return (
            "an exp's input nears the point where exp overflows in its dtype: a softmax or "
            "logsumexp written by hand should subtract the row maximum first (torch.softmax "
            "and torch.logsumexp do), or run in float32"
        )
    attention = any(word in name for word in ("attn", "attention", "score", "qk"))
    if warning.kind == "low headroom" and warning.limit is not None and warning.limit < 1:
        return (
            "outputs near their dtype's smallest normal lose precision and flush to zero: "
            "compute this module in float32 or bfloat16"
        )
    if attention:
        return (
            "attention logits grow (Dehghani et al. 2023; Wortsman et al. 2023): "
            "qk-layernorm (a LayerNorm on queries and keys) bounds them; so does a lower "
            "learning rate; compute the scores and softmax in float32"
        )
    if warning.kind == "low headroom" or warning.steps_left is not None:
        return (
            "outputs near their dtype's overflow: compute this module in float32 (or "
            "bfloat16, whose range is float32's), or normalise its input"
        )
    return (
        "outputs grow step after step (arXiv 2410.16682 sees this before divergence): a "
        "lower peak learning rate or a longer warm-up, weight decay, or a normalisation "
        "after this module"
    )
