"""The limits a floating-point value must stay within: its dtype's largest finite value and
smallest normal number, and the input at which ``exp`` overflows in that dtype (11.09 in
float16, 88.72 in float32 and bfloat16)."""

import math

import torch


def overflow(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def smallest_normal(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).tiny)


def exp_overflow(dtype: torch.dtype) -> float:
    return math.log(torch.finfo(dtype).max)
