"""Fan-out items are checked when the pipeline is built: each passes the step's own Args rules, is a JSON value,
and is given once. The sweep's grid says which setting is wrong before anything renders."""

import pytest

from eksflow import Pipeline, PipelineConfig, PipelineError, task
from tests.commands import ROOT, python
from tests.unit.test_pipeline import MakeArgs, make


def fan_out(items: list) -> None:
    with Pipeline(PipelineConfig(name="t"), title="test") as p:
        p.fan_out(lambda item: {"rows": task(make, size=item.size, out_dir="/tmp/x").rows}, items, task_name="each")


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([{"size": 2}, {"size": 0}], r"argument size=0 \(from item.size\): Input should be greater than or equal to 1"),
        ([{"size": float("nan")}], r"item 0 .* is not a JSON value"),
        ([{"size": float("inf")}], r"item 0 .* is not a JSON value"),
        ([{"size": 2}, {"size": 2}], r"items 0 and 1 are the same"),
    ],
    ids=["args-rule", "nan", "inf", "duplicate"],
)
def test_an_item_the_step_would_refuse_fails_the_build(items, message):
    with pytest.raises(PipelineError, match=message):
        fan_out(items)


def test_items_within_the_rules_build():
    fan_out([{"size": 1}, {"size": 3}])
    assert MakeArgs.model_fields["size"].metadata  # the rule the items are held to is the step's own


@pytest.mark.parametrize(
    ("setting", "first_line"),
    [
        ("sweep.ranks=[0]", "config error: sweep.ranks[0]: Input should be greater than or equal to 1"),
        ("sweep.ranks=[-4]", "config error: sweep.ranks[0]: Input should be greater than or equal to 1"),
        ("sweep.ranks=[100000]", "config error: sweep.ranks: rank 100000 is above the default serving engine's"),
        ("sweep.learning_rates=[.nan]", "config error: sweep.learning_rates[0]: Input should be a finite number"),
        ("sweep.learning_rates=[.inf]", "config error: sweep.learning_rates[0]: Input should be a finite number"),
        ("sweep.learning_rates=[-1]", "config error: sweep.learning_rates[0]: Input should be greater than 0"),
        ("sweep.ranks=[8,8]", "config error: sweep.ranks: Value error, 8 given more than once"),
        ("sweep.ranks=[]", "config error: sweep.ranks: Value error, no value; give at least one"),
    ],
    ids=["zero", "negative", "huge", "nan", "inf", "negative-lr", "duplicate", "empty"],
)
def test_a_bad_grid_is_refused_in_one_line_before_anything_renders(setting, first_line):
    done = python(str(ROOT / "pipelines" / "lora_sweep.py"), "render", "--set", setting)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith(first_line), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("rates", "names"),
    [
        ("[0.001,0.0010000001]", ["r8-lr0.001", "r8-lr0.0010000001"]),  # one name (and folder) when spelled `:g`
        ("[0.0001,0.00010000000000001]", ["r8-lr0.0001", "r8-lr0.00010000000000001"]),
        ("[2e-5,0.001]", ["r8-lr2e-05", "r8-lr0.001"]),
    ],
    ids=["below-g-precision", "last-digit", "usual"],
)
def test_every_sweep_candidate_has_a_name_and_folder_of_its_own(rates, names):
    from eksflow.config import load_config
    from pipelines.lora_sweep import LoraSweepConfig, grid

    items = grid(load_config(LoraSweepConfig, overrides=["sweep.ranks=[8]", f"sweep.learning_rates={rates}"]))
    assert [item["name"] for item in items] == names
    assert [float(item["name"].partition("-lr")[2]) for item in items] == [item["learning_rate"] for item in items]


@pytest.mark.parametrize(
    ("setting", "first_line"),
    [
        ("sweep.learning_rates=[0.001,1.0e-3]", "config error: sweep.learning_rates: Value error, 0.001 given more"),
        ("sweep.ranks=[8,8.0]", "config error: sweep.ranks: Value error, 8 given more than once"),
    ],
    ids=["learning-rate", "rank"],
)
def test_a_grid_value_given_twice_in_other_spellings_is_refused_naming_it(setting, first_line):
    done = python(str(ROOT / "pipelines" / "lora_sweep.py"), "render", "--set", setting)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(first_line), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
