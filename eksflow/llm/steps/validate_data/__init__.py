"""Check a staged dataset with great-expectations before any GPU time is spent on it.

    python -m eksflow.llm.steps.validate_data --dataset-dir=/fsx/<workflow>/data --report-dir=/fsx/<workflow>/reports \
        [--base-model=smollm2-135m-instruct --max-tokens=512]

Each split (train.jsonl, eval.jsonl) must: hold records of one type that --method trains on, prompt-completion or
conversational for sft, preference for dpo (a file mixing types, or holding a type the method cannot use, is refused
at once in one line naming the type and its first line; `mostly` never lets that through); have at least `min_rows` rows
(mandatory: per-row expectations pass vacuously on an empty file); parse line by line as JSON objects (malformed
JSON and non-UTF-8 bytes are counted and reported with their line numbers, never raised); for pairs, have `prompt`
and `completion` present, strings, not blank and at most `max_*_chars` long; for conversations, have well-formed
`messages` (record_valid: role order, non-blank content, tool_calls and tool messages in OpenAI's shape; see
eksflow.llm.steps.common.data.record_error); for preferences, a well-formed prompt, chosen and rejected
(record_valid: two different answers, string or assistant turns); repeat no earlier record; and, when --base-model
and --max-tokens are given, fit in max_tokens tokens of that model's tokenizer, counted exactly as training encodes
them. No eval prompt (of a conversation: its history) may occur in train. Each unparsed or malformed row is named
in the log as file:line with why (the first BAD_ROWS_LISTED of each split).

`mostly` applies to every per-row expectation (mostly=0.99 lets 1 bad row in 100 pass); `mostly_by_check`
overrides it per check name, e.g. {"no_duplicate": 0.95} tolerates 5% duplicates. On failure the step prints each
failed expectation with counts and up to three examples, writes the report, and exits 2 (bad data: never retried).
great-expectations Data Docs (HTML) of both suites land in <report_dir>/data_docs/index.html.

At scale: a split is read twice, never held whole (eksflow.llm.steps.validate_data.scan): a pass for what needs every
row (duplicates and train/eval overlap, by 16-byte digests; token counts), then great-expectations validates chunks of
`chunk_rows` rows whose results add up by GE's own rules (eksflow.llm.steps.validate_data.merge): same counts, `mostly`
decisions and examples as one validation of the whole file, memory of one chunk. Tokens are counted from the
token cache (eksflow.llm.steps.common.token_cache) that the train step then reuses: the data is tokenized once for both.

Outputs (one file each under --outputs-dir):
    train_rows  non-blank lines of train.jsonl
    eval_rows   non-blank lines of eval.jsonl
    report      path of validation.json (written on failure too)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field, field_validator

from eksflow.llm.steps.common.base_model import default_cache_dir
from eksflow.llm.steps.common.chat_template import TemplateSettings
from eksflow.llm.steps.common.data import FIELDS, Method
from eksflow.runtime.args import Location, Settings, StepArgs

if TYPE_CHECKING:
    pass


REPORT_FILE = "validation.json"


DOCS_DIR = "data_docs"


CHECKS = (
    "row_count",
    "lines_parse",
    *(f"{name}_{check}" for name in FIELDS for check in ("exists", "not_null", "is_str", "not_blank", "max_chars")),
    "no_duplicate",
    "record_valid",
    "max_tokens",
    "prompt_not_in_train",
)


class ValidateSettings(Settings):
    """Data-quality thresholds (the `validate` section of the pipeline config)."""

    min_rows: int = Field(1, ge=1, description="fewest rows each split may have")
    max_prompt_chars: int = Field(4000, ge=1, description="longest prompt allowed, in characters")
    max_completion_chars: int = Field(4000, ge=1, description="longest completion allowed, in characters")
    mostly: float = Field(
        1.0, ge=0.0, le=1.0, description="fraction of rows each per-row expectation must hold for (1.0: all)"
    )
    mostly_by_check: dict[str, float] = Field(
        default_factory=dict, description='`mostly` for single checks, e.g. {"no_duplicate": 0.95}'
    )
    # ~1 KB per row in a frame of Python objects: 200,000 rows keep a chunk near 200 MB, and the fixed cost of one
    # great-expectations run (~1 s) under 10% of the chunk's time
    chunk_rows: int = Field(
        200_000, ge=1, description="rows per great-expectations batch: memory grows with it, per-batch overhead shrinks"
    )

    @field_validator("mostly_by_check")
    @classmethod
    def _known_checks(cls, value: dict[str, float]) -> dict[str, float]:
        for name, mostly in value.items():
            if name not in CHECKS:
                raise ValueError(f"unknown check {name!r}; known: {', '.join(CHECKS)}")
            if not 0.0 <= mostly <= 1.0:
                raise ValueError(f"mostly of {name!r} is {mostly}; use a fraction between 0 and 1")
        return value

    def mostly_of(self, check: str) -> float:
        """The `mostly` tolerance of one check."""
        return self.mostly_by_check.get(check, self.mostly)


class Args(ValidateSettings, TemplateSettings, StepArgs):
    """Settings plus the folders and model (train's base model and chat template) the workflow wires in."""

    dataset_dir: Path = Field(description="staged dataset folder (stage_data's dataset_dir)")
    report_dir: Path = Field(description=f"folder to write {REPORT_FILE} and {DOCS_DIR}/ in")
    base_model: Location = Field("", description="model whose tokenizer measures max_tokens (train's base_model)")
    max_tokens: int = Field(0, ge=0, description="longest example in tokens (train's max_seq_len); 0 skips it")
    method: Method = Field(
        "sft",
        description="train's method: sft takes prompt-completion or conversational records, dpo preference records; "
        "a split of another type is refused in one line",
    )
    model_cache_dir: Path = Field(default_factory=default_cache_dir, description="where base models are cached")
    token_cache_dir: Path | None = Field(
        None, description="tokenized copies of the splits, shared with train; default <model_cache_dir>/tokenized"
    )


class Outputs(BaseModel):
    """Argo output parameters of validate_data."""

    train_rows: int
    eval_rows: int
    report: str
