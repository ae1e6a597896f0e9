"""``gradscope open RECORDING [MORE...]``: the app on recordings, each checked here first."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from gradscope.cli import app
from gradscope.cli.exits import EXIT_BAD_INPUT, print_error


def open_command(argv: Sequence[str]) -> int:
    """``gradscope open RECORDING [MORE...]``: the app on a recording (following it while it
    is being written), with any further recordings compared on the same axes. A file that
    is no readable recording is reported here, before any window."""
    parser = argparse.ArgumentParser(
        prog="gradscope open", description="Show a GradScope recording in the app."
    )
    parser.add_argument("recording", help="a .gsrec file written by gradscope.watch(record=...)")
    parser.add_argument(
        "compare", nargs="*", help="more recordings, drawn on the same axes to compare runs"
    )
    parser.add_argument("--screenshot", metavar="PNG", help="save a screenshot and exit")
    parser.add_argument(
        "--statistic",
        metavar="NAME",
        help="the statistic the gradient-norm plot shows: grad_norm, max_abs, weight_norm, "
        "update_ratio, param_grad_norm or a named one the recording holds (its name)",
    )
    args = parser.parse_args(list(argv))
    from gradscope.core.errors import GradScopeError
    from gradscope.core.recording.rank_set import find_rank_set, load_rank_set
    from gradscope.core.recording.reader import check_recording

    path = args.recording
    try:
        recordings = find_rank_set(path)
        if recordings is not None:
            # A distributed run's set: the rank named, or rank 0 for the common name.
            named = Path(path).expanduser()
            path = str(named if named in recordings.paths.values() else recordings.primary)
            others = ", ".join(p.name for p in recordings.paths.values() if str(p) != path)
            print(
                f"note: showing {Path(path).name}; the set's other ranks: {others or 'none'}",
                file=sys.stderr,
            )
            for note in recordings.notes:
                print(f"note: {note}", file=sys.stderr)
            load_rank_set(recordings)  # the window reads every rank's file
        # What the window reads, read here: a damaged file is one message, not a dialog
        # after the window opened (and an exit 2 with nothing said).
        for each in (path, *args.compare):
            history = check_recording(each)
            if each == path and args.statistic is not None:
                _check_statistic(args.statistic, [*history.statistic_names, "param_grad_norm"])
    except GradScopeError as error:
        print_error(error)
        return EXIT_BAD_INPUT
    launch = app.app_launcher()  # looked up on its module, where a test replaces it
    if launch is None:
        return EXIT_BAD_INPUT
    return launch(
        model=None,
        overrides={},
        screenshot=args.screenshot,
        recording=path,
        compare=list(args.compare),
        statistic=args.statistic,
    )


def _check_statistic(name: str, held: list[str]) -> None:
    if name not in held:
        from gradscope.core.errors import GradScopeError

        raise GradScopeError(
            f"--statistic {name}: the recording holds no statistic of that name; it holds "
            f"{', '.join(held)}"
        )
