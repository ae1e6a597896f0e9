"""Early warnings (#37): precursors of a failure seen in a quantity's own history, before any
NaN/Inf. Pure and Qt-free: each detector reads a series of plain floats; ``EarlyWarnings``
keeps the series by (module, quantity) and turns what the detectors find into
``gradscope.core.facts.EarlyWarning``s.

- ``limits``: a dtype's overflow, smallest normal and exp's overflow point;
- ``spike``: a robust z-score against the running median (MAD) of the quantity's history;
- ``drift``: a sustained growth rate (Theil-Sen fit of the log), projected to the limit;
- ``headroom``: how far a value sits from its dtype's overflow or smallest normal;
- ``monitor``: the series and the one warning per module and kind;
- ``observations``: what a watched step gives them; ``hints``: what practice does.

The forward statistics they read (a layer's output max |x|, the head's log-partition) are
statistics like any other, in ``gradscope.core.watch.statistics``; a layer's output RMS is
measured beside them, for the plots, and read by no detector.
"""

from gradscope.core.warnings import drift, headroom, limits, spike
from gradscope.core.warnings.monitor import EarlyWarnings, LayerObservations, Observation

__all__ = [
    "EarlyWarnings",
    "LayerObservations",
    "Observation",
    "drift",
    "headroom",
    "limits",
    "spike",
]
