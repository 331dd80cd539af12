"""References, items and aggregates spelled as Argo's controller spells them (Go's encoding/json)."""

from typing import Any

import pytest

from eksflow.local.gojson import go_json
from eksflow.local.substitution import (
    Scope,
    UnresolvedError,
    aggregate,
    aggregate_maps,
    iteration_name,
    parse_items,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (8, "8"),
        (0.0001, "0.0001"),
        (2e-05, "0.00002"),
        (1.5e-07, "1.5e-7"),
        (2.0, "2"),
        (1e21, "1e+21"),
        (True, "true"),
        ("a<b>&c", '"a\\u003cb\\u003e\\u0026c"'),
        ({"rank": 8, "lr": 0.0001}, '{"lr":0.0001,"rank":8}'),
        ([1, "x", None], '[1,"x",null]'),
    ],
    ids=["int", "small", "smaller", "exponent", "integral-float", "huge", "bool", "html", "object", "list"],
)
def test_go_json(value: Any, expected: str) -> None:
    assert go_json(value) == expected


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("a", "t(0:a)"),
        (16, "t(0:16)"),
        ({"rank": 8, "lr": 2e-05}, "t(0:lr:0.00002,rank:8)"),
        ({"name": "f(x)"}, "t(0:name:fx)"),  # Argo drops parentheses from the item
        (["a", 1], 't(0:["a",1])'),
    ],
    ids=["string", "number", "object", "parentheses", "list"],
)
def test_iteration_names(item: Any, expected: str) -> None:
    assert iteration_name("t", 0, item) == expected


def test_aggregates_keep_strings_unless_every_value_is_json_structure() -> None:
    assert aggregate(["0.5", "0.75"]) == '["0.5","0.75"]'
    assert aggregate(['{"a": 1}', "[2]"]) == '[{"a":1},[2]]'
    assert aggregate(['{"a": 1}', "plain"]) == '["{\\"a\\": 1}","plain"]'
    assert aggregate_maps([{"b": "2", "a": "1"}, {}]) == '[{"a":"1","b":"2"}]'


def test_scope_resolves_in_one_pass_and_names_what_is_missing() -> None:
    scope = Scope({"name": "wf", "parameters.p": "{{workflow.name}}"}, {"x": "1"}).with_item({"k": "v"})
    assert scope.substitute("{{workflow.parameters.p}} {{ inputs.parameters.x }} {{item.k}} {{item}}") == (
        '{{workflow.name}} 1 v {"k":"v"}'
    )
    with pytest.raises(UnresolvedError, match=r"this item has no key 'z' \(it has: k\)"):
        scope.substitute("{{item.z}}")
    with pytest.raises(UnresolvedError, match=r"unresolved reference \{\{workflow.nope\}\}"):
        scope.substitute("{{workflow.nope}}")
    assert parse_items('[1, "a"]', "withParam") == [1, "a"]
    with pytest.raises(UnresolvedError, match="withParam must be a JSON list"):
        parse_items('{"a": 1}', "withParam")
