"""Where did the first NaN/Inf come from?

The watch only says that a step went non-finite. To say where, :func:`locate_first_nonfinite`
re-runs that step's forward and backward (same batch, same weights, same random state, before
the optimizer touched anything) with instruments that would be too costly to leave on:

- the batch itself is checked first: NaN in the data (or an Inf that is not a mask and that
  the re-run shows flowing into the first bad value) is the data's fault, phase ``"input"``;
- forward pre/post hooks on every module record which non-finite kinds its inputs carried
  and its output carries; the first module, in the order calls finish, whose output holds a
  kind its inputs did not (NaN from NaN-free inputs, Inf from Inf-free inputs) made the value
  (children finish before parents, so this is the deepest module whose own code did it).
  Values that are non-finite by design (an additive ``-inf`` mask, ``masked_fill(-inf)``)
  therefore blame nobody until something turns them into a NaN;
- a ``TorchFunctionMode`` sees every torch operation, checks the same thing per operation,
  and labels each autograd node it creates with the operation, the innermost module being
  run and the line of user code that called it. A custom ``torch.autograd.Function`` is one
  operation: its name, the module that applied it, the line of ``.apply(...)``;
- hooks on those autograd nodes (not ``register_full_backward_hook``, which breaks on
  in-place ReLU) check, in the order gradients are computed, for the first node whose
  incoming gradient is finite and whose outgoing gradient is not. The forward that reentrant
  activation checkpointing recomputes during backward is traced the same way, so a
  checkpointed block is blamed exactly as it would be without checkpointing.

All checks look at detached tensors (non-reentrant checkpointing compares what autograd saved
in the forward and in the recomputation; a check recorded by autograd would break it).
Everything is removed afterwards; the model's buffers (BatchNorm statistics), gradients and
any weight the forward wrote in place (``nn.Embedding(max_norm=...)``) are restored, so
localisation never changes training. Nothing is hooked before this function runs.

The package, by idea: :mod:`.traced_step` (the re-run and :func:`locate_first_nonfinite`),
:mod:`.forward_tracer` (the ``TorchFunctionMode`` and the labels of autograd nodes),
:mod:`.input_blame` (the batch's NaN/Inf), :mod:`.kinds` (which non-finite kinds a value
holds); the tensor-tree walk they share is :mod:`gradscope.core.tensor_tree`.
"""

from gradscope.core.facts import Origin
from gradscope.core.origin.forward_tracer import user_location
from gradscope.core.origin.kinds import tensor_summary
from gradscope.core.origin.traced_step import locate_first_nonfinite, origin_from_statistics
from gradscope.core.tensor_tree import float_tensors, loss_from_output

__all__ = [
    "Origin",
    "float_tensors",
    "locate_first_nonfinite",
    "loss_from_output",
    "origin_from_statistics",
    "tensor_summary",
    "user_location",
]
