"""Authoring: a pipeline is a DAG of tasks, each running one step module, wired by the step's typed outputs.

    with Pipeline(cfg, title="LoRA fine-tune", parameters={"data_source": cfg.data.source}) as p:
        staged = task(stage_data, cfg.data, source=p.parameters.data_source, dest_dir=p.run_dir / "data")
        checked = task(validate_data, cfg.validation, dataset_dir=staged.dataset_dir)
        trained = task(train, cfg.train, dataset_dir=staged.dataset_dir, after=checked, when=staged.changed)

Each wire is written once: `staged.dataset_dir` is a typed reference to an output of the `stage-data` task (the
fields of the step's Outputs model); passing it as an argument makes it an input parameter of the consumer's
template and makes the consumer depend on the producer's success. `after=` orders tasks that share no data;
`when=` takes a bool output or a condition on typed outputs (eksflow/conditions.py: `>=`, `.eq()`, `&`, `|`, `~`);
`after=ended(t)` waits for t whatever its outcome.
Mistakes (an output or argument the step does not have, a value of the wrong kind, a task name used twice, a
literal holding `{{`) raise PipelineError naming the task and field when the pipeline is built, long before
anything runs.

`fan_out` runs a sub-DAG once per item (Argo `withItems`/`withParam`); its outputs are JSON lists in item order.
`on_exit` adds tasks to the exit handler, which runs whatever the outcome (`workflow_status` says which).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import re
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, UnionType
from typing import TYPE_CHECKING, Any, Literal

from hera.workflows import DAG, Parameter, Task, Workflow
from hera.workflows import models as m
from hera.workflows.models import DAGTask
from pydantic import BaseModel

from eksflow.conditions import Condition, Constant, compared, condition, constant_kind
from eksflow.errors import PipelineError
from eksflow.runtime.args import K8S_NAME, encode

if TYPE_CHECKING:
    from hera.workflows import Container, Resource

    from eksflow.config import PipelineConfig
    from eksflow.launchers import Job

Kind = Literal["text", "bool", "int", "float", "json", "any"]
EXIT_HANDLER = "exit-handler"
ENTRYPOINT = "main"


def kind_of(annotation: Any) -> Kind:
    """How a field's value travels: text, bool, int, float or JSON (containers and models)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return kind_of(typing.get_args(annotation)[0])
    if origin in (typing.Union, UnionType):
        kinds = {kind_of(a) for a in typing.get_args(annotation) if a is not type(None)}
        return kinds.pop() if len(kinds) == 1 else "any"
    if origin is Literal:
        values = typing.get_args(annotation)
        return "bool" if all(isinstance(v, bool) for v in values) else "text"
    if origin in (list, tuple, dict, set, frozenset):
        return "json"
    if annotation is bool:
        return "bool"
    if annotation is int:
        return "int"
    if annotation is float:
        return "float"
    if isinstance(annotation, type) and issubclass(annotation, (str, Path)):
        return "text"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "json"
    return "any"


def accepts(target: Kind, source: Kind) -> bool:
    """Whether a value of kind `source` may fill a field of kind `target` (an int fills a float field)."""
    return "any" in (target, source) or target == source or (target == "float" and source == "int")


@dataclass(frozen=True, eq=False)
class Ref:
    """A value known only when the workflow runs: a task output, a workflow parameter, a fan-out item, a global."""

    argo: str  # the expression in the scope of `dag` (a global one is valid everywhere)
    kind: Kind
    label: str  # what a message calls it, e.g. `stage-data.dataset_dir`
    producer: TaskRef | None = None  # the task whose success the value needs
    dag: _Dag | None = None  # where `argo` is valid; None: anywhere in the workflow
    values: tuple[Any, ...] | None = None  # every value it takes, when known as the pipeline is built (fan-out items)

    def __truediv__(self, part: str | Ref) -> Ref:
        """A path below this one: `p.run_dir / "data"`, `p.run_dir / "candidates" / item.name`.

        At most one side may be a scoped value (a task output, a fan-out item): the joined text then travels as
        one input parameter, which Argo fills in the consumer's scope.
        """
        if isinstance(part, Ref):
            if self.dag is not None and part.dag is not None and self.dag is not part.dag:
                raise PipelineError(f"cannot join {self.label} and {part.label}: they come from different scopes")
            return Ref(
                f"{self.argo}/{part.argo}",
                "text",
                f"{self.label}/{part.label}",
                producer=self.producer or part.producer,
                dag=self.dag or part.dag,
            )
        return Ref(f"{self.argo}/{part}", "text", f"{self.label}/{part}", producer=self.producer, dag=self.dag)

    def __invert__(self) -> Condition:
        """`when=~scored.passed`: run only when the bool output is false."""
        return ~condition(self)

    def __and__(self, other: Condition | Ref) -> Condition:
        """`when=a.passed & b.passed`: both bool outputs are true."""
        return condition(self) & other

    def __or__(self, other: Condition | Ref) -> Condition:
        """`when=a.passed | b.passed`: either bool output is true."""
        return condition(self) | other

    def __lt__(self, other: Ref | Constant) -> Condition:  # type: ignore[override]
        return self._compared("<", other)

    def __le__(self, other: Ref | Constant) -> Condition:  # type: ignore[override]
        return self._compared("<=", other)

    def __gt__(self, other: Ref | Constant) -> Condition:  # type: ignore[override]
        return self._compared(">", other)

    def __ge__(self, other: Ref | Constant) -> Condition:  # type: ignore[override]
        return self._compared(">=", other)

    def eq(self, other: Ref | Constant) -> Condition:
        """`when=chosen.rank.eq(8)`: the output equals a number, a bool or another output (`==` stays Python's)."""
        return self._compared("==", other)

    def ne(self, other: Ref | Constant) -> Condition:
        """`when=chosen.rank.ne(8)`: the output differs from it."""
        return self._compared("!=", other)

    def _compared(self, op: str, other: Ref | Constant) -> Condition:
        # Whether both sides are task outputs is checked once the condition is a task's (Pipeline._condition).
        right_kind = other.kind if isinstance(other, Ref) else constant_kind(other, f"{self.label} {op} {other!r}")
        return compared(self, op, other, right_kind)

    def __str__(self) -> str:
        return self.argo


When = Ref | Condition


def ended(task: TaskRef) -> TaskRef:
    """`after=ended(t)`: run once t has finished, whether it succeeded, failed or was skipped (exit handlers)."""
    whatever = TaskRef(task._name, task._outputs, task._dag, task._step)
    whatever._any_outcome = True
    return whatever


class TaskRef:
    """A task in a DAG. Its step's outputs are attributes: `staged.dataset_dir` is a Ref to that output."""

    def __init__(self, name: str, outputs: Mapping[str, Kind], dag: _Dag, step: str) -> None:
        self._name = name
        self._outputs = dict(outputs)
        self._dag = dag
        self._step = step
        self._fingerprint = ""  # what makes its result (eksflow.templates): a memoized consumer's key includes it
        self._any_outcome = False  # as `after=ended(t)`: t finished, succeeded or not

    def __getattr__(self, output: str) -> Ref:
        if output.startswith("_"):
            raise AttributeError(output)
        if output not in self._outputs:
            known = ", ".join(self._outputs) or "none"
            raise PipelineError(f"task {self._name!r} ({self._step}) has no output {output!r}; its outputs: {known}")
        return Ref(
            f"{{{{tasks.{self._name}.outputs.parameters.{output}}}}}",
            self._outputs[output],
            f"{self._name}.{output}",
            producer=self,
            dag=self._dag,
        )

    def __repr__(self) -> str:
        return f"<task {self._name} ({self._step})>"


@dataclass
class _Dag:
    name: str
    tasks: list[Task | DAGTask] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    # values from outside this DAG and the input parameters standing for them (fan-out bodies only)
    inputs: dict[int, tuple[str, Ref]] = field(default_factory=dict)
    parent: _Dag | None = None
    items: _Dag | None = None  # the scope of `{{item...}}`: the fan-out task's arguments

    def __post_init__(self) -> None:
        if self.parent is not None:
            self.items = _Dag(f"{self.name} items")


class Item:
    """The current item of a fan-out: `item.rank` for a key of an object item, `item.value` for a scalar item."""

    def __init__(
        self,
        kinds: Mapping[str, Kind],
        value_kind: Kind,
        where: str,
        scope: _Dag | None,
        items: Sequence[Any] | None = None,
    ) -> None:
        self._kinds = dict(kinds)
        self._value_kind = value_kind
        self._where = where
        self._scope = scope
        self._items = None if items is None else tuple(items)  # None: a withParam list, known when it runs

    @property
    def value(self) -> Ref:
        """The whole item (`{{item}}`)."""
        return Ref("{{item}}", self._value_kind, "item", dag=self._scope, values=self._items)

    def __getattr__(self, key: str) -> Ref:
        if key.startswith("_"):
            raise AttributeError(key)
        if self._kinds and key not in self._kinds:
            raise PipelineError(f"{self._where}: the items have no key {key!r}; keys: {', '.join(self._kinds)}")
        values = None if self._items is None else tuple(item[key] for item in self._items)
        return Ref(f"{{{{item.{key}}}}}", self._kinds.get(key, "any"), f"item.{key}", dag=self._scope, values=values)


_current: contextvars.ContextVar[Pipeline | None] = contextvars.ContextVar("eksflow_pipeline", default=None)


class Pipeline:
    """One Argo Workflow under construction: `with Pipeline(cfg, ...) as p:` then add tasks with `task(...)`.

    `parameters` become workflow parameters (shown in the Argo UI, overridable with `argo submit -p`);
    `scheduled` gives some of them other values in the runs a CronWorkflow starts.
    """

    def __init__(
        self,
        cfg: PipelineConfig,
        *,
        title: str,
        description: str = "",
        parameters: Mapping[str, str] | None = None,
        scheduled: Mapping[str, str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.title = title
        self.description = description
        self.parameter_values = dict(parameters or {})
        self.scheduled = dict(scheduled or {})  # parameter values of runs a CronWorkflow starts
        unknown = sorted(set(self.scheduled) - set(self.parameter_values))
        if unknown:
            raise PipelineError(f"scheduled= names parameters the pipeline does not declare: {', '.join(unknown)}")
        for name, value in self.parameter_values.items():
            if not re.fullmatch(r"[A-Za-z_][\w\-]*", name):
                raise PipelineError(f"workflow parameter name {name!r}: use letters, digits, '_' and '-'")
            if "{{" in str(value):
                raise PipelineError(f"workflow parameter {name}: its value holds '{{{{', which Argo would evaluate")
        self.templates: dict[str, Container | Resource | DAG] = {}
        self.jobs: list[Job] = []  # distributed tasks, for `plan`
        self.main = _Dag(ENTRYPOINT)
        self.exit: _Dag | None = None
        self._dag = self.main
        self._token: contextvars.Token[Pipeline | None] | None = None

    # -- values every pipeline can use ------------------------------------------------------------------------------

    @property
    def parameters(self) -> _Parameters:
        """The workflow parameters: `p.parameters.data_source` stands for `{{workflow.parameters.data_source}}`."""
        return _Parameters(self.parameter_values)

    @property
    def run_dir(self) -> Ref:
        """This run's folder on the shared volume: `<fsx_mount>/runs/{{workflow.name}}`."""
        return Ref(f"{self.cfg.storage.fsx_mount}/runs/{{{{workflow.name}}}}", "text", "run_dir")

    workflow_name = Ref("{{workflow.name}}", "text", "workflow.name")
    workflow_uid = Ref("{{workflow.uid}}", "text", "workflow.uid")

    @property
    def workflow_status(self) -> Ref:
        """Succeeded, Failed or Error: only known in the exit handler."""
        if self._dag is not self.exit:
            raise PipelineError("workflow_status is only known in the exit handler: use it inside `with p.on_exit():`")
        return Ref("{{workflow.status}}", "text", "workflow.status")

    # -- building ---------------------------------------------------------------------------------------------------

    def __enter__(self) -> Pipeline:
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None

    @staticmethod
    def current() -> Pipeline:
        """The pipeline being built (`with Pipeline(...)`); PipelineError outside one."""
        pipeline = _current.get()
        if pipeline is None:
            raise PipelineError("task(...) must be called inside `with Pipeline(cfg, ...) as p:`")
        return pipeline

    @contextlib.contextmanager
    def on_exit(self) -> Iterator[None]:
        """Tasks added inside run when the workflow ends, whatever its outcome (Argo's onExit handler)."""
        if self.exit is None:
            self.exit = _Dag(EXIT_HANDLER)
        previous, self._dag = self._dag, self.exit
        try:
            yield
        finally:
            self._dag = previous

    def add(
        self,
        name: str,
        template: Container | Resource,
        *,
        step: str,
        outputs: Mapping[str, Kind],
        inputs: Mapping[str, Ref] | None = None,
        after: TaskRef | Sequence[TaskRef] = (),
        when: When | None = None,
    ) -> TaskRef:
        """Add a task running `template` (named like the task) to the current DAG; used by task() and launchers."""
        dag = self._dag
        self._check_name(name, dag)
        self.templates[name] = template
        arguments = [Parameter(name=arg, value=self._in_scope(ref, dag)) for arg, ref in (inputs or {}).items()]
        needs = [ref.producer for ref in (inputs or {}).values() if ref.producer is not None]
        condition = None
        if when is not None:
            condition, producers = self._condition(when, dag, name)
            needs += producers
        needs += [after] if isinstance(after, TaskRef) else list(after)
        dag.tasks.append(
            Task(
                name=name,
                template=name,
                arguments=arguments or None,
                depends=self._depends(needs, dag),
                when=condition,
            )
        )
        dag.names.add(name)
        return TaskRef(name, outputs, dag, step)

    def fan_out(
        self,
        body: Callable[[Item], Mapping[str, Ref]],
        items: Sequence[Any] | Ref,
        *,
        task_name: str | None = None,
        after: TaskRef | Sequence[TaskRef] = (),
        parallelism: int | None = None,
    ) -> TaskRef:
        """Run `body`'s tasks once per item; the returned task's outputs are `body`'s, as JSON lists in item order.

        `items` is a list (Argo withItems: scalars, or objects whose keys `item.<key>` reads) or a Ref to a JSON
        list output (withParam). `body(item)` adds tasks with `task(...)` and returns the outputs to collect.
        """
        name = task_name or body.__name__.replace("_", "-")
        where = f"fan-out {name!r}"
        outer = self._dag
        self._check_name(name, outer)
        inner = _Dag(name, parent=outer)
        if isinstance(items, Ref):
            item = Item({}, "any", where, inner.items)
        elif not items:
            raise PipelineError(f"{where}: no items; give at least one")
        else:
            item = _item_of(items, where, inner.items)
        self._dag = inner
        try:
            collected = body(item)
        finally:
            self._dag = outer
        if not inner.tasks:
            raise PipelineError(f"{where}: its body added no task")
        for output, ref in collected.items():
            if ref.dag is not inner or ref.producer is None:
                raise PipelineError(f"{where}: output {output!r} must be an output of a task its body added")
        self.templates[name] = DAG(
            name=name,
            tasks=inner.tasks,
            inputs=[Parameter(name=param) for param, _ in inner.inputs.values()] or None,
            outputs=[
                Parameter(name=output, value_from=m.ValueFrom(parameter=ref.argo)) for output, ref in collected.items()
            ]
            or None,
        )
        # The body's values from outside come in as inputs: items from {{item...}}, the rest from this scope.
        outside = [(param, ref) for param, ref in inner.inputs.values() if ref.dag is not inner.items]
        item_arguments = [
            Parameter(name=p, value=ref.argo) for p, ref in inner.inputs.values() if ref.dag is inner.items
        ]
        arguments = [Parameter(name=param, value=self._in_scope(ref, outer)) for param, ref in outside]
        needs = [ref.producer for _, ref in outside if ref.producer is not None]
        needs += [after] if isinstance(after, TaskRef) else list(after)
        if isinstance(items, Ref) and items.producer is not None:
            needs.append(items.producer)
        with_items = None if isinstance(items, Ref) else list(items)
        with_param = self._in_scope(items, outer) if isinstance(items, Ref) else None
        if parallelism is None:
            looped = Task(
                name=name,
                template=name,
                arguments=[*arguments, *item_arguments] or None,
                depends=self._depends(needs, outer),
                with_items=with_items,
                with_param=with_param,
            )
        else:
            # Argo limits concurrent iterations through the template holding the looped task: wrap it in one.
            wrapper = f"{name}-all"
            self._check_name(wrapper, outer)
            forwarded = [Parameter(name=p, value=f"{{{{inputs.parameters.{p}}}}}") for p, _ in outside]
            param_inside = None
            if with_param is not None:  # the list comes in as an input of the wrapper
                arguments.append(Parameter(name="fan_out_items", value=with_param))
                param_inside = "{{inputs.parameters.fan_out_items}}"
            self.templates[wrapper] = DAG(
                name=wrapper,
                parallelism=parallelism,
                inputs=[Parameter(name=a.name) for a in arguments] or None,
                tasks=[
                    Task(
                        name=name,
                        template=name,
                        arguments=[*forwarded, *item_arguments] or None,
                        with_items=with_items,
                        with_param=param_inside,
                    )
                ],
                outputs=[
                    Parameter(
                        name=output,
                        value_from=m.ValueFrom(parameter=f"{{{{tasks.{name}.outputs.parameters.{output}}}}}"),
                    )
                    for output in collected
                ]
                or None,
            )
            looped = Task(name=name, template=wrapper, arguments=arguments or None, depends=self._depends(needs, outer))
        outer.tasks.append(looped)
        outer.names.add(name)
        return TaskRef(name, dict.fromkeys(collected, "json"), outer, where)

    # -- helpers ----------------------------------------------------------------------------------------------------

    def _check_name(self, name: str, dag: _Dag) -> None:
        if not re.fullmatch(K8S_NAME, name) or len(name) > 63:
            raise PipelineError(f"task name {name!r}: use lower-case letters, digits and '-' (at most 63)")
        if name in self.templates or name in (ENTRYPOINT, EXIT_HANDLER):
            raise PipelineError(f"task name {name!r} is used twice; give the second one another task_name=")

    def _in_scope(self, ref: Ref, dag: _Dag) -> str:
        """The expression standing for `ref` inside `dag`: itself, or an input of `dag` fed from outside it."""
        if ref.dag is None or ref.dag is dag:
            return ref.argo
        if dag.parent is None:
            raise PipelineError(
                f"{ref.label} is not available here: outside its fan-out it is a list (a fan-out output)"
            )
        for param, known in dag.inputs.values():
            if known.argo == ref.argo and known.dag is ref.dag:
                return f"{{{{inputs.parameters.{param}}}}}"
        param = re.sub(r"\W+", "_", ref.label).strip("_")[:60]
        dag.inputs[len(dag.inputs)] = (param, ref)
        return f"{{{{inputs.parameters.{param}}}}}"

    def _condition(self, when: When, dag: _Dag, task: str) -> tuple[str, list[TaskRef]]:
        """The Argo `when` expression of a task in `dag`, and the tasks whose outputs it reads."""
        try:
            decided = condition(when)
        except PipelineError as err:
            raise PipelineError(f"task {task!r}: {err}") from None
        producers = []
        for ref in decided.refs():
            if ref.producer is None:
                raise PipelineError(f"task {task!r}: when= reads {ref.label}, which is not a task output")
            producers.append(ref.producer)
        return decided.render(lambda ref: self._in_scope(ref, dag)), producers

    def _depends(self, needs: Sequence[TaskRef], dag: _Dag) -> str | None:
        """`a.Succeeded && b.Succeeded`: a consumer needs its producers to have succeeded (a skip skips it too)."""
        terms: list[str] = []
        for producer in needs:
            if producer._dag is not dag:
                continue  # an outer task: its value came in as an input of this DAG, ordered by the outer task
            n = producer._name
            term = f"({n}.Succeeded || {n}.Skipped || {n}.Failed || {n}.Errored)" if producer._any_outcome else None
            if (term or f"{n}.Succeeded") not in terms:
                terms.append(term or f"{n}.Succeeded")
        return " && ".join(terms) or None

    def workflow(self) -> Workflow:
        """The Hera Workflow: every template, the main DAG and the exit handler."""
        from eksflow.templates import workflow_shell

        dags = [DAG(name=ENTRYPOINT, tasks=self.main.tasks)]
        if self.exit is not None:
            dags.append(DAG(name=EXIT_HANDLER, tasks=self.exit.tasks))
        return workflow_shell(self, [*dags, *self.templates.values()])


class _Parameters:
    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = values

    def __getattr__(self, name: str) -> Ref:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._values:
            raise PipelineError(f"no workflow parameter {name!r}; declared: {', '.join(self._values) or 'none'}")
        return Ref(f"{{{{workflow.parameters.{name}}}}}", "any", f"workflow.parameters.{name}")


def _item_of(items: Sequence[Any], where: str, scope: _Dag | None) -> Item:
    seen: dict[str, int] = {}
    for index, item in enumerate(items):
        try:  # Argo's withItems is JSON: NaN and Infinity are not JSON numbers
            text = json.dumps(item, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise PipelineError(f"{where}: item {index} ({item!r}) is not a JSON value: {err}") from None
        if text in seen:  # the same work twice, and the same folders for both
            raise PipelineError(f"{where}: items {seen[text]} and {index} are the same ({item!r}); give each once")
        seen[text] = index
    first = items[0]
    if isinstance(first, Mapping):
        keys = set(first)
        for other in items[1:]:
            if not isinstance(other, Mapping) or set(other) != keys:
                raise PipelineError(f"{where}: every item must be an object with the keys {sorted(keys)}")
        kinds = {key: kind_of(type(first[key])) for key in first}
        return Item(kinds, "json", where, scope, items)
    return Item({}, kind_of(type(first)), where, scope, items)


def literal_problem(value: object) -> str | None:
    """Why a literal cannot travel as an argv value, or None: Argo would evaluate a `{{` inside it."""
    text = encode(value)
    if "{{" in text:
        return "holds '{{', which Argo would evaluate as an expression; remove it"
    return None


def step_name(module: ModuleType) -> str:
    """`steps.stage_data` -> `stage-data` (Argo names are kebab-case, derived, never typed by hand)."""
    return module.__name__.rsplit(".", 1)[-1].replace("_", "-")
