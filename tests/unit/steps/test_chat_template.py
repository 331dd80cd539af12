"""`train.chat_template`: a Jinja file that gives a base model a chat template, or replaces its own, everywhere a
conversation is rendered (one model folder: eksflow.llm.steps.common.chat_template); bad templates end in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from eksflow.config import load_config
from eksflow.llm.steps import prepare_fleet
from eksflow.llm.steps.common import fleet_names
from eksflow.llm.steps.common.chat_template import (
    FOLDER,
    TEMPLATE_FILE,
    TemplateSettings,
    record,
    recorded,
    serving_problem,
    sha256,
    with_template,
)
from eksflow.llm.steps.common.data import Example
from eksflow.llm.steps.common.encoding import encode_batch, tokenizer_fingerprint
from eksflow.llm.steps.common.modeling import load_tokenizer
from eksflow.llm.steps.train import TrainSettings
from eksflow.render import manifest
from eksflow.run import localized
from eksflow.runtime.args import StepInputError
from pipelines.llama_lora import LlamaLoraConfig, build
from tests.commands import ROOT, python

# Another template than conftest's TEMPLATE (in its words): each turn ends with "the", the answer after "assistant :".
OVERRIDE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} the {% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)
TURNS = (
    {"role": "user", "content": "what is 1 plus 1"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "what is 2 plus 2"},
    {"role": "assistant", "content": "4"},
)


def model_folder(folder: Path, tokenizer) -> Path:
    tokenizer.save_pretrained(folder)  # what load_tokenizer reads
    (folder / "config.json").write_text("{}")
    return folder


def template_file(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_a_base_model_without_a_template_is_refused_naming_train_chat_template_which_gives_one(
    tmp_path, tokenizer_factory
):
    base = model_folder(tmp_path / "base", tokenizer_factory(template=None))
    with pytest.raises(StepInputError, match=r"^the base model has no chat template.*train\.chat_template") as err:
        encode_batch(load_tokenizer(base), [Example("", "", TURNS)])
    assert "\n" not in str(err.value)

    given = template_file(tmp_path / "chat.jinja", OVERRIDE)
    settings = TrainSettings(chat_template=str(given))
    assert settings.chat_template_sha256 == sha256(OVERRIDE)  # in every step's argv: memo keys follow the content
    templated = settings.templated(base, tmp_path / "cache")
    tokenizer = load_tokenizer(templated)
    assert tokenizer.chat_template == OVERRIDE
    [ids], [spans] = encode_batch(tokenizer, [Example("", "", TURNS)])
    assert (
        tokenizer.decode(ids)
        == "user : what is 1 plus 1 the assistant : 2 the user : what is 2 plus 2 the assistant : 4 the"
    )
    assert [tokenizer.decode(ids[start:end]) for start, end in spans] == ["2 the", "4 the"]
    assert not (base / TEMPLATE_FILE).exists()  # the base model's folder is left as it was
    assert (templated / "tokenizer.json").resolve() == (base / "tokenizer.json").resolve()  # linked, not copied


def test_the_option_overrides_the_models_own_template_and_the_token_cache_key_follows_its_content(
    tmp_path, tiny_tokenizer
):
    base = model_folder(tmp_path / "base", tiny_tokenizer)
    assert TemplateSettings().templated(base, tmp_path / "cache") == base  # not set: the model's own template
    given = template_file(tmp_path / "chat.jinja", OVERRIDE)
    first = with_template(base, str(given), "", tmp_path / "cache")
    assert load_tokenizer(first).chat_template == OVERRIDE != tiny_tokenizer.chat_template
    assert with_template(base, str(given), sha256(OVERRIDE), tmp_path / "cache") == first  # made once
    edited = template_file(given, OVERRIDE.replace(" the ", " long "))
    second = with_template(base, str(edited), "", tmp_path / "cache")
    assert second != first
    fingerprints = {tokenizer_fingerprint(load_tokenizer(folder)) for folder in (base, first, second)}
    assert len(fingerprints) == 3  # three token caches: the template is in the key
    assert sorted(p.name for p in (tmp_path / "cache" / FOLDER).iterdir() if not p.name.startswith(".")) == sorted(
        [first.name, second.name]
    )


def test_a_template_pasted_as_a_value_is_refused_in_one_line_saying_to_give_a_file(tmp_path):
    with pytest.raises(ValidationError, match="give the template as a file"):
        TrainSettings(chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    flagship = str(ROOT / "pipelines" / "llama_lora.py")
    done = python(flagship, "run", "--set", "train.chat_template={{ messages }}", "--state-dir", str(tmp_path / "s"))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("config error: train.chat_template: ") and "give the template as a file" in line, line
    assert not (tmp_path / "s").exists()


def test_a_missing_template_file_is_refused_before_the_run_and_by_the_step(tmp_path, tiny_tokenizer):
    missing = str(tmp_path / "nope.jinja")
    assert TrainSettings(chat_template=missing).local_problems() == [
        f"chat_template {missing!r} cannot be read (No such file or directory); give a Jinja file"
    ]
    base = model_folder(tmp_path / "base", tiny_tokenizer)
    with pytest.raises(StepInputError, match=r"^train\.chat_template '.*nope\.jinja' cannot be read"):
        with_template(base, missing, "", tmp_path / "cache")


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}{{ oops( ) }}{% endif %}",
         "cannot render a conversation"),
        ("{% for m in messages %}{% if m['role'] == 'assistant' %}{{ raise_exception('users only') }}{% endif %}"
         "{{ m['content'] }}{% endfor %}", "cannot render a conversation (TemplateError: users only)"),
        ("{% for m in messages %}{% if m['role'] != 'assistant' %}{{ m['content'] }} {% endif %}{% endfor %}",
         "without its assistant turns' text"),
        ("{{ messages | length }}{% for m in messages %} {{ m['content'] }}{% endfor %}",
         "as no prefix of the whole conversation"),
    ],
    ids=["undefined", "raises", "drops-answers", "rewrites-history"],
)  # fmt: skip
def test_a_template_that_cannot_render_a_conversation_is_refused_and_nothing_is_kept(
    tmp_path, tiny_tokenizer, template, why
):
    base = model_folder(tmp_path / "base", tiny_tokenizer)
    given = template_file(tmp_path / "chat.jinja", template)
    with pytest.raises(StepInputError, match=r"^train\.chat_template '.*chat\.jinja' ") as err:
        with_template(base, str(given), "", tmp_path / "cache")
    assert why in str(err.value) and "\n" not in str(err.value)
    assert [p for p in (tmp_path / "cache" / FOLDER).iterdir() if not p.name.endswith(".lock")] == []


def test_a_template_edited_after_the_config_loaded_is_refused(tmp_path, tiny_tokenizer):
    given = template_file(tmp_path / "chat.jinja", OVERRIDE)
    loaded = TrainSettings(chat_template=str(given))
    template_file(given, OVERRIDE + " ")
    with pytest.raises(ValidationError, match="changed since the config was loaded"):
        TrainSettings(**loaded.model_dump())  # the step parsing the run's argv
    base = model_folder(tmp_path / "base", tiny_tokenizer)
    with pytest.raises(StepInputError, match="changed since the config was loaded"):
        loaded.templated(base, tmp_path / "cache")


def test_a_relative_file_is_the_callers_and_every_chat_rendering_task_gets_it_with_its_digest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where `run` starts: the file is read and made absolute against it
    template_file(tmp_path / "chat.jinja", OVERRIDE)
    cfg = localized(load_config(LlamaLoraConfig, None, ["train.chat_template=chat.jinja"]), tmp_path)
    assert cfg.train.chat_template == str(tmp_path / "chat.jinja")

    def rendered(config: LlamaLoraConfig) -> dict[str, list[str]]:
        templates = manifest(build(config))["spec"]["templates"]
        return {t["name"]: t["container"]["args"] for t in templates if "container" in t}

    def memo_keys(config: LlamaLoraConfig) -> dict[str, str]:
        templates = manifest(build(config))["spec"]["templates"]
        return {t["name"]: t["memoize"]["key"] for t in templates if "memoize" in t}

    args = rendered(cfg)
    given = [f"--chat-template={tmp_path / 'chat.jinja'}", f"--chat-template-sha256={sha256(OVERRIDE)}"]
    for name in ("validate-data", "train", "evaluate"):
        assert all(a in args[name] for a in given), (name, args[name])
    before = memo_keys(cfg)
    template_file(tmp_path / "chat.jinja", OVERRIDE.replace(" the ", " long "))
    after = memo_keys(localized(load_config(LlamaLoraConfig, None, ["train.chat_template=chat.jinja"]), tmp_path))
    assert before["train"] != after["train"] and before["evaluate"] != after["evaluate"]
    assert json.dumps(before) != json.dumps(after)


def test_the_fleet_serves_the_templated_folder_on_a_fleet_of_its_own(tmp_path, tiny_tokenizer):
    base = model_folder(tmp_path / "base", tiny_tokenizer)
    given = template_file(tmp_path / "chat.jinja", OVERRIDE)

    def prepared(*template: str) -> prepare_fleet.Outputs:
        flags = [f"--base-model={base}", f"--model-cache-dir={tmp_path / 'cache'}", "--pipeline=llama-lora"]
        flags += ["--namespace=argo", f"--serving-dir={tmp_path / 'adapters'}", f"--outputs-dir={tmp_path / 'out'}"]
        return prepare_fleet.run(prepare_fleet.Args.from_argv([*flags, *template]))

    plain, templated = prepared(), prepared(f"--chat-template={given}")
    assert plain.model_dir == str(base) and plain.fleet == fleet_names.fleet_name("llama-lora", str(base))
    assert load_tokenizer(Path(templated.model_dir)).chat_template == OVERRIDE  # what vLLM's --model is
    assert templated.fleet != plain.fleet  # one engine applies one template: the champion's keeps its own


def test_the_training_run_keeps_the_template_make_serve_reads_it_and_a_fleet_of_another_is_refused(
    tmp_path, tiny_tokenizer
):
    from eksflow.llm.steps.common import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    given = template_file(tmp_path / "chat.jinja", OVERRIDE)
    settings = TrainSettings(chat_template=str(given))

    def training_run(params: dict[str, str]) -> str:
        run_id = tracking.start_run(uri, "llama-lora", "wf", {})
        tracking.log_params(uri, run_id, params)
        return run_id

    trained = training_run(settings.template_settings.model_dump())
    record(uri, trained, settings)
    served = recorded(uri, trained, tmp_path / "serve")
    assert Path(served.chat_template).read_text() == OVERRIDE and served.chat_template_sha256 == sha256(OVERRIDE)
    assert recorded(uri, training_run(TemplateSettings().model_dump()), tmp_path / "serve") == TemplateSettings()
    lost = training_run(settings.template_settings.model_dump())  # the digest logged, the file never
    with pytest.raises(StepInputError, match=r"trained with train\.chat_template .* holds no copy of it") as err:
        recorded(uri, lost, tmp_path / "serve")
    assert "\n" not in str(err.value)
    # load-candidate: a version is served only by a fleet whose engine applies the template it was trained with
    base = model_folder(tmp_path / "base", tiny_tokenizer)
    fleet = settings.templated(base, tmp_path / "cache")
    own = training_run(TemplateSettings().model_dump())
    assert serving_problem(uri, trained, fleet) is None and serving_problem(uri, own, base) is None
    assert serving_problem(uri, trained, base) == (
        f"it was trained through train.chat_template's file (sha256 {sha256(OVERRIDE)[:12]}), and this fleet serves "
        "the base model's own template: roll it out with the train.chat_template it was trained with"
    )
    assert "it was trained through the base model's own template" in str(serving_problem(uri, own, fleet))
    whole = model_folder(tmp_path / "whole", load_tokenizer(fleet))  # a full fine-tune saves the tokenizer it trained
    assert (whole / TEMPLATE_FILE).read_text() == OVERRIDE and serving_problem(uri, trained, whole) is None
