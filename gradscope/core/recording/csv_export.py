"""A run history as CSV rows, one per step and layer."""

from __future__ import annotations

import csv
import io
import itertools
import os
from collections.abc import Sequence

import numpy as np

from gradscope.core.errors import GradScopeError
from gradscope.core.facts import (
    STATUS_NAMES,
)
from gradscope.core.history import (
    MISSING,
    STATISTICS,
    STATUS_MISSING,
    RunHistory,
)


# -- export -------------------------------------------------------------------------------
def write_csv(
    history: RunHistory,
    path: str | os.PathLike[str],
    layers: Sequence[str] | None = None,
) -> int:
    """Write ``step,layer,grad_norm,max_abs,weight_norm,update_ratio,status`` rows, one per
    step and watched layer (all layers, or ``layers``), then a column per named statistic
    (``gradscope.Statistic``, by its name); an unmeasured value is empty, NaN and Inf are
    written as ``nan``, ``inf``, ``-inf``. Returns the number of rows."""
    names = list(history.layer_names if layers is None else layers)
    for name in names:
        if not history.has_layer(name):
            raise GradScopeError(f"no layer {name!r} in this run")
    status = history.status_matrix()
    steps = history.steps
    written = 0
    try:
        with open(path, "w", newline="", encoding="utf-8") as file:
            named = history.figure_names
            measured = {name: history.figure_measured(name) for name in named}
            header = io.StringIO()
            csv.writer(header).writerow(("step", "layer", *STATISTICS, "status", *named))
            file.write(header.getvalue().rstrip("\r\n") + "\n")
            for name in names:
                column = history.column(name)
                watched = np.flatnonzero(status[:, column] != STATUS_MISSING)
                if not len(watched):
                    continue
                quoted = io.StringIO()
                csv.writer(quoted).writerow((name,))  # quoted only if it must be
                cells = [
                    _csv_column(history.matrix(statistic)[watched, column])
                    for statistic in STATISTICS
                ]
                labels = [STATUS_NAMES[code] for code in status[watched, column].tolist()]
                figures = [
                    _csv_column(
                        history.matrix(name)[watched, column], ~measured[name][watched, column]
                    )
                    for name in named
                ]
                lines = zip(
                    map(str, steps[watched].tolist()),
                    itertools.repeat(quoted.getvalue().rstrip("\r\n")),
                    *cells,
                    labels,
                    *figures,
                    strict=False,
                )
                file.write("\n".join(map(",".join, lines)) + "\n")
                written += len(watched)
    except OSError as error:
        raise GradScopeError(f"cannot write {path}: {error.strerror or error}") from None
    return written


def _csv_column(
    values: np.ndarray, missing: np.ndarray | None = None
) -> list[str] | itertools.repeat[str]:
    """Text of one statistic's values: 9 significant digits (enough for float32 to read
    back exactly), ``nan``/``inf``/``-inf`` as such, empty where not measured (``missing``;
    by default where the value is MISSING)."""
    missing = values == MISSING if missing is None else missing
    if missing.all():
        return itertools.repeat("")
    text = [f"{value:.9g}" for value in values.tolist()]
    for index in np.flatnonzero(missing).tolist():
        text[index] = ""
    return text
