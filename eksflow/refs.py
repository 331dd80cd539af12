"""Values known only when the workflow runs, and the tasks that produce them: what a pipeline wires together.

`Ref` is one value (a task output, a workflow parameter, a fan-out item, the run folder) with its kind and the
scope where its Argo expression is valid; `TaskRef` is a task whose step outputs are Refs; `Item` is a fan-out's
current item; `Scope` is one DAG under construction (the main DAG, the exit handler or a fan-out's body).
A task output formatted as text (str(), an f-string) is recorded on its task under that exact text, so that
resource() finds the Ref behind a manifest string's tag (`formatted`) instead of parsing the tag back into one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hera.workflows import Task
from hera.workflows.models import DAGTask

from eksflow.conditions import Condition, Constant, compared, condition, constant_kind
from eksflow.errors import PipelineError
from eksflow.kinds import Kind


@dataclass(frozen=True, eq=False)
class Ref:
    """A value known only when the workflow runs: a task output, a workflow parameter, a fan-out item, a global."""

    argo: str  # the expression in the scope of `dag` (a global one is valid everywhere)
    kind: Kind
    label: str  # what a message calls it, e.g. `stage-data.dataset_dir`
    producer: TaskRef | None = None  # the task whose success the value needs
    dag: Scope | None = None  # where `argo` is valid; None: anywhere in the workflow
    values: tuple[Any, ...] | None = None  # every value it takes, when known as the pipeline is built (fan-out items)
    output: str = ""  # for a task output: the output's name
    joined: tuple[Ref, ...] = ()  # for a joined path (`a / b`): the values whose texts its `argo` holds, in order

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
                joined=(*self.parts(), *part.parts()),
            )
        if "{{" in part:
            raise PipelineError(f"{self.label} / {part[:60]!r}: the part holds '{{{{', which Argo would evaluate")
        return Ref(f"{self.argo}/{part}", "text", f"{self.label}/{part}", self.producer, self.dag, joined=self.parts())

    def parts(self) -> tuple[Ref, ...]:
        """The single values this one's text is made of: itself, or those of a joined path."""
        return self.joined or (self,)

    def __invert__(self) -> Condition:
        """`when=~scored.passed`: run only when the bool output is false."""
        return ~condition(self)

    def __and__(self, other: Condition | Ref) -> Condition:
        """`when=a.passed & b.passed`: both bool outputs are true."""
        return condition(self) & other

    def __or__(self, other: Condition | Ref) -> Condition:
        """`when=a.passed | b.passed`: either bool output is true."""
        return condition(self) | other

    def otherwise(self, reason: str | Ref) -> Condition:
        """`when=staged.changed.otherwise(staged.reason)`: true, and why the task is skipped when it is not."""
        return condition(self).otherwise(reason)

    def __lt__(self, other: Ref | Constant) -> Condition:  # type: ignore[override]
        return self._compared("<", other)

    def __le__(self, other: Ref | Constant) -> Condition:  # type: ignore[override]
        return self._compared("<=", other)

    def __gt__(self, other: Ref | Constant) -> Condition:  # type: ignore[override]
        return self._compared(">", other)

    def __ge__(self, other: Ref | Constant) -> Condition:  # type: ignore[override]
        return self._compared(">=", other)

    def eq(self, other: Ref | Constant) -> Condition:
        """`when=chosen.rank.eq(8)`: the output equals a number, a bool or another output."""
        return self._compared("==", other)

    def ne(self, other: Ref | Constant) -> Condition:
        """`when=chosen.rank.ne(8)`: the output differs from it."""
        return self._compared("!=", other)

    # `==`, `!=` and truth would be decided by Python while the pipeline is built, long before the value exists
    # (`when=x == 0` was False, always): refused, naming the method that makes a condition. Hashing stays by identity.
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        raise PipelineError(f"{self.label} == {_named(other)}: compare an output with {self.label}.eq(...), not ==")

    def __ne__(self, other: object) -> bool:
        raise PipelineError(f"{self.label} != {_named(other)}: compare an output with {self.label}.ne(...), not !=")

    def __bool__(self) -> bool:
        raise PipelineError(
            f"{self.label} has no value while the pipeline is built (it is known when the workflow runs); as a "
            "condition give it as when=, combined with &, | and ~ (not and/or/not)"
        )

    def _compared(self, op: str, other: Ref | Constant) -> Condition:
        # Whether both sides are task outputs is checked once the condition is a task's (Pipeline._condition).
        right_kind = other.kind if isinstance(other, Ref) else constant_kind(other, f"{self.label} {op} {other!r}")
        return compared(self, op, other, right_kind)

    def __str__(self) -> str:
        """The Argo text, each task output in it recorded on its task under that text (`formatted`).

        So resource() wires the output where a manifest string holds the text, typed: no `{{tasks...}}` is parsed
        back into a task, and one typed in by hand (never a Ref's text) is refused.
        """
        for part in self.parts():
            if part.producer is not None:
                part.producer._formatted[part.argo] = part
        return self.argo

    def __format__(self, spec: str) -> str:
        """`f"{fleet}-vllm"`: the Argo text, recorded as str() records it."""
        return format(str(self), spec)


When = Ref | Condition


def _named(value: object) -> str:
    """How a message names the other side of a refused `==`."""
    return value.label if isinstance(value, Ref) else repr(value)[:60]


def ended(task: TaskRef) -> TaskRef:
    """`after=ended(t)`: run once t has finished, whether it succeeded, failed or was skipped (exit handlers)."""
    whatever = TaskRef(task._name, task._outputs, task._dag, task._step, task._fingerprint)
    whatever._any_outcome = True
    whatever._formatted = task._formatted  # the same task's outputs: formatted through either, found through both
    return whatever


def formatted(tasks: Iterable[TaskRef]) -> dict[str, Ref]:
    """The outputs of `tasks` that were formatted as text (str(), an f-string), by that exact text."""
    return {text: ref for task in tasks for text, ref in task._formatted.items()}


class TaskRef:
    """A task in a DAG. Its step's outputs are attributes: `staged.dataset_dir` is a Ref to that output."""

    def __init__(self, name: str, outputs: Mapping[str, Kind], dag: Scope, step: str, fingerprint: str = "") -> None:
        self._name = name
        self._outputs = dict(outputs)
        self._dag = dag
        self._step = step
        self._fingerprint = fingerprint  # what makes its result (eksflow.templates): a memoized consumer's key has it
        self._any_outcome = False  # as `after=ended(t)`: t finished, succeeded or not
        self._formatted: dict[str, Ref] = {}  # its outputs' Refs formatted as text, by that text (Ref.__str__)

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
            output=output,
        )

    def __repr__(self) -> str:
        return f"<task {self._name} ({self._step})>"


@dataclass
class Scope:
    """One DAG under construction: its tasks, and for a fan-out's body the values it takes from outside."""

    name: str
    tasks: list[Task | DAGTask] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    # values from outside this DAG and the input parameters standing for them (fan-out bodies only)
    inputs: dict[int, tuple[str, Ref]] = field(default_factory=dict)
    parent: Scope | None = None
    items: Scope | None = None  # the scope of `{{item...}}`: the fan-out task's arguments
    exit: bool = False  # in the exit handler, which runs once the main DAG has ended and reads none of its outputs
    # tasks of enclosing DAGs that tasks of this fan-out's body run after: the fan-out task runs after them
    after: list[TaskRef] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.parent is not None:
            self.exit = self.parent.exit
            self.items = Scope(f"{self.name} items", exit=self.exit)

    def encloses(self, other: Scope) -> bool:
        """Whether `other` is this DAG or a fan-out body inside it."""
        inner: Scope | None = other
        while inner is not None and inner is not self:
            inner = inner.parent
        return inner is self


class Item:
    """The current item of a fan-out: `item.rank` for a key of an object item, `item.value` for a scalar item."""

    def __init__(
        self,
        kinds: Mapping[str, Kind],
        value_kind: Kind,
        where: str,
        scope: Scope | None,
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
