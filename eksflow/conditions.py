"""`when=`: conditions on typed task outputs, checked for type as the pipeline is built, rendered as Argo's `when`.

    when=scored.passed                                  a bool output is true
    when=~scored.passed                                 ... is false
    when=chosen.accuracy >= 0.9                         a number output against a number (< <= > >=)
    when=chosen.rank.eq(8) | chosen.rank.ne(16)         == and != are methods (`==` on an output is refused)
    when=(chosen.accuracy > 0.8) & ~staged.changed      & (and), | (or), ~ (not), grouped as written
    when=staged.changed.otherwise(staged.reason)        ... and why the task is skipped when it is false

Only bool and number outputs take part: a step's outputs are validated against its Outputs model when it writes
them, so what Argo substitutes into the expression is `true`, `false` or a number, never text that could change
the expression. Text is compared inside a step, which outputs a bool. `otherwise(reason)` says, in words a user
reads in place of the expression, why the task was skipped: a text of the pipeline, or a text output of a task of
the same DAG; it travels beside the expression (eksflow.runtime.skip_reason), never in it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

from eksflow.config import text_problem
from eksflow.errors import PipelineError
from eksflow.runtime.skip_reason import REASON, REASON_OUTPUT

if TYPE_CHECKING:
    from eksflow.refs import Ref

Constant = bool | int | float
NUMBERS = ("int", "float")
# What a message advises for text or JSON outputs: Argo would paste their text into the expression.
TEXT_ADVICE = "compare text in the step that writes it, and output a bool"


class Condition(ABC):
    """A `when=`: true or false once its outputs are known. Combine with `&`, `|` and `~`."""

    def __and__(self, other: Condition | Ref) -> Condition:
        return Combined("&&", self, condition(other))

    def __or__(self, other: Condition | Ref) -> Condition:
        return Combined("||", self, condition(other))

    def __invert__(self) -> Condition:
        return Negated(self)

    def otherwise(self, reason: str | Ref) -> Condition:
        """This condition, and why its task is skipped when it is false (text, or a text output); give it last."""
        return Explained(self, reason)

    def __bool__(self) -> bool:
        raise PipelineError(
            "a when= condition has no value while the pipeline is built (it is decided when the workflow runs); "
            "combine conditions with &, | and ~, not and/or/not"
        )

    @abstractmethod
    def refs(self) -> list[Ref]:
        """The outputs the condition reads (their tasks must run first)."""

    @abstractmethod
    def render(self, scope: Callable[[Ref], str]) -> str:
        """The Argo expression, each output written as `scope` makes it valid where the task runs."""


@dataclass(frozen=True, eq=False)
class IsTrue(Condition):
    """A bool output is true."""

    ref: Ref

    def refs(self) -> list[Ref]:  # noqa: D102 (Condition.refs)
        return [self.ref]

    def render(self, scope: Callable[[Ref], str]) -> str:  # noqa: D102 (Condition.render)
        return f"{scope(self.ref)} == true"


@dataclass(frozen=True, eq=False)
class Compared(Condition):
    """An output against a constant or another output."""

    left: Ref
    op: str
    right: Ref | Constant

    def refs(self) -> list[Ref]:  # noqa: D102 (Condition.refs)
        return [self.left, *([self.right] if not isinstance(self.right, Constant) else [])]

    def render(self, scope: Callable[[Ref], str]) -> str:  # noqa: D102 (Condition.render)
        right = _literal(self.right) if isinstance(self.right, Constant) else scope(self.right)
        return f"{scope(self.left)} {self.op} {right}"


@dataclass(frozen=True, eq=False)
class Negated(Condition):
    """The inner condition is false."""

    inner: Condition

    def refs(self) -> list[Ref]:  # noqa: D102 (Condition.refs)
        return self.inner.refs()

    def render(self, scope: Callable[[Ref], str]) -> str:  # noqa: D102 (Condition.render)
        if isinstance(self.inner, IsTrue):
            return f"{scope(self.inner.ref)} == false"
        return f"!({self.inner.render(scope)})"


@dataclass(frozen=True, eq=False)
class Combined(Condition):
    """Both conditions (&&) or either (||)."""

    op: str  # && or ||
    left: Condition
    right: Condition

    def refs(self) -> list[Ref]:  # noqa: D102 (Condition.refs)
        return [*self.left.refs(), *self.right.refs()]

    def render(self, scope: Callable[[Ref], str]) -> str:  # noqa: D102 (Condition.render)
        return f"({self.left.render(scope)}) {self.op} ({self.right.render(scope)})"


@dataclass(frozen=True, eq=False)
class Explained(Condition):
    """A condition with the reason its task is skipped when it is false: the whole `when=`, never a part of one."""

    inner: Condition
    reason: str | Ref

    def refs(self) -> list[Ref]:  # noqa: D102 (Condition.refs): the reason's task too runs first
        return [*self.inner.refs(), *([self.reason] if not isinstance(self.reason, str) else [])]

    def render(self, scope: Callable[[Ref], str]) -> str:  # noqa: D102 (Condition.render)
        return self.inner.render(scope)

    def __and__(self, other: Condition | Ref) -> Condition:
        raise _reason_not_last()

    def __or__(self, other: Condition | Ref) -> Condition:
        raise _reason_not_last()

    def __invert__(self) -> Condition:
        raise _reason_not_last()

    def otherwise(self, reason: str | Ref) -> Condition:  # noqa: D102 (Condition.otherwise)
        raise _reason_not_last()


def _reason_not_last() -> PipelineError:
    return PipelineError(
        "otherwise(...) gives the reason of a whole when= condition: combine first, then give it once, last, "
        "e.g. when=(a.passed & b.passed).otherwise(...)"
    )


def reason_annotation(when: Condition, dag: object, where: str) -> dict[str, str]:
    """The template annotation saying why a task in DAG `dag` is skipped (eksflow.runtime.skip_reason), or none."""
    if not isinstance(when, Explained):
        return {}
    reason = when.reason
    if isinstance(reason, str):
        why = text_problem("otherwise", reason) if reason.strip() else "is empty"
        if why:
            raise PipelineError(f"{where}: the reason {why}; give text a user reads, or a text output")
        return {REASON: reason}
    if reason.producer is None or reason.dag is not dag or not reason.output:
        raise PipelineError(f"{where}: {reason.label} is no output of a task of this DAG; give one, or text")
    if reason.kind not in ("text", "any"):
        raise PipelineError(f"{where}: {reason.label} is {reason.kind}, not text; give a text output")
    return {REASON_OUTPUT: f"{reason.producer._name}.{reason.output}"}


def condition(when: Condition | Ref) -> Condition:
    """`when` as a Condition: a bool output stands for `output is true`."""
    if isinstance(when, Condition):
        return when
    if when.kind in NUMBERS:
        raise PipelineError(
            f"when={when.label}: an output of kind {when.kind} is no condition; compare it "
            f"(e.g. {when.label} >= 0.9 or {when.label}.eq(0)) or output a bool"
        )
    if when.kind not in ("bool", "any"):
        raise PipelineError(
            f"when={when.label}: an output of kind {when.kind} is no condition, and a condition cannot read "
            f"{when.kind}: {TEXT_ADVICE}"
        )
    return IsTrue(when)


def compared(left: Ref, op: str, right: Ref | Constant, right_kind: str) -> Compared:
    """`left <op> right`, refused unless both sides are numbers (any comparison) or bools (== and !=)."""
    kinds = {left.kind, right_kind} - {"any"}
    if kinds <= set(NUMBERS) or (kinds == {"bool"} and op in ("==", "!=")):
        return Compared(left, op, right)
    what = " and ".join(sorted({left.kind, right_kind}))
    advice = f"; {TEXT_ADVICE}" if kinds - {*NUMBERS, "bool"} else ""
    raise PipelineError(
        f"when={left.label} {op} {shown(right)}: compares {what}; a condition compares numbers "
        f"(< <= > >= .eq .ne) or bools (.eq .ne){advice}"
    )


def constant_kind(value: object, where: str) -> str:
    """The kind of a constant a condition compares an output with; PipelineError for anything else."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float) and math.isfinite(value):
        return "float"
    raise PipelineError(f"when={where}: {value!r} is no constant a condition can compare (a bool or a finite number)")


def shown(value: Ref | Constant) -> str:
    """How a message names one side of a comparison."""
    return repr(value) if isinstance(value, Constant) else value.label


def _literal(value: Constant) -> str:
    """A constant as govaluate reads it: true/false, or a decimal without exponent (1e-05 -> 0.00001)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return format(Decimal(repr(value)), "f")
