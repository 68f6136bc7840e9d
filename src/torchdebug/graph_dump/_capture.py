"""Records from compiled graphs: one :class:`GraphCapture` per backend with ``enable_dump``.

Instrumented graphs call back (:mod:`torchdebug.graph_dump._runtime`) once per run with their statistics
and tensors; the dump's scene picks what becomes a record, and this module counts steps and call
indices across the graphs of a step, names the block instance that ran (``_instances.py``) and builds
the records eager capture writes (``capture="graph"``, ``node`` = FX node name) through a
:class:`CaptureSession`, in one run folder per backend. When a step begins, per-block compile, dynamic
shapes and the layout: docs/graph_dump.md ("Records and names", "Per-block compile", "Dynamic shapes").
"""

from __future__ import annotations

import atexit
import functools
import logging
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchdebug._torch import symbolic
from torchdebug._torch.autograd import current_autograd_node
from torchdebug._torch.nn import module_hooks
from torchdebug.capture.recompute import RECOMPUTE
from torchdebug.capture.session import CaptureSession, SessionOptions
from torchdebug.dist import rank_and_world_size
from torchdebug.graph_dump import _golden as golden
from torchdebug.graph_dump._handover import Arrived, Handover, RunValues
from torchdebug.graph_dump._instances import NO_INSTANCE, CompiledInstances, Instance, in_instance
from torchdebug.graph_dump._plan import ACCUMULATORS, CallPlan, GraphPlan, Key, Rows, SlotPlan, StatTable, resolve
from torchdebug.graph_dump._run import GraphRun
from torchdebug.graph_dump._runtime import register_sink, unregister_sink
from torchdebug.graph_dump._settings import DumpSettings
from torchdebug.graph_dump._step_clock import StepClock
from torchdebug.graph_dump._value_ids import SlotValue
from torchdebug.records import UNREAD, Record, make_call_name
from torchdebug.stats import IDENTITY, stats_from_sums
from torchdebug.store import RankWriter, TemplateColumns, join_run, rank_dir_name, run_manifest

log = logging.getLogger("torchdebug.graph_dump._capture")

_KEPT_SIZES = 8
"""Sets of symbolic-size values per graph whose evaluated sizes and built record fields are kept."""


@dataclass
class _Template:
    """Per call of a plan, per slot: the record fields that do not change from step to step (see
    :meth:`GraphCapture._template_of`); and, once a run wrote every call, their records as columns
    with the slots whose value ids each run gives, in record order."""

    fields: list[list[tuple[SlotPlan, dict[str, Any]]]]
    columns: TemplateColumns | None = None
    held: list[SlotValue] = dc_field(default_factory=list)


_ForwardRun = tuple[Instance, dict[Key, int], RunValues | None]
"""A forward run a backward run may belong to: its instance, call index bases and values
(``None`` where no forward run is known)."""


class GraphCapture:
    """Receives the runs of instrumented graphs and writes their records.

    ``settings``: the dump (its scene says which records a run makes; ``step``: the steps written,
    ``None``: all). ``model``: the root model, in which the module instance running each graph is
    named (``None``: in the outermost compiled module whose call is running).
    """

    def __init__(self, settings: DumpSettings, model: torch.nn.Module | None = None) -> None:
        self.rank, self.world_size = rank_and_world_size()
        self.run_dir = join_run(Path(settings.dump_path), self.rank, self.world_size)  # one run folder for every rank
        config = {"task": settings.task, "dump_config": settings.to_dict()}
        manifest = run_manifest(self.run_dir.name, self.rank, self.world_size, config, capture="graph")
        writer = RankWriter(self.run_dir / rank_dir_name(self.world_size, self.rank), manifest)
        self.session = CaptureSession(SessionOptions(task=settings.task), writer, self.rank)
        self.save_tensors = settings.task == "tensor"
        self.steps = settings.step
        self.scene = settings.scene
        self.step = 0
        self._clock = StepClock()
        self._counts: dict[Key, int] = {}
        self._instances = CompiledInstances(model)
        self._running: dict[str, Instance] = {}
        """Per Dynamo graph (``plan.model``): the instance its next runs belong to."""
        self._entered: dict[str, weakref.ref[torch.Tensor]] = {}
        """Per Dynamo graph: the parameter its last run was handed first."""
        self._awaiting_backward: dict[str, list[_ForwardRun]] = {}
        """Per Dynamo graph: its forward runs whose backward has not run yet."""
        self._last_backward: dict[str, _ForwardRun] = {}
        self._forward_bases: dict[tuple[int, str], dict[Key, int]] = {}
        """Per plan (``id``) and instance: ``bases`` of its latest forward run in the step, which a
        recomputation of that run in the backward repeats (its ``fwd`` names)."""
        self._next_value = 0
        """The value id the next graph run's first local value takes (ids are never reused)."""
        self._handover = Handover()
        self._arrived: dict[int, tuple[int, Arrived]] = {}
        """Per plan (``id``): what arrived at the inputs of the run about to start, and the step it
        was looked up in."""
        self._ended: dict[int, tuple[RunValues, Arrived]] = {}
        """Per plan (``id``): its run that just ended, until what it read and returned is held."""
        self._handover_failed = False
        """A fault stopped the hand-over (``_handover_lost``)."""
        self._keys: dict[tuple[int, str, bool], dict[Key, Key]] = {}
        self._hooks_compiled: dict[int, tuple[str, tuple]] = {}
        """Per graph, the instance it first ran for (the one Dynamo compiled it for) and its modules' hooks."""
        self._hooks_checked: set[tuple[int, int]] = set()
        """The graphs and instances whose hooks :meth:`_check_hooks` compared."""
        self._seq = 0
        self._run: GraphRun | None = None
        self._templates: dict[int, dict[tuple[Any, ...], _Template]] = {}
        """Per plan: the record fields of its last few runs' signatures (see :meth:`_template_of`)."""
        self._evaluations: dict[int, dict[tuple[int, ...], list[Any]]] = {}
        """Per plan: its symbolic expressions evaluated, per set of symbol values."""
        self._sinks: list[int] = []
        self._closed = False
        atexit.register(self.close)

    # -- compile time ----------------------------------------------------------------------------
    def add_graph(self, plan: GraphPlan) -> int:
        """Register an instrumented graph; returns the sink key its dump ops carry."""
        key = register_sink(_GraphSink(self, plan), f"graph_capture/{plan.model}/{plan.phase}")
        self._sinks.append(key)
        self._instances.changed()
        return key

    def enter(self, model: str, parameter: torch.Tensor | None) -> None:
        """Dynamo graph ``model`` is about to run, handed ``parameter`` (its first parameter input;
        ``None`` when it reads none): the runs of its graphs belong to that parameter's module."""
        self._running[model] = self._instances.of(parameter)
        if parameter is not None:
            self._entered[model] = weakref.ref(parameter)

    # -- run time --------------------------------------------------------------------------------
    def before_run(self, plan: GraphPlan, args: list[Any]) -> None:
        """A run of ``plan``'s graph is about to get ``args`` (what the backend's wrapper calls)."""
        if plan.inputs and not self._handover_failed:
            try:
                self._arrived[id(plan)] = (self.step, self._handover.received(plan.inputs, args))
            except Exception as error:  # never into the user's run: its inputs are new values then
                self._handover_lost(error)

    def after_run(self, plan: GraphPlan, outputs: Any) -> None:
        """A run of ``plan``'s graph returned ``outputs``: later graphs of the step reading one of
        them, or one of the tensors it read, hold its value (what the backend's wrapper calls)."""
        ended = self._ended.pop(id(plan), None)
        if ended is None or self._handover_failed:
            return
        values, (_, read) = ended
        returned = outputs if isinstance(outputs, (list, tuple)) else ()
        tensors = [(returned[position], local) for position, local in plan.outputs if position < len(returned)]
        tensors += [(ref(), value) for local, ref, value in read if local not in values.received]
        try:
            self._handover.hold(tensors, values)
        except Exception as error:  # never into the user's run
            self._handover_lost(error)

    def _handover_lost(self, error: Exception) -> None:
        """A fault in following values from graph to graph: said once; from then on each graph
        input is a new value, as in a dump written before the hand-over."""
        self._handover_failed = True
        self._handover.clear()
        log.warning("torchdebug: graph dump stopped following values from graph to graph (%s: %s)", type(error).__name__, error)

    def _begin(self, plan: GraphPlan) -> GraphRun:
        run = self._run
        if run is not None and run.plan is plan:
            return run
        forward_bases: dict[Key, int] = {}
        forward_values: RunValues | None = None
        recomputed = False
        if plan.phase == "backward":
            self._clock.backward_ran()
            instance, forward_bases, forward_values = self._forward_of(plan.model)
        else:
            instance = self._instances.running(plan.code) or self._running.get(plan.model, NO_INSTANCE)
            self._check_hooks(plan, instance)
            in_backward = current_autograd_node() is not None
            # a recompile of the same code ends the step as its first graph would
            code = (plan.frame or plan.model, instance.key)
            if not in_backward and self._clock.begins(code, functools.partial(self._parameters_of, plan.model, instance)):
                self._next_step()
            # a forward graph that ran in the step, run again by the autograd engine: activation
            # checkpointing around a compiled region, as eager capture's phase "recompute" records it
            # (not a graph that first runs in the backward: a compiled optimizer step in a gradient hook)
            if in_backward and plan.phase == "forward" and (id(plan), instance.path) in self._forward_bases:
                recomputed, forward_bases = True, self._forward_bases[id(plan), instance.path]
        keys = self._keys_of(plan, instance, recomputed)
        counts = self._counts
        bases = {key: counts.get(keys[key], 0) for key in plan.counts}
        for key, n in plan.counts.items():
            counts[keys[key]] = bases[key] + n
        step, arrived = self._arrived.pop(id(plan), (self.step, _NOTHING_ARRIVED))
        received = arrived[0] if step == self.step else {}  # else the last step's values: this run began a step
        values = RunValues(self._next_value, received, forward_values)
        self._next_value += plan.values
        if recomputed:
            self._recomputed(plan.model, instance, forward_bases, values)
        elif plan.phase == "forward":
            self._awaiting_backward.setdefault(plan.model, []).append((instance, bases, values))
            self._forward_bases[id(plan), instance.path] = bases
        dumped = self.steps is None or self.step in self.steps
        self._run = GraphRun(
            plan, self.step, dumped, bases, self._seq, instance, keys, forward_bases, values, arrived, recomputed
        )
        self._seq += plan.n_ops
        return self._run

    def _parameters_of(self, model: str, instance: Instance) -> list[torch.Tensor]:
        """The parameters of the module ``instance`` that need a gradient; where it was not found,
        the one the Dynamo graph ``model`` was last handed first."""
        module = self._instances.module(instance)
        if module is not None:
            return [parameter for parameter in module.parameters() if parameter.requires_grad]
        entered = self._entered.get(model)
        parameter = entered() if entered is not None else None
        return [parameter] if parameter is not None else []

    def _check_hooks(self, plan: GraphPlan, instance: Instance) -> None:
        """Warn, once per graph and instance, where an instance runs a graph Dynamo compiled for one
        whose modules hold other hooks: Dynamo does not guard on module hooks by default, so the run
        runs the hooks traced into the graph, not the instance's own (a hook on one block's
        submodule, blocks compiled one by one)."""
        if (id(plan), instance.key) in self._hooks_checked:
            return
        self._hooks_checked.add((id(plan), instance.key))
        module = self._instances.module(instance)
        if module is None:
            return
        hooks = module_hooks(module)
        first_path, first_hooks = self._hooks_compiled.setdefault(id(plan), (instance.path, hooks))
        if hooks != first_hooks:
            log.warning(
                "torchdebug: %s runs the graph Dynamo compiled for %s, but their modules' hooks differ (%s against %s: "
                "path, then how many forward-pre, forward, backward-pre and backward hooks); Dynamo does not guard on "
                "module hooks (torch._dynamo.config.skip_nnmodule_hook_guards), so this run runs the hooks traced "
                "into the graph, not its own: set it to False to compile each set of hooks apart",
                instance.path or "<root>",
                first_path or "<root>",
                list(hooks) or "none",
                list(first_hooks) or "none",
            )

    def _recomputed(self, model: str, instance: Instance, forward_bases: dict[Key, int], values: RunValues) -> None:
        """A recomputation's values stand for those of the forward run it repeats: the backward
        reads what it saved. That run keeps its place among those awaiting their backward (a new
        entry would be taken by the backward of an earlier block of the same graph)."""
        waiting = self._awaiting_backward.setdefault(model, [])
        for index in range(len(waiting) - 1, -1, -1):
            forward_instance, bases, _ = waiting[index]
            if forward_instance.path == instance.path:
                waiting[index] = (forward_instance, bases, values)
                return
        waiting.append((instance, forward_bases, values))

    def _forward_of(self, model: str) -> _ForwardRun:
        """The forward run a backward run of Dynamo graph ``model`` belongs to: the latest one whose
        backward has not run (the same as the last backward's when none is left: a second
        backward through a retained graph)."""
        waiting = self._awaiting_backward.get(model)
        if waiting:
            self._last_backward[model] = waiting.pop()
        return self._last_backward.get(model, (self._running.get(model, NO_INSTANCE), {}, None))

    def _keys_of(self, plan: GraphPlan, instance: Instance, recomputed: bool) -> dict[Key, Key]:
        """The plan's keys named in ``instance`` (see :attr:`GraphRun.keys`), in phase ``recompute``
        for a ``recomputed`` run; a module the graph reached through more than attributes named
        where it sits in the model (``CompiledInstances.resolve``)."""
        path = instance.path
        keys = self._keys.get((id(plan), path, recomputed))
        if keys is None:
            keys = {key: self._in_instance(key, instance) for key in plan.counts}
            if recomputed:
                keys = {key: (RECOMPUTE, module, op) for key, (_, module, op) in keys.items()}
            self._keys[id(plan), path, recomputed] = keys
        return keys

    def _in_instance(self, key: Key, instance: Instance) -> Key:
        phase, module, op = key
        resolved = self._instances.resolve(instance, module)
        return (phase, resolved, op) if resolved is not None else _in(key, instance.path)

    def _next_step(self) -> None:
        self.session.flush()
        self.step += 1
        self.session.step = self.step
        self._counts.clear()
        self._awaiting_backward.clear()
        self._forward_bases.clear()
        self._handover.clear()
        self._seq = 0

    def on_graph(self, plan: GraphPlan, stats: list[torch.Tensor], tensors: list[torch.Tensor], sizes: list[int]) -> None:
        """One run of ``plan``'s graph ended: the scene writes its records (their statistics arrive
        with the session's next flush, at once on the CPU). ``sizes``: the values of the plan's symbols."""
        run = self._begin(plan)
        self._run = None
        if not run.dumped:
            return
        self._ended[id(plan)] = (run.values, run.arrived)
        if plan.sizes.expressions:
            run.sizes = tuple(sizes)
            run.evaluated = self._evaluate(plan, run.sizes)
        self.scene.on_graph(self, run, stats, tensors)

    def _evaluate(self, plan: GraphPlan, sizes: tuple[int, ...]) -> list[Any]:
        """The plan's symbolic expressions with the symbols' values ``sizes`` (kept for a few sets)."""
        kept = self._evaluations.setdefault(id(plan), {})
        evaluated = kept.get(sizes)
        if evaluated is None:
            if len(kept) >= _KEPT_SIZES:
                del kept[next(iter(kept))]
            values = dict(zip(plan.sizes.symbols, sizes))
            evaluated = kept[sizes] = symbolic.evaluate(plan.sizes.expressions, values)
        return evaluated

    def on_point(self, plan: GraphPlan, point: int, tensors: list[torch.Tensor], sizes: list[int]) -> None:
        """Point ``point`` of ``plan``'s graph handed ``tensors`` over (``-1``: the graph's inputs)."""
        run = self._begin(plan)
        if point < 0:  # the graph's inputs, for the interpreter of dump_stage="original"
            if run.dumped:
                run.computed = golden.interpret(plan, tensors, sizes)
            return
        if run.dumped:
            self.scene.on_point(self, run, point, tensors)

    # -- building records (what scenes call) -------------------------------------------------------
    def slot_record(self, run: GraphRun, call: CallPlan, slot: SlotPlan) -> Record:
        """A record of one slot of one call, with no statistics or tensor yet."""
        record = Record(step=run.step, **self._fields(run, call, slot, self.call_name(run, call), None))
        _identify(record, run, slot)
        return record

    def stage_rows(self, run: GraphRun, stats: list[torch.Tensor], done: Callable[[Rows], None] | None) -> Rows:
        """Hand the run's statistics to the session, one vector per table (``plan.tables``: one
        device and dtype each), to be read with the next flush; returns the rows (statistics dicts),
        filled in place when the last table arrives, which then calls ``done``."""
        plan = run.plan
        numel = [resolve(n, run.evaluated) for n in plan.numel] if run.evaluated else plan.numel
        pending = _PendingRows(plan, numel, done)
        start = 0
        for table in plan.tables:
            part = stats[start : start + table.count]
            start += table.count
            vector = torch.cat(part) if table.rows else torch.stack(part)
            self.session.stage(vector, functools.partial(pending.deliver, table))
        if not plan.tables:
            pending.finish()
        return pending.rows

    def write(self, run: GraphRun, calls: Iterable[int], rows: Rows, tensors: list[torch.Tensor]) -> None:
        """Queue the records of ``calls`` (indices into the plan's calls) of one run: statistics from
        ``rows`` (:meth:`stage_rows`), tensors from those the graph handed over. The records of
        every call of a run that saves no tensor are queued as columns, those of its template made
        once (``store/_template_columns.py``)."""
        template = self._template_of(run)
        if calls == range(len(run.plan.calls)) and not self.save_tensors and run.plan.golden is None:
            self._write_columns(run, template, rows)
        else:
            self._write_records(run, template, calls, rows, tensors)

    def _write_records(
        self, run: GraphRun, template: _Template, calls: Iterable[int], rows: Rows, tensors: list[torch.Tensor]
    ) -> None:
        """Queue the records of ``calls`` of ``run``, one record object a slot."""
        refs: dict[int, dict[str, str]] = {}
        stats_of: dict[int, dict[str, Any]] = {}
        records = []
        for index in calls:
            for slot, fields in template.fields[index]:
                record = Record(step=run.step, **fields)
                if slot.held is not None:
                    _identify(record, run, slot)
                if slot.kind == "tensor" and slot.note is None and slot.unread is None:
                    self._fill(record, run, slot, rows, tensors, stats_of, refs)
                records.append(record)
        self.session.add_records(records)

    def _write_columns(self, run: GraphRun, template: _Template, rows: Rows) -> None:
        """Queue the records of every call of ``run`` as columns: the template's made at its first
        run, the statistics and value ids of this one."""
        columns = template.columns
        if columns is None:
            records, stat_rows, held = [], [], []
            for call_fields in template.fields:
                for slot, fields in call_fields:
                    if slot.held is not None:
                        held.append(len(records))
                        template.held.append(slot.held)
                    read = slot.kind == "tensor" and slot.note is None and slot.unread is None and slot.stat is not None
                    stat_rows.append(slot.stat if read else -1)
                    records.append(Record(step=run.step, **fields))
            columns = template.columns = TemplateColumns(records, stat_rows, held)
        absolute = run.values.absolute
        ids = [absolute(held) for held in template.held]
        self.session.add_columns(functools.partial(columns.batch, run.step, rows, ids))

    def call_name(self, run: GraphRun, call: CallPlan) -> str:
        """The call's name in this run (``phase/module/op#call``)."""
        phase, module, op = run.keys[call.key]
        return make_call_name(phase, module, op, run.bases[call.key] + call.local)

    @staticmethod
    def _fwd_name(run: GraphRun, call: CallPlan) -> str | None:
        """The forward call a backward call belongs to, or the one a recomputed call repeats."""
        if run.recomputed:
            key, local = call.key, call.local
        elif call.fwd is None:
            return None
        else:
            key, local = call.fwd
        phase, module, op = _in(key, run.instance.path)
        return make_call_name(phase, module, op, run.forward_bases.get(key, 0) + local)

    def _template_of(self, run: GraphRun) -> _Template:
        """Per call of the plan, per slot: the record fields that do not change from step to step.

        They depend on where the run's call indices and seq numbers start (and, for backward
        graphs, the forward's), which repeat every step of a steady training loop, and on the
        values of its symbolic sizes, so those of the last few signatures of each plan are kept.
        """
        plan = run.plan
        signature = (
            tuple(run.bases.values()),
            run.seq,
            tuple(run.forward_bases.values()),
            run.sizes,
            run.instance.path,
            run.recomputed,
        )
        kept = self._templates.setdefault(id(plan), {})
        template = kept.get(signature)
        if template is not None:
            return template
        fields = []
        for call in plan.calls:
            prefix, fwd = self.call_name(run, call), self._fwd_name(run, call)
            fields.append([(slot, self._fields(run, call, slot, prefix, fwd)) for slot in call.slots])
        if len(kept) >= _KEPT_SIZES:
            del kept[next(iter(kept))]
        template = kept[signature] = _Template(fields)
        return template

    def _fields(self, run: GraphRun, call: CallPlan, slot: SlotPlan, prefix: str, fwd: str | None) -> dict[str, Any]:
        """A slot's record fields but ``step``, statistics and tensor."""
        phase, module, op = run.keys[call.key]
        meta = slot.meta or {}
        shape, stride, value = meta.get("shape"), meta.get("stride"), slot.value
        if run.evaluated:  # symbolic sizes: those of this run
            shape, stride, value = resolve(shape, run.evaluated), resolve(stride, run.evaluated), resolve(value, run.evaluated)
        source = call.source
        if source is not None:
            self.session.add_stack(source.stack_id, list(source.frames))
        extra = {"graph": f"{run.plan.model}/{run.plan.phase}"}
        if call.target is not None:
            extra["target"] = call.target
        if slot.unread is not None:
            extra[UNREAD] = slot.unread
        return dict(
            name=f"{prefix}/{slot.io}.{slot.arg}",
            rank=self.rank,
            phase=phase,
            module=module,
            op=op,
            call=run.bases[call.key] + call.local,
            seq=run.seq + call.order,
            io=slot.io,
            arg=slot.arg,
            kind=slot.kind,
            dtype=meta.get("dtype"),
            shape=shape,
            stride=stride,
            device=meta.get("device"),
            value=value,
            stack=source.stack_id if source else None,
            source=source.source if source else None,
            fwd=fwd,
            node=call.node,
            capture="graph",
            capture_error=slot.note,
            extra=extra,
        )

    def _fill(
        self,
        record: Record,
        run: GraphRun,
        slot: SlotPlan,
        rows: Rows,
        tensors: list[torch.Tensor],
        stats_of: dict[int, dict[str, Any]],
        refs: dict[int, dict[str, str]],
    ) -> None:
        """Statistics (shared by the slots of one value) and the saved tensor of one slot."""
        if run.plan.golden is not None:
            value = run.computed.get(slot.source_node or "")
            if not isinstance(value, torch.Tensor):
                record.capture_error = "the interpreter produced no tensor for this slot"
                return
            key = id(value)
            if key not in stats_of:
                stats_of[key] = self.session.tensor_stats(value)
                if self.save_tensors:
                    refs[key] = self.session.save(record.name, value.detach())
            record.stats = stats_of[key]
            record.tensor = refs.get(key)
            return
        if slot.stat is not None:
            record.stats = rows[slot.stat]
        if slot.tensor is not None and self.save_tensors:
            if slot.tensor not in refs:
                refs[slot.tensor] = self.session.save(record.name, tensors[slot.tensor])
            record.tensor = refs[slot.tensor]

    # -- lifetime ----------------------------------------------------------------------------------
    @property
    def overflows(self) -> list[Any]:
        """What the scene found while the graphs ran: the overflow scene's first call of each step
        that made a NaN/Inf (:class:`~torchdebug.graph_dump.scenes._overflow.Overflow`); empty otherwise."""
        return self.scene.findings

    @property
    def rank_dir(self) -> Path:
        return self.session.writer.rank_dir

    def flush(self) -> None:
        """Write everything captured so far to disk, records and tensor files (waits for the writer
        threads: a tensor file still queued would be written after the call returns)."""
        self.session.flush(wait=True, tensors=True)

    def close(self) -> None:
        """Flush, write the completion marker and stop listening to graphs. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for key in self._sinks:
            unregister_sink(key)
        self._clock.close()
        self.session.flush()
        self.session.writer.close("complete", steps=self.step + 1, **self.session.memory_info())
        atexit.unregister(self.close)


class _PendingRows:
    """The statistics rows of one graph run, filled as its tables reach the host."""

    def __init__(self, plan: GraphPlan, numel: list[Any], done: Callable[[Rows], None] | None) -> None:
        self.plan, self.numel, self.done = plan, numel, done
        self.rows: list[dict[str, Any]] = [{} for _ in plan.integral]
        self._sums = np.empty((len(plan.integral), len(ACCUMULATORS)), object)
        """Per row, its accumulators (``ACCUMULATORS`` order) as they arrive: the numbers as the
        staging reads them (Python ints stay exact), placed a table at a time."""
        self._sums[:] = _NO_SUMS
        self._waiting = len(plan.tables)

    def deliver(self, table: StatTable, values: list[float]) -> None:
        """One table's numbers arrived (the session's staging calls this)."""
        if table.rows:
            width = len(ACCUMULATORS)
            self._sums[list(table.rows)] = np.array(values[: width * len(table.rows)], object).reshape(-1, width)
        if table.entries:
            rows, accumulators = _entry_index(table)
            self._sums[rows, accumulators] = np.array(values[: len(rows)], object)
        self._waiting -= 1
        if self._waiting == 0:
            self.finish()

    def finish(self) -> None:
        """Every table arrived: turn the accumulators into statistics, then call ``done``."""
        plan = self.plan
        for row, (stats, sums) in enumerate(zip(self.rows, self._sums.tolist())):
            numel = self.numel[row]
            if not isinstance(numel, int):  # a size the host cannot evaluate: the graph counted the values
                numel = int(sums[_VALID]) + int(sums[_NAN])
            stats.update(stats_from_sums(sums[:_VALID], numel, plan.integral[row]))
        if self.done is not None:
            self.done(self.rows)


@functools.lru_cache(maxsize=1024)
def _entry_index(table: StatTable) -> tuple[np.ndarray, np.ndarray]:
    """The rows and accumulators of a table's entries, as index arrays (made once a table)."""
    index = np.array(table.entries, np.int64).reshape(-1, 2)
    return index[:, 0], index[:, 1]


def _identify(record: Record, run: GraphRun, slot: SlotPlan) -> None:
    """Set the record's ``value_id``, ``version`` and ``view_of`` from the slot's local ids and the
    run's values (a backward input the forward saved: the forward run's; none where no forward run
    is known)."""
    held = slot.held
    if held is None:
        return
    value = run.values.absolute(held)
    if value is not None:
        record.value_id, record.version, record.view_of = value


def _in(key: Key, path: str) -> Key:
    """A plan's key named in the instance at ``path`` (``instances.in_instance``)."""
    phase, module, op = key
    return (phase, in_instance(path, module), op) if path else key


_NOTHING_ARRIVED: Arrived = ({}, [])

_NO_SUMS = (*IDENTITY, 0)
"""Accumulators before any arrived (an empty value gets none: no values, every count 0)."""
_NAN, _VALID = ACCUMULATORS.index("nan"), ACCUMULATORS.index("valid")


class _GraphSink:
    """Binds one graph's plan to its capture (what :func:`register_sink` keeps)."""

    def __init__(self, capture: GraphCapture, plan: GraphPlan) -> None:
        self.capture, self.plan = capture, plan

    def on_graph(
        self, stats: list[torch.Tensor], tensors: list[torch.Tensor], labels: list[str], *, sizes: list[int] = ()
    ) -> None:
        self.capture.on_graph(self.plan, stats, tensors, sizes)

    def on_point(self, point: int, tensors: list[torch.Tensor], *, sizes: list[int] = ()) -> None:
        self.capture.on_point(self.plan, point, tensors, sizes)
