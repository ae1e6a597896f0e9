"""The gradient watch: per-layer gradient statistics for every step, at the cost of a few
batched tensor ops and one host transfer per step, and the origin of each NaN/Inf.

This class only coordinates; each idea has its own module in this package: which parameters
are read and how they are grouped (binding), the tensor reads (figures, reads), the step's
true gradient norms (norms), exact figures on rare steps (exact), per-layer aggregation
(layers, per_layer), statuses and the step's flags (verdict, status), NaN/Inf episodes
(episodes), mixed precision (loss_scale), the update ratio (update_ratio), torch.distributed
(distributed), and where a step goes (sinks).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gradscope.core.errors import GradScopeError
from gradscope.core.facts import (
    STATUS_VANISHING,
    LayerInfo,
    Origin,
    StatisticInfo,
    StepStats,
)
from gradscope.core.replay import DEFAULT_GRADIENT_BYTES, make_replay
from gradscope.core.sharded import RankExchange, local
from gradscope.core.tiny_gradient import tiny_scale_after
from gradscope.core.user_warnings import warn_user
from gradscope.core.warnings import EarlyWarnings
from gradscope.core.warnings.observations import step_observations
from gradscope.core.warnings.op_reader import COMPILED, OpReader, op_observations
from gradscope.core.watch.binding import Binding, bind
from gradscope.core.watch.distributed import UnreducedCheck, fact_device
from gradscope.core.watch.episodes import Episodes
from gradscope.core.watch.figures import accumulation_dtype, squares_of
from gradscope.core.watch.host import to_host
from gradscope.core.watch.norms import settle_norms
from gradscope.core.watch.outputs import OutputReads
from gradscope.core.watch.per_layer import per_layer_figures
from gradscope.core.watch.plain_step import plain_figures, plan_for
from gradscope.core.watch.reads import (
    Figures,
    ReadSetup,
    Transfer,
    launch,
    place,
    without_grad,
)
from gradscope.core.watch.sinks import Sinks
from gradscope.core.watch.statistic_set import StatisticSet
from gradscope.core.watch.statistics import Statistic
from gradscope.core.watch.statistics.output_log_partition import OutputLogPartition
from gradscope.core.watch.statistics.output_max_abs import OutputMaxAbs
from gradscope.core.watch.statistics.output_rms import OutputRMS
from gradscope.core.watch.status import StatusTracker, all_ok_status
from gradscope.core.watch.update_ratio import UpdateRatio
from gradscope.core.watch.verdict import judge_step
from gradscope.core.wrappers import named_layers, unwrap_model


class GradientWatch:
    """Collect per-layer gradient statistics after each backward pass, and say where each
    NaN/Inf came from.

    ``layers``: None (every module owning parameters, frozen ones included: their status is
    ``frozen`` until they are unfrozen), or module names / glob patterns. A selected module
    that owns no parameters of its own is watched over its whole subtree's parameters.
    Thresholds classify each layer as ok, vanishing (norm below ``vanish_threshold`` for
    ``vanish_steps`` consecutive measured steps, 3 by default), exploding (above
    ``explode_threshold``) or nonfinite; a layer whose parameters got no gradient this step
    is ``no gradient``, one whose parameters are all frozen ``frozen``.
    Statistics: each layer's gradient L2 norm (and each parameter's), the loss, the total
    norm, NaN/Inf detection and the status at every step; max |g|, the weight norm and the
    update ratio every ``detail_every``-th step (default 10; 1 for every step), and always
    on a step that goes non-finite or changes a layer's status. Steps without detail hold
    None there (never NaN, which means non-finite).
    ``update_ratio=True`` also measures ||Δw||/||w|| of each (detail) optimizer step; pass
    ``optimizer`` (or a list of them) so that happens by itself (otherwise call
    :meth:`measure_update` after ``optimizer.step()``); it costs a copy of the watched
    weights and one more transfer.

    ``model`` may be wrapped (DistributedDataParallel, DataParallel, ``torch.compile``):
    layer names are those of the model inside, and the diagnosis re-run calls that model
    directly (no collective, no recompilation). A compiled model's calls are captured outside
    its compiled region, in every order of watch and compile (:mod:`gradscope.core.replay`).

    NaN/Inf: the first step of each NaN/Inf episode (a non-finite step after a finite one)
    gets ``stats.origin``. The step is re-run with instruments (module, op, line): through
    ``locate`` when given to :meth:`collect`, else by repeating the step the watch captured
    (``replay=True``, :mod:`gradscope.core.replay`; the gradient kept at the model's output
    is bounded by ``max_gradient_bytes``); at most ``max_located`` episodes are re-run per
    watch, each for at most ``locate_timeout`` seconds. The re-run never raises into the training
    loop and never runs a collective (see :mod:`gradscope.core.safe_locate`).

    ``scaler``: the ``torch.amp.GradScaler`` of a mixed-precision loop. Statistics are then
    of the true, unscaled gradients whether or not ``scaler.unscale_`` ran before
    :meth:`collect` (the reduced figures are divided by the scale: no extra pass), a step
    whose scaled gradients overflowed is ``stats.skipped`` (not a failure, no origin), and
    ``stats.loss_scale`` is the scale. A non-finite loss is still a failure (the scaler would
    skip it forever), and so is a scale that halves below ``scale_collapse_below`` (1.0).

    Under torch.distributed (DDP, FSDP2) every rank gets the whole model's statistics: DDP
    gradients are already all-reduced; FSDP2's sharded ones are reduced from each rank's
    shard with one ``all_gather`` of a small vector per step (never a gather of tensors). The
    same gather brings ``stats.ranks``: each rank's loss and whether its batch or loss went
    non-finite. Every rank must call :meth:`collect` at every step, as it calls
    ``backward``. A watch made on one rank only (``if rank == 0``) is noticed when it is made
    (through the process group's store, within 30 s) and then runs no collective; pass
    ``collectives=False`` to say so at once (no per-rank facts, and sharded statistics of
    this rank's shards only), or ``collectives=True`` to skip the check.

    ``statistics``: figures of your own (:class:`gradscope.Statistic` instances), measured
    beside the built-in ones on their own schedules and found in ``StepStats.figures[name]``
    on the steps they are due (absent on the others); ``statistic_infos`` lists every
    statistic the watch measures. One that raises or returns anything but one value is
    turned off with one warning.

    ``early_warnings=True``: warn before a NaN/Inf (``stats.warnings``, the warnings new at
    the step; all of them in ``watch.early_warnings.warnings``): a layer's output max |x|
    (measured at every step of the first 100, then every ``detail_every``: see
    ``gradscope.core.warnings.schedule``) or max |g| that spikes above its own history, drifts
    upwards (with the steps left to its dtype's overflow at that rate), or sits close to its
    dtype's overflow or smallest normal; a loss that spikes.

    ``record="runs/x.gsrec"`` adds a recording sink (``settings``: a JSON-able dict stored
    with it; ``overwrite=True`` replaces an existing recording, otherwise a new numbered name
    is chosen); ``sinks`` are further objects with ``on_step(watch, stats)`` and ``close()``.
    """

    def __init__(
        self,
        model: nn.Module,
        layers: str | Iterable[str] | None = None,
        *,
        explode_threshold: float = 1000.0,
        vanish_threshold: float = 1e-7,
        vanish_steps: int = 3,
        update_ratio: bool = False,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        locate_timeout: float = 120.0,
        max_located: int = 20,
        scaler: Any = None,
        scale_collapse_below: float = 1.0,
        collectives: bool | None = None,
        detail_every: int = 10,
        record: str | os.PathLike[str] | None = None,
        settings: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        commit_seconds: float = 1.0,
        sinks: Sequence[Any] = (),
        replay: bool = True,
        max_gradient_bytes: int = DEFAULT_GRADIENT_BYTES,
        statistics: Sequence[Statistic] = (),
        early_warnings: bool = False,
    ) -> None:
        self.wrapped_model = model
        model = unwrap_model(model)
        self.model = model
        self.explode_threshold = float(explode_threshold)
        self.vanish_threshold = float(vanish_threshold)
        self.update_ratio_enabled = update_ratio
        self.scaler = scaler
        self.scale_collapse_below = float(scale_collapse_below)
        if int(detail_every) < 1:
            raise GradScopeError(f"detail_every must be >= 1, not {detail_every}")
        self.detail_every = int(detail_every)
        if int(vanish_steps) < 1:
            raise GradScopeError(f"vanish_steps must be >= 1, not {vanish_steps}")
        self.vanish_steps = int(vanish_steps)
        self.statuses = StatusTracker(self.vanish_steps)
        if isinstance(statistics, Statistic):
            statistics = [statistics]
        statistics = list(statistics)
        # Early warnings (#37): the loss, the layers' output max |x| (a forward statistic on
        # its schedule) and max |g|, each against its own history and its dtype's limits.
        self.early_warnings = EarlyWarnings() if early_warnings else None
        self._output_max_abs = OutputMaxAbs()
        self._output_rms = OutputRMS()
        self._log_partition = OutputLogPartition()
        self._warned_modules: dict[str, nn.Module] | None = None
        # Attention logits and exp inputs, read from the ops on the same due steps.
        self._op_reader = OpReader() if early_warnings else None
        self._op_figures: list = []
        if early_warnings:
            statistics += [self._output_max_abs, self._output_rms, self._log_partition]
        self.statistics = StatisticSet(statistics)
        # The statistics this step reads (set by launch, for the step's placing).
        self._reads: tuple[Statistic, ...] = ()
        self._output_reads: tuple[Statistic, ...] = ()
        self.outputs = OutputReads(self.statistics)
        if isinstance(layers, str):
            layers = [layers]
        self._layers_spec = None if layers is None else list(layers)
        # torch.distributed: statistics of sharded parameters and the per-rank facts travel
        # in one all_gather per step (see gradscope.core.sharded); none without it.
        if collectives is False:
            self.exchange = None
        else:
            self.exchange = RankExchange.current(verify=collectives is None)
        # FSDP1 under no_sync(): each rank holds its own whole, unreduced gradients; then
        # nothing of theirs is summed over the ranks.
        self.check_unreduced = UnreducedCheck()
        self.unreduced = False
        self.rebind()
        if layers is not None and self.layers and not any(p.requires_grad for p in self._params):
            warn_user(
                f"gradscope.watch: layers={list(layers)!r} match only frozen layers "
                "(requires_grad=False); they show as frozen until they are unfrozen"
            )
        self._step = 0
        self._collected = 0  # steps collected by this watch (its step numbering may be set)
        self.update = UpdateRatio(self.exchange, self.fact_device)
        self.read_setup = ReadSetup(self.statistics, self.update, self.exchange)
        self.last: StepStats | None = None
        self.episodes = Episodes(int(max_located), float(locate_timeout))
        # What repeating a step without locate= needs, captured at each training forward.
        self.replay = make_replay(
            self.wrapped_model, enabled=replay, max_gradient_bytes=max_gradient_bytes
        )
        self._handles: list[Any] = []
        # The optimizers that write the weights: an "update" origin names them, and with
        # update_ratio their steps are measured. A runner that replaces its optimizer
        # updates this list.
        if optimizer is None:
            self.optimizers: list[torch.optim.Optimizer] = []
        elif isinstance(optimizer, (list, tuple)):
            self.optimizers = list(optimizer)
        else:
            self.optimizers = [optimizer]
        if update_ratio:
            for each in self.optimizers:
                self._handles.append(each.register_step_post_hook(lambda *_: self.measure_update()))
        self.sinks = Sinks(sinks)
        self.recording: Any = None
        if record is not None:
            from gradscope.core.recording.sink import RecordingSink

            try:
                sink = RecordingSink(
                    self,
                    record,
                    settings,
                    overwrite=overwrite,
                    commit_seconds=commit_seconds,
                )
            except BaseException:
                self.close()
                raise
            self.recording = sink.writer
            self.sinks.add(sink)
        elif settings is not None:
            raise GradScopeError("settings= is stored in a recording; pass record= too")
        self._arm_outputs()

    # -- what is watched -------------------------------------------------------------------
    def rebind(self) -> None:
        """Find the watched layers and their parameters again (see binding)."""
        self.binding: Binding = bind(
            self.model, self._layers_spec, exchanged=self.exchange is not None
        )
        self.layers: list[LayerInfo] = self.binding.layers
        self.param_names: list[str] = self.binding.param_names
        self._params = self.binding.params
        # Weight figures of parameters without a gradient are not read again each step
        # (a frozen backbone's weights do not change): the last ones read stand for them.
        self.weight_norm = self._read_weight_norms()
        # The detail figures a parameter keeps between steps, by statistic (the weights').
        self.kept_figures: dict[str, np.ndarray] = {"weight_norm": self.weight_norm}

    @torch.no_grad()
    def _read_weight_norms(self) -> np.ndarray:
        norms = np.zeros(len(self._params))
        for group in self.binding.groups:
            if group.params[0].device.type == "meta":  # no values yet (deferred init)
                continue
            if group.sharded:
                squares = squares_of([local(p) for p in group.params])
                if self.exchange is not None:
                    squares = self.exchange.all_reduce_sum(squares)
                norms[group.index_array] = to_host((squares / group.replicas).sqrt())
                continue
            values = torch._foreach_norm(group.params, 2, dtype=accumulation_dtype(group.params[0]))
            norms[group.index_array] = to_host(torch.stack(values).double())
        return norms

    def set_vanish_steps(self, steps: int) -> None:
        """From the next step on, vanishing needs ``steps`` consecutive measured steps under
        the threshold (the counts so far stand)."""
        if int(steps) < 1:
            raise GradScopeError(f"vanish_steps must be >= 1, not {steps}")
        self.vanish_steps = self.statuses.vanish_steps = int(steps)

    @property
    def step(self) -> int:
        """Index the next collected step will get."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        # A runner that replaces or rewinds its watch keeps the step numbering going; a
        # rewound run (a step before the next one) starts a new timeline, so a NaN after it
        # is a new episode. A callback that numbers each step as its library does sets the
        # number the watch expects, or a later one (a skipped step): the same timeline, so
        # the episode (and a vanishing layer's count) goes on.
        value = int(value)
        rewound = value < self._step
        self._step = value
        if rewound:
            self.episodes.in_episode = False
            self.statuses.forget()
        self._arm_outputs()

    @property
    def statistic_infos(self) -> list[StatisticInfo]:
        """Every statistic this watch measures (the built-in ones, then the user's), by
        name, with its label, combine and schedule (``every`` resolved against
        ``detail_every``); one turned off after failing is no longer listed."""
        return self.statistics.infos(self.detail_every, self)

    @property
    def on_every_rank(self) -> bool:
        """Under torch.distributed, whether every rank made this watch (and so it exchanges
        figures and facts with them)."""
        return self.exchange is not None

    @property
    def origins(self) -> list[Origin]:
        """The origins of the first NaN/Inf episodes (the first 200; later ones are counted
        in ``episodes.origins_dropped``)."""
        return self.episodes.origins

    @property
    def first_origin(self) -> Origin | None:
        """The origin of the first NaN/Inf episode, or None."""
        return self.origins[0] if self.origins else None

    @property
    def path(self) -> Path | None:
        """The recording's path, when the watch records."""
        return self.recording.path if self.recording is not None else None

    def fact_device(self) -> torch.device:
        return fact_device(self.exchange)

    # -- collection ------------------------------------------------------------------------
    def _arm_outputs(self) -> None:
        """Hook the watched modules' forward for the next step when a forward statistic is
        due then; otherwise no hook at all. Hooks already armed for the same statistics
        stay, with what they measured (a callback sets the step number between the forward
        and the collect)."""
        if self.statistics.has_outputs or self.outputs.armed:
            due = self.statistics.output_reads(self._step, self.detail_every)
            if not (self.outputs.armed and due == self.outputs.due):
                self.outputs.arm(self.model, self.wrapped_model, self.layers, due)
            if self._op_reader is not None and self._output_max_abs in due:
                if self.outputs.skipped is None:
                    self._op_reader.arm(self.model, self.wrapped_model)
                elif self._op_reader.skipped is None:
                    self._op_reader.skip(COMPILED)

    def launch(self, loss: Any = None, *, batch: Any = None) -> list[Transfer]:
        """Queue every statistic's computation and the device-to-host copies; no host
        synchronisation happens here (see gradscope.core.watch.reads)."""
        self._reads = self.statistics.parameter_reads(self._step, self.detail_every)
        outputs = None
        self._output_reads = self.outputs.due if self.outputs.armed else ()
        self._op_figures = []
        if self._output_reads:
            outputs = self.outputs.take()
            if self._op_reader is not None:
                self._op_figures = self._op_reader.take()
            if not outputs:  # no forward ran with the hooks (armed after it): not measured
                self._output_reads = ()
        if self.binding.parameters_replaced(self.model):
            self.rebind()
        binding = self.binding
        # FSDP1 units only: flat groups are sharded
        self.unreduced = binding.sharded and without_grad(
            self.check_unreduced, [*binding.groups, *binding.unwatched_groups], self.exchange
        )
        return launch(
            binding,
            self.read_setup,
            loss,
            batch,
            reads=self._reads,
            facts=True,
            unreduced=self.unreduced,
            scaler=self.scaler,
            update_ratio=self.update_ratio_enabled,
            outputs=outputs,
        )

    def collect(
        self,
        loss: Any = None,
        *,
        locate: Callable[[], Any] | None = None,
        batch: Any = None,
    ) -> StepStats:
        """This step's statistics. Call after ``loss.backward()`` and before
        ``optimizer.step()`` (and before any in-place clipping, to see the raw gradients).

        ``loss``: the loss tensor, or the model output carrying it (``output.loss``); it is
        recorded without a second synchronisation. ``locate``: a function that rebuilds this
        step's loss from the same batch (``lambda: criterion(model(x), y)``, with the same
        autocast and micro-batch); when this step starts a NaN/Inf episode it is re-run with
        instruments and ``stats.origin`` says the module, operation and line. It is never
        called on finite steps. ``batch``: the step's batch, checked for NaN/Inf data.
        """
        return self.resolve(self.launch(loss, batch=batch), locate=locate, batch=batch)

    def resolve(
        self,
        transfers: list[Transfer],
        *,
        locate: Callable[[], Any] | None = None,
        batch: Any = None,
    ) -> StepStats:
        """Wait for the copies queued by :meth:`launch` (the step's one synchronisation),
        turn them into per-layer numpy statistics, find the origin of a new NaN/Inf episode
        and hand the step to the sinks."""
        stats = without_grad(self._figures_to_stats, transfers, batch)
        # The origin's re-run needs autograd; the sinks only store.
        if stats.nonfinite or self.episodes.in_episode:  # an episode begins, goes on or ends
            self._follow(stats, locate, batch)
        if self.replay is not None:  # the next forward is a new step
            self.replay.step_collected()
        self._arm_outputs()
        if self.early_warnings is not None and not stats.nonfinite:
            if self._warned_modules is None:
                self._warned_modules = named_layers(self.model)
            observed = step_observations(
                stats,
                self.layers,
                self._warned_modules,
                self._output_max_abs,
                self._log_partition,
            )
            observed += op_observations(self._op_figures)
            self._op_figures = []
            stats.warnings = self.early_warnings.observe(stats.step, observed)
        self.sinks.on_step(self, stats)
        return stats

    def _follow(self, stats: StepStats, locate: Any, batch: Any) -> None:
        self.episodes.follow(
            stats,
            model=self.wrapped_model,
            layers=self.layers,
            locate=locate,
            batch=batch,
            sharded=self.binding.sharded,
            rank=None if self.exchange is None else self.exchange.rank,
            optimizers=self.optimizers,
            first_collected=self._collected == 1,
            replay=self.replay,
        )

    def _figures_to_stats(self, transfers: list[Transfer], batch: Any) -> StepStats:
        """The step's statistics from its transfers (and a second read when it needs the
        detail). The common step (nothing but the norms and the built-in detail due, every
        figure finite, every layer ok now and at the step before) is read in Python floats
        (:meth:`_plain_stats`): each numpy call costs 10-30 µs with the caches cold after a
        backward."""
        if not (self._output_reads or self.statistics.failures):
            if len(transfers) == 1:
                stats = self._plain_stats(transfers[0])
                if stats is not None:
                    return stats
        binding = self.binding
        figures = place(binding, self.kept_figures, self.update, transfers)
        norms = settle_norms(
            figures,
            binding,
            exchange=self.exchange,
            unreduced=self.unreduced,
            scaler=self.scaler,
            optimizers=self.optimizers,
        )
        verdict = judge_step(
            figures,
            norms,
            binding,
            self.statuses,
            explode_threshold=self.explode_threshold,
            vanish_threshold=self.vanish_threshold,
            scale_collapse_below=self.scale_collapse_below,
            batch=batch,
        )
        status = verdict.status
        statuses = status.tobytes()
        changed = self.statuses.changed(statuses)
        # Not under sharding: reading a sharded scale would be a collective of its own.
        tiny_reasons = self._tiny_reasons(status) if changed and not binding.sharded else None
        reads = self._reads
        more = self.statistics.trouble_reads(reads)
        if more and (verdict.trouble or changed or verdict.nonfinite):
            # A step that goes wrong or changes status always gets the detail: read it now.
            self._read_detail_again(figures, more)
            reads = reads + more
        self.statuses.keep(statuses)
        per_layer, absent = (
            per_layer_figures(
                binding,
                figures,
                reads,
                self._output_reads,
                divisor=norms.divisor,
                kept=self.kept_figures,
                failed=self.statistics.settle(),
                layer_count=len(self.layers),
                absent=self.statistics.take_absent(len(binding.params)),
            )
            if reads or self._output_reads or self.statistics.failures
            else ({}, {})
        )
        stats = StepStats(
            step=self._step,
            loss=figures.loss,
            total_grad_norm=math.sqrt(norms.watched_sq + norms.unwatched_sq),
            grad_norm=verdict.grad_norm,
            max_abs=per_layer.pop("max_abs", None),
            weight_norm=per_layer.pop("weight_norm", None),
            nan_count=verdict.nan_count,
            inf_count=verdict.inf_count,
            status=status,
            param_grad_norm=norms.param_norm,
            loss_nonfinite=verdict.loss_nonfinite,
            unwatched_nonfinite=verdict.unwatched_nonfinite,
            loss_scale=figures.scale,
            skipped=verdict.skipped,
            scale_collapsed=verdict.collapsed,
            ranks=figures.ranks,
            tiny_reasons=tiny_reasons,
            wall_time=time.time(),
            figures=per_layer,
            absent=absent,
            known_nonfinite=(
                verdict.nonfinite
                or verdict.loss_nonfinite
                or verdict.unwatched_nonfinite
                or verdict.collapsed
            ),
        )
        self._step += 1
        self._collected += 1
        self.last = stats
        return stats

    def _plain_stats(self, transfer: Transfer) -> StepStats | None:
        """The common step's statistics (every figure finite, every layer ok now and at the
        step before, nothing but the norms and the built-in detail due) in Python floats:
        the same figures as the general path, bit for bit, at a fraction of its cost
        (gradscope.core.watch.plain_step). None for any other step, which the general path
        then takes."""
        statuses = self.statuses
        if statuses.counting:
            return None
        plan = plan_for(self.binding, transfer.entries, all_ok_status(len(self.layers)))
        if plan is None or statuses.previous != plan.ok:
            return None
        found = plain_figures(
            plan,
            transfer.copy.wait().tolist(),
            explode_threshold=self.explode_threshold,
            vanish_threshold=self.vanish_threshold,
        )
        if found is None:
            return None
        if found.weight_norm is not None:  # a parameter keeps its weights' last figure
            self.kept_figures["weight_norm"][:] = found.weight_norm
        layers = len(found.grad_norm)
        # Each array by its own call: cheaper with the caches cold than one conversion and
        # views, or than unpacking a (2, layers) array (measured after a backward).
        stats = StepStats(
            step=self._step,
            loss=found.loss,
            total_grad_norm=math.sqrt(found.watched_sq),
            grad_norm=np.array(found.grad_norm),
            max_abs=None if found.layer_max_abs is None else np.array(found.layer_max_abs),
            weight_norm=(
                None if found.layer_weight_norm is None else np.array(found.layer_weight_norm)
            ),
            nan_count=np.zeros(layers, dtype=np.int64),
            inf_count=np.zeros(layers, dtype=np.int64),
            status=plan.ok_status.copy(),
            param_grad_norm=np.array(found.param_norm),
            wall_time=time.time(),
            known_nonfinite=False,
        )
        self._step += 1
        self._collected += 1
        self.last = stats
        return stats

    def _read_detail_again(self, figures: Figures, more: tuple[Statistic, ...]) -> None:
        """The statistics of ``more`` read now, at a step that was not due them, into
        ``figures``. Sharded groups too (one more collective), when every rank takes this
        decision from the same reduced figures; with mixed sharding they had it already."""
        binding = self.binding
        again = place(
            binding,
            self.kept_figures,
            self.update,
            launch(
                binding,
                self.read_setup,
                None,
                None,
                reads=more,
                facts=False,
                unreduced=self.unreduced,
                update_ratio=self.update_ratio_enabled,
                sharded=not (binding.mixed_sharding or self.unreduced),
            ),
        )
        read = again.with_grad()
        per_param = figures.per_param
        for name, values in again.per_param.items():
            before = per_param.get(name)
            per_param[name] = np.where(read, values, 0.0 if before is None else before)

    def _tiny_reasons(self, status: np.ndarray) -> dict[str, str] | None:
        """Why the layers that turn vanishing at this step (a status change: rare) have a
        tiny gradient, where the weights show it: a zero or tiny scale after the layer in its
        block (gradscope.core.tiny_gradient)."""
        onset = status == STATUS_VANISHING
        if self.statuses.previous is not None:
            before = np.frombuffer(self.statuses.previous, dtype=np.uint8)
            if len(before) == len(status):
                onset &= before != STATUS_VANISHING
        if not onset.any():
            return None
        reasons = {}
        for index in np.flatnonzero(onset).tolist():
            name = self.layers[index].name
            found = tiny_scale_after(self.model, name)
            if found is not None:
                reasons[name] = found.describe()
        return reasons or None

    def measure_update(self) -> np.ndarray | None:
        """After ``optimizer.step()``: ||Δw||/||w|| per layer for the last collected step.
        Under sharding (FSDP) the sums of this rank's parts are reduced with the next
        step's exchange instead, so it returns None and ``update_ratio`` of that step's
        stats is filled in by the next :meth:`collect` (before the sinks see that step)."""
        return self.update.measure(self.binding, self.last)

    # -- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Flush and close the sinks (a recording's last steps; every sink, even when one
        raises) and remove every hook this watch added (the statistics themselves need
        none)."""
        try:
            self.sinks.close()
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles.clear()
            self.outputs.disarm()
            if self._op_reader is not None:
                self._op_reader.disarm()
            if self.replay is not None:
                self.replay.close()

    def __enter__(self) -> GradientWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
