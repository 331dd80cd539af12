"""Tokenization through the chat template: a pair keeps exactly its old ids and labels, a conversation learns
every assistant turn (content and end-of-turn marker) and nothing else, and what cannot be learned is refused."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from eksflow.llm.steps.common import encoding
from eksflow.llm.steps.common.base_model import DEMO_MODEL, default_cache_dir, resolve_model
from eksflow.llm.steps.common.data import Example
from eksflow.llm.steps.common.encoding import ConversationError, encode_batch, prompt_texts
from eksflow.llm.steps.common.modeling import IGNORE_INDEX, encode_example, load_tokenizer, prompt_text, truncated
from eksflow.llm.steps.common.token_cache import ensure
from eksflow.runtime.args import StepInputError

# ChatML with tool calls rendered as Qwen2.5's template renders them (the demo model's own template renders none)
TOOL_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{% for c in m.get('tool_calls') or [] %}{{ '<tool_call>' + ({'name': c['function']['name'], 'arguments': "
    "c['function']['arguments']} | tojson) + '</tool_call>' }}{% endfor %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}
TOOL_CONVERSATION = (
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "4"},
    {"role": "assistant", "content": "It is 4."},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "You are welcome."},
)
# what each assistant turn of TOOL_CONVERSATION is in TOOL_TEMPLATE's text: its content and end of turn, no header
TOOL_ANSWERS = [
    '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 2}}</tool_call><|im_end|>\n',
    "It is 4.<|im_end|>\n",
    "You are welcome.<|im_end|>\n",
]
ODD = ["", " ", "  leading and trailing  ", "é 😀 中文", "line\nbreaks\r\n\ttab", "<|im_end|> in text", "a" * 300]


@pytest.fixture(scope="module")
def demo_tokenizer() -> Any:
    return load_tokenizer(resolve_model(DEMO_MODEL, default_cache_dir()))


@pytest.fixture(scope="module")
def tool_tokenizer(demo_tokenizer: Any) -> Any:
    tokenizer = copy.deepcopy(demo_tokenizer)
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


def learned_text(tokenizer: Any, example: Example) -> tuple[list[int], list[str]]:
    [ids], [spans] = encode_batch(tokenizer, [example])
    return ids, [tokenizer.decode(ids[start:end]) for start, end in spans]


def test_a_pair_keeps_exactly_the_ids_and_labels_of_encode_example(demo_tokenizer):
    pairs = [("What is 2 + 2?", "4"), *((p, c) for p in ODD for c in ("4", *ODD[2:5]))]
    ids, spans = encode_batch(demo_tokenizer, [Example(p, c) for p, c in pairs])
    for (prompt, completion), row, learned in zip(pairs, ids, spans, strict=True):
        assert row == encode_example(demo_tokenizer, prompt, completion, 10_000)[0]
        assert len(learned) == 1 and learned[0][1] == len(row)
        for max_len in (1, learned[0][0], learned[0][0] + 1, len(row) - 1, len(row), 10_000):
            assert truncated(row, learned, max_len) == encode_example(demo_tokenizer, prompt, completion, max_len)
    histories = [Example(p, c).history() for p, c in pairs]
    assert prompt_texts(demo_tokenizer, histories) == [prompt_text(demo_tokenizer, p) for p, _ in pairs]


def test_a_conversation_learns_each_assistant_turn_and_nothing_else(tool_tokenizer):
    example = Example("shown only", "You are welcome.", TOOL_CONVERSATION)
    ids, learned = learned_text(tool_tokenizer, example)
    assert learned == TOOL_ANSWERS  # no system, user or tool token, no assistant header
    whole = tool_tokenizer.apply_chat_template(encoding.chat_messages(TOOL_CONVERSATION), tokenize=False)
    assert ids == tool_tokenizer(whole, add_special_tokens=False)["input_ids"]  # the whole text, tokenized once
    labels = truncated(ids, encode_batch(tool_tokenizer, [example])[1][0], len(ids))[1]
    assert tool_tokenizer.decode([t for t in labels if t != IGNORE_INDEX]) == "".join(TOOL_ANSWERS)
    # asked as vLLM asks it: the history, arguments decoded, ending where the last answer starts
    [asked] = prompt_texts(tool_tokenizer, [example.history()])
    assert asked + TOOL_ANSWERS[-1] == whole


def test_the_demo_models_own_template_learns_its_assistant_turns(demo_tokenizer):
    turns = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"})
    turns += ({"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2 + 2?"})
    turns += ({"role": "assistant", "content": "4"},)
    _, learned = learned_text(demo_tokenizer, Example("", "4", turns))
    assert learned == ["Hello!<|im_end|>\n", "4<|im_end|>\n"]


def test_a_turn_the_template_cannot_show_is_refused_naming_it(demo_tokenizer, tokenizer_factory):
    silent_call = dict(TOOL_CONVERSATION[2], content="")  # the demo template renders no tool_calls
    conversation = (*TOOL_CONVERSATION[:2], silent_call, *TOOL_CONVERSATION[3:])
    with pytest.raises(ConversationError, match=r"^turn 3: the chat template renders this assistant turn empty"):
        encode_batch(demo_tokenizer, [Example("", "", conversation)])
    with pytest.raises(ConversationError, match=r"^turn 3: the base model.s chat template cannot render tool calls"):
        encode_batch(demo_tokenizer, [Example("", "", TOOL_CONVERSATION)])  # content None: the template fails
    counting = tokenizer_factory(
        template="{{ messages | length }} {% for m in messages %}{{ m['content'] }} {% endfor %}"
    )
    with pytest.raises(ConversationError, match=r"^turn 2: the chat template renders the conversation up to"):
        encode_batch(counting, [Example("", "", TOOL_CONVERSATION[1:2] + TOOL_CONVERSATION[4:5] * 2)])
    no_template = tokenizer_factory(template=None)
    for call in (lambda: encode_batch(no_template, [Example("q", "a")]), lambda: prompt_texts(no_template, [[]])):
        with pytest.raises(StepInputError, match=r"^the base model has no chat template, .*train\.chat_template"):
            call()


def test_a_truncated_conversation_learns_only_its_tokens_inside_max_len(tool_tokenizer):
    [ids], [spans] = encode_batch(tool_tokenizer, [Example("", "", TOOL_CONVERSATION)])
    max_len = (spans[1][0] + spans[1][1]) // 2  # inside the second assistant turn
    kept, labels = truncated(ids, spans, max_len)
    assert kept == ids[:max_len] and len(labels) == max_len
    learned = [i for i, label in enumerate(labels) if label != IGNORE_INDEX]
    assert learned == [*range(*spans[0]), *range(spans[1][0], max_len)]
    assert all(labels[i] == ids[i] for i in learned)


def test_the_cache_keeps_spans_refuses_a_bad_line_and_rebuilds_on_a_new_encoding(
    tmp_path, tool_tokenizer, demo_tokenizer, monkeypatch
):
    split = tmp_path / "train.jsonl"
    pair = json.dumps({"prompt": "What is 2 + 2?", "completion": "4"})
    split.write_text(f"{json.dumps({'messages': TOOL_CONVERSATION})}\n{pair}\n", encoding="utf-8")
    cache, built = ensure(split, tool_tokenizer, tmp_path / "cache")
    expected = encode_batch(tool_tokenizer, [Example("", "", TOOL_CONVERSATION), Example("What is 2 + 2?", "4")])
    rows = [cache.example(r) for r in range(cache.rows)]
    assert built and ([ids.tolist() for ids, _ in rows], [spans for _, spans in rows]) == expected
    monkeypatch.setattr(encoding, "ENCODING_VERSION", encoding.ENCODING_VERSION + 1)
    rebuilt, built = ensure(split, tool_tokenizer, tmp_path / "cache")
    assert built and rebuilt.folder != cache.folder
    silent_call = dict(TOOL_CONVERSATION[2], content="")
    bad = {"messages": [*TOOL_CONVERSATION[:2], silent_call, *TOOL_CONVERSATION[3:]]}
    split.write_text(f"{pair}\n{json.dumps(bad)}\n", encoding="utf-8")
    with pytest.raises(StepInputError, match=rf"^{split}:2: turn 3: the chat template renders this assistant"):
        ensure(split, demo_tokenizer, tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]  # nothing half-written
