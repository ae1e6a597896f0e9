"""GradScope inside other libraries' training loops, through their own extension points.

- :mod:`gradscope.integrations.lightning`: ``GradScopeCallback`` for Lightning 2's Trainer
  (the ``lightning`` package, or ``pytorch_lightning`` when only that one is installed);
  :mod:`gradscope.integrations.pytorch_lightning` for a ``pytorch_lightning.Trainer``.
- :mod:`gradscope.integrations.transformers`: ``GradScopeCallback`` for transformers' Trainer.

Each module imports its library when it is imported, and only then; ``import gradscope``
and the app never do.
"""
