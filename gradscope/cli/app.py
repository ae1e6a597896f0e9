"""``gradscope [MODEL]``: the app, imported only when it is asked for (Qt is heavy)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from gradscope.cli.exits import EXIT_BAD_INPUT, EXIT_OK
from gradscope.cli.options import add_run_options, typed_overrides


def _app_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradscope",
        description="GradScope: inspect PyTorch gradients "
        "(`gradscope run --help` for headless runs).",
    )
    parser.add_argument("model", nargs="?", help="a .py model script or a torchvision model name")
    add_run_options(parser)
    parser.add_argument(
        "--screenshot",
        metavar="PNG",
        help="run the steps, save a screenshot of the window and exit",
    )
    parser.add_argument("--version", action="store_true", help="print versions and exit")
    return parser


def _versions() -> str:
    import platform

    import gradscope

    parts = [f"gradscope {gradscope.__version__}", f"Python {platform.python_version()}"]
    try:
        import torch

        parts.append(f"torch {torch.__version__}")
    except ImportError:
        pass
    return ", ".join(parts)


def app_launcher() -> Any:
    """The app's ``launch``, imported only now (Qt is heavy); None, with the reason on
    stderr, when the app cannot start here."""
    try:
        from gradscope.gui.app import launch
    except ImportError as error:
        print(f"gradscope: error: the app cannot start: {error}", file=sys.stderr)
        return None
    return launch


def app_command(argv: Sequence[str]) -> int:
    args = _app_parser().parse_args(list(argv))
    if args.version:
        print(_versions())
        return EXIT_OK
    launch = app_launcher()
    if launch is None:
        return EXIT_BAD_INPUT
    return launch(
        model=args.model,
        overrides=typed_overrides(args),
        weights=args.weights,
        screenshot=args.screenshot,
    )
