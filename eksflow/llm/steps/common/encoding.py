"""Batched tokenization through the model's chat template: token ids and the spans of them a model learns.

A prompt-completion pair is the prompt as one user turn up to where the answer starts, then the completion and EOS,
exactly as `modeling.encode_example` makes it; the completion and EOS are learned. A conversation (`Example.messages`)
is its whole text as the template renders it, tokenized once; each assistant turn is learned (its content and
end-of-turn marker, not its header), nothing else: system, user and tool turns are what the model is asked with.

An assistant turn's span is found on characters: from the end of the text the template gives for the turns before
it with the generation prompt (where a served model starts answering) to the end of the text it gives for the turns
through it. Both must be prefixes of the whole text (a template that rewrites earlier turns as a conversation grows
is refused for that record), and the fast tokenizer's offsets map the characters to tokens.

One call tokenizes a few thousand examples through the fast (Rust) tokenizer's batch API instead of one or two calls
per example: the per-call Python overhead, not the tokenizing, is what made one-at-a-time encoding slow. Ids are
kept untruncated (a consumer cuts them to its max_seq_len), so one tokenized copy serves every sequence length.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from eksflow.errors import EXIT_BAD_INPUT
from eksflow.llm.steps.common.data import Example
from eksflow.runtime.args import StepInputError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Bump when encode_batch changes what it returns: it is part of every tokenized cache's key.
ENCODING_VERSION = 2
# Examples per tokenizer call: large enough that Python's per-call overhead vanishes (measured flat from ~512 up
# on SmolLM2's tokenizer), small enough that a batch's Python lists stay a few MB.
BATCH = 2048

Span = tuple[int, int]  # [start, end) token positions a model learns


class ConversationError(StepInputError):
    """A conversation the chat template cannot turn into learned tokens; `index` is its position in the batch."""

    label = "error"
    exit_code = EXIT_BAD_INPUT

    def __init__(self, index: int, turn: int, reason: str) -> None:
        super().__init__(f"turn {turn + 1}: {reason}")
        self.index = index


def require_chat_template(tokenizer: PreTrainedTokenizerBase) -> None:
    """Raise StepInputError when the tokenizer has no chat template to ask, train and serve the model through."""
    if not getattr(tokenizer, "chat_template", None):
        raise StepInputError(
            "the base model has no chat template, which eksflow trains, evaluates and serves it through: give one "
            "as a Jinja file in train.chat_template, or choose a base model that has one (an instruct or chat model)"
        )


def chat_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` as vLLM's /v1/chat/completions hands them to the template.

    A tool call's `arguments`, a JSON string in OpenAI's shape, is decoded to the object templates expect (as vLLM
    does), so that training renders the text the served model is asked with.
    """
    rendered = []
    for message in messages:
        calls = message.get("tool_calls")
        decoded = [_decoded_call(call) for call in calls] if isinstance(calls, list) else calls
        rendered.append({**message, "tool_calls": decoded} if isinstance(calls, list) else dict(message))
    return rendered


def _decoded_call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except json.JSONDecodeError as err:
        raise StepInputError(f"tool call arguments are not JSON ({err.msg})") from err
    if not isinstance(arguments, dict):
        raise StepInputError(f"tool call arguments are a JSON {type(arguments).__name__}, expected an object")
    return {**call, "function": {**function, "arguments": arguments}}


def prompt_texts(tokenizer: PreTrainedTokenizerBase, histories: Sequence[list[dict[str, Any]]]) -> list[str]:
    """Each history (`Example.history()`) in the chat template up to where the answer starts.

    For a pair's history (one user turn) this is the text `modeling.prompt_text` gives.
    """
    require_chat_template(tokenizer)
    texts = tokenizer.apply_chat_template(
        [chat_messages(h) for h in histories], add_generation_prompt=True, tokenize=False
    )
    return [str(t) for t in texts]


def encode_batch(
    tokenizer: PreTrainedTokenizerBase, examples: Sequence[Example]
) -> tuple[list[list[int]], list[list[Span]]]:
    """Token ids (untruncated) and the learned token spans [start, end), in order, of each example.

    A pair: one span (prompt_len, len(ids)), equal to `modeling.encode_example(tokenizer, p, c, max_len)` once cut
    to max_len. A conversation: one span per assistant turn. Raises StepInputError without a chat template, and
    ConversationError for a conversation the template cannot render turn by turn, or whose assistant turn it
    renders empty (a turn the model would be trained on without seeing it).
    """
    if not examples:
        return [], []
    require_chat_template(tokenizer)
    ids: list[list[int]] = [[] for _ in examples]
    spans: list[list[Span]] = [[] for _ in examples]
    pairs = [i for i, e in enumerate(examples) if not e.messages]
    if pairs:
        prompts = prompt_texts(tokenizer, [examples[i].history() for i in pairs])
        prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
        eos = tokenizer.eos_token or ""
        answer_ids = tokenizer([examples[i].completion + eos for i in pairs], add_special_tokens=False)["input_ids"]
        for i, prompt, answer in zip(pairs, prompt_ids, answer_ids, strict=True):
            ids[i], spans[i] = prompt + answer, [(len(prompt), len(prompt) + len(answer))]
    conversations = [i for i, e in enumerate(examples) if e.messages]
    if conversations:
        if not tokenizer.is_fast:
            raise StepInputError("conversations need the base model's fast tokenizer (its tokenizer.json)")
        rendered = [_rendered(tokenizer, i, examples[i].messages) for i in conversations]
        encoded = tokenizer([text for text, _ in rendered], add_special_tokens=False, return_offsets_mapping=True)
        special = _special_tokens(tokenizer)
        for i, (text, chars), row, offsets in zip(
            conversations, rendered, encoded["input_ids"], encoded["offset_mapping"], strict=True
        ):
            ids[i], spans[i] = row, _token_spans(i, text, chars, offsets, special)
    return ids, spans


def _rendered(
    tokenizer: PreTrainedTokenizerBase, index: int, messages: Sequence[dict[str, Any]]
) -> tuple[str, dict[int, Span]]:
    """The conversation's whole text and, per assistant turn, its character span [start, end) in that text."""

    def render(turn: int, upto: int, generation: bool) -> str:
        try:
            text = tokenizer.apply_chat_template(
                chat_messages(messages[:upto]), add_generation_prompt=generation, tokenize=False
            )
        except Exception as err:  # the template is the model's own Jinja: whatever it raises is about this record
            tools = any("tool_calls" in m or m.get("role") == "tool" for m in messages[:upto])
            what = "tool calls or tool results (choose a base model whose template does)" if tools else "it"
            raise ConversationError(index, turn, f"the base model's chat template cannot render {what}: {err}") from err
        return str(text)

    prefixes = {  # rendered in turn order, so that a turn the template fails on is the one named
        turn: (render(turn, turn, True), render(turn, turn + 1, False))
        for turn, message in enumerate(messages)
        if message.get("role") == "assistant"
    }
    whole = render(len(messages) - 1, len(messages), False)
    chars: dict[int, Span] = {}
    for turn, (before, through) in prefixes.items():
        if not (whole.startswith(before) and whole.startswith(through) and len(before) <= len(through)):
            raise ConversationError(
                index,
                turn,
                "the chat template renders the conversation up to this assistant turn differently from the whole "
                "conversation (it rewrites earlier turns), so its tokens cannot be told apart",
            )
        chars[turn] = (len(before), len(through))
    return whole, chars


def _special_tokens(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return sorted({*tokenizer.all_special_tokens, *(str(t) for t in added.values() if t.special)}, key=len)[::-1]


def _token_spans(
    index: int, text: str, chars: dict[int, Span], offsets: Sequence[Span], special: Sequence[str]
) -> list[Span]:
    """The tokens lying inside each character span (offsets: each token's characters, in order)."""
    starts = [start for start, _ in offsets]
    ends = [end for _, end in offsets]
    spans = []
    for turn, (first, last) in chars.items():
        visible = text[first:last]
        for token in special:
            visible = visible.replace(token, "")
        start = bisect.bisect_left(starts, first)
        end = max(start, bisect.bisect_right(ends, last))
        if not visible.strip() or start == end:
            raise ConversationError(
                index,
                turn,
                f"the chat template renders this assistant turn empty ({text[first:last]!r}; a template that does not "
                "render tool_calls?): the model would learn an answer it cannot see",
            )
        spans.append((start, end))
    return spans


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """sha256 of what decides `encode_batch`'s output: vocabulary and rules, chat template, EOS, and probes.

    The probes (a pair and a two-turn conversation, encoded) catch what the serialized tokenizer does not show, such
    as a template that adds a system turn. A template that cannot encode the conversation probe records why.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    rules = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    pair = encode_batch(tokenizer, [Example("What is 2 + 2?", "4")])
    turns = (
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
    )
    try:
        conversation: Any = encode_batch(tokenizer, [Example("", "4", turns)])
    except StepInputError as err:
        conversation = str(err)
    parts = [
        str(ENCODING_VERSION),
        type(tokenizer).__name__,
        rules,
        str(getattr(tokenizer, "chat_template", "") or ""),
        str(tokenizer.eos_token),
        json.dumps([pair, conversation]),
    ]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()
