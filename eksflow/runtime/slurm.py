"""A slurmrestd client: submit a batch job, read its state, cancel it; one class per OpenAPI version spoken.

    api = slurm_api("v0.0.38", "http://127.0.0.1:6820", user="root", token=token)
    job_id = api.submit(JobSpec(name="llama-lora-x1-train", script=SCRIPT, environment={...}, ...))
    api.status(job_id).state          # PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, PREEMPTED, NODE_FAIL, ...

Two versions, because the two Slurms this project meets speak different ones:
- v0.0.38: Slurm 22.05 (Debian 12's packages), the Slurm the tests run here. Its job is `{"job": {...},
  "script": ...}`, its environment an object, `time_limit` and `exit_code` plain integers, `job_state` a string.
- v0.0.44: Slurm 25.x, what Slinky's slurm-operator deploys. The environment is a list of `NAME=value`, numbers
  that may be unset are `{"set": true, "number": n}`, `job_state` is a list of flags and `exit_code` an object
  with `return_code`. Checked against its official OpenAPI document (tests/contract/schemas/slurm).

What this client leaves out on purpose: `argv` (slurmrestd 22.05.8 segfaults on a v0.0.38 submission that has it,
measured), so the job's arguments travel in its environment and the script stays a constant; `gres` strings
other than `gpu:<n>`.

Authentication is Slurm's JWT: `X-SLURM-USER-NAME` and `X-SLURM-USER-TOKEN` on every request. An empty token, or
one holding anything but visible ASCII (a line break of a badly written Secret), is refused before any request
(SlurmTokenError, bad input). Every error line goes through eksflow.runtime.shown, the token among its secrets:
slurmrestd's own text (an answer's `errors[]`, a proxy's error page) may echo the header, and a terminal must not
act on its control characters. Neither the token nor a part of it is ever printed.

The settings that name a slurmrestd and a job's time limit are typed here (SlurmUrl, TimeLimitMin), for the config
(cluster.slurm) and the job's arguments alike.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, StrictInt

from eksflow.errors import EXIT_BAD_INPUT, EXIT_FAILED, EksflowError
from eksflow.runtime.hosts import is_host
from eksflow.runtime.shown import shown

API_VERSIONS = ("v0.0.38", "v0.0.44")
ENDED = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
)
# Slurm keeps a time limit as uint32 minutes, and its two largest values are markers (NO_VAL, INFINITE): a limit
# must stay far below them. A year is longer than any training job; a larger number is a unit mistake (seconds).
MAX_TIME_LIMIT_MIN = 365 * 24 * 60
MESSAGE_CHARS = 300  # of a server's error text: an error page can be long
# Slurm's error numbers (slurm_errno.h) for a job refused for what it asks, by the JobSpec field they name: another
# attempt would be refused alike. slurmrestd reports them as `error_code` (v0.0.38) or `error_number` (v0.0.44).
REFUSED_SETTINGS = {
    2000: "partition",  # ESLURM_INVALID_PARTITION_NAME
    2001: "partition",  # ESLURM_DEFAULT_PARTITION_NOT_SET: the cluster has no default, the job named none
    2045: "account",  # ESLURM_INVALID_ACCOUNT
    2051: "time_limit_min",  # ESLURM_INVALID_TIME_LIMIT
    2066: "qos",  # ESLURM_INVALID_QOS
}


class SlurmError(EksflowError):
    """slurmrestd refused a request or could not be reached; the message names the URL, never the token."""

    label = "slurm error"
    exit_code = EXIT_FAILED

    def __init__(self, message: str, codes: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.codes = codes  # Slurm's error numbers in the answer (slurm_errno.h), where it gave any


class SlurmJobRefusedError(SlurmError):
    """slurmctld refused the job for a setting of it (no such partition, account or QoS): bad input, not retried."""

    label = "slurm error"
    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, setting: str) -> None:
        super().__init__(message)
        self.setting = setting  # the JobSpec field Slurm refused: partition, account, qos, time_limit_min


class SlurmTokenError(SlurmError):
    """A token no request can carry (empty, a control character inside); refused before any request, not shown."""

    label = "slurm token error"
    exit_code = EXIT_BAD_INPUT


def slurmrestd_url(url: str) -> str:
    """`url` if it is `http(s)://<host>[:<port>][/]`, the host a DNS name or an IP address; ValueError otherwise."""
    example = "e.g. http://slurm-restapi.slurm:6820"
    # urlsplit drops tabs and line breaks silently: the text is checked as given
    if not url.isascii() or not url.isprintable() or " " in url:
        raise ValueError(f"holds a space, control or non-ASCII character; give slurmrestd's address, {example}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a port beyond 65535 or not a number, an unbalanced IPv6 bracket
        raise ValueError(f"not http(s)://<host>:<port> with a port of 1-65535; {example}") from None
    if parts.scheme not in ("http", "https") or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"give slurmrestd's address alone, http(s)://<host>:<port>; {example}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("holds a user name or password; the token comes from the Secret cluster.slurm.token_secret")
    if port == 0 or (port is None and parts.netloc.endswith(":")):
        raise ValueError(f"the port must be 1-65535; {example}")
    host = parts.hostname or ""
    if not is_host(host):
        raise ValueError(f"host {host!r} is neither a DNS name nor an IP address; {example}")
    return url


def token_problem(token: str) -> str:
    """Why no request can carry `token` ("is empty", "holds a line break at position 14"), or "" when it can."""
    if not token:
        return "is empty"
    position, char = next(((i, c) for i, c in enumerate(token) if not "!" <= c <= "~"), (-1, ""))
    if position < 0:
        return ""
    if char in "\r\n":
        what = "a line break"
    elif not char.isprintable():  # tab, ESC, DEL, C1 controls, bidi overrides
        what = "a control character"
    else:
        what = "a space" if char == " " else "a non-ASCII character"
    return f"holds {what} at position {position}; a Slurm JWT is one line of ASCII letters, digits and . - _"


SlurmUrl = Annotated[str, AfterValidator(slurmrestd_url)]
TimeLimitMin = Annotated[StrictInt, Field(ge=0, le=MAX_TIME_LIMIT_MIN)]  # strict: `true` is no number of minutes


@dataclass(frozen=True)
class JobSpec:
    """A batch job: a constant script and what varies in its environment, with the resources it asks for."""

    name: str
    script: str
    environment: Mapping[str, str]
    working_directory: str
    standard_output: str  # stdout and stderr of the batch script, on the shared file system
    comment: str = ""  # what marks the job as a run's own (eksflow.runtime.slurm_job adopts only jobs with its own)
    partition: str = ""
    account: str = ""
    qos: str = ""
    time_limit_min: int = 0  # 0: the partition's limit
    nodes: int = 1
    tasks_per_node: int = 1
    cpus_per_task: int = 1
    gpus_per_node: int = 0
    requeue: bool = True  # a preempted or failed node's job goes back to the queue (and resumes from a checkpoint)


@dataclass(frozen=True)
class JobStatus:
    """A job as slurmctld reports it."""

    job_id: int
    name: str
    state: str  # the base state: PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, ...
    exit_code: int | None  # the batch script's return code, once known
    restarts: int  # how often the job was requeued
    reason: str = ""
    user: str = ""  # the user the job runs as (`user_name`)
    comment: str = ""
    nodes: str = ""  # the nodes allocated to it, as Slurm writes a host list: slurm-node-[1-2]

    @property
    def ended(self) -> bool:
        """True once the job will not run again by itself."""
        return self.state in ENDED


@dataclass
class SlurmApi(ABC):
    """The REST API of one slurmrestd (the version's subclass shapes the documents)."""

    url: str
    user: str
    token: str = field(repr=False)
    timeout_s: float = 30.0
    version = ""
    collection_suffix = ""  # v0.0.44 names its collections with a trailing slash: /ping/, /jobs/

    def __post_init__(self) -> None:
        if problem := token_problem(self.token):
            raise SlurmTokenError(f"the Slurm token {problem}")

    def submit(self, spec: JobSpec) -> int:
        """Submit the batch job; its id. SlurmJobRefusedError when Slurm refuses one of its settings."""
        try:
            body = self._request("POST", "job/submit", self.submission(spec))
        except SlurmError as err:
            refused = next((REFUSED_SETTINGS[code] for code in err.codes if code in REFUSED_SETTINGS), None)
            if refused is None:
                raise
            raise SlurmJobRefusedError(str(err), refused) from None
        if "job_id" not in body:
            raise self._error(f"POST {self._url('job/submit')} answered without a job_id: {self._said(_errors(body))}")
        return int(body["job_id"])

    def status(self, job_id: int) -> JobStatus | None:
        """The job's status; None when slurmctld no longer knows it (purged after MinJobAge)."""
        try:
            body = self._request("GET", f"job/{job_id}")
        except SlurmError as err:
            if "Invalid job id" in str(err) or "Unable to find JobId" in str(err):
                return None
            raise
        jobs = [self.parse(job) for job in body.get("jobs") or []]
        return next((job for job in jobs if job.job_id == job_id), None)

    def jobs(self) -> list[JobStatus]:
        """Every job slurmctld knows."""
        return [self.parse(job) for job in self._request("GET", f"jobs{self.collection_suffix}").get("jobs") or []]

    def cancel(self, job_id: int) -> None:
        """Cancel the job (SIGKILL to its steps; DELETE /job/{id}); a job that already ended is left as it is."""
        try:
            self._request("DELETE", f"job/{job_id}")
        except SlurmError as err:
            if "already completed" not in str(err) and "Invalid job id" not in str(err):
                raise

    @abstractmethod
    def submission(self, spec: JobSpec) -> dict[str, Any]:
        """The version's job submission document."""

    @abstractmethod
    def parse(self, job: Mapping[str, Any]) -> JobStatus:
        """A job of the version's job list as a JobStatus."""

    def _url(self, path: str) -> str:
        return f"{self.url.rstrip('/')}/slurm/{self.version}/{path}"

    def _request(self, method: str, path: str, payload: Mapping[str, Any] | None = None) -> dict[str, Any]:
        url = self._url(path)
        data = None if payload is None else json.dumps(payload).encode()
        headers = {
            "Content-Type": "application/json",
            "X-SLURM-USER-NAME": self.user,
            "X-SLURM-USER-TOKEN": self.token,
        }
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as err:
            text = err.read().decode("utf-8", "replace")
            said = self._said(_errors(_json(text)) or text)
            raise self._error(f"{method} {url} answered {err.code}: {said}", _error_codes(_json(text))) from None
        except (OSError, ValueError) as err:
            raise self._error(
                f"{method} {url} failed ({type(err).__name__}: {err}); is slurmrestd running there (cluster.slurm.url)?"
            ) from None
        body = _json(text)
        if errors := _errors(body):
            raise self._error(f"{method} {url}: {self._said(errors)}", _error_codes(body))
        return body

    def _error(self, message: str, codes: tuple[int, ...] = ()) -> SlurmError:
        """A SlurmError of `message` as it may be shown (eksflow.runtime.shown, the token among the secrets)."""
        return SlurmError(shown(message, [self.token]), codes)

    def _said(self, text: str) -> str:
        """The server's own text, shortened: the token is redacted first, so no part of it survives the cut."""
        said = shown(text, [self.token])
        return said if len(said) <= MESSAGE_CHARS else said[: MESSAGE_CHARS - 3] + "..."


class SlurmApiV0038(SlurmApi):
    """Slurm 22.05's v0.0.38."""

    version = "v0.0.38"

    def submission(self, spec: JobSpec) -> dict[str, Any]:
        """`{"job": {...}, "script": ...}`, the environment an object."""
        job = _common(spec)
        job.update(environment=dict(spec.environment), nodes=[spec.nodes, spec.nodes])  # nodes: [min, max]
        if spec.time_limit_min:
            job["time_limit"] = spec.time_limit_min
        if spec.gpus_per_node:
            job["gpus_per_node"] = f"gpu:{spec.gpus_per_node}"
        return {"job": job, "script": spec.script}

    def parse(self, job: Mapping[str, Any]) -> JobStatus:
        """`job_state` a string, `exit_code` a wait status."""
        status = job.get("exit_code")  # a wait(2) status here: 512 is exit 2, 15 a SIGTERM
        if isinstance(status, int):
            exit_code: int | None = (status >> 8) & 0xFF if status & 0x7F == 0 else 128 + (status & 0x7F)
        else:
            exit_code = None
        return JobStatus(
            job_id=int(job["job_id"]),
            name=str(job.get("name", "")),
            state=str(job.get("job_state", "")).split()[0] if job.get("job_state") else "",
            exit_code=exit_code,
            restarts=int(job.get("restart_cnt") or 0),
            reason=str(job.get("state_reason") or ""),
            user=str(job.get("user_name") or ""),
            comment=str(job.get("comment") or ""),
            nodes=str(job.get("nodes") or ""),
        )


class SlurmApiV0044(SlurmApi):
    """Slurm 25.x's v0.0.44 (Slinky)."""

    version = "v0.0.44"
    collection_suffix = "/"

    def submission(self, spec: JobSpec) -> dict[str, Any]:
        """`{"job": {..., "script": ...}}`, the environment a list of NAME=value."""
        job = _common(spec)
        job.update(
            script=spec.script,
            environment=[f"{name}={value}" for name, value in spec.environment.items()],
            nodes=str(spec.nodes),  # a range specification: "2" is exactly 2
        )
        if spec.time_limit_min:
            job["time_limit"] = {"set": True, "infinite": False, "number": spec.time_limit_min}
        if spec.gpus_per_node:
            job["tres_per_node"] = f"gres/gpu:{spec.gpus_per_node}"
        return {"job": job}

    def parse(self, job: Mapping[str, Any]) -> JobStatus:
        """`job_state` a list of flags, `exit_code` an object with a `return_code`."""
        states = job.get("job_state") or []
        code = (job.get("exit_code") or {}).get("return_code") or {}
        return JobStatus(
            job_id=int(job["job_id"]),
            name=str(job.get("name", "")),
            state=str(states[0]) if isinstance(states, list) and states else str(states or ""),
            exit_code=int(code["number"]) if isinstance(code, Mapping) and code.get("set") else None,
            restarts=int(job.get("restart_cnt") or 0),
            reason=str(job.get("state_reason") or ""),
            user=str(job.get("user_name") or ""),
            comment=str(job.get("comment") or ""),
            nodes=str(job.get("nodes") or ""),
        )


def slurm_api(version: str, url: str, *, user: str, token: str, timeout_s: float = 30.0) -> SlurmApi:
    """The client of `version` (one of API_VERSIONS) for the slurmrestd at `url`."""
    kinds: dict[str, type[SlurmApi]] = {"v0.0.38": SlurmApiV0038, "v0.0.44": SlurmApiV0044}
    if version not in kinds:
        raise SlurmError(f"cluster.slurm.api_version: {version!r} is not spoken here; use one of {API_VERSIONS}")
    return kinds[version](url, user, token, timeout_s)


def _common(spec: JobSpec) -> dict[str, Any]:
    """The job fields both versions spell alike; a scheduling field left empty is Slurm's default."""
    job: dict[str, Any] = {
        "name": spec.name,
        "current_working_directory": spec.working_directory,
        "standard_output": spec.standard_output,
        "tasks_per_node": spec.tasks_per_node,
        "tasks": spec.nodes * spec.tasks_per_node,
        "cpus_per_task": spec.cpus_per_task,
        "requeue": spec.requeue,
    }
    optional = (("comment", spec.comment), ("partition", spec.partition), ("account", spec.account), ("qos", spec.qos))
    job.update({k: v for k, v in optional if v})
    return job


def _json(text: str) -> dict[str, Any]:
    try:
        body = json.loads(text)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _error_codes(body: Mapping[str, Any]) -> tuple[int, ...]:
    """Slurm's error numbers in the `errors` list of a slurmrestd answer."""
    found = [e for e in body.get("errors") or [] if isinstance(e, Mapping)]
    codes = (e.get("error_code", e.get("error_number")) for e in found)
    return tuple(code for code in codes if isinstance(code, int) and not isinstance(code, bool))


def _errors(body: Mapping[str, Any]) -> str:
    """The `errors` list of a slurmrestd answer as one line ("" when there is none)."""
    found = [e for e in body.get("errors") or [] if isinstance(e, Mapping)]
    return "; ".join(str(e.get("description") or e.get("error") or e) for e in found)
