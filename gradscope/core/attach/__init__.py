"""``gradscope attach SCRIPT``: watch an unmodified training script.

- :mod:`.model_finder`: which modules are the script's models (outermost modules called in
  forward, found through torch's global module hooks) and each one's inputs at every call;
- :mod:`.loss_capture`: the losses ``backward()`` is called on;
- :mod:`.session`: one watch per model, fed just before each ``optimizer.step()`` through
  torch's global optimizer-step hook;
- :mod:`.script`: running the script as ``__main__`` with its own argv, output and exit code;
- :mod:`.runs_folder`: where recordings go by default;
- :mod:`.app_launch`: ``--open``, the app on the recording.
"""
