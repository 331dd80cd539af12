"""Copy a dataset (local folder or file, file://, s3:// prefix or object) into the shared FSx folder and fingerprint it.

    python -m eksflow.llm.steps.stage_data --source=s3://bucket/datasets/dates --dest-dir=/fsx/<workflow>/data

Layouts: a folder with train.jsonl and eval.jsonl, or one data file (a single .jsonl file or object, or a folder
holding data.jsonl) that is split into train/eval by a hash of each prompt (of a conversation: its history), so a
row's split never changes when rows are added elsewhere. Records may be prompt/completion, instruction/input/output
(made a pair), conversational `messages` (kept as turns) or preference (eksflow.llm.steps.common.data). The source
files themselves land under raw/ (other files are copied too), listed in manifest.json with key, size, ETag and
sha256.

Fast: files are copied `concurrency` at a time, S3 objects of at least `multipart_threshold_mb` in ranged parts
(`part_concurrency` per object). A file whose size and ETag (for a local file: its mtime) equal the previous
manifest's is not copied again: the published copy is hard-linked into the new version, so a re-stage with nothing
changed costs one listing.

Linked: when a data repository association (DRA) already exposes the s3:// source on FSx, --fsx-linked-path names
that FSx path (e.g. --source=s3://datasets/dates --fsx-linked-path=/fsx/dra/dates) and no object is downloaded. The
prefix is still listed (keys, sizes, ETags, the same key checks); each listed file must be under the linked path (no
symlink leading out of it), a regular file and of the listed size; it is then read there (FSx loads it from S3 on
first read) and copied, with its sha256, into the new version. A copy, not a hard link: FSx may overwrite or drop
the content of a linked file when its object changes, and a published version must never change. A missing file or
another size means the DRA has not imported the change yet (auto-import lag, or an import policy without NEW or
CHANGED events): the stage fails (exit 1, retried) naming the key. Only the size is compared: a same-size edit not
yet imported is staged with its old bytes; the next stage reads the file again, as it does any linked file changed
(ctime) after its published copy was written, so the import landing is enough to correct it.

Safe: the new version is built in a temporary sibling of dest_dir and published with a rename, so readers never see
a half-written dataset, a killed stage leaves the previous one intact, and a rerun completes (it removes what the
killed run left). Object keys with `..`, empty or absolute parts, and symlinks leading out of a local source are
refused: nothing is ever written outside dest_dir's parent.

Outputs (one file each under --outputs-dir):
    dataset_dir     the published folder (dest_dir)
    dataset_digest  "sha256:<hex>" over the sorted (path, sha256) pairs of every file: equal digests mean equal data
    data_key        the digest's hex alone: a memoization key part (Argo allows only letters, digits and '-')
    changed         "true" unless --previous-digest equals the new digest (a cron retrains only when data changed)
    reason          the same in words, naming what was compared: "data unchanged since champion v1 (sha256:1a2b...)"
                    (--previous-version: the version trained on --previous-digest); a skipped train says it
    num_files       source files staged (manifest.json and the derived splits not counted)
    num_bytes       bytes of those files
    copied_files    files downloaded or copied this time (the rest were unchanged and linked); 0 with a linked path
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field, field_validator

from eksflow.runtime.args import Location, Settings, StepArgs


class StageSettings(Settings):
    """Where the dataset comes from and how it is copied (the `data` section of the pipeline config)."""

    source: Location = Field("data/demo", description="dataset: local path, file:///path, s3://bucket/prefix or object")
    concurrency: int = Field(16, ge=1, le=64, description="files copied in parallel")
    part_concurrency: int = Field(8, ge=1, le=64, description="parts of one large S3 object downloaded in parallel")
    multipart_threshold_mb: int = Field(64, ge=5, description="S3 objects this large (MiB) are fetched in parts")
    multipart_chunk_mb: int = Field(16, ge=5, description="size of one part (MiB)")
    eval_fraction: float = Field(
        0.1, gt=0.0, lt=1.0, description="share of a single data file's rows (by prompt hash) that go to eval"
    )
    fsx_linked_path: Location = Field(
        "",
        description="FSx path where a data repository association exposes the s3:// source (e.g. /fsx/dra/dates): "
        "files are read there, checked against the S3 listing, never downloaded; empty: download from S3",
    )

    @field_validator("source")
    @classmethod
    def _readable(cls, source: str) -> str:
        from eksflow.llm.steps.common.storage import location_problem  # light: no cloud library

        if problem := location_problem(source):
            raise ValueError(problem)
        return source

    def localized(self, base: Path) -> StageSettings:
        """These settings with a relative local source made absolute against `base` (the folder `run` started in).

        Tasks run in the project's folder, not the caller's: a relative path must mean the caller's `mydata`,
        checked and staged from the same place, and recorded absolute in the run.
        """
        if "://" in self.source or Path(self.source).is_absolute():
            return self
        return self.model_copy(update={"source": os.path.abspath(base / self.source)})

    def local_problems(self) -> list[str]:
        """`field: problem` when the source cannot exist on this machine (asked by `run` before anything starts)."""
        from eksflow.llm.steps.common.storage import is_s3, local_path
        from eksflow.runtime.args import StepInputError

        if is_s3(self.source):
            return []
        shown = self.source if len(self.source) <= 80 else f"{self.source[:60]}... ({len(self.source)} characters)"
        try:
            found = local_path(self.source).exists()
        except (OSError, ValueError, StepInputError) as err:
            reason = getattr(err, "strerror", None) or str(err)
            return [f"source: {shown!r} cannot be a path here ({reason}); give a dataset folder or an s3:// prefix"]
        if not found:
            return [f"source: {shown!r} does not exist; give a dataset folder (e.g. data/demo) or an s3:// prefix"]
        return []


class Args(StageSettings, StepArgs):
    """Settings plus the destination the workflow chooses."""

    dest_dir: Path = Field(description="folder to publish the dataset in, e.g. /fsx/<workflow>/data")
    previous_digest: str = Field("", description="digest of the last trained dataset; sets the `changed` output")
    previous_version: str = Field(
        "", pattern=r"^([1-9][0-9]*)?$", description="registered version trained on previous_digest, for `reason`"
    )


class Outputs(BaseModel):
    """Argo output parameters of stage_data."""

    dataset_dir: str
    dataset_digest: str
    data_key: str
    changed: bool
    reason: str
    num_files: int
    num_bytes: int
    copied_files: int
