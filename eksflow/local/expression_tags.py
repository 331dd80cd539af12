"""Expression tags, `{{=<expr>}}`, evaluated as Argo's controller evaluates them with expr-lang.

eksflow renders them where a value must reach a resource manifest as data (eksflow/manifests.py):
`{{=toJson(inputs.parameters.model_dir)}}`, `{{=toJson("--model=" + inputs.parameters.model_dir)}}`. Argo runs the
expression over its variables (`workflow.parameters.x`, `inputs.parameters.x`, `workflow.name`, `retries`, ...,
nested by their dots) and writes the result in place of the tag: a string as itself, anything else as its JSON.

The subset read here: string literals ("..." or '...', with expr-lang's escapes), member paths (`a.b`, `a["b-c"]`),
`+` between strings, parentheses, and the calls `toJson(x)` (Go's json.Marshal: HTML characters escaped) and
`string(x)`. Anything else is refused when the manifest is checked, before the run starts, naming the tag.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eksflow.errors import EXIT_BAD_INPUT, EksflowError
from eksflow.local.gojson import go_json

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<op>[.+()\[\],])
    )""",
    re.VERBOSE | re.DOTALL,
)
_SIMPLE_ESCAPES = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "\\": "\\", "'": "'", '"': '"', "`": "`", "?": "?",
}  # fmt: skip
_HEX_ESCAPE = {"x": 2, "X": 2, "u": 4, "U": 8}


class ExpressionTagError(EksflowError, ValueError):
    """An expression tag outside the subset read here, or one naming a value that does not exist."""

    label = "expression tag error"
    exit_code = EXIT_BAD_INPUT


@dataclass(frozen=True)
class _Token:
    kind: str  # str | name | op | end
    text: str


def _tokens(expression: str) -> list[_Token]:
    tokens, position = [], 0
    while expression[position:].strip():
        match = _TOKEN.match(expression, position)
        if match is None:
            raise ExpressionTagError(
                f"unsupported syntax at {expression[position:].strip()[:20]!r} in {{{{={expression}}}}}"
            )
        kind = str(match.lastgroup)
        tokens.append(_Token(kind, match.group(kind)))
        position = match.end()
    return [*tokens, _Token("end", "")]


def unescape(quoted: str) -> str:
    """An expr-lang string literal's value (its lexer's rules: Go's escapes, CR/CRLF read as LF)."""
    body = quoted[1:-1].replace("\r\n", "\n").replace("\r", "\n")
    out, i = [], 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        code = body[i + 1] if i + 1 < len(body) else ""
        if code in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[code])
            i += 2
        elif code in _HEX_ESCAPE:
            digits = body[i + 2 : i + 2 + _HEX_ESCAPE[code]]
            if not re.fullmatch(rf"[0-9a-fA-F]{{{_HEX_ESCAPE[code]}}}", digits) or int(digits, 16) > 0x10FFFF:
                raise ExpressionTagError(f"bad escape \\{code}{digits} in {quoted}")
            out.append(chr(int(digits, 16)))
            i += 2 + len(digits)
        elif re.fullmatch(r"[0-3][0-7]{2}", body[i + 1 : i + 4]):
            out.append(chr(int(body[i + 1 : i + 4], 8)))
            i += 4
        else:
            raise ExpressionTagError(f"bad escape \\{code} in {quoted}")
    return "".join(out)


def _string(value: Any) -> str:
    return value if isinstance(value, str) else go_json(value)


_FUNCTIONS: dict[str, Callable[[Any], Any]] = {"toJson": go_json, "string": _string}


class _Parser:
    """Recursive descent over expr := term ('+' term)*, with no `lookup` a syntax check only.

    term := literal | call | path | '(' expr ')'; path := name ('.' name | '[' str ']')*.
    """

    def __init__(self, expression: str, lookup: Callable[[str], str] | None) -> None:
        self.expression = expression
        self.tokens = _tokens(expression)
        self.index = 0
        self.lookup = lookup

    def fail(self, what: str) -> ExpressionTagError:
        return ExpressionTagError(f"{what} in {{{{={self.expression}}}}}")

    def peek(self, text: str) -> bool:
        token = self.tokens[self.index]
        return token.kind == "op" and token.text == text

    def take(self, kind: str, text: str | None = None) -> _Token:
        token = self.tokens[self.index]
        if token.kind != kind or (text is not None and token.text != text):
            raise self.fail(f"expected {text or kind}, got {token.text or 'the end'!r}")
        self.index += 1
        return token

    def parse(self) -> Any:
        value = self.sum()
        self.take("end")
        return value

    def sum(self) -> Any:
        value = self.term()
        while self.peek("+"):
            self.index += 1
            right = self.term()
            if self.lookup is not None:
                if not (isinstance(value, str) and isinstance(right, str)):
                    raise self.fail(f"'+' joins strings here, got {value!r} and {right!r}")
                value += right
        return value

    def term(self) -> Any:
        token = self.tokens[self.index]
        if token.kind == "str":
            self.index += 1
            return unescape(token.text)
        if self.peek("("):
            self.index += 1
            value = self.sum()
            self.take("op", ")")
            return value
        name = self.take("name").text
        if self.peek("("):
            return self.call(name)
        path = [name]
        while self.peek(".") or self.peek("["):
            if self.take("op").text == ".":
                path.append(self.take("name").text)
            else:
                path.append(unescape(self.take("str").text))
                self.take("op", "]")
        return self.lookup(".".join(path)) if self.lookup is not None else ""

    def call(self, name: str) -> Any:
        function = _FUNCTIONS.get(name)
        if function is None:
            raise self.fail(f"function {name!r} is not read here (known: {', '.join(sorted(_FUNCTIONS))})")
        self.take("op", "(")
        argument = self.sum()
        self.take("op", ")")
        return function(argument) if self.lookup is not None else ""


def check(expression: str) -> None:
    """Raise ExpressionTagError if `expression` (the text after `{{=`) is outside the subset read here."""
    _Parser(expression, None).parse()


def evaluate(expression: str, lookup: Callable[[str], str]) -> str:
    """The text Argo writes in place of `{{=<expression>}}`; `lookup` gives a variable's value by its dotted name."""
    return _string(_Parser(expression, lookup).parse())
