"""Exports of what a watch measures into the dashboards users already keep open.

- :mod:`.scalars`: a step's statistics as named scalars (the tags every export shares);
- :mod:`.tensorboard_sink`: a watch sink writing them live as TensorBoard event files;
- :mod:`.tensorboard_report`: the same from a recording (``gradscope report --tensorboard``);
- :mod:`.wandb_sink`: a watch sink logging them into the active W&B run;
- :mod:`.optional_import`: the extras these need, imported only when asked for.

Sinks only store what the watch computed; nothing here recomputes a statistic.
"""
