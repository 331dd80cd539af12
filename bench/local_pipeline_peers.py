#!/usr/bin/env python3
# Copied from the project's shared benchmark harnesses (shared/bench/local_pipeline_peers.py, the peer
# harness of issue 11), unchanged below this note, so bench/local_pipeline.py can run it from the repository.
# A vendored file: kept byte-for-byte as its source, so neither linted nor reformatted here.
# ruff: noqa
# fmt: off
"""local_pipeline_peers -- local-run overhead of peer pipeline SDKs (no-op steps).

Times, wall clock, whole command (what a user pays for a local run):
  mf_min2      : `python flow.py run`, Metaflow start->end (2 no-op steps; fixed cost)
  mf_linear5   : `python flow.py run`, Metaflow start->a->b->c->end (5 no-op steps)
  mf_foreach10 : `python flow.py run`, start -> foreach fan-out of 10 no-op branches -> join -> end
                 (13 tasks)
  kfp_1 / kfp_5: kfp.local with SubprocessRunner(use_venv=False), a 1- and a 5-component
                 chained no-op pipeline, components as built by default (each task runs the
                 `pip install kfp==<ver> --no-deps` prelude kfp puts in every lightweight
                 component -- a no-op here but paid)
  kfp_1_nopip / kfp_5_nopip : same with @dsl.component(install_kfp_package=False)
  py_import_mf / py_import_kfp : `python -c "import metaflow"` / `import kfp` (interpreter floor)
Per-step overhead is reported two ways: total/steps, and marginal = (T5 - T_small)/(5 - small).
Variants rotate order every round (interleaved); default 3 rounds; median and min-max.

Run:   python3 bench/local_pipeline_peers.py [--rounds 3] [--extra NAME:STEPS='cmd']
Plug-in: --extra NAME:STEPS='shell command' times the project's own local run of a no-op
       pipeline with STEPS steps, interleaved with the peers (cwd /tmp/bench-pipe); reported
       per step and as a ratio to the Metaflow flow with the nearest step count.  Give two
       extras with the same NAME prefix and different STEPS (e.g. p:2 and p:5 -> names p2, p5)
       to also get its marginal per-step cost.
       A/A check: --extra aa:5='/tmp/bench-metaflow/bin/python /tmp/bench-pipe/linear5.py --quiet run'
Needs: /tmp/bench-metaflow (venv + `pip install metaflow`), /tmp/bench-kfp (venv +
       `pip install kfp`); created if absent (kfp part skipped if it cannot be installed).
Out:   table on stdout; JSON in /tmp/bench-pipe/results.json
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = "/tmp/bench-pipe"
MF_VENV = "/tmp/bench-metaflow"
KFP_VENV = "/tmp/bench-kfp"

MF_MIN2 = '''
from metaflow import FlowSpec, step
class Min2Flow(FlowSpec):
    @step
    def start(self):
        self.next(self.end)
    @step
    def end(self):
        pass
if __name__ == "__main__":
    Min2Flow()
'''

MF_LINEAR5 = '''
from metaflow import FlowSpec, step
class Linear5Flow(FlowSpec):
    @step
    def start(self):
        self.next(self.a)
    @step
    def a(self):
        self.next(self.b)
    @step
    def b(self):
        self.next(self.c)
    @step
    def c(self):
        self.next(self.end)
    @step
    def end(self):
        pass
if __name__ == "__main__":
    Linear5Flow()
'''

MF_FOREACH10 = '''
from metaflow import FlowSpec, step
class Foreach10Flow(FlowSpec):
    @step
    def start(self):
        self.items = list(range(10))
        self.next(self.fan, foreach="items")
    @step
    def fan(self):
        self.next(self.join)
    @step
    def join(self, inputs):
        self.next(self.end)
    @step
    def end(self):
        pass
if __name__ == "__main__":
    Foreach10Flow()
'''

KFP_PIPE = '''
import sys
from kfp import dsl, local
N = int(sys.argv[1]); INSTALL = sys.argv[2] == "1"; ROOT = sys.argv[3]
local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=ROOT)

@dsl.component(install_kfp_package=INSTALL)
def noop():
    pass

@dsl.pipeline
def chain():
    prev = noop()
    for _ in range(N - 1):
        prev = noop().after(prev)

chain()
'''


def ensure_venv(path, pkg):
    py = os.path.join(path, "bin", "python")
    if os.path.exists(py):
        return py
    subprocess.check_call(["python3", "-m", "venv", path])
    r = subprocess.run([os.path.join(path, "bin", "pip"), "install", "-q", pkg])
    return py if r.returncode == 0 else None


def timed(cmd, cwd, env):
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"{cmd} failed rc={p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return dt, p.stdout + p.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--extra", action="append", default=[], help="NAME:STEPS=shell command")
    a = ap.parse_args()
    extras = {}
    for e in a.extra:
        spec, cmd = e.split("=", 1)
        name, n = spec.split(":")
        extras[f"{name}{n}"] = (int(n), name, cmd)
    os.makedirs(ROOT, exist_ok=True)
    mf_py = ensure_venv(MF_VENV, "metaflow")
    kfp_py = ensure_venv(KFP_VENV, "kfp")
    mf_dir = os.path.join(ROOT, "mf")
    os.makedirs(mf_dir, exist_ok=True)
    for name, src in (("min2.py", MF_MIN2), ("linear5.py", MF_LINEAR5),
                      ("foreach10.py", MF_FOREACH10), ("kfp_pipe.py", KFP_PIPE)):
        open(os.path.join(ROOT, name), "w").write(src)
    env = dict(os.environ, USERNAME="bench", METAFLOW_DEFAULT_DATASTORE="local",
               METAFLOW_DEFAULT_METADATA="local", METAFLOW_DATASTORE_SYSROOT_LOCAL=mf_dir,
               PYTHONWARNINGS="ignore", PIP_DISABLE_PIP_VERSION_CHECK="1")
    kroot = os.path.join(ROOT, "kfp_root")
    V = {
        "py_import_mf": [mf_py, "-c", "import metaflow"],
        "mf_min2": [mf_py, os.path.join(ROOT, "min2.py"), "--quiet", "run"],
        "mf_linear5": [mf_py, os.path.join(ROOT, "linear5.py"), "--quiet", "run"],
        "mf_foreach10": [mf_py, os.path.join(ROOT, "foreach10.py"), "--quiet", "run"],
    }
    if kfp_py:
        V.update({
            "py_import_kfp": [kfp_py, "-c", "import kfp.dsl, kfp.local"],
            "kfp_1": [kfp_py, os.path.join(ROOT, "kfp_pipe.py"), "1", "1", kroot],
            "kfp_5": [kfp_py, os.path.join(ROOT, "kfp_pipe.py"), "5", "1", kroot],
            "kfp_1_nopip": [kfp_py, os.path.join(ROOT, "kfp_pipe.py"), "1", "0", kroot],
            "kfp_5_nopip": [kfp_py, os.path.join(ROOT, "kfp_pipe.py"), "5", "0", kroot],
        })
    for v, (n, _, cmd) in extras.items():
        V[v] = ["bash", "-c", cmd]
    # one untimed warm-up of each (bytecode compile, first-run datastore init)
    for v, cmd in V.items():
        timed(cmd, ROOT, env)
    res = {v: [] for v in V}
    names = list(V)
    for rnd in range(a.rounds):
        k = (rnd * 3) % len(names)
        for v in names[k:] + names[:k]:
            dt, _ = timed(V[v], ROOT, env)
            res[v].append(dt)
        print(f"#  round {rnd}: " + " ".join(f"{v}={res[v][-1]:.2f}s" for v in names), flush=True)
        shutil.rmtree(kroot, ignore_errors=True)
    med = {v: statistics.median(ts) for v, ts in res.items()}
    steps = {"mf_min2": 2, "mf_linear5": 5, "mf_foreach10": 13, "kfp_1": 1, "kfp_5": 5,
             "kfp_1_nopip": 1, "kfp_5_nopip": 5}
    derived = {
        "mf_per_step_total_div_5": med["mf_linear5"] / 5,
        "mf_per_step_marginal": (med["mf_linear5"] - med["mf_min2"]) / 3,
        "mf_foreach_per_task_total_div_13": med["mf_foreach10"] / 13,
        "mf_foreach_per_branch_marginal": (med["mf_foreach10"] - med["mf_min2"]) / 11,
        "mf_fixed_s_min2": med["mf_min2"],
    }
    if kfp_py:
        derived.update({
            "kfp_per_step_total_div_5": med["kfp_5"] / 5,
            "kfp_per_step_marginal": (med["kfp_5"] - med["kfp_1"]) / 4,
            "kfp_nopip_per_step_total_div_5": med["kfp_5_nopip"] / 5,
            "kfp_nopip_per_step_marginal": (med["kfp_5_nopip"] - med["kfp_1_nopip"]) / 4,
        })
    mf_by_steps = {2: "mf_min2", 5: "mf_linear5", 13: "mf_foreach10"}
    for v, (n, name, _) in extras.items():
        steps[v] = n
        ref = mf_by_steps[min(mf_by_steps, key=lambda k: abs(k - n))]
        derived[f"{v}_per_step_total_div_{n}"] = med[v] / n
        derived[f"{v}_time_ratio_vs_{ref}"] = med[v] / med[ref]
        others = [(n2, v2) for v2, (n2, name2, _) in extras.items() if name2 == name and n2 < n]
        if others:
            n2, v2 = max(others)
            derived[f"{v}_per_step_marginal"] = (med[v] - med[v2]) / (n - n2)
    vers = {"metaflow": subprocess.run([mf_py, "-c", "import metaflow;print(metaflow.__version__)"],
                                       capture_output=True, text=True).stdout.strip()}
    if kfp_py:
        vers["kfp"] = subprocess.run([kfp_py, "-c", "import kfp;print(kfp.__version__)"],
                                     capture_output=True, text=True).stdout.strip()
    out = dict(raw=res, median=med, derived=derived, versions=vers, rounds=a.rounds,
               nproc=os.cpu_count(), loadavg_end=os.getloadavg(), steps=steps)
    for name in ("results.json", time.strftime("results-%Y%m%d-%H%M%S.json")):
        json.dump(out, open(os.path.join(ROOT, name), "w"), indent=1)
    print(f"# versions {vers}; rounds={a.rounds}; nproc={os.cpu_count()}")
    for v in names:
        ts = res[v]
        print(f"{v:14s} median {med[v]:6.2f}s (min {min(ts):.2f} max {max(ts):.2f})"
              + (f"  = {med[v] / steps[v]:.2f}s per step/task" if v in steps else ""))
    for k, val in derived.items():
        print(f"  {k:34s} {val:.2f}" + ("x" if "ratio" in k else "s"))


if __name__ == "__main__":
    main()
