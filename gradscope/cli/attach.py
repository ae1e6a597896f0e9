"""``gradscope attach [options] SCRIPT [ARGS...]``: the command line of the attach
(the work is ``gradscope.core.attach.command``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def _attach_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradscope attach",
        description="Run an unmodified training script and record every model its "
        "optimizers step, one step per optimizer.step(). The script's stdout and exit code "
        "are its own; GradScope writes to stderr only.",
    )
    parser.add_argument(
        "--record",
        metavar="PATH",
        help="the recording (default: a new file in the per-user runs folder); a second "
        "model goes beside it as PATH-stem.<Class>.gsrec",
    )
    parser.add_argument("--open", action="store_true", help="open the app on the recording")
    parser.add_argument("--layers", nargs="+", metavar="GLOB", help="watch only these layers")
    parser.add_argument("--detail-every", type=int, metavar="K", help="detail every K-th step")
    parser.add_argument(
        "--statistic",
        action="append",
        dest="statistics",
        default=[],
        metavar="MODULE:CLASS",
        help="also measure this gradscope.Statistic subclass (repeatable)",
    )
    parser.add_argument(
        "--fail-on-nonfinite",
        action="store_true",
        help="exit with status 1 when a NaN/Inf was recorded (and the script exited 0)",
    )
    parser.add_argument(
        "--early-warnings",
        action="store_true",
        help="warn before a NaN/Inf: outputs or the loss that spike, drift upwards or near "
        "their dtype's limits (in the summary and the recording)",
    )
    parser.add_argument(
        "--fail-on-warning",
        action="store_true",
        help="exit with status 1 when an early warning was given (and the script exited 0; "
        "turns --early-warnings on)",
    )
    parser.add_argument(
        "--tensorboard", metavar="DIR", help="also write TensorBoard scalars into DIR"
    )
    parser.add_argument("script", help="the training script (.py), run as __main__")
    parser.add_argument("args", nargs="*", help="the script's own arguments, as given")
    return parser


_ATTACH_VALUED = ("--record", "--detail-every", "--tensorboard", "--statistic")


def split_attach_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """GradScope's options, and ``SCRIPT ARGS...`` (never parsed: they are the script's).
    The script is the first word that is neither an option nor an option's value; the
    values of ``--layers`` run until the next option or the first ``.py`` word."""
    argv = list(argv)
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "--":
            return argv[:index], argv[index + 1 :]
        if word in _ATTACH_VALUED:
            index += 2
        elif word == "--layers":
            index += 1
            while index < len(argv) and not argv[index].startswith("-"):
                if argv[index].endswith(".py"):
                    break
                index += 1
        elif word.startswith("-"):
            index += 1
        else:
            break
    return argv[:index], argv[index:]


def attach_command(argv: Sequence[str]) -> int:
    """``gradscope attach [options] SCRIPT [ARGS...]``."""
    options, rest = split_attach_argv(argv)
    parser = _attach_parser()
    args = parser.parse_args([*options, "--", *rest[:1]])
    from gradscope.core.attach.command import attach

    return attach(
        args.script,
        rest[1:],
        record=args.record,
        layers=args.layers,
        detail_every=args.detail_every,
        tensorboard=args.tensorboard,
        open_app=args.open,
        fail_on_nonfinite=args.fail_on_nonfinite,
        statistics=args.statistics,
        early_warnings=args.early_warnings,
        fail_on_warning=args.fail_on_warning,
    )
