"""`train.chat_template`: a Jinja chat template, given as a file, that replaces the base model's own.

One mechanism wherever a conversation becomes text: the template is written into a model folder of its own, the
base model's files linked into it, its tokenizer_config.json without a template and the file as
chat_template.jinja, which transformers and vLLM both read as the tokenizer's chat template. Train, validate_data
and evaluate load that folder as they load any model; vLLM started on it (`--model`) applies it to every
/v1/chat/completions request by itself. A `--chat-template` flag on the engine, or a ConfigMap, would be a second copy
that the Deployment, `make serve` and the steps could each get wrong; a model folder is already what all of them load.

The folder is named by the base folder and the template's sha256: a changed file makes a new folder, the token
cache's key changes with the tokenizer's template (encoding.tokenizer_fingerprint), and `chat_template_sha256`, taken
from the file when the config loads and checked by the step, puts its content into every memo key.
"""

from __future__ import annotations

import hashlib
import json
import os
import typing
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from eksflow.llm.steps.common.base_model import publish
from eksflow.llm.steps.common.storage import local_path
from eksflow.runtime.args import Location, Settings, StepInputError

TEMPLATE_FILE = "chat_template.jinja"  # what transformers (>= 4.43) and vLLM read as a folder's chat template
TOKENIZER_CONFIG = "tokenizer_config.json"
LEGACY_TEMPLATE_FILE = "chat_template.json"  # an older place for it, read before the tokenizer config's
FOLDER = "templated"  # under the model cache: <base folder name>-<16 hex>
TEMPLATE_ARTIFACT = "chat_template"  # the training run's copy of the file (MLflow artifact path)
DIGEST_FILE = "eksflow-chat-template.sha256"  # in a templated folder: its template's digest (what a fleet serves)
_JINJA = ("{{", "{%")
# A conversation every chat template must render: each turn's text must appear in what it renders. No system turn:
# some models' templates refuse one (a record that has one is refused by encoding.encode_batch, naming it).
PROBE = (
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3 + 3?"},
    {"role": "assistant", "content": "6"},
)


class TemplateSettings(Settings):
    """The chat template a step renders conversations with: the base model's own, or the file `chat_template` names.

    The train section's settings (`train.chat_template`); every other step that renders chat (validate_data,
    evaluate, prepare_fleet, serve) takes the same two fields from it.
    """

    chat_template: Location = Field(
        "",
        description="a Jinja chat template file that replaces the base model's own in training, evaluate and "
        "serving (a path, relative to where `run` starts, or on the FSx volume); empty: the model's own",
    )
    chat_template_sha256: str = Field(
        "",
        pattern=r"^([0-9a-f]{64})?$",
        description="set from chat_template's file where the config loads (memo keys follow the file's content) "
        "and checked by each step; leave it empty",
    )

    @field_validator("chat_template")
    @classmethod
    def _a_template_file(cls, reference: str) -> str:
        if problem := value_problem(reference):
            raise ValueError(problem)
        return reference

    @model_validator(mode="before")
    @classmethod
    def _template_digest(cls, data: Any) -> Any:
        return settings_with_digest(data)

    def localized(self, base: Path) -> typing.Self:
        """These settings with a relative chat_template made absolute against `base` (where `run` started)."""
        if not self.chat_template or "://" in self.chat_template or Path(self.chat_template).is_absolute():
            return self
        return self.model_copy(update={"chat_template": os.path.abspath(base / self.chat_template)})

    def local_problems(self) -> list[str]:
        """`chat_template ...: problem` when its file cannot be read here (asked by `run` before anything starts)."""
        if not self.chat_template:
            return []
        try:
            read_template(self.chat_template, "chat_template")
        except StepInputError as err:
            return [str(err)]
        return []

    @property
    def template_settings(self) -> TemplateSettings:
        """Just these two settings: the section a pipeline gives the steps besides train that render chat."""
        return TemplateSettings(chat_template=self.chat_template, chat_template_sha256=self.chat_template_sha256)

    def template_digest(self) -> str:
        """The template file's sha256 now; "" for the model's own template."""
        return sha256(read_template(self.chat_template)) if self.chat_template else ""

    def templated(self, base_dir: Path, cache_dir: Path) -> Path:
        """The model folder a step loads: `base_dir`, or its folder with this template (`with_template`)."""
        return with_template(base_dir, self.chat_template, self.chat_template_sha256, cache_dir)


def value_problem(value: str) -> str | None:
    """Why `value` is not a template file's path (no I/O), or None; an empty value is the model's own template."""
    if "\x00" in value:
        return "holds a NUL byte, which no file's path does: give the template file's path"
    if any(marker in value for marker in _JINJA):
        return (
            "holds Jinja ('{{' or '{%'): give the template as a file, e.g. chat_template: templates/chat.jinja, "
            "not its text"
        )
    if "://" in value and not value.startswith("file://"):
        return "is a file of this machine or the FSx volume: give a path or file:///absolute/path"
    return None


def read_template(reference: str, name: str = "train.chat_template") -> str:
    """The template file's text; StepInputError naming setting `name` when it is missing, unreadable or empty."""
    path = local_path(reference)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise StepInputError(f"{name} {reference!r} cannot be read ({reason}); give a Jinja file") from err
    if not text.strip():
        raise StepInputError(f"{name} {reference!r} is empty; give a Jinja chat template")
    return text


def sha256(text: str) -> str:
    """The template's digest: what names its model folder and enters memo keys."""
    return hashlib.sha256(text.encode()).hexdigest()


def settings_with_digest(data: Any) -> Any:
    """Settings `data` (as given) with `chat_template_sha256` of the template file, where it can be read here.

    Where it cannot (a path on the cluster's FSx volume, rendered on a laptop) the digest stays as given: the step
    reads the file, and refuses a missing one. A digest given that the file no longer has is refused: the template
    was edited after the run's config was loaded.
    """
    reference = data.get("chat_template") if isinstance(data, dict) else None
    if not isinstance(reference, str) or not reference or value_problem(reference):
        return data  # no template, or one its field's validator refuses, saying why
    try:
        text = local_path(reference).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return data
    digest, given = sha256(text), data.get("chat_template_sha256")
    if given and given != digest:
        raise ValueError(
            f"chat_template {reference!r} changed since the config was loaded (sha256 {digest[:12]}, expected "
            f"{str(given)[:12]}): start the run again to use the new template"
        )
    return {**data, "chat_template_sha256": digest}


def with_template(model_dir: Path, reference: str, expected_sha256: str, cache_dir: Path) -> Path:
    """The model folder to load: `model_dir` itself without a template file, else its folder with that template.

    `expected_sha256` (the digest taken when the config loaded; empty: not known) must be the file's now: a template
    edited after the run started would train one text and serve another. The folder is made once (published whole
    under a lock) and checked to render a conversation before it is: StepInputError otherwise.
    """
    if not reference:
        return model_dir
    text = read_template(reference)
    digest = sha256(text)
    if expected_sha256 and digest != expected_sha256:
        raise StepInputError(
            f"train.chat_template {reference!r} changed since the config was loaded (sha256 {digest[:12]}, expected "
            f"{expected_sha256[:12]}): start the run again to use the new template"
        )
    source = model_dir.resolve()
    key = hashlib.sha256(f"{source}\0{digest}".encode()).hexdigest()[:16]
    target = cache_dir / FOLDER / f"{source.name}-{key}"
    publish(target, lambda tmp: _fill(source, text, tmp, reference))
    return target


def _fill(source: Path, text: str, out: Path, reference: str) -> None:
    for entry in source.iterdir():
        if entry.name not in (TEMPLATE_FILE, LEGACY_TEMPLATE_FILE, TOKENIZER_CONFIG):
            # relative: the folder and the base sit on one volume, which pods may mount at other paths
            os.symlink(os.path.relpath(entry.resolve(), out), out / entry.name)
    config_file = source / TOKENIZER_CONFIG
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    config.pop("chat_template", None)
    (out / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2))
    (out / TEMPLATE_FILE).write_text(text, encoding="utf-8")
    (out / DIGEST_FILE).write_text(sha256(text))
    check_renders(out, reference)


def check_renders(model_dir: Path, reference: str) -> None:
    """Refuse (StepInputError) a template that fails on, or leaves out a turn of, a plain multi-turn conversation."""
    from eksflow.llm.steps.common.modeling import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    try:
        whole = str(tokenizer.apply_chat_template(list(PROBE), tokenize=False))
        asked = str(tokenizer.apply_chat_template(list(PROBE[:-1]), add_generation_prompt=True, tokenize=False))
    except Exception as err:  # the user's Jinja: whatever it raises is about the template
        raise StepInputError(
            f"train.chat_template {reference!r} cannot render a conversation ({type(err).__name__}: {err})"
        ) from err
    if missing := list(dict.fromkeys(m["role"] for m in PROBE if m["content"] not in whole)):
        raise StepInputError(
            f"train.chat_template {reference!r} renders a conversation without its {', '.join(missing)} turns' text"
        )
    if not whole.startswith(asked):  # what encoding.encode_batch needs of every assistant turn
        raise StepInputError(
            f"train.chat_template {reference!r} renders a conversation's history (add_generation_prompt) as no "
            "prefix of the whole conversation: training could not tell the answers' tokens apart"
        )


def record(tracking_uri: str, run_id: str, settings: TemplateSettings) -> None:
    """Log the template file into the training run (artifact TEMPLATE_ARTIFACT): a registered version's run holds it.

    Its digest is a param of that run already (chat_template_sha256, with the other train settings).
    """
    from eksflow.llm.steps.common import tracking

    if settings.chat_template and tracking_uri and run_id:
        tracking.log_files(tracking_uri, run_id, [local_path(settings.chat_template)], TEMPLATE_ARTIFACT)


def recorded(tracking_uri: str, run_id: str, folder: Path) -> TemplateSettings:
    """The template a training run was given (downloaded into `folder`), or none: how `make serve` asks a version.

    StepInputError when the run's params name a template whose file the run does not hold.
    """
    if not run_id:  # a version registered without a training run: nothing was trained through a template file
        return TemplateSettings()
    params = _run_params(tracking_uri, run_id)
    digest = params.get("chat_template_sha256", "")
    if not digest:
        return TemplateSettings()
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        path = mlflow.artifacts.download_artifacts(
            run_id=run_id,
            artifact_path=f"{TEMPLATE_ARTIFACT}/{Path(params.get('chat_template', TEMPLATE_FILE)).name}",
            dst_path=str(folder),
            tracking_uri=tracking_uri,
        )
    except (MlflowException, OSError) as err:
        raise StepInputError(
            f"MLflow run {run_id} was trained with train.chat_template (sha256 {digest[:12]}) but holds no copy of it "
            f"under {TEMPLATE_ARTIFACT}/ ({type(err).__name__}); train the version again"
        ) from err
    return TemplateSettings(chat_template=path, chat_template_sha256=digest)


def serving_problem(tracking_uri: str, run_id: str, model_dir: Path) -> str | None:
    """Why an engine started on `model_dir` would ask a version trained in run `run_id` through another template.

    The run's `chat_template_sha256` param ("": the base model's own) against the folder's (a templated folder's
    DIGEST_FILE; none: the model's own). None when they agree, when the folder's own chat_template.jinja is the
    trained one (a whole model trained through it saves its tokenizer with it: finetune full), or when the version
    has no training run.
    """
    if not run_id:
        return None
    trained = _run_params(tracking_uri, run_id).get("chat_template_sha256", "")
    marker = model_dir / DIGEST_FILE
    served = marker.read_text().strip() if marker.is_file() else ""
    own = model_dir / TEMPLATE_FILE
    if trained == served or (trained and own.is_file() and sha256(own.read_text(encoding="utf-8")) == trained):
        return None

    def shown(digest: str) -> str:
        return f"train.chat_template's file (sha256 {digest[:12]})" if digest else "the base model's own template"

    return (
        f"it was trained through {shown(trained)}, and this fleet serves {shown(served)}: roll it out with the "
        "train.chat_template it was trained with"
    )


def _run_params(tracking_uri: str, run_id: str) -> dict[str, str]:
    """The training run's params: its train settings, chat_template and chat_template_sha256 among them."""
    from eksflow.llm.steps.common import tracking

    with tracking.errors(tracking_uri, f"reading the chat template of MLflow run {run_id}"):
        return dict(tracking.client(tracking_uri).get_run(run_id).data.params)
