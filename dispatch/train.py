"""A small OLMoE worth routing: build, train (seeded), save, load.

The model is transformers' ``OlmoeForCausalLM`` (same modules as OLMoE-1B-7B). Router hooks and
evaluation live in :mod:`dispatch.routertap` (``RouterTap``, ``evaluate``), which drive either model.

    python -m dispatch.train --preset cpu                   # ≤ 5 min on 2 cores → dispatch/assets/cpu
    python -m dispatch.train --preset study --balance bias --out DIR   # one run of the balancing study
    python -m dispatch.train --preset gpu --out DIR         # on a CUDA machine (the device is picked automatically)
    python -m dispatch.train --preset demo --max-seconds 200 --out DIR   # the demo model, on one GPU

On CUDA the forward and backward run under bf16 autocast (sm_80+; fp32 below), the weights and the
optimizer in fp32. ``--max-seconds`` ends training after the step that crosses it (evaluations
included; the learning-rate schedule stays the one of ``--steps``): the last step is then logged,
evaluated and saved as the last of ``--steps`` would be.

A checkpoint folder is written atomically (into a temporary folder beside it, then renamed) and
carries ``hashes.json`` (SHA-256 of every file), which ``load`` verifies. ``--out`` refuses a path
that holds anything but a checkpoint the package wrote (``--force`` replaces it). A loss, a gradient
or a coefficient that is not finite stops training with an error, before any weight takes it:
nothing is saved, so the checkpoint already at ``--out`` stays.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import json
import math
import pathlib
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from dispatch import balance, checkpoint, data, runtime
from dispatch.routertap import RouterTap, evaluate

# The committed checkpoints: package data, found through importlib.resources (a folder on disk for
# every install from a checkout, a wheel or git).
ASSETS = pathlib.Path(str(importlib.resources.files("dispatch") / "assets"))
BIAS_FILE = "router_bias.safetensors"
LOG_FILE = "train_log.json"


@dataclass(frozen=True)
class TrainConfig:
    vocab_size: int = 4096
    hidden_size: int = 128  # H
    intermediate_size: int = 64  # I per expert
    num_layers: int = 4
    num_heads: int = 4
    num_experts: int = 16  # E
    top_k: int = 2  # K
    seq_len: int = 128
    batch_size: int = 16  # T = batch_size · seq_len tokens per step
    steps: int = 800
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.1
    balance: str = "aux"  # "none" | "aux" (Switch loss) | "bias" (DeepSeek-V3, loss-free)
    aux_coef: float = 0.01
    z_coef: float = 0.001
    bias_rate: float = 1e-3  # u in bias += u · sign(mean load − load)
    seed: int = 0
    threads: int = 2
    log_every: int = 10
    eval_every: int = 100
    eval_tokens: int = 8192
    final_eval_tokens: int = 65536
    save_dtype: str = "bfloat16"
    max_seconds: float | None = None  # wall-clock cap on the training loop (None: all `steps`)

    def __post_init__(self):
        if self.balance not in ("none", "aux", "bias"):
            raise ValueError(f"balance must be 'none', 'aux' or 'bias', got {self.balance!r}")
        if self.top_k > self.num_experts:
            raise ValueError(f"TrainConfig.top_k={self.top_k} must be <= num_experts={self.num_experts}")
        for name in ("steps", "batch_size", "seq_len", "warmup", "threads", "log_every", "eval_every",
                     "eval_tokens", "final_eval_tokens", "vocab_size", "num_layers", "num_heads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TrainConfig.{name} must be a positive int, got {v!r}")
        for name in ("lr", "aux_coef", "z_coef", "bias_rate", "weight_decay"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                    or (name == "lr" and v == 0):
                raise ValueError(f"TrainConfig.{name} must be a finite number >= 0{' (> 0)' if name == 'lr' else ''}, "
                                 f"got {v!r}")
        s = self.max_seconds
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0):
            raise ValueError(f"TrainConfig.max_seconds must be None or a finite number > 0, got {s!r}")


PRESETS = {
    "cpu": TrainConfig(),  # ~2.4M parameters, ~4 min on 2 cores
    "study": TrainConfig(steps=300, eval_every=50, final_eval_tokens=32768, z_coef=0.0, bias_rate=5e-3),
    # ~55M parameters (E=64, K=8 as OLMoE): ~110 MB in bf16, so commit its train_log.json, not its weights
    "gpu": TrainConfig(vocab_size=8192, hidden_size=256, intermediate_size=128, num_layers=8, num_heads=8,
                       num_experts=64, top_k=8, seq_len=512, batch_size=32, steps=2000, lr=1e-3,
                       warmup=200, threads=8, eval_every=250, save_dtype="bfloat16"),
    # the draft model of chapter 9: the cpu preset's data and tokenizer (one vocabulary), 2 of its 4 layers
    # at half the width (0.4M parameters, 0.8 MB in bf16); shipped beside it (dispatch/assets/draft)
    "draft": TrainConfig(hidden_size=64, intermediate_size=32, num_layers=2, num_heads=2, num_experts=8, top_k=2,
                         steps=600),
    # the demo model (dispatch/assets/demo): the cpu preset's data and tokenizer, ~12M parameters (~24 MB in
    # bf16), a 256-token context; 800 steps of 8192 tokens, ~5.5 epochs of the train split (about 2 min on an H100)
    "demo": TrainConfig(hidden_size=256, intermediate_size=128, num_layers=6, num_heads=8, num_experts=16, top_k=2,
                        seq_len=256, batch_size=32, steps=800, lr=2e-3, warmup=60),
    "micro": TrainConfig(vocab_size=300, hidden_size=32, intermediate_size=16, num_layers=1, num_heads=2,
                         num_experts=4, top_k=2, seq_len=16, batch_size=4, steps=3, warmup=1, log_every=1,
                         eval_every=2, eval_tokens=128, final_eval_tokens=256, save_dtype="float32"),
}


def demo_model() -> str:
    """The model the demo runs: "demo" (``dispatch/assets/demo``) where it is committed, else "cpu"."""
    return "demo" if (ASSETS / "demo").is_dir() else "cpu"


def build_model(cfg: TrainConfig):
    """A freshly initialised ``OlmoeForCausalLM`` (seeded by ``cfg.seed``)."""
    from transformers import OlmoeConfig, OlmoeForCausalLM

    torch.manual_seed(cfg.seed)
    hf = OlmoeConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                     intermediate_size=cfg.intermediate_size, num_attention_heads=cfg.num_heads,
                     num_key_value_heads=cfg.num_heads, num_experts=cfg.num_experts,
                     num_experts_per_tok=cfg.top_k, max_position_embeddings=cfg.seq_len,
                     tie_word_embeddings=True, pad_token_id=None, bos_token_id=None, eos_token_id=0,
                     router_aux_loss_coef=cfg.aux_coef, output_router_logits=False)
    return OlmoeForCausalLM(hf)


def _imbalance(counts_LE: torch.Tensor) -> tuple[float, float]:
    stats = [balance.load_stats(c) for c in counts_LE]
    return (sum(s["max_over_mean"] for s in stats) / len(stats), sum(s["cv"] for s in stats) / len(stats))


def _check_finite(step: int, loss: torch.Tensor, norm: torch.Tensor, ce: float) -> None:
    """FloatingPointError naming the step and the culprit if the loss or the gradient is not finite."""
    total, grad = torch.stack([loss.detach().float(), norm.detach().float().to(loss.device)]).tolist()
    if math.isfinite(total) and math.isfinite(grad):
        return
    what = (f"the cross-entropy is {ce}" if not math.isfinite(ce) else
            f"the balancing terms made the loss {total} (cross-entropy {ce:.4f})" if not math.isfinite(total) else
            f"the gradient norm is {grad} (loss {total:.4f})")
    raise FloatingPointError(f"training stopped at step {step}: {what}; the weights were not updated and "
                             "nothing was saved (lower the learning rate or the coefficients)")


def train(cfg: TrainConfig, train_ids: torch.Tensor, val_ids: torch.Tensor, *, progress: bool = True):
    """Train a model; returns ``(model, bias_LE or None, log)`` with curves and final metrics."""
    torch.set_num_threads(cfg.threads)
    model = build_model(cfg).to(runtime.device())
    dev = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / cfg.steps)))))
    bias_LE = torch.zeros(cfg.num_layers, cfg.num_experts) if cfg.balance == "bias" else None
    val_win = data.windows(val_ids, cfg.seq_len, cfg.eval_tokens)
    batches = data.batches(train_ids, cfg.seq_len, cfg.batch_size, seed=cfg.seed)
    curves = {k: [] for k in ("step", "loss", "imbalance", "cv", "eval_step", "eval_ppl")}
    window = torch.zeros(cfg.num_layers, cfg.num_experts, dtype=torch.int64)
    losses = []
    bf16 = runtime.compute_dtype(dev) == torch.bfloat16  # autocast on sm_80+ GPUs only (fp16 would need a scaler)
    t0 = time.time()
    bar = tqdm(range(1, cfg.steps + 1), disable=not progress, desc=f"train {cfg.balance}")
    for step in bar:
        x = next(batches).to(dev)
        with RouterTap(model, bias_LE=bias_LE) as tap, torch.autocast(dev.type, torch.bfloat16, enabled=bf16):
            logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten())
        ce = loss.detach().item()
        L = len(tap.logits_L)
        if cfg.balance == "aux" and cfg.aux_coef:  # mean over layers of each layer's Switch loss
            aux = sum(balance.aux_loss(lg, i) for lg, i in zip(tap.logits_L, tap.ids_L, strict=True))
            loss = loss + cfg.aux_coef * aux / L
        if cfg.z_coef:
            loss = loss + cfg.z_coef * sum(balance.z_loss(lg) for lg in tap.logits_L) / L
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        _check_finite(step, loss, norm, ce)  # before the step: no weight takes a NaN
        opt.step()
        sched.step()
        if bias_LE is not None:
            for layer in range(cfg.num_layers):
                bias_LE[layer] = balance.update_bias(bias_LE[layer], tap.counts_LE[layer], cfg.bias_rate)
        window += tap.counts_LE
        losses.append(ce)
        last = step == cfg.steps or (cfg.max_seconds is not None and time.time() - t0 >= cfg.max_seconds)
        if step % cfg.log_every == 0 or last:
            imb, cv = _imbalance(window)
            curves["step"].append(step)
            curves["loss"].append(round(sum(losses) / len(losses), 4))
            curves["imbalance"].append(round(imb, 4))
            curves["cv"].append(round(cv, 4))
            window.zero_()
            losses = []
            bar.set_postfix(loss=curves["loss"][-1], imbalance=curves["imbalance"][-1])
        if step % cfg.eval_every == 0 or last:
            curves["eval_step"].append(step)
            curves["eval_ppl"].append(round(evaluate(model, val_win, bias_LE=bias_LE)["ppl"], 3))
        if last:
            break
    bar.close()
    seconds = time.time() - t0
    log = {"config": dataclasses.asdict(cfg), "train_seconds": round(seconds, 1), "steps_done": step,
           "curves": curves}
    return model, bias_LE, log


def save(model, bias_LE, log: dict, tokenizer, out_dir: pathlib.Path, manifest: dict, *,
         force: bool = False) -> pathlib.Path:
    """Checkpoint folder: model.safetensors + config.json (save_pretrained), tokenizer files,
    ``router_bias.safetensors`` (bias mode), ``train_log.json`` (curves, provenance), manifest.json,
    and ``hashes.json``. Written into a temporary folder beside ``out_dir``, then renamed over it: an
    existing checkpoint is replaced whole or not at all. Anything else at ``out_dir`` (a file, a
    folder that is not our checkpoint) is a FileExistsError unless ``force``; a weight that is not
    finite is a ValueError (nothing written)."""
    from safetensors.torch import save_file
    from transformers import PreTrainedTokenizerFast

    out_dir = pathlib.Path(out_dir)
    checkpoint.check_replaceable(out_dir, force)
    for name, t in [*model.state_dict().items(), *([("router bias", bias_LE)] if bias_LE is not None else [])]:
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"refusing to save a checkpoint whose {name} holds inf or NaN")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    try:
        dtype = runtime.dtype(log["config"]["save_dtype"])
        model.to("cpu", dtype).save_pretrained(tmp)
        model.float()
        PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=data.SPECIAL).save_pretrained(tmp)
        if bias_LE is not None:
            save_file({"bias_LE": bias_LE.contiguous()}, str(tmp / BIAS_FILE))
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=0) + "\n")
        (tmp / LOG_FILE).write_text(json.dumps(log, indent=1) + "\n")
        checkpoint.write_hashes(tmp)
        checkpoint.swap(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


@dataclass(frozen=True)
class Loaded:
    model: object
    tokenizer: object
    bias_LE: torch.Tensor | None
    log: dict | None  # train_log.json of our checkpoints; None for hub models


def load(source: str | pathlib.Path, device: str = "auto", dtype: str = "auto", *, strict: bool = False) -> Loaded:
    """One loader for our checkpoints and hub models (``allenai/OLMoE-1B-7B-0924``).

    ``source``: a preset name with a committed checkpoint ("cpu" → dispatch/assets/cpu), a
    checkpoint folder (verified against its ``hashes.json``; a folder without one loads with a
    ``checkpoint.UnverifiedWarning``, or is refused under ``strict``), or a hub id. The model then
    runs with transformers' own modules.

    fp32 on CPU; on a GPU the runtime's dtype (bf16 on sm_80+, fp16 on a T4).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, local = checkpoint.resolve(source, ASSETS, PRESETS)
    if pathlib.Path(source).is_dir():
        checkpoint.verify(pathlib.Path(source), strict=strict)
    dev = runtime.device(device)
    dt = torch.float32 if dev.type == "cpu" and dtype == "auto" else runtime.dtype(dtype, dev)
    kw = {"device_map": str(dev)} if dev.type == "cuda" else {}
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no loading bars in the book's cells
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dt, local_files_only=local, **kw).to(dev).eval()
        tok = AutoTokenizer.from_pretrained(source, local_files_only=local)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    path = pathlib.Path(source)
    bias_LE, log = None, None
    if (path / BIAS_FILE).exists():
        from safetensors.torch import load_file
        bias_LE = load_file(str(path / BIAS_FILE))["bias_LE"]
    if (path / LOG_FILE).exists():
        log = json.loads((path / LOG_FILE).read_text())
    return Loaded(model, tok, bias_LE, log)


def run(cfg: TrainConfig, out_dir: pathlib.Path, *, command: str, progress: bool = True,
        force: bool = False) -> dict:
    """Corpus → tokenizer → train → final evaluation (of the saved, rounded weights) → save.
    ``out_dir`` is checked first (see :func:`save`): a refusal costs no training."""
    checkpoint.check_replaceable(out_dir, force)
    man = data.manifest()
    tok = data.tokenizer(cfg.vocab_size)
    train_ids, val_ids = data.encode_split(tok, "train"), data.encode_split(tok, "val")
    model, bias_LE, log = train(cfg, train_ids, val_ids, progress=progress)
    model.to(runtime.dtype(cfg.save_dtype)).float()  # evaluate exactly what is saved
    final = evaluate(model, data.windows(val_ids, cfg.seq_len, cfg.final_eval_tokens), bias_LE=bias_LE)
    imb, cv = _imbalance(final["counts_LE"])
    info = runtime.describe()
    log.update({"command": command, "python": info["python"], "versions": info,
                "manifest_hash": man["hash"],
                "unigram_ppl": round(data.unigram_perplexity(train_ids, val_ids, cfg.vocab_size), 3),
                "final": {"val_ppl": round(final["ppl"], 3), "val_tokens": final["tokens"],
                          "imbalance": round(imb, 4), "cv": round(cv, 4)},
                "params": sum(p.numel() for p in model.parameters()),
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    save(model, bias_LE, log, tok, out_dir, man, force=force)
    return log


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    p.add_argument("--balance", choices=["none", "aux", "bias"])
    p.add_argument("--aux-coef", type=float)
    p.add_argument("--z-coef", type=float)
    p.add_argument("--bias-rate", type=float)
    p.add_argument("--steps", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--threads", type=int, help="torch threads (1 is faster on a busy 2-core machine)")
    p.add_argument("--max-seconds", type=float, help="end training after the step that crosses this many seconds")
    p.add_argument("--out", type=pathlib.Path, help="checkpoint folder (default: the package's assets/<preset>)")
    p.add_argument("--force", action="store_true", help="replace whatever is at --out (a file, a folder that is "
                   "not a checkpoint): by default only a checkpoint written here is replaced")
    a = p.parse_args(argv)
    over = {k: v for k, v in {"balance": a.balance, "aux_coef": a.aux_coef, "z_coef": a.z_coef,
                              "bias_rate": a.bias_rate, "steps": a.steps, "seed": a.seed,
                              "threads": a.threads, "max_seconds": a.max_seconds}.items() if v is not None}
    try:
        cfg = dataclasses.replace(PRESETS[a.preset], **over)
    except ValueError as e:
        p.error(str(e))
    out = a.out or ASSETS / a.preset
    try:
        log = run(cfg, out, command="python -m dispatch.train " + " ".join(sys.argv[1:] if argv is None else argv),
                  force=a.force)
    except (FileExistsError, FloatingPointError) as e:
        raise SystemExit(f"dispatch.train: {e}") from None
    print(f"{out}: val ppl {log['final']['val_ppl']} (unigram {log['unigram_ppl']}), "
          f"imbalance {log['final']['imbalance']}, {log['steps_done']} steps in {log['train_seconds']} s")


if __name__ == "__main__":
    main()
