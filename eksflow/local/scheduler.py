"""Scheduling a run's DAGs as Argo's controller does: dependencies, fan-out, nested DAGs, parallelism, fail fast.

The scheduler runs on one thread and decides everything but how a pod runs (the executor's task threads do that).
Each pass (`advance`) walks the tree of running DAGs from the entrypoint:

- a task whose dependencies are fulfilled is expanded: its `depends` is evaluated (false: Omitted), a fanned-out
  task becomes a TaskGroup node with one node per item, `task(index:item)`, each with its own `when`; a task whose
  template is a DAG becomes a DAG node whose tasks are named `<node>.<task>`;
- a node ready to run starts when the limits allow: spec.parallelism counts running pods, a DAG template's
  parallelism its running children (pods and DAG nodes, each iteration counts);
- a memoized template whose key is in the cache Succeeds at once with the saved outputs;
- with failFast (the default), a failure no `depends` expects stops the DAG from starting anything new;
- a DAG is done when nothing in it runs and nothing more can start; its phase is decided by its leaf tasks as
  Argo decides it (a skipped or omitted leaf takes the outcome of the branch that led to it), and its outputs are
  read from its tasks (valueFrom.parameter). A TaskGroup fails if any iteration failed.

A resumed run keeps every node that Succeeded (a kept DAG or TaskGroup keeps everything under it), so only what
failed or never ran runs again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from eksflow.local.book import NodeBook
from eksflow.local.expressions import ExpressionError, TaskOutcome, evaluate_depends, evaluate_when
from eksflow.local.memo import MemoCache
from eksflow.local.model import DagTask, DagTemplate, Template, Workflow, bind_inputs
from eksflow.local.phase import Phase
from eksflow.local.status import NodeType
from eksflow.local.substitution import (
    Scope,
    UnresolvedError,
    aggregate,
    aggregate_maps,
    iteration_name,
    parse_items,
)
from eksflow.runtime.skip_reason import skip_reason


@dataclass
class Unit:
    """A node ready to run: a pod (container or resource template) or a nested DAG."""

    key: str
    task: str  # the DAG task it belongs to (fail fast asks whether that task's failure is expected)
    template: Template
    inputs: dict[str, str]
    values: Mapping[str, str]  # the workflow.* values it sees (the exit handler's include workflow.status)
    memo_key: str | None = None


@dataclass
class DagRun:
    """One running instance of a DAG template."""

    template: DagTemplate
    prefix: str  # its tasks' node keys start with this ("" for the entrypoint)
    node: str | None  # its own DAG node (None for the entrypoint and the exit handler)
    scope: Scope  # workflow values and the DAG's inputs
    waiting: list[str] = field(default_factory=list)  # tasks not yet expanded
    queued: list[Unit] = field(default_factory=list)  # nodes created, waiting for a parallelism slot
    active: dict[str, Unit] = field(default_factory=dict)  # started and not yet fulfilled
    inner: dict[str, DagRun] = field(default_factory=dict)  # DAG nodes running, by key
    groups: dict[str, str] = field(default_factory=dict)  # fanned-out task -> its TaskGroup node
    failed: list[str] = field(default_factory=list)  # tasks whose unexpected failure stopped the DAG
    done: bool = False


class Scheduler:
    """Advances a run's DAGs; pods go to `start_pod`, which must mark their node started at once.

    Started: Running, or Pending with a start time while it waits for room on the node.
    """

    def __init__(
        self,
        workflow: Workflow,
        book: NodeBook,
        *,
        values: Mapping[str, str],
        memo: MemoCache,
        start_pod: Callable[[Unit], None],
        stop_reason: Callable[[], str],
    ) -> None:
        self.wf = workflow
        self.book = book
        self.values = values  # workflow.name, workflow.parameters.x, ...: what a template's scope starts from
        self.memo = memo
        self.start_pod = start_pod
        self.stop_reason = stop_reason
        self._roots: list[DagRun] = []  # the entrypoint's and the exit handler's

    def runs(self) -> Iterator[DagRun]:
        """Every DAG still running, nested ones included (what the node asks of what is ahead: ahead.py)."""
        stack = [run for run in self._roots if not run.done]
        while stack:
            run = stack.pop()
            yield run
            stack += run.inner.values()

    # -- building ------------------------------------------------------------------------------------------

    def begin(self, template: DagTemplate, prefix: str, node: str | None, scope: Scope) -> DagRun:
        """A DagRun of `template`, its tasks' nodes created Pending (or kept from the resumed run)."""
        run = DagRun(template, prefix, node, scope)
        if node is None:
            self._roots.append(run)
        with self.book.quietly():
            for name, task in template.tasks.items():
                key = prefix + name
                if self.book.keep(key, node):
                    continue
                target = self.wf.templates[task.template]
                is_dag = isinstance(target, DagTemplate)
                node_type = NodeType.TASK_GROUP if task.loop else NodeType.DAG if is_dag else NodeType.POD
                self.book.add(key, task.template, node_type=node_type, display_name=name, parent=node)
                run.waiting.append(name)
        return run

    # -- one pass ------------------------------------------------------------------------------------------

    def advance(self, run: DagRun) -> None:
        """Start whatever can start in `run` and the DAGs under it; mark it done when nothing more can happen."""
        for key, inner in list(run.inner.items()):
            self.advance(inner)
            if inner.done:
                del run.inner[key]
                self._finish_dag_node(key, inner)
                self.save_memo(run.active[key])
        for key in [k for k in run.active if self.book[k].phase.fulfilled]:
            unit = run.active.pop(key)
            self._note_failure(run, unit.task, key)
        self._complete_groups(run)
        if not self._stopped(run):
            for name in list(run.waiting):
                task = run.template.tasks[name]
                if all(self._fulfilled(run, need) for need in task.needs()):
                    run.waiting.remove(name)
                    self._expand(run, task)
                    if self._stopped(run):
                        break
        while run.queued and not self._stopped(run) and self._slot(run, run.queued[0]):
            self._start(run, run.queued.pop(0))
        self._complete_groups(run)
        if not run.active and not run.inner and (self._stopped(run) or not (run.waiting or run.queued)):
            self._finish(run)

    def _stopped(self, run: DagRun) -> str:
        reason = self.stop_reason()
        if reason:
            return reason
        if run.template.fail_fast and run.failed:
            return f"fail fast after {', '.join(dict.fromkeys(run.failed))} failed"
        return ""

    def _note_failure(self, run: DagRun, task: str, key: str) -> None:
        if self.book[key].phase.failed_or_error and task not in run.template.handled:
            run.failed.append(task)

    def _fulfilled(self, run: DagRun, task: str) -> bool:
        node = self.book.get(run.prefix + task)
        return node is not None and node.phase.fulfilled

    def _slot(self, run: DagRun, unit: Unit) -> bool:
        is_pod = not isinstance(unit.template, DagTemplate)
        if is_pod and self.wf.parallelism is not None and self.book.running_pods() >= self.wf.parallelism:
            return False
        limit = run.template.parallelism
        return limit is None or len(run.active) < limit

    # -- expanding a task ------------------------------------------------------------------------------------

    def _outcome(self, run: DagRun, task: str) -> TaskOutcome:
        node = self.book[run.prefix + task]
        if node.type is not NodeType.TASK_GROUP:
            return TaskOutcome(node.phase)
        return TaskOutcome(node.phase, tuple(self.book[c].phase for c in node.children))

    def _task_scope(self, run: DagRun) -> Scope:
        def tasks(name: str, parts: list[str]) -> str:
            return self._task_value(run, name, parts)

        return Scope(run.scope.workflow, run.scope.inputs, tasks=tasks)

    def _expand(self, run: DagRun, task: DagTask) -> None:
        key = run.prefix + task.name
        try:
            if task.depends:
                outcomes = {need: self._outcome(run, need) for need in task.needs()}
                if not evaluate_depends(task.depends, outcomes):
                    self._skip(key, Phase.OMITTED, f"depends {task.depends!r} is false")
                    return
            scope = self._task_scope(run)
            if task.loop is None:
                self._prepare(run, key, task, scope)
                return
            if task.loop.items is not None:
                items = [_substitute_item(item, scope) for item in task.loop.items]
            else:
                items = parse_items(scope.substitute(task.loop.param or ""), f"task {task.name!r}: withParam")
        except (UnresolvedError, ExpressionError) as exc:
            self._error(run, task.name, key, str(exc))
            return
        if not items:
            self._skip(key, Phase.SKIPPED, "Skipped, empty params")
            return
        self.book.set(key, Phase.RUNNING, "", children=[])
        run.groups[task.name] = key
        for index, item in enumerate(items):
            child = run.prefix + iteration_name(task.name, index, item)
            if self.book.keep(child, key):
                continue
            target = self.wf.templates[task.template]
            node_type = NodeType.DAG if isinstance(target, DagTemplate) else NodeType.POD
            self.book.add(child, task.template, node_type=node_type, display_name=child[len(run.prefix) :], parent=key)
            self._prepare(run, child, task, scope.with_item(item))

    def _skip(self, key: str, phase: Phase, message: str) -> None:
        self.book.set(key, phase, message, type=NodeType.SKIPPED)

    def _error(self, run: DagRun, task: str, key: str, message: str) -> None:
        """A node that cannot run (a reference with no value): Error, never retried, and a failure of its DAG."""
        self._skip(key, Phase.ERROR, message)
        self._note_failure(run, task, key)

    def _prepare(self, run: DagRun, key: str, task: DagTask, scope: Scope) -> None:
        """Evaluate `when` and the arguments of one node, and queue it to run."""
        template = self.wf.templates[task.template]
        try:
            if task.when:
                condition = scope.substitute(task.when)
                if not evaluate_when(condition):
                    why = skip_reason(self.wf.skip_reasons.get(task.template, {}), lambda t, o: _output(scope, t, o))
                    self._skip(key, Phase.SKIPPED, why or f"when {condition!r} evaluated to false")
                    return
            arguments = {name: scope.substitute(value) for name, value in task.arguments}
            inputs = bind_inputs(
                template.inputs,
                arguments,
                lambda name: UnresolvedError(
                    f"input parameter {name!r} of template {template.name!r} has no value; pass it in the task's "
                    "arguments.parameters or give it a default"
                ),
            )
        except (UnresolvedError, ExpressionError) as exc:
            self._error(run, task.name, key, str(exc))
            return
        run.queued.append(Unit(key, task.name, template, inputs, run.scope.workflow))

    def _start(self, run: DagRun, unit: Unit) -> None:
        run.active[unit.key] = unit
        if unit.template.memoize is not None and self._memoized(unit):
            return
        if isinstance(unit.template, DagTemplate):
            self.book.set(unit.key, Phase.RUNNING, "")
            scope = Scope(run.scope.workflow, unit.inputs)
            run.inner[unit.key] = self.begin(unit.template, f"{unit.key}.", unit.key, scope)
        else:
            self.start_pod(unit)

    def _memoized(self, unit: Unit) -> bool:
        """Whether the cache had the unit's outputs (its node then Succeeded); a bad key fails the node."""
        memoize = unit.template.memoize
        assert memoize is not None
        try:
            key = Scope(unit.values, unit.inputs).substitute(memoize.key)
            unit.memo_key = MemoCache.check_key(key, f"template {unit.template.name!r}: memoize")
        except (UnresolvedError, ValueError) as exc:
            self.book.set(unit.key, Phase.ERROR, str(exc))
            return True  # fulfilled: the next pass counts the failure
        found = self.memo.lookup(memoize, unit.memo_key)
        if found.outputs is None:
            self.book.set(unit.key, self.book[unit.key].phase, "", memoization=found.status)
            return False
        self.book.set(unit.key, Phase.SUCCEEDED, "", outputs=found.outputs, memoization=found.status)
        return True

    def save_memo(self, unit: Unit) -> None:
        """Save a unit's outputs under its memoization key once it Succeeded."""
        node = self.book[unit.key]
        memoize = unit.template.memoize
        if memoize is None or unit.memo_key is None or node.phase is not Phase.SUCCEEDED or node.cached:
            return
        self.memo.save(memoize, unit.memo_key, f"{self.values['name']}.{unit.key}", dict(node.outputs))

    # -- finishing -------------------------------------------------------------------------------------------

    def _complete_groups(self, run: DagRun) -> None:
        for key in run.groups.values():
            group = self.book[key]
            children = [self.book[c] for c in group.children]
            if group.phase.fulfilled or not all(c.phase.fulfilled for c in children):
                continue
            failed = [c for c in children if c.phase.failed_or_error]
            if failed:
                message = (
                    f"{len(failed)} of {len(children)} iterations failed; {failed[0].display_name}: {failed[0].message}"
                )
                self.book.set(key, failed[0].phase, message)
            else:
                self.book.set(key, Phase.SUCCEEDED, "")

    def _finish(self, run: DagRun) -> None:
        reason = self._stopped(run)
        why = f"not run: {reason}" if reason else "not run"
        for name in run.waiting:
            self._skip(run.prefix + name, Phase.OMITTED, why)
        for unit in run.queued:
            self._skip(unit.key, Phase.OMITTED, why)
        run.waiting.clear()
        run.queued.clear()
        self._complete_groups(run)
        run.done = True

    def outcome(self, run: DagRun) -> tuple[Phase, str | None]:
        """A finished DAG's phase, decided by its leaf tasks, and the node whose failure decided it."""
        branches: dict[str, tuple[Phase, str | None]] = {}

        def branch(name: str) -> tuple[Phase, str | None]:
            if name not in branches:
                key = run.prefix + name
                node = self.book.get(key)
                if node is not None and node.phase.completed:
                    branches[name] = (node.phase, key)
                else:  # skipped or omitted: the outcome of the branch that led here, a failure first
                    found: tuple[Phase, str | None] = (Phase.SUCCEEDED, None)
                    for need in run.template.tasks[name].needs():
                        parent = branch(need)
                        if parent[0].failed_or_error and not found[0].failed_or_error:
                            found = parent
                    branches[name] = found
            return branches[name]

        for leaf in run.template.leaves:
            phase, origin = branch(leaf)
            if phase.failed_or_error:
                return phase, origin
        return Phase.SUCCEEDED, None

    def _finish_dag_node(self, key: str, inner: DagRun) -> None:
        reason = self.stop_reason()
        phase, origin = self.outcome(inner)
        if reason:
            self.book.set(key, Phase.FAILED, reason)
            return
        if phase.failed_or_error and origin is not None:
            failed = self.book[origin]
            self.book.set(key, phase, f"child {failed.display_name!r} failed: {failed.message}")
            return
        try:
            outputs = self.dag_outputs(inner)
        except UnresolvedError as exc:
            self.book.set(key, Phase.ERROR, str(exc))
            return
        self.book.set(key, Phase.SUCCEEDED, "", outputs=outputs)

    def dag_outputs(self, run: DagRun) -> dict[str, str]:
        """A finished DAG template's output parameters, read from its tasks (valueFrom.parameter)."""
        scope = self._task_scope(run)
        outputs = {}
        for output in run.template.outputs:
            try:
                outputs[output.name] = scope.substitute(output.parameter or "")
            except UnresolvedError as exc:
                if output.default is None:
                    raise UnresolvedError(f"output parameter {output.name!r}: {exc}") from None
                outputs[output.name] = output.default
        return outputs

    # -- references to tasks -------------------------------------------------------------------------------

    def _task_value(self, run: DagRun, name: str, parts: list[str]) -> str:
        ref = ".".join(["tasks", name, *parts])
        node = self.book.get(run.prefix + name)
        if node is None or name not in run.template.tasks:
            raise UnresolvedError(f"{{{{{ref}}}}}: there is no task {name!r} in this DAG")
        if parts == ["status"]:
            return str(node.phase)
        if parts == ["exitCode"] and node.exit_code is not None:
            return str(node.exit_code)
        if parts in (["startedAt"], ["finishedAt"]) and getattr(node, _SNAKE[parts[0]]):
            return str(getattr(node, _SNAKE[parts[0]]))
        if parts[:2] == ["outputs", "parameters"] and len(parts) in (2, 3):
            if node.type is NodeType.TASK_GROUP:
                return self._aggregate(node.children, parts, ref, name)
            if len(parts) == 3 and parts[2] in node.outputs:
                return node.outputs[parts[2]]
            if len(parts) == 3:
                have = ", ".join(node.outputs) or "none"
                raise UnresolvedError(
                    f"{{{{{ref}}}}}: task {name!r} ({node.phase}) has no output parameter {parts[2]!r} (it has: {have})"
                )
        raise UnresolvedError(f"unresolved reference {{{{{ref}}}}}: no such value here")

    def _aggregate(self, children: list[str], parts: list[str], ref: str, name: str) -> str:
        succeeded = [self.book[c] for c in children if self.book[c].phase is Phase.SUCCEEDED]
        if len(parts) == 2:
            return aggregate_maps([c.outputs for c in succeeded])
        values = [c.outputs[parts[2]] for c in succeeded if parts[2] in c.outputs]
        if not values:
            raise UnresolvedError(f"{{{{{ref}}}}}: no iteration of {name!r} succeeded with output {parts[2]!r}")
        return aggregate(values)


_SNAKE = {"startedAt": "started_at", "finishedAt": "finished_at"}


def _substitute_item(item: Any, scope: Scope) -> Any:
    """A withItems item with the references in its strings substituted (Argo substitutes the whole task)."""
    if isinstance(item, str):
        return scope.substitute(item)
    if isinstance(item, Mapping):
        return {k: _substitute_item(v, scope) for k, v in item.items()}
    if isinstance(item, list):
        return [_substitute_item(v, scope) for v in item]
    return item


def _output(scope: Scope, task: str, output: str) -> str | None:
    """Output `output` of task `task` of the DAG `scope` is in, or None when it has no value."""
    try:
        return scope.lookup(f"tasks.{task}.outputs.parameters.{output}")
    except UnresolvedError:
        return None
