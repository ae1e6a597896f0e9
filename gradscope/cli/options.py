"""The run settings shared by ``gradscope run`` and the app, as command-line options."""

from __future__ import annotations

import argparse
from typing import Any


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``gradscope run`` and the app; all default to None so that only
    what the user typed overrides a script's CONFIG."""
    add = parser.add_argument
    add("--steps", type=int, help="number of training steps (default 50)")
    add("--batch-size", type=int, help="batch size (default 8)")
    add("--device", help="auto, cpu, cuda or cuda:N (default auto)")
    add(
        "--optimizer",
        choices=("sgd", "adam", "adamw"),
        help="optimizer (default sgd, momentum 0.9)",
    )
    add("--lr", type=float, help="learning rate (default 0.01)")
    add("--momentum", type=float, help="SGD momentum (default 0.9)")
    add("--weight-decay", type=float, help="weight decay (default 0)")
    add("--loss-scale", type=float, help="multiply the loss by this (provokes explosion)")
    add(
        "--amp",
        choices=("bf16", "fp16"),
        help="mixed precision: autocast (and a GradScaler for fp16) on forward and loss",
    )
    add("--clip", type=float, help="clip the total gradient norm to this (default off)")
    add("--image-size", type=int, help="image size for torchvision models (default 224)")
    add("--seq-len", type=int, help="tokens per sequence for hf: models (default 128)")
    add(
        "--config",
        action="append",
        dest="model_config",
        metavar="KEY=VALUE",
        help="set a config value of an hf:/timm: model (repeatable)",
    )
    add("--layers", nargs="+", metavar="GLOB", help="layers to watch, names or globs")
    add("--seed", type=int, help="random seed (default 0)")
    add("--explode-threshold", type=float, help="grad norm above this is exploding (1000)")
    add("--vanish-threshold", type=float, help="grad norm below this is vanishing (1e-7)")
    add(
        "--vanish-steps",
        type=int,
        metavar="N",
        help="vanishing once under the threshold for N consecutive steps (default 3)",
    )
    add("--update-ratio", action="store_true", default=None, help="also measure ||dw||/||w||")
    add(
        "--detail-every",
        type=int,
        metavar="K",
        help="max |g|, weight norm and update ratio every K-th step (default 1: every step)",
    )
    add(
        "--statistic",
        action="append",
        dest="statistics",
        metavar="MODULE:CLASS",
        help="also measure this gradscope.Statistic subclass, imported from the current "
        "folder or sys.path (or a .py file); repeatable",
    )
    add(
        "--early-warnings",
        action="store_true",
        default=None,
        help="warn before a NaN/Inf: outputs or the loss that spike, drift upwards or near "
        'their dtype\'s limits (JSON: "warnings")',
    )
    add(
        "--keep-going",
        action="store_true",
        default=None,
        help="continue after a NaN/Inf instead of stopping before that optimizer step",
    )
    add("--weights", help="a state-dict file for a torchvision model (loaded weights_only)")
    add(
        "--trace",
        action="store_true",
        default=None,
        help='record every forward call and backward gradient of each step (JSON: "trace")',
    )


def typed_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The run settings the user typed (argparse dests are the RunSettings field names)."""
    from gradscope.core.settings import SETTING_NAMES

    return {n: getattr(args, n) for n in SETTING_NAMES if getattr(args, n, None) is not None}
