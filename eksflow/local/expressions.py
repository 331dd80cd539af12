"""The three expression languages of an Argo DAG, evaluated locally.

- `when` (govaluate, after `{{...}}` substitution): `==  !=  <  >  <=  >=  &&  ||  !`, parentheses, numbers,
  quoted strings, `true`/`false`; any other bare word is a string, so `false == true` and `Succeeded == Succeeded`
  work as they do in Argo.
- `depends` (enhanced depends): task names with an optional `.Succeeded`, `.Failed`, ... result, combined with
  `&&  ||  !` and parentheses. A bare `a` means `a.Succeeded || a.Skipped || a.Daemoned`.
- `retryStrategy.expression` (expr-lang subset): variables such as `lastRetry.exitCode`, `asInt()`/`asFloat()`,
  comparisons, `&& || !` and `and or not`, and `matches` (regular expression search).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

from eksflow.errors import EXIT_BAD_INPUT, EksflowError
from eksflow.local.phase import Phase

Value = bool | float | str

# Results a `depends` term may ask for, and the node phases that satisfy each. AnySucceeded and AllFailed are about
# a fanned-out task's iterations (false for a task that did not fan out, as in Argo); nothing is daemoned locally.
DEPENDS_RESULTS: Mapping[str, frozenset[Phase]] = {
    "Succeeded": frozenset({Phase.SUCCEEDED}),
    "Failed": frozenset({Phase.FAILED}),
    "Errored": frozenset({Phase.ERROR}),
    "Skipped": frozenset({Phase.SKIPPED}),
    "Omitted": frozenset({Phase.OMITTED}),
    "Daemoned": frozenset(),
    "AnySucceeded": frozenset(),
    "AllFailed": frozenset(),
}
# Results that expect a failure: a task named with one of them does not stop its DAG when it fails.
FAILURE_RESULTS = frozenset({"Failed", "Errored", "AllFailed", "AnySucceeded"})
_BARE_DEPENDS = frozenset({Phase.SUCCEEDED, Phase.SKIPPED})


@dataclass(frozen=True)
class TaskOutcome:
    """What a depends term can ask of a completed task: its phase, and for a fan-out, its iterations' phases."""

    phase: Phase
    iterations: tuple[Phase, ...] | None = None  # None: the task did not fan out

    def satisfies(self, result: str | None) -> bool:
        """Whether this outcome meets `task.<result>` (a bare `task` when result is None)."""
        if result == "AnySucceeded":
            return self.iterations is not None and Phase.SUCCEEDED in self.iterations
        if result == "AllFailed":
            return bool(self.iterations) and all(p is Phase.FAILED for p in self.iterations or ())
        return self.phase in (_BARE_DEPENDS if result is None else DEPENDS_RESULTS[result])


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<op>==|!=|<=|>=|&&|\|\||[<>!(),])
      | (?P<word>[^\s()!=<>&|'",]+)
    )""",
    re.VERBOSE,
)
_NUMBER = re.compile(r"^-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$")
_KEYWORD_OPS = {"and": "&&", "or": "||", "not": "!", "matches": "matches"}


class ExpressionError(EksflowError, ValueError):
    """An expression that cannot be parsed or evaluated; the message quotes it."""

    label = "expression error"
    exit_code = EXIT_BAD_INPUT


@dataclass(frozen=True)
class _Token:
    kind: str  # "str" | "op" | "word" | "end"
    text: str
    pos: int


def _tokenize(expression: str, *, keywords: bool) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(expression):
        if expression[pos:].strip() == "":
            break
        match = _TOKEN.match(expression, pos)
        if match is None or match.end() == pos:
            raise ExpressionError(f"unexpected character {expression[pos:].lstrip()[:1]!r} in {expression!r}")
        kind = match.lastgroup or "word"
        text = match.group(kind)
        if kind == "word" and keywords and text in _KEYWORD_OPS:
            kind, text = "op", _KEYWORD_OPS[text]
        tokens.append(_Token(kind, text, match.start(kind)))
        pos = match.end()
    tokens.append(_Token("end", "", len(expression)))
    return tokens


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text[1:-1], flags=re.DOTALL)


class _Parser:
    """Recursive descent over one token list; evaluates while parsing (expressions are tiny).

    Precedence, lowest first: `||`, `&&`, comparisons and `matches`, unary `!`, primaries.
    """

    def __init__(
        self,
        expression: str,
        *,
        word: Callable[[str], Value],
        keywords: bool = False,
        functions: Mapping[str, Callable[[Value], Value]] | None = None,
    ) -> None:
        self.expression = expression
        self.tokens = _tokenize(expression, keywords=keywords)
        self.index = 0
        self.word = word
        self.functions = functions or {}

    def parse(self) -> Value:
        if self.tokens[0].kind == "end":
            raise ExpressionError("empty expression")
        value = self._or()
        if self._peek().kind != "end":
            self._fail(f"unexpected {self._peek().text!r}")
        return value

    def _peek(self) -> _Token:
        return self.tokens[self.index]

    def _next(self) -> _Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def _accept(self, op: str) -> bool:
        token = self._peek()
        if token.kind == "op" and token.text == op:
            self.index += 1
            return True
        return False

    def _fail(self, what: str) -> NoReturn:
        raise ExpressionError(f"{what} at position {self._peek().pos} in {self.expression!r}")

    def _bool(self, value: Value, op: str) -> bool:
        if not isinstance(value, bool):
            raise ExpressionError(f"operator {op!r} needs true/false, got {value!r} in {self.expression!r}")
        return value

    def _or(self) -> Value:
        value = self._and()
        while self._accept("||"):
            right = self._and()
            value = self._bool(value, "||") | self._bool(right, "||")
        return value

    def _and(self) -> Value:
        value = self._comparison()
        while self._accept("&&"):
            right = self._comparison()
            value = self._bool(value, "&&") & self._bool(right, "&&")
        return value

    def _comparison(self) -> Value:
        value = self._unary()
        while (token := self._peek()).kind == "op" and token.text in ("==", "!=", "<", ">", "<=", ">=", "matches"):
            self.index += 1
            value = _compare(token.text, value, self._unary(), self.expression)
        return value

    def _unary(self) -> Value:
        if self._accept("!"):
            return not self._bool(self._unary(), "!")
        return self._primary()

    def _primary(self) -> Value:
        token = self._next()
        if token.kind == "op" and token.text == "(":
            value = self._or()
            if not self._accept(")"):
                self._fail("missing ')'")
            return value
        if token.kind == "str":
            return _unquote(token.text)
        if token.kind == "word":
            if self._peek().text == "(" and self._peek().kind == "op":
                return self._call(token)
            return self.word(token.text)
        self.index -= 1
        self._fail(f"expected a value, got {token.text or 'end of expression'!r}")

    def _call(self, name: _Token) -> Value:
        function = self.functions.get(name.text)
        if function is None:
            known = ", ".join(sorted(self.functions)) or "none"
            raise ExpressionError(f"unknown function {name.text!r} in {self.expression!r} (known: {known})")
        self._accept("(")
        argument = self._or()
        if not self._accept(")"):
            self._fail(f"{name.text}() takes exactly one argument")
        return function(argument)


def _compare(op: str, left: Value, right: Value, expression: str) -> bool:
    if op == "matches":
        if not isinstance(left, str) or not isinstance(right, str):
            raise ExpressionError(f"'matches' needs two strings, got {left!r} and {right!r} in {expression!r}")
        return re.search(right, left) is not None
    if op in ("==", "!="):
        # govaluate compares typed values: a number never equals a string, and bools only equal bools.
        same = type(left) is type(right) and left == right
        return same if op == "==" else not same
    both_numbers = isinstance(left, float) and isinstance(right, float)
    both_strings = isinstance(left, str) and isinstance(right, str)
    if not (both_numbers or both_strings):
        raise ExpressionError(f"cannot compare {left!r} {op} {right!r} in {expression!r}")
    ordered: dict[str, Callable[[Value, Value], bool]] = {
        "<": lambda a, b: a < b,  # type: ignore[operator]
        ">": lambda a, b: a > b,  # type: ignore[operator]
        "<=": lambda a, b: a <= b,  # type: ignore[operator]
        ">=": lambda a, b: a >= b,  # type: ignore[operator]
    }
    return ordered[op](left, right)


def _literal(word: str) -> Value | None:
    if word in ("true", "false"):
        return word == "true"
    if _NUMBER.match(word):
        return float(word)
    return None


def _result_bool(value: Value, expression: str, kind: str) -> bool:
    if not isinstance(value, bool):
        raise ExpressionError(f"{kind} expression {expression!r} evaluated to {value!r}, expected true or false")
    return value


def evaluate_when(expression: str) -> bool:
    """Evaluate a substituted `when` expression the way Argo's govaluate does (bare words are strings)."""

    def word(text: str) -> Value:
        literal = _literal(text)
        return text if literal is None else literal

    return _result_bool(_Parser(expression, word=word).parse(), expression, "when")


def _as_int(value: Value) -> Value:
    try:
        return float(int(str(value).strip()))
    except ValueError:
        raise ExpressionError(f"asInt({value!r}): not an integer") from None


def _as_float(value: Value) -> Value:
    try:
        return float(str(value).strip())
    except ValueError:
        raise ExpressionError(f"asFloat({value!r}): not a number") from None


def evaluate_retry_expression(expression: str, variables: Mapping[str, str]) -> bool:
    """Evaluate a retryStrategy.expression; `variables` maps dotted names (`lastRetry.exitCode`) to strings."""

    def word(text: str) -> Value:
        literal = _literal(text)
        if literal is not None:
            return literal
        if text not in variables:
            known = ", ".join(sorted(variables))
            raise ExpressionError(f"unknown variable {text!r} in {expression!r} (known: {known})")
        return variables[text]

    parser = _Parser(expression, word=word, keywords=True, functions={"asInt": _as_int, "asFloat": _as_float})
    return _result_bool(parser.parse(), expression, "retry")


def _split_depends_term(term: str, expression: str) -> tuple[str, str | None]:
    task, dot, result = term.partition(".")
    if not re.fullmatch(r"[A-Za-z0-9][\w\-]*", task):
        raise ExpressionError(f"invalid task name {task!r} in depends {expression!r}")
    if not dot:
        return task, None
    if result not in DEPENDS_RESULTS:
        known = ", ".join(DEPENDS_RESULTS)
        raise ExpressionError(f"unknown result {term!r} in depends {expression!r} (known: {known})")
    return task, result


def depends_references(expression: str) -> list[tuple[str, str | None]]:
    """The (task, result) terms of a depends expression, in order; result is None for a bare task name."""
    return [
        _split_depends_term(token.text, expression)
        for token in _tokenize(expression, keywords=False)
        if token.kind == "word"
    ]


def depends_on_failure(expression: str) -> set[str]:
    """Tasks whose failure this depends expression expects (`Failed`, `Errored`, `AllFailed`, `AnySucceeded`)."""
    return {task for task, result in depends_references(expression) if result in FAILURE_RESULTS}


def evaluate_depends(expression: str, outcomes: Mapping[str, TaskOutcome]) -> bool:
    """Evaluate an enhanced depends expression once every task it names has completed."""

    def word(text: str) -> Value:
        task, result = _split_depends_term(text, expression)
        if task not in outcomes:
            raise ExpressionError(f"depends {expression!r} names task {task!r}, which has not completed")
        return outcomes[task].satisfies(result)

    return _result_bool(_Parser(expression, word=word).parse(), expression, "depends")


def dependencies_to_depends(dependencies: Sequence[str]) -> str:
    """The enhanced depends equivalent of a legacy `dependencies` list: every task, bare, joined by `&&`."""
    return " && ".join(dependencies)
