"""Evaluate asks a held-out conversation with its whole history through the chat template (the text a served model
is asked with, and training learned the answer after) and scores its loss on the last assistant turn only (the
reference its answer is compared with); a prompt-completion pair is asked and scored as before."""

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from eksflow.llm.steps.common.data import Example
from eksflow.llm.steps.common.encoding import encode_batch
from eksflow.llm.steps.common.modeling import encode_example
from eksflow.llm.steps.evaluate import base_scores, scoring
from eksflow.runtime.outputs import Progress
from tests.unit.steps.conftest import make_tokenizer
from tests.unit.steps.test_evaluate_generate import tiny_model  # noqa: F401 (a pytest fixture)

TURNS = (
    {"role": "user", "content": "what is 3 plus 4"},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": "what is the answer plus 5"},
    {"role": "assistant", "content": "12 the answer"},
)
CONVERSATION = Example(prompt="user: what is 3 plus 4\nassistant: 7\nuser: what is the answer plus 5",
                       completion="12 the answer", messages=TURNS)  # fmt: skip
PAIR = Example(prompt="what is 3 plus 5", completion="8")


def recording_tokenizer() -> tuple[Any, list[str]]:
    """The tests' tokenizer (tests/unit/steps/conftest.py), keeping every text it is asked to tokenize."""
    tokenizer = make_tokenizer()
    texts: list[str] = []

    class Recording(type(tokenizer)):  # type: ignore[misc]
        def __call__(self, text: Any, *args: Any, **kwargs: Any) -> Any:
            texts.extend([text] if isinstance(text, str) else text)
            return super().__call__(text, *args, **kwargs)

    tokenizer.__class__ = Recording
    return tokenizer, texts


def test_a_conversation_is_asked_with_its_whole_history_through_the_chat_template(tiny_model):  # noqa: F811
    import torch

    tokenizer, texts = recording_tokenizer()
    history = list(TURNS[:3])
    asked = tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=False)
    with Progress(4, "evaluate") as progress, torch.inference_mode():
        decoded = scoring._decode(tiny_model, tokenizer, [CONVERSATION, PAIR], SimpleNamespace(batch_size=2), 4,
                                  progress)  # fmt: skip
    assert asked == "user: what is 3 plus 4 assistant: 7 user: what is the answer plus 5 assistant: "
    assert asked in texts  # the exact text the conversation was generated from
    flattened = tokenizer.apply_chat_template([{"role": "user", "content": CONVERSATION.prompt}],
                                              add_generation_prompt=True, tokenize=False)  # fmt: skip
    assert flattened not in texts  # not its "role: content" lines as one user turn
    pair = tokenizer.apply_chat_template([{"role": "user", "content": PAIR.prompt}], add_generation_prompt=True,
                                         tokenize=False)  # fmt: skip
    assert pair in texts  # a pair: its prompt as one user turn, as before
    assert len(decoded.answers) == 2 and math.isfinite(decoded.eval_loss)


def test_a_conversations_loss_falls_on_its_last_assistant_turn_only(tiny_model):  # noqa: F811
    import torch

    tokenizer = make_tokenizer()
    whole = tokenizer(tokenizer.apply_chat_template(list(TURNS), tokenize=False))["input_ids"]

    def loss_over(turn: int) -> float:
        """Mean cross-entropy over the tokens of assistant turn `turn` (its content after the template's header)."""
        before = tokenizer.apply_chat_template(list(TURNS[:turn]), add_generation_prompt=True, tokenize=False)
        through = tokenizer.apply_chat_template(list(TURNS[: turn + 1]), tokenize=False)
        start, end = len(tokenizer(before)["input_ids"]), len(tokenizer(through)["input_ids"])
        with torch.inference_mode():
            logits = tiny_model(input_ids=torch.tensor([whole])).logits[0]
        return float(torch.nn.functional.cross_entropy(logits[start - 1 : end - 1], torch.tensor(whole[start:end])))

    with Progress(1, "evaluate") as progress, torch.inference_mode():
        scored = scoring._completion_loss(tiny_model, tokenizer, [CONVERSATION], SimpleNamespace(batch_size=1),
                                          progress)  # fmt: skip
    assert scored == pytest.approx(loss_over(3), rel=1e-5)
    every_turn = (loss_over(1) + 2 * loss_over(3)) / 3  # "7" is one token, "12 the answer" three
    assert scored != pytest.approx(every_turn, rel=1e-5)  # near-uniform random weights: 7e-4 apart, not noise


@pytest.mark.parametrize(("prompt", "completion"), [("what is 3 plus 5", "8"), ("q", "a long story"), ("", "x y")])
@pytest.mark.parametrize("max_len", [4096, 6, 3])
def test_a_pairs_scored_tokens_are_the_completion_as_training_learned_it(tiny_tokenizer, prompt, completion, max_len):
    ids, spans = encode_batch(tiny_tokenizer, [Example(prompt, completion)])
    assert scoring.answer_labels(ids[0], spans[0][-1], max_len) == tuple(
        encode_example(tiny_tokenizer, prompt, completion, max_len)
    )


def test_the_base_answers_are_kept_per_conversation_not_per_prompt_shown(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    called = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]}]

    def kept(arguments: str) -> Path:
        turns = json.loads(json.dumps(called))
        turns[1]["tool_calls"][0]["function"]["arguments"] = arguments
        turns += [
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "assistant", "content": "Sunny."},
        ]
        example = Example(prompt="the same lines shown", completion="Sunny.", messages=tuple(turns))
        return base_scores.cache_file(tmp_path / "cache", model, [example], {"batch_size": 1}, [])

    assert kept('{"city": "Paris"}') == kept('{"city": "Paris"}')
    assert kept('{"city": "Paris"}') != kept('{"city": "Oslo"}')  # another history: another answer
