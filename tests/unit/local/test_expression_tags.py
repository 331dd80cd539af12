"""Expression tags `{{=...}}` evaluate as Argo's expr does: literals, escapes, member paths, `+`, toJson."""

import json

import pytest

from eksflow.local import expression_tags
from eksflow.local.substitution import Scope, UnresolvedError
from eksflow.manifests import expression, literal, variable

VALUES = {"inputs.parameters.model_dir": "/fsx/models/m", "workflow.name": "wf-1", "tasks.a-b.outputs.x": "7"}


def lookup(name: str) -> str:
    if name not in VALUES:
        raise UnresolvedError(f"unresolved reference {{{{{name}}}}}")
    return VALUES[name]


@pytest.mark.parametrize(
    ("source", "value"),
    [
        (r'"a\nb\t\"q\" \\ \'s\'"', "a\nb\t\"q\" \\ 's'"),
        (r"'single \"double\"'", 'single "double"'),
        (r'"\u00e9 \U0001f600 \x41 \101 \a\b\f\v\? \`"', "é \U0001f600 A A \a\b\f\v? `"),
        ('"crlf\r\nand cr\rend"', "crlf\nand cr\nend"),  # expr's lexer reads CR and CRLF as LF
    ],
    ids=["common", "single-quoted", "unicode-hex-octal", "newlines"],
)
def test_string_literals_unescape_as_expr_lang_does(source, value):
    assert expression_tags.evaluate(source, lookup) == value


@pytest.mark.parametrize("source", [r'"\q"', r'"\u12"', r'"\U00110000"', r'"end\"'], ids=str)
def test_bad_escapes_are_refused(source):
    with pytest.raises(expression_tags.ExpressionTagError):
        expression_tags.check(source)


def test_to_json_is_go_json_marshal():
    assert expression_tags.evaluate('toJson("a<b>&c \\u2028 é")', lookup) == '"a\\u003cb\\u003e\\u0026c \\u2028 é"'
    assert expression_tags.evaluate('toJson("x\\n\\"")', lookup) == '"x\\n\\""'


def test_member_paths_and_concatenation_read_the_variables():
    assert expression_tags.evaluate('"--model=" + inputs.parameters.model_dir', lookup) == "--model=/fsx/models/m"
    assert expression_tags.evaluate('tasks["a-b"].outputs.x + "/" + workflow.name', lookup) == "7/wf-1"
    assert expression_tags.evaluate('toJson(("a" + "b"))', lookup) == '"ab"'
    assert expression_tags.evaluate("string(workflow.name)", lookup) == "wf-1"


@pytest.mark.parametrize(
    "source",
    ["a == b", "sprig.env('HOME')", "env('HOME')", "1 + 2", "x ? y : z", "toJson(a, b)", "[1, 2]", "a.", ""],
    ids=["comparison", "sprig", "unknown-function", "numbers", "ternary", "two-arguments", "array", "dot", "empty"],
)
def test_what_the_subset_does_not_read_is_refused(source):
    with pytest.raises(expression_tags.ExpressionTagError):
        expression_tags.check(source)


def test_a_scope_evaluates_expression_tags_in_one_pass():
    scope = Scope({"name": "wf-1", "parameters.base_model": "{{workflow.name}}\n'"}, {"dir": "a b"}, retries=2)
    text = "x: {{=toJson(workflow.parameters.base_model)}}\ny: {{=toJson(inputs.parameters.dir + retries)}}"
    assert scope.substitute(text) == 'x: "{{workflow.name}}\\n\'"\ny: "a b2"'
    with pytest.raises(UnresolvedError, match=r"inputs\.parameters\.missing"):
        scope.substitute("{{=toJson(inputs.parameters.missing)}}")


@pytest.mark.parametrize(
    "text",
    ["plain", "--model={{inputs.parameters.model_dir}}", "{{workflow.name}}-{{tasks.a-b.outputs.x}}/}}{{\"'\n\x00é😀"],
    ids=["no-reference", "flag", "mixed"],
)
def test_the_rendered_expression_gives_back_the_text_with_its_references_filled(text):
    rendered = expression(text)
    assert "}}" not in rendered and "{{" not in rendered  # Argo ends a tag at the first `}}`
    expected = text.replace("{{inputs.parameters.model_dir}}", VALUES["inputs.parameters.model_dir"])
    expected = expected.replace("{{workflow.name}}", "wf-1").replace("{{tasks.a-b.outputs.x}}", "7")
    assert json.loads(expression_tags.evaluate(rendered, lookup)) == expected


def test_literals_and_paths_are_written_for_expr():
    assert literal("a'b\"c{}") == '"a\\u0027b\\u0022c\\u007b\\u007d"'
    assert (
        variable("tasks.train-nb.outputs.parameters.adapter_dir") == 'tasks["train-nb"].outputs.parameters.adapter_dir'
    )
