"""``gradscope attach``'s work once its options are read: hooks in, the script run, every
watch closed, a summary on stderr, and the script's exit code (1 instead of 0 with
``--fail-on-nonfinite`` when a NaN/Inf was recorded, or with ``--fail-on-warning`` when an
early warning was given; the script itself always runs to its
end, as it would without GradScope)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from gradscope.core.attach.runs_folder import default_recording_path
from gradscope.core.attach.script import check_script, run_script
from gradscope.core.attach.session import AttachOptions, AttachSession, say
from gradscope.core.errors import GradScopeError
from gradscope.core.watch.statistic_loader import load_statistic_class

EXIT_NONFINITE = 1


def attach(
    script: str,
    args: Sequence[str],
    *,
    record: str | os.PathLike[str] | None = None,
    layers: Sequence[str] | None = None,
    detail_every: int | None = None,
    tensorboard: str | os.PathLike[str] | None = None,
    open_app: bool = False,
    fail_on_nonfinite: bool = False,
    statistics: Sequence[str] = (),
    early_warnings: bool = False,
    fail_on_warning: bool = False,
) -> int:
    check_script(script)
    # A bad --statistic is said now, before the script runs.
    statistic_classes = [load_statistic_class(spec) for spec in statistics]
    if detail_every is not None and detail_every < 1:
        raise GradScopeError(f"--detail-every must be >= 1, not {detail_every}")
    if tensorboard is not None:
        # A missing package is said now, not at the first step deep in the script.
        from gradscope.core.export.optional_import import require

        require("tensorboard.summary.writer.event_file_writer")
    if record is None:
        record = default_recording_path(script)
    session = AttachSession(
        AttachOptions(
            record=record,
            layers=list(layers) if layers else None,
            detail_every=detail_every,
            tensorboard=tensorboard,
            open_app=open_app,
            source=os.path.abspath(script),
            statistics=statistic_classes,
            early_warnings=early_warnings or fail_on_warning,
        )
    )
    session.start()
    try:
        code = run_script(script, list(args))
    finally:
        session.close()
    for line in session.summary():
        say(line)
    if fail_on_nonfinite and code == 0 and session.nonfinite:
        return EXIT_NONFINITE
    if fail_on_warning and code == 0 and session.warned:
        return EXIT_NONFINITE
    return code
