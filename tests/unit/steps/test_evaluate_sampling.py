"""Scoring a seeded sample of a large eval set: the sample, its digest, and Wilson confidence intervals."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from eksflow.llm.steps import evaluate
from eksflow.llm.steps.common import checkpoints
from eksflow.llm.steps.common.base_model import DEMO_MODEL
from eksflow.llm.steps.evaluate import EvaluateSettings
from eksflow.llm.steps.evaluate import step as evaluate_step
from eksflow.llm.steps.evaluate.sampling import load_sample, sample_indices, sample_suffix, wilson_interval
from eksflow.llm.steps.evaluate.scoring import Scores


def test_a_sample_is_a_pure_function_of_seed_and_size():
    first = sample_indices(10_000, 500, seed=7)
    assert first == sample_indices(10_000, 500, seed=7)
    assert first == sorted(set(first)) and len(first) == 500 and first[0] >= 0 and first[-1] < 10_000
    assert first != sample_indices(10_000, 500, seed=8)
    assert sample_indices(20, 50, seed=1) == list(range(20))  # a sample as large as the set is the set


def test_load_sample_streams_usable_examples_in_file_order(tmp_path):
    path = tmp_path / "eval.jsonl"
    lines = [json.dumps({"prompt": f"q{i}", "completion": f"a{i}"}) for i in range(200)]
    lines[5] = "{broken"
    lines[9] = json.dumps({"prompt": "no answer"})
    turns = [{"role": "user", "content": "q16"}, {"role": "assistant", "content": "a16"}]
    lines[16] = json.dumps({"messages": turns})  # a conversation is sampled as one, its turns kept
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    examples, total = load_sample(path, 30, seed=3)
    assert total == 198
    usable = [i for i in range(200) if i not in (5, 9)]
    expected = [usable[k] for k in sample_indices(198, 30, 3)]
    assert [e.completion for e in examples] == [f"a{i}" for i in expected]
    assert 16 in expected and examples[expected.index(16)].messages == tuple(turns)


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [(50, 100, 0.4038, 0.5962), (0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0), (81, 263, 0.2553, 0.3662)],
)
def test_wilson_interval_matches_reference_values(successes, n, low, high):
    """Values of scipy.stats.binomtest(successes, n).proportion_ci(method="wilson")."""
    assert wilson_interval(successes, n, 0.95) == pytest.approx((low, high), abs=1e-4)


def test_wilson_intervals_cover_the_true_rate_at_their_level():
    """2,000 samples of 200 Bernoulli(0.3) draws: about 95% of the 95% intervals hold 0.3 (binomial spread of
    the coverage estimate ~0.5%; the bounds are 4 of those)."""
    rng = random.Random(11)
    covered = 0
    for _ in range(2000):
        hits = sum(rng.random() < 0.3 for _ in range(200))
        low, high = wilson_interval(hits, 200, 0.95)
        covered += low <= 0.3 <= high
    assert 0.93 <= covered / 2000 <= 0.97


def test_max_examples_and_sample_size_exclude_each_other():
    with pytest.raises(ValidationError, match="set one of them to 0"):
        EvaluateSettings(max_examples=10, sample_size=100)
    assert sample_suffix(100, 4, 10_000) == "@sample-100-seed-4"
    assert sample_suffix(100, 4, 100) == ""  # the whole set: comparable with a full-set score


def test_a_sampled_evaluation_reports_its_intervals_and_its_own_digest(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(1000)]
    (data / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")

    def adapter(folder: Path) -> None:
        (folder / "adapter").mkdir()
        (folder / "adapter" / "adapter_config.json").write_text("{}")

    checkpoint = checkpoints.commit(tmp_path / "checkpoints", 8, adapter)

    def scorer(args, examples, preferences=()):
        # the tuned model right on every 4th example of the sample, the base model never
        tuned = [e.completion if k % 4 == 0 else "?" for k, e in enumerate(examples)]
        metrics = {"eval_loss": 1.0, "perplexity": 2.7, "exact_match": 0.25, "contains": 0.25}
        base = {"eval_loss": 2.0, "perplexity": 7.4, "exact_match": 0.0, "contains": 0.0}
        return {"tuned": Scores(metrics=metrics, answers=tuned), "base": Scores(metrics=base, answers=["?"] * 200)}

    monkeypatch.setattr(evaluate_step, "score_models", scorer)
    args = evaluate.Args(
        dataset_dir=data,
        adapter_dir=checkpoint.path / "adapter",
        base_model=DEMO_MODEL,
        report_dir=tmp_path / "reports",
        outputs_dir=tmp_path / "outputs",
        champion_version="",
        task_metrics=("exact_match", "contains"),
        sample_size=200,
        sample_seed=5,
    )
    outputs = evaluate_step.run(args)
    assert outputs.eval_set_digest.endswith("@sample-200-seed-5")
    assert outputs.intervals["exact_match"] == pytest.approx(list(wilson_interval(50, 200, 0.95)), abs=1e-4)
    assert outputs.intervals["base_exact_match"][0] == 0.0
    report = json.loads(Path(outputs.report).read_text())
    assert (report["examples"], report["eval_set_examples"]) == (200, 1000)
    assert report["confidence"]["intervals"] == outputs.intervals
    assert "sampled 200 of 1000 held-out examples (seed 5)" in (tmp_path / "reports" / "eval_report.md").read_text()
    full = evaluate_step.run(args.model_copy(update={"sample_size": 0}))
    assert full.intervals == {} and "@" not in full.eval_set_digest
