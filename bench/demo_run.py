"""The demo workflow's time, task by task: what `make run` costs after the install, for this tree or another commit.

    .venv/bin/python bench/demo_run.py run                      # this tree: one flagship run, its table
    .venv/bin/python bench/demo_run.py ab --baseline fc40870    # another commit's tree first, then this one

`run` runs `pipelines/llama_lora.py run` (the command `make run` runs) in a fresh state folder, with the base model
already converted into a model cache shared by every run of the benchmark (its conversion is the same code in both
trees and is paid once per machine), and times the whole command. It then reads the run's status.json and logs:
for each task, how long it waited for the node (Pending: from its creation to its first attempt's log header) and
how long it ran (from that header to its end), so the table shows where the workflow's time goes, and the evaluate
and canary costs (evaluate; the analyze-* tasks together) on their own lines.

`ab` exports another commit into a temporary git worktree (this checkout's .venv linked in, its serving engines named by
their variables) and runs the same command there, then here, one after the other (a run is ~10-16 minutes on 2 cores:
there is no interleaving of rounds; run it on a quiet machine and say the load).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eksflow.llm.engines import ENGINES  # noqa: E402  (after the path: bench/ is not a package)
from eksflow.llm.engines import command as command_of  # noqa: E402
from eksflow.local.status import file_name  # noqa: E402

HEADER = re.compile(r"^===== (?P<key>\S+): attempt (?P<attempt>\d+), (?P<at>\S+) =====$", re.MULTILINE)


def seconds(start: str | None, end: str | None) -> float:
    """Seconds between two of status.json's ISO 8601 times (0 when one is missing)."""
    if not start or not end:
        return 0.0
    return (
        datetime.fromisoformat(end.replace("Z", "+00:00")) - datetime.fromisoformat(start.replace("Z", "+00:00"))
    ).total_seconds()


def task_times(run_dir: Path) -> list[dict[str, Any]]:
    """Each pod's wait for the node and its run time, in the order the tasks started."""
    nodes = json.loads((run_dir / "status.json").read_text())["status"]["nodes"]
    rows = []
    for key, node in nodes.items():
        if node.get("type") != "Pod" or not node.get("startedAt"):
            continue
        log = run_dir / "logs" / f"{file_name(key)}.log"
        first = HEADER.search(log.read_text(errors="replace")) if log.exists() else None
        began = first.group("at") if first else node["startedAt"]
        rows.append(
            {
                "task": key,
                "phase": node["phase"],
                "pending_s": seconds(node["startedAt"], began),
                "running_s": seconds(began, node.get("finishedAt")),
                "started": node["startedAt"],
            }
        )
    return sorted(rows, key=lambda r: r["started"])


def run_demo(tree: Path, models: Path, extra: list[str]) -> dict[str, Any]:
    """One flagship run with `tree`'s code; its wall time and task table."""
    state = Path(tempfile.mkdtemp(prefix="demo-state-"))
    command = [str(tree / ".venv" / "bin" / "python"), str(tree / "pipelines" / "llama_lora.py"), "run"]
    command += ["--state-dir", str(state), "--set", f"storage.model_cache={models}", *extra]
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    # The engines this checkout installed (eksflow.llm.engines), named by the variables every tree's fleet reads.
    env |= {engine.override_env: command_of(engine) for engine in ENGINES.values()}
    started = time.monotonic()
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"the demo run in {tree} exited {done.returncode}:\n{done.stderr[-3000:]}")
    (run_dir,) = (state / "runs").iterdir()
    tasks = task_times(run_dir)
    analyses = [t for t in tasks if t["task"].startswith("analyze-")]
    return {
        "tree": str(tree),
        "wall_s": wall,
        "load": os.getloadavg(),
        "tasks": tasks,
        "evaluate_s": sum(t["running_s"] for t in tasks if t["task"] == "evaluate"),
        "canary_s": sum(t["running_s"] for t in analyses),
        "run_dir": str(run_dir),
    }


def convert_model(models: Path) -> None:
    """The demo base model, converted once into `models` (not part of any timed run)."""
    from eksflow.llm.steps.common.base_model import DEMO_MODEL, resolve_model

    resolve_model(DEMO_MODEL, models)


def table(results: list[dict[str, Any]]) -> str:
    """A Markdown table: each task's pending and running seconds per tree, then the totals."""
    names = list(dict.fromkeys(t["task"] for r in results for t in r["tasks"]))
    head = "| task | " + " | ".join(f"{Path(r['tree']).name}: pending / running" for r in results) + " |"
    lines = [head, "| --- |" + " --- |" * len(results)]
    for name in names:
        cells = []
        for r in results:
            found = next((t for t in r["tasks"] if t["task"] == name), None)
            cells.append(f"{found['pending_s']:.0f} s / {found['running_s']:.0f} s" if found else "")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for label, key in (("evaluate", "evaluate_s"), ("canary (analyze-*)", "canary_s"), ("whole command", "wall_s")):
        lines.append(f"| **{label}** | " + " | ".join(f"{r[key]:.0f} s" for r in results) + " |")
    return "\n".join(lines)


def worktree(ref: str) -> Path:
    """A git worktree of `ref` in a temporary folder, with this checkout's virtualenvs linked in."""
    folder = Path(tempfile.mkdtemp(prefix="demo-tree-")) / ref
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), ref], check=True)
    (folder / ".venv").symlink_to(ROOT / ".venv")
    return folder


def main(argv: list[str] | None = None) -> int:
    """Convert the model once, run the demo per tree, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("run", "ab"))
    parser.add_argument("--baseline", help="git ref whose tree `ab` runs first")
    parser.add_argument("--models", type=Path, default=Path(tempfile.gettempdir()) / "demo-models")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="k=v passed to run --set")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    extra = [item for kv in args.overrides for item in ("--set", kv)]
    convert_model(args.models)
    trees = [ROOT]
    if args.mode == "ab":
        if not args.baseline:
            parser.error("ab needs --baseline REF")
        trees = [worktree(args.baseline), ROOT]
    try:
        results = [run_demo(tree, args.models, extra) for tree in trees]
    finally:
        for tree in trees[:-1]:  # the baseline's worktree: it stayed registered in this checkout and on disk
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
            shutil.rmtree(tree.parent, ignore_errors=True)
    print(table(results))
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
