"""Peak downsampling of the log-norm cache: per-layer min/max over blocks of steps, at
power-of-two block sizes."""

from __future__ import annotations

import math

import numpy as np

from gradscope.gui.plots.log_norm_cache import LogNormCache


class PeakCache:
    """Per-layer minimum and maximum of each block of ``per_block`` steps (peak
    downsampling; NaN wins a block so that a gap never closes), for all complete blocks,
    extended as steps arrive. With a ``finer`` level (half the block size) that is up to
    date, blocks are made from pairs of its blocks instead of from the steps: reading a
    fraction of the data."""

    def __init__(self, per_block: int) -> None:
        self.per_block = per_block
        self.resets = -1
        self.blocks = 0
        self.low = np.zeros((0, 0), dtype=np.float32)
        self.high = np.zeros((0, 0), dtype=np.float32)

    def update(self, cache: LogNormCache, finer: PeakCache | None = None) -> None:
        per_block = self.per_block
        if cache.resets != self.resets or self.low.shape[0] < cache.columns:
            self.resets, self.blocks = cache.resets, 0
            self.low = np.zeros((cache.columns, 0), dtype=np.float32)
            self.high = self.low
        complete = cache.rows // per_block
        if complete <= self.blocks:
            return
        if complete > self.low.shape[1]:
            capacity = max(complete, 2 * self.low.shape[1])
            for name in ("low", "high"):
                grown = np.empty((cache.columns, capacity), dtype=np.float32)
                grown[:, : self.blocks] = getattr(self, name)[: cache.columns, : self.blocks]
                setattr(self, name, grown)
        columns, start = cache.columns, self.blocks
        if (
            finer is not None
            and finer.per_block * 2 == per_block
            and finer.resets == cache.resets
            and finer.blocks >= 2 * complete
            and finer.low.shape[0] >= columns
        ):
            pairs = slice(2 * start, 2 * complete)
            for name, reduce in (("low", np.minimum), ("high", np.maximum)):
                halves = getattr(finer, name)[:columns, pairs]
                getattr(self, name)[:, start:complete] = reduce(halves[:, 0::2], halves[:, 1::2])
        else:
            segment = cache.values[:columns, start * per_block : complete * per_block]
            segment = segment.reshape(columns, complete - start, per_block)
            self.low[:, start:complete] = segment.min(axis=2)
            self.high[:, start:complete] = segment.max(axis=2)
        self.blocks = complete


class PeakLevels:
    """Peak caches at power-of-two block sizes, kept as the user zooms: going back to a
    zoom level costs nothing, and a coarser level is made from a finer one."""

    def __init__(self) -> None:
        self.levels: dict[int, PeakCache] = {}

    @staticmethod
    def block_size(steps_per_pixel: float) -> int:
        """The power of two at or above ``steps_per_pixel`` (at most two points a pixel)."""
        return 1 << max(0, math.ceil(math.log2(max(steps_per_pixel, 1.0))))

    def level(self, cache: LogNormCache, per_block: int) -> PeakCache:
        level = self.levels.get(per_block)
        if level is None:
            level = self.levels[per_block] = PeakCache(per_block)
        finer = self.levels.get(per_block // 2)
        if finer is not None:
            finer.update(cache, self.levels.get(per_block // 4))
        level.update(cache, finer)
        return level
