"""The base model's answers are decoded once per model, eval set and decoding settings, then read from the model
cache: a sweep's candidates and every retrain on the same rows stop paying for them (eksflow.llm.steps.evaluate
.base_scores). What is reused gives the metrics decoding gives; a change to anything that decides the answers
decodes again; a cache that cannot be read or written costs time only."""

import json
import math
from pathlib import Path

import pytest

from eksflow.llm.steps import evaluate
from eksflow.llm.steps.common.base_model import DEMO_MODEL, default_cache_dir, resolve_model
from eksflow.llm.steps.evaluate import base_scores, scoring
from eksflow.llm.steps.evaluate import step as evaluate_step
from tests.unit.steps.test_evaluate_conversations import CONVERSATION, PAIR

DEMO_DATA = Path(__file__).resolve().parents[3] / "data" / "demo"
REUSED = "answers and loss of an earlier evaluation"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """The check images' tiny Llama and its adapter (images/checks/tiny_model.py): <folder>/model, <folder>/adapter."""
    from images.checks.tiny_model import main

    folder = tmp_path_factory.mktemp("tiny")
    main(resolve_model(DEMO_MODEL, default_cache_dir()), folder)
    return folder


@pytest.fixture
def decoded_models(monkeypatch) -> list[int]:
    """How many models each evaluation decoded (the base, the tuned model, or both)."""
    calls: list[int] = []
    decode = scoring._decode

    def counted(*args, **kwargs):
        calls.append(1)
        return decode(*args, **kwargs)

    monkeypatch.setattr(scoring, "_decode", counted)
    return calls


def evaluate_once(tmp_path: Path, tiny: Path, cache: Path, name: str, **extra) -> evaluate.Outputs:
    values = {
        "dataset_dir": DEMO_DATA,
        "adapter_dir": tiny / "adapter",
        "base_model": str(tiny / "model"),
        "model_cache_dir": cache,
        "report_dir": tmp_path / name / "reports",
        "outputs_dir": tmp_path / name / "outputs",
        "max_examples": 4,
        "batch_size": 4,
        "max_new_tokens": 8,
        "champion_version": "",
        **extra,
    }
    return evaluate_step.run(evaluate.Args.model_validate(values))


@pytest.mark.slow  # real models (the tiny one): seconds an evaluation
def test_a_second_evaluation_reads_the_base_answers_and_gets_the_same_metrics(tmp_path, tiny, decoded_models, capsys):
    cache = tmp_path / "cache"
    first = evaluate_once(tmp_path, tiny, cache, "first")
    assert len(decoded_models) == 2 and REUSED not in capsys.readouterr().err
    assert len(list((cache / base_scores.FOLDER).iterdir())) == 1

    second = evaluate_once(tmp_path, tiny, cache, "second")
    assert len(decoded_models) == 3  # the tuned model only
    assert REUSED in capsys.readouterr().err
    assert second.metrics == first.metrics  # base_* included: what was kept is what decoding gives

    evaluate_once(tmp_path, tiny, cache, "fewer rows", max_examples=3)
    assert len(decoded_models) == 5  # other rows: the base decoded again, and kept beside the first
    assert len(list((cache / base_scores.FOLDER).iterdir())) == 2


def test_a_torn_or_foreign_file_is_no_answer(tmp_path):
    kept = tmp_path / "kept.json"
    base_scores.write(kept, base_scores.Decoded(eval_loss=1.5, answers=["a", "b"], cut=1))
    assert base_scores.read(kept) == base_scores.Decoded(eval_loss=1.5, answers=["a", "b"], cut=1)
    kept.write_text('{"eval_loss": 1.5, "answers": ["a"')
    assert base_scores.read(kept) is None
    kept.write_text('{"eval_loss": "not a number", "answers": []}')
    assert base_scores.read(kept) is None
    assert base_scores.read(tmp_path / "missing.json") is None
    assert [p.name for p in tmp_path.iterdir()] == ["kept.json"]  # no temporary file left


@pytest.mark.slow
def test_a_cache_that_cannot_be_written_costs_time_only(tmp_path, tiny, decoded_models, capsys):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / base_scores.FOLDER).write_text("a file where the folder goes")
    evaluate_once(tmp_path, tiny, cache, "first")
    assert len(decoded_models) == 2
    assert "warning: the base model's answers were not kept" in capsys.readouterr().err


@pytest.mark.slow  # the tiny real model: seconds
def test_an_evaluated_conversation_reports_the_history_it_was_asked(tmp_path, tiny):
    """A conversation is scored as test_evaluate_conversations.py shows; here the whole step, on the tiny model."""
    data = tmp_path / "data"
    data.mkdir()
    system = {"role": "system", "content": "You answer with one word."}
    records = [{"messages": [system, *CONVERSATION.messages]}, {"prompt": PAIR.prompt, "completion": PAIR.completion}]
    (data / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = evaluate_once(tmp_path, tiny, tmp_path / "cache", "chat", dataset_dir=data)
    rows = json.loads(Path(out.report).read_text())["rows"]
    assert rows[0]["messages"] == [system, *CONVERSATION.messages[:3]] and rows[0]["reference"] == "12 the answer"
    assert rows[0]["prompt"].startswith("system: You answer with one word.\nuser: what is 3 plus 4")
    assert "messages" not in rows[1] and (rows[1]["prompt"], rows[1]["reference"]) == (PAIR.prompt, PAIR.completion)
    assert math.isfinite(out.metrics["eval_loss"]) and math.isfinite(out.metrics["base_eval_loss"])
