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
`on_exit` adds tasks to the exit handler, which runs whatever the outcome (`workflow_status` says which), once the
main DAG has ended: neither reads the other's outputs nor waits for its tasks (`after=`), as Argo allows.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any

from hera.workflows import DAG, Parameter, Task
from hera.workflows import models as m

from eksflow.conditions import Condition, condition, reason_annotation
from eksflow.config import text_problem
from eksflow.errors import PipelineError
from eksflow.kinds import Kind, kind_of
from eksflow.refs import Item, Ref, Scope, TaskRef, When
from eksflow.runtime.args import K8S_NAME, encode

if TYPE_CHECKING:
    from hera.workflows import Container, Resource

    from eksflow.config import PipelineConfig
    from eksflow.launchers import Job

EXIT_HANDLER = "exit-handler"
ENTRYPOINT = "main"

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
        title: str = "",
        description: str = "",
        parameters: Mapping[str, str] | None = None,
        scheduled: Mapping[str, str] | None = None,
    ) -> None:
        # Required, but checked here rather than by Python: a missing keyword would be a TypeError's traceback.
        if not isinstance(title, str) or not title.strip():
            raise PipelineError(
                f"Pipeline(...) needs title=, the one line the Argo UI shows for the workflow (got {title!r}): "
                'e.g. Pipeline(cfg, title="LoRA fine-tune of the demo model")'
            )
        self.cfg = cfg
        self.title = title
        self.description = description
        self.parameter_values = dict(parameters or {})
        self.scheduled = dict(scheduled or {})  # parameter values of runs a CronWorkflow starts
        unknown = sorted(set(self.scheduled) - set(self.parameter_values))
        if unknown:
            raise PipelineError(f"scheduled= names parameters the pipeline does not declare: {', '.join(unknown)}")
        for name in self.parameter_values:
            if not re.fullmatch(r"[A-Za-z_][\w\-]*", name):
                raise PipelineError(f"workflow parameter name {name!r}: use letters, digits, '_' and '-'")
        for name, value in [*self.parameter_values.items(), *self.scheduled.items()]:
            if why := text_problem(name, str(value)):  # what `-p` values are held to as well (eksflow.parameters)
                raise PipelineError(f"workflow parameter {name}: {why}")
        self.templates: dict[str, Container | Resource | DAG] = {}
        self.tasks: dict[str, TaskRef] = {}  # every task added, by name (names are unique in a workflow)
        self.jobs: list[Job] = []  # distributed tasks, for `plan`
        self.main = Scope(ENTRYPOINT)
        self.exit: Scope | None = None
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
            self.exit = Scope(EXIT_HANDLER, exit=True)
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
        fingerprint: str = "",
    ) -> TaskRef:
        """Add a task running `template` (named like the task) to the current DAG; used by task() and launchers.

        `fingerprint`: what makes the task's result (templates.template_fingerprint), for memoized consumers' keys.
        """
        dag = self._dag
        self._check_name(name, dag)
        self.templates[name] = template
        where = f"task {name!r}"
        arguments = [Parameter(name=arg, value=self._in_scope(ref, dag, where)) for arg, ref in (inputs or {}).items()]
        needs = [ref.producer for ref in (inputs or {}).values() if ref.producer is not None]
        condition = None
        if when is not None:
            condition, producers, reason = self._condition(when, dag, name)
            needs += producers
            if reason:  # beside the expression, on the template: what a skipped node's message says instead
                template.annotations = {**(template.annotations or {}), **reason}
        needs += self._after(after, dag, where)
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
        self.tasks[name] = TaskRef(name, outputs, dag, step, fingerprint)
        return self.tasks[name]

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
        inner = Scope(name, parent=outer)
        collected = self._run_body(body, items, inner, where)
        self.templates[name] = _body_dag(inner, collected)
        loop = self._loop(inner, outer, items, after, where)
        looped = loop.task() if parallelism is None else self._wrapped(loop, outer, parallelism, list(collected))
        outer.tasks.append(looped)
        outer.names.add(name)
        self.tasks[name] = TaskRef(name, dict.fromkeys(collected, "json"), outer, where)
        return self.tasks[name]

    def _run_body(
        self, body: Callable[[Item], Mapping[str, Ref]], items: Sequence[Any] | Ref, inner: Scope, where: str
    ) -> Mapping[str, Ref]:
        """Add `body`'s tasks to `inner`, the fan-out's DAG; the outputs it collects, each one of its tasks'."""
        if isinstance(items, Ref):
            item = Item({}, "any", where, inner.items)
        elif not items:
            raise PipelineError(f"{where}: no items; give at least one")
        else:
            item = _item_of(items, where, inner.items)
        outer, self._dag = self._dag, inner
        try:
            collected = body(item)
        finally:
            self._dag = outer
        if not inner.tasks:
            raise PipelineError(f"{where}: its body added no task")
        for output, ref in collected.items():
            if ref.dag is not inner or ref.producer is None:
                raise PipelineError(f"{where}: output {output!r} must be an output of a task its body added")
        return collected

    def _loop(
        self, inner: Scope, outer: Scope, items: Sequence[Any] | Ref, after: TaskRef | Sequence[TaskRef], where: str
    ) -> _Loop:
        """The task in `outer` looping over `inner`: the body's values from outside come in as its arguments.

        Items from `{{item...}}`, the rest from `outer`; it waits for their tasks, `after`, and those the body's
        tasks wait for in `outer`. A withParam list is `outer`'s value, its task waited for too.
        """
        outside = [(param, ref) for param, ref in inner.inputs.values() if ref.dag is not inner.items]
        from_item = [Parameter(name=p, value=ref.argo) for p, ref in inner.inputs.values() if ref.dag is inner.items]
        arguments = [Parameter(name=param, value=self._in_scope(ref, outer, where)) for param, ref in outside]
        needs = [ref.producer for _, ref in outside if ref.producer is not None]
        needs += self._after(after, outer, where)
        for waited in inner.after:  # what the body's tasks run after: the fan-out task (or an enclosing one) waits
            (needs if waited._dag is outer else outer.after).append(waited)
        if isinstance(items, Ref) and items.producer is not None:
            needs.append(items.producer)
        with_items = None if isinstance(items, Ref) else list(items)
        with_param = self._in_scope(items, outer, where) if isinstance(items, Ref) else None
        return _Loop(inner.name, arguments, from_item, self._depends(needs, outer), with_items, with_param)

    def _wrapped(self, loop: _Loop, outer: Scope, parallelism: int, outputs: list[str]) -> Task:
        """The looped task in a DAG of its own: Argo limits concurrent iterations through the template holding it.

        The wrapper `<name>-all` takes the loop's arguments (and a withParam list) as inputs, forwards them and
        gives the loop's outputs; the task in `outer` runs it.
        """
        name, wrapper = loop.name, f"{loop.name}-all"
        self._check_name(wrapper, outer)
        forwarded = [Parameter(name=a.name, value=f"{{{{inputs.parameters.{a.name}}}}}") for a in loop.arguments]
        arguments, inside = list(loop.arguments), loop
        if loop.with_param is not None:  # the list comes in as an input of the wrapper
            arguments.append(Parameter(name="fan_out_items", value=loop.with_param))
            inside = replace(loop, with_param="{{inputs.parameters.fan_out_items}}")
        self.templates[wrapper] = DAG(
            name=wrapper,
            parallelism=parallelism,
            inputs=[Parameter(name=a.name) for a in arguments] or None,
            tasks=[replace(inside, arguments=forwarded, depends=None).task()],
            outputs=[
                Parameter(name=o, value_from=m.ValueFrom(parameter=f"{{{{tasks.{name}.outputs.parameters.{o}}}}}"))
                for o in outputs
            ]
            or None,
        )
        return Task(name=name, template=wrapper, arguments=arguments or None, depends=loop.depends)

    # -- helpers ----------------------------------------------------------------------------------------------------

    def _check_name(self, name: str, dag: Scope) -> None:
        if not re.fullmatch(K8S_NAME, name) or len(name) > 63:
            raise PipelineError(f"task name {name!r}: use lower-case letters, digits and '-' (at most 63)")
        if name in self.templates or name in (ENTRYPOINT, EXIT_HANDLER):
            raise PipelineError(f"task name {name!r} is used twice; give the second one another task_name=")

    def _in_scope(self, ref: Ref, dag: Scope, where: str) -> str:
        """The expression standing for `ref` inside `dag`: itself, or an input of `dag` fed from outside it."""
        if ref.dag is None or ref.dag is dag:
            return ref.argo
        if ref.dag.exit and not dag.exit:
            raise PipelineError(
                f"{where} reads {ref.label}, an output of an exit-handler task: the exit handler runs once the main "
                "DAG has ended, so no main-DAG task can read its outputs"
            )
        if dag.exit and not ref.dag.exit:
            raise PipelineError(
                f"{where} reads {ref.label}, an output of a main-DAG task, which Argo's exit handler cannot read: "
                "have that task write it into the run folder (p.run_dir / ...) and give this task that path"
            )
        if dag.parent is None:
            raise PipelineError(
                f"{where} reads {ref.label}, which is not available here: outside its fan-out it is a list (a "
                "fan-out output)"
            )
        for param, known in dag.inputs.values():
            if known.argo == ref.argo and known.dag is ref.dag:
                return f"{{{{inputs.parameters.{param}}}}}"
        param = re.sub(r"\W+", "_", ref.label).strip("_")[:60]
        dag.inputs[len(dag.inputs)] = (param, ref)
        return f"{{{{inputs.parameters.{param}}}}}"

    def _condition(self, when: When, dag: Scope, task: str) -> tuple[str, list[TaskRef], dict[str, str]]:
        """The Argo `when` of a task in `dag`, the tasks whose outputs it reads, and why it is skipped (annotation)."""
        if not isinstance(when, Ref | Condition):
            raise PipelineError(
                f"task {task!r}: when={repr(when)[:60]} is a Python value, decided while the pipeline is built; give "
                "a bool output or a condition on outputs (x >= 1, x.eq(0), a & b)"
            )
        try:
            decided = condition(when)
        except PipelineError as err:
            raise PipelineError(f"task {task!r}: {err}") from None
        producers = []
        for ref in decided.refs():
            if ref.producer is None:
                raise PipelineError(f"task {task!r}: when= reads {ref.label}, which is not a task output")
            producers.append(ref.producer)
        reason = reason_annotation(decided, dag, f"task {task!r}: when=...otherwise(...)")
        return decided.render(lambda ref: self._in_scope(ref, dag, f"task {task!r}: when=")), producers, reason

    def _after(self, after: TaskRef | Sequence[TaskRef], dag: Scope, where: str) -> list[TaskRef]:
        """The tasks `after=` names, each one `dag` can wait for (one of an enclosing DAG: its fan-out waits)."""
        tasks = [after] if isinstance(after, TaskRef) else list(after)
        for other in tasks:
            said = f"{where}: after={other._name}"
            if other._dag.exit and not dag.exit:
                raise PipelineError(
                    f"{said} is a task of the exit handler, which runs only once the main DAG has ended; put this "
                    "task in the exit handler too (`with p.on_exit():`) or drop the after="
                )
            if dag.exit and not other._dag.exit:
                raise PipelineError(
                    f"{said} is a main-DAG task; the exit handler runs once the main DAG has ended, whatever its "
                    "outcome: drop the after= (p.workflow_status says how the run ended)"
                )
            if other._dag is not dag and other._dag.encloses(dag):
                dag.after.append(other)
            elif other._dag is not dag:
                raise PipelineError(
                    f"{said} is inside fan-out {other._dag.name!r}; wait for the whole fan-out: after= its task"
                )
        return tasks

    def _depends(self, needs: Sequence[TaskRef], dag: Scope) -> str | None:
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


class _Parameters:
    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = values

    def __getattr__(self, name: str) -> Ref:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._values:
            raise PipelineError(f"no workflow parameter {name!r}; declared: {', '.join(self._values) or 'none'}")
        return Ref(f"{{{{workflow.parameters.{name}}}}}", "any", f"workflow.parameters.{name}")


@dataclass(frozen=True)
class _Loop:
    """The task that runs a fan-out's body once per item (Argo withItems/withParam)."""

    name: str
    arguments: list[Parameter]  # the body's values from the enclosing scope
    item_arguments: list[Parameter]  # and from the item
    depends: str | None
    with_items: list[Any] | None
    with_param: str | None

    def task(self) -> Task:
        """The looped task: the body's DAG (named like the fan-out) once per item."""
        return Task(
            name=self.name,
            template=self.name,
            arguments=[*self.arguments, *self.item_arguments] or None,
            depends=self.depends,
            with_items=self.with_items,
            with_param=self.with_param,
        )


def _body_dag(inner: Scope, collected: Mapping[str, Ref]) -> DAG:
    """The body's DAG template: its tasks, the values from outside as inputs, the collected outputs."""
    return DAG(
        name=inner.name,
        tasks=inner.tasks,
        inputs=[Parameter(name=param) for param, _ in inner.inputs.values()] or None,
        outputs=[Parameter(name=o, value_from=m.ValueFrom(parameter=ref.argo)) for o, ref in collected.items()] or None,
    )


def _item_of(items: Sequence[Any], where: str, scope: Scope | None) -> Item:
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
    """`eksflow.llm.steps.stage_data` -> `stage-data` (Argo names are kebab-case, derived, never typed by hand)."""
    return module.__name__.rsplit(".", 1)[-1].replace("_", "-")
