"""Device figures to the host: the step's one transfer, by a non-blocking copy into pinned
memory and an event, so that the wait is explicit (``torch.cuda.set_sync_debug_mode("error")``
refuses the implicit synchronisation inside an operation)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class HostCopy:
    """A copy under way (``event`` None: the tensor was on the host already)."""

    tensor: torch.Tensor
    event: torch.cuda.Event | None = None

    def wait(self) -> np.ndarray:
        if self.event is not None:
            self.event.synchronize()
        return self.tensor.numpy()


def start_host_copy(tensor: torch.Tensor) -> HostCopy:
    """Queue ``tensor``'s copy to the host; no synchronisation happens here."""
    if tensor.device.type != "cuda":
        return HostCopy(tensor)
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return HostCopy(host, event)


def to_host(tensor: torch.Tensor) -> np.ndarray:
    """A device tensor's values on the host (rare steps: the exact figures, the weights)."""
    return start_host_copy(tensor).wait()
