"""``gradscope attach SCRIPT``: watch an unmodified training script.

- :mod:`.model_finder`: which modules are the script's models (the smallest module holding
  an optimizer's parameters, from torch's global registration hooks, or the outermost module
  called in forward), the capture of their first forward (step 0) and their inputs;
- :mod:`.loss_capture`: the losses ``backward()`` is called on (unscaled under a GradScaler);
- :mod:`.step_calls`: the script's ``GradScaler.scale``/``step`` and gradient clipping calls;
- :mod:`.session`: one watch per model, fed at each optimizer step: before the script clips,
  at ``scaler.step`` (skipped steps too), or at ``optimizer.step()``;
- :mod:`.script`: running the script as ``__main__`` with its own argv, output and exit code;
- :mod:`.runs_folder`: where recordings go by default;
- :mod:`.app_launch`: ``--open``, the app on the recording.
"""
