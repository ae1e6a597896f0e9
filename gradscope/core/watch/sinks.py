"""Where a watched step goes: the sinks (a recording, the app's history, an exporter) only
store or show what the watch computed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gradscope.core.facts import StepStats, WatchView
from gradscope.core.user_warnings import warn_user


class Sinks:
    """The watch's sinks: objects with ``on_step(watch, stats)`` and ``close()``."""

    def __init__(self, sinks: Sequence[Any] = ()) -> None:
        self.items: list[Any] = list(sinks)

    def add(self, sink: Any) -> None:
        self.items.append(sink)

    def on_step(self, watch: WatchView, stats: StepStats) -> None:
        for sink in self.items:
            sink.on_step(watch, stats)

    def close(self) -> None:
        """Close every sink, even when one of them raises: the others still flush (a
        recording's last steps are not lost to an exporter's error). The first error is
        raised after all were closed; later ones are warned about."""
        first: BaseException | None = None
        for sink in self.items:
            try:
                sink.close()
            except Exception as error:
                if first is None:
                    first = error
                else:
                    warn_user(f"gradscope.watch: closing {type(sink).__name__} failed: {error}")
        if first is not None:
            raise first
