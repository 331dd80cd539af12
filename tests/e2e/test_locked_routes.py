"""Every route of a real vLLM engine refuses a request without its key; with the key it generates (SE2).

vLLM 0.32's `--api-key` guards /v1, /v2, /inference and /cohere only; on an engine with just that, POST /adapters
loaded an adapter and POST /invocations generated for anyone. The engines eksflow starts load
eksflow.llm.steps.common.vllm_auth, which asks for the key everywhere but GET /health. The routes are read from the
running server (/openapi.json, fetched with the key) and from the app vLLM builds for the engine's args and supported
tasks (tests/e2e/vllm_app_routes.py: the routes the schema leaves out), so a route a vLLM upgrade adds is
checked too. Runs on the session's shared engine (conftest.py), before test_rollout.py, which kills it last
(ENGINE_MODULES, tests/conftest.py).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import requests

from eksflow.llm.steps.common import vllm, vllm_client
from tests.e2e.conftest import BASE_NAME, SharedEngine

pytestmark = pytest.mark.slow
ROUTES_SCRIPT = Path(__file__).with_name("vllm_app_routes.py")
OPEN = {("GET", "/health")}  # the liveness probe (the kubelet sends no key)
# Routes an unguarded engine must never serve: adapters loaded or unloaded, text generated.
DANGEROUS = {
    ("POST", "/adapters"),
    ("DELETE", "/adapters/{adapter_name}"),
    ("POST", "/invocations"),
    ("POST", "/v1/load_lora_adapter"),
    ("POST", "/v1/unload_lora_adapter"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
}


def app_routes(engine: SharedEngine) -> set[tuple[str, str]]:
    """(method, path) of every route of the app the engine's server built (its args, env and supported tasks)."""
    found = re.findall(r"Supported tasks: (.+)$", engine.log.read_text(errors="replace"), re.MULTILINE)
    assert found, f"no 'Supported tasks' line in {engine.log}"
    tasks = list(ast.literal_eval(found[-1].strip()))
    result = subprocess.run(
        [engine.python, str(ROUTES_SCRIPT), json.dumps(tasks), *engine.args],
        env=engine.env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return {(method, path) for method, path in json.loads(result.stdout.strip().splitlines()[-1])}


def test_every_route_of_the_real_engine_refuses_a_request_without_the_key(shared_engine):
    base = shared_engine.url  # it generates with the key (wait_ready sends it)
    started = time.monotonic()  # what this test adds to a session whose engine already runs
    key = shared_engine.api_key
    schema = requests.get(f"{base}/openapi.json", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert schema.status_code == 200
    documented = {(m.upper(), path) for path, ops in schema.json()["paths"].items() for m in ops}
    routes = app_routes(shared_engine)
    assert documented <= routes, documented - routes  # the app built here is the one serving
    assert routes >= DANGEROUS, DANGEROUS - routes  # runtime LoRA updating is on: its routes exist
    refused: dict[tuple[str, str], list[int]] = {}
    wrong = [{}, {"Authorization": "Bearer not-the-key"}, {"Authorization": key}, {"Authorization": f"Basic {key}"}]
    for method, path in sorted(routes - OPEN):
        url = base + re.sub(r"\{[^}/]+\}", "x", path)
        statuses = [requests.request(method, url, headers=h, json={}, timeout=60).status_code for h in wrong]
        if statuses != [401] * len(wrong):
            refused[(method, path)] = statuses
    assert refused == {}, f"answered without the key: {refused}"
    assert requests.get(f"{base}/health", timeout=30).status_code == 200  # liveness needs no key
    assert requests.get(f"{base}/no-such-route", timeout=30).status_code == 401  # not even a 404 without the key
    # With the key: generation, and the adapter listing the rollout reads.
    assert vllm_client.chat(base, BASE_NAME, vllm.READY_PROMPT, api_key=key, max_tokens=2).ok
    assert vllm_client.chat(base, BASE_NAME, vllm.READY_PROMPT, max_tokens=2).status == 401
    assert vllm_client.base_model_card(base, api_key=key) is not None
    print(f"\n{len(routes)} routes refused without the key but {sorted(OPEN)}; {time.monotonic() - started:.1f} s")


CONVERSATION = (
    {"role": "system", "content": "You answer with a date in ISO form."},
    {"role": "user", "content": "When did the Apollo 11 crew land on the Moon?"},
    {"role": "assistant", "content": "1969-07-20"},
    {"role": "user", "content": "And when did they come back to Earth?"},
    {"role": "assistant", "content": "1969-07-24"},
)


def test_the_engine_renders_a_conversation_as_training_and_evaluate_do(shared_engine):
    """No train/serve skew: vLLM's own tokenization of a multi-turn conversation (/tokenize, the model's chat
    template, as /v1/chat/completions applies it) is the token ids training learns from, and of its history with the
    assistant header the ids evaluate generates from; both learned spans are the assistant turns' tokens."""
    from eksflow.llm.steps.common.data import Example
    from eksflow.llm.steps.common.encoding import encode_batch, prompt_texts
    from eksflow.llm.steps.common.modeling import load_tokenizer

    base, key = shared_engine.url, shared_engine.api_key

    def served_ids(messages: list[dict[str, str]], *, asking: bool) -> list[int]:
        body = {"model": BASE_NAME, "messages": messages, "add_generation_prompt": asking}
        answer = requests.post(f"{base}/tokenize", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        assert answer.status_code == 200, answer.text
        return answer.json()["tokens"]

    tokenizer = load_tokenizer(shared_engine.model_dir)
    example = Example(prompt="", completion=CONVERSATION[-1]["content"], messages=CONVERSATION)
    ((ids,), (spans,)) = encode_batch(tokenizer, [example])
    assert served_ids(list(CONVERSATION), asking=False) == ids  # trained on the text the engine is asked with
    (asked,) = prompt_texts(tokenizer, [example.history()])
    assert served_ids(example.history(), asking=True) == tokenizer(asked, add_special_tokens=False)["input_ids"]
    learned = [tokenizer.decode(ids[start:end]) for start, end in spans]
    assert [text.split("<|im_end|>")[0] for text in learned] == ["1969-07-20", "1969-07-24"]


def test_the_engine_serves_an_all_linear_lora_and_refuses_dora(shared_engine):
    """train.lora.target_modules=all-linear (attention and MLP) is an adapter the pinned vLLM serves on the demo
    model, through the fleet's filesystem resolver; a DoRA adapter it refuses (vllm/lora/peft_helper.py), which is
    why register merges one into its base and the rollout serves it as a model (TrainSettings.registers)."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from eksflow.llm.steps.train import LoraSettings

    base, key = shared_engine.url, shared_engine.api_key
    answers = {}
    for name, lora in (("all-linear", LoraSettings(rank=8, target_modules="all-linear")),
                       ("dora", LoraSettings(rank=8, target_modules="all-linear", use_dora=True))):  # fmt: skip
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(shared_engine.model_dir)
        adapter = get_peft_model(model, lora.peft_config())
        for module, param in adapter.named_parameters():
            if "lora_B" in module:  # peft starts B at zero (the base's answers): make the adapter change them
                torch.nn.init.normal_(param, std=0.05)
        adapter.save_pretrained(shared_engine.adapters_dir / f"lora-family-{name}")
        answers[name] = vllm_client.chat(base, f"lora-family-{name}", "What is 2 plus 2?", api_key=key)
    served = answers["all-linear"]
    assert served.status == 200 and served.text, served
    assert served.text != vllm_client.chat(base, BASE_NAME, "What is 2 plus 2?", api_key=key).text
    refused = answers["dora"]
    assert refused.status == 400 and "'lora-family-dora' was found but could not be loaded" in refused.error, refused
    assert "vLLM does not yet support DoRA." in shared_engine.log.read_text(errors="replace")
    assert vllm_client.chat(base, BASE_NAME, "What is 2 plus 2?", api_key=key).ok  # the engine lives on


@pytest.mark.drill  # an engine of its own: one to three minutes to start on 2 cores
def test_an_engine_on_a_chat_template_folder_renders_as_training_does(model_cache, tmp_path):
    """train.chat_template's one mechanism (eksflow/llm/steps/common/chat_template.py): vLLM started on the model
    folder that holds the template applies it, and its /tokenize of a multi-turn conversation is the ids training
    learns from through the same folder; the base model's own template gives other ids."""
    from eksflow.llm.steps.common.base_model import DEMO_MODEL, resolve_model
    from eksflow.llm.steps.common.chat_template import with_template
    from eksflow.llm.steps.common.data import Example
    from eksflow.llm.steps.common.encoding import encode_batch
    from eksflow.llm.steps.common.modeling import load_tokenizer

    template = tmp_path / "chat.jinja"  # ChatML without SmolLM2's default system turn, roles in capitals
    template.write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] | upper }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>ASSISTANT\n{% endif %}"
    )
    base_dir = resolve_model(DEMO_MODEL, model_cache)
    folder = with_template(base_dir, str(template), "", tmp_path / "cache")
    turns = CONVERSATION[1:]  # no system turn: SmolLM2's own template would add its default one
    example = Example(prompt="", completion=turns[-1]["content"], messages=turns)
    ((ids,), _) = encode_batch(load_tokenizer(folder), [example])
    ((own,), _) = encode_batch(load_tokenizer(base_dir), [example])
    assert ids != own
    engine = SharedEngine(folder, tmp_path)
    try:
        body = {"model": BASE_NAME, "messages": list(turns), "add_generation_prompt": False}
        auth = {"Authorization": f"Bearer {engine.api_key}"}
        answer = requests.post(f"{engine.url}/tokenize", json=body, headers=auth, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["tokens"] == ids
    finally:
        engine.stop()
