"""``gradscope run SCRIPT --nproc N [--fsdp]``: the same steps on N local processes through
torch.distributed's own launcher.

- :mod:`.launcher` (the CLI's side): starts ``torch.distributed.run`` as a subprocess,
  watches every rank's progress, ends a run whose ranks stopped moving (with every rank's
  stacks), and reads back what each rank did.
- :mod:`.worker` (each rank's process): builds the model, wraps it in DDP or shards it with
  ``fully_shard``, and runs the usual :class:`~gradscope.core.runner.StepRunner` steps on its
  own batches.
- :mod:`.rank_stream`: the file through which a rank hands its steps to the launcher, one
  record at a time, so nothing finished is lost when a rank dies.
"""
