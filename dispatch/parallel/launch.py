"""Run a function on R ranks: from a notebook or a test (:func:`launch`), or under torchrun
(:func:`init_from_env`). A fault ends the whole job within ``timeout_s`` and names its rank.

    results = launch(fn, 2, cfg, seed)   # gloo on CPU: one process per rank

``fn`` must be importable by name (a module-level function of an importable module); it runs after
``init_process_group``, and its return value comes back per rank through a file (any size; never a
pipe). Each rank reports into a private directory: a result file, or an error file with the
exception's original traceback. The launcher polls those files and the processes:

    a rank raised                 → RankError naming the rank, the exception and its traceback
    a rank exited / was killed    → RankError naming the rank and its exit code or signal
    a result that cannot be saved → RankError naming the rank and the pickling error
    nothing within ``timeout_s``  → RankError naming the ranks that had not returned

A failure inside a collective (a peer died or left) is reported only when no rank failed on its
own: it is the symptom, the other rank the cause. Finished ranks wait for the launcher's word
before they exit, so no rank tears its sockets down while a peer still talks to it; at the end
every rank is terminated (then killed), within ``timeout_s`` + about a second of the start.
"""
from __future__ import annotations

import contextlib
import datetime
import faulthandler
import hashlib
import os
import pathlib
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from unittest import mock

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dispatch import runtime

POLL_S = 0.02
GRACE_S = 0.5  # after a first failure: time for the other ranks' reports to land


class RankError(RuntimeError):
    """A rank of a multi-process job failed; the message names it and carries the original traceback."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collective_failure(exc: BaseException) -> bool:
    """True for errors that say a peer broke a collective (the symptom, not the cause)."""
    text = f"{type(exc).__name__} {exc}"
    return isinstance(exc, dist.DistError) or any(
        s in text for s in ("gloo", "Gloo", "NCCL", "Connection closed", "Connection reset", "Broken pipe"))


def _entry(rank, world_size, port, backend, timeout_s, payload, sys_path, run_dir):
    run_dir = pathlib.Path(run_dir)
    sys.path[:] = sys_path  # the parent's import path: test helpers and notebooks' modules resolve
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))

    def report(suffix: str, write) -> None:
        tmp = run_dir / f"rank{rank}.{suffix}.tmp"
        write(tmp)
        tmp.rename(run_dir / f"rank{rank}.{suffix}")  # atomic: the launcher never sees half a file

    stack_file = open(run_dir / f"rank{rank}.stack", "w")  # noqa: SIM115  (open until the process ends)
    faulthandler.register(signal.SIGUSR1, file=stack_file)  # the launcher asks where a late rank is
    try:
        fn, args, kwargs = pickle.loads(payload)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        else:
            torch.set_num_threads(1)  # R ranks share the CPU cores
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        out = fn(*args, **kwargs)
        try:
            report("result", lambda p: torch.save(out, p))
        except Exception as exc:  # noqa: BLE001  (unpicklable result)
            raise RankError(f"its result ({type(out).__name__}) could not be saved: {exc}") from exc
    except BaseException as exc:  # noqa: BLE001
        head = "collective" if _collective_failure(exc) else "own"
        text = f"{head}\n{time.time()}\n{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exception(exc))
        report("error", lambda p: p.write_text(text))
    while not (run_dir / "release").exists():  # keep sockets open until every rank is done
        time.sleep(POLL_S)
    os._exit(0)


def _death(code: int | None) -> str:
    cause = runtime.exit_cause(code)
    return cause if code is not None and code < 0 else f"{cause} before returning a result"


def launch(fn, world_size: int, *args, backend: str = "gloo", timeout_s: float = 60.0, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` fresh processes; return their results by rank.

    backend: "gloo" (CPU ranks) or "nccl" (rank r on cuda:r). ``timeout_s`` bounds the whole job
    (and every collective). Raises :class:`RankError` naming the failing rank and why.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"nccl with {world_size} ranks needs {world_size} GPUs, found {torch.cuda.device_count()}")
    try:
        payload = pickle.dumps((fn, args, kwargs))
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"launch: fn and its arguments must be picklable (fn a module-level function): {exc}") from exc
    if backend == "nccl":  # CUDA cannot be used in a forked child: each NCCL rank imports torch itself
        ctx = mp.get_context("spawn")
    else:  # one forkserver imports torch and the library once, then forks each rank in milliseconds
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["dispatch.parallel"])
    run_dir = pathlib.Path(tempfile.mkdtemp(prefix="dispatch-launch-"))
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world_size, port, backend, timeout_s, payload, list(sys.path),
                                              str(run_dir)), daemon=True) for r in range(world_size)]
    try:
        with _cpu_ranks(backend == "gloo"):
            for p in procs:
                p.start()
        return _collect(procs, run_dir, timeout_s)
    finally:
        (run_dir / "release").touch()
        _end(procs)
        shutil.rmtree(run_dir, ignore_errors=True)


def _cpu_ranks(on: bool):
    """gloo ranks are CPU ranks, also on a machine with GPUs: they (and the forkserver that forks
    them, started with this environment) see no GPU, so Triton runs under its interpreter there."""
    if not on:
        return contextlib.nullcontext()
    return mock.patch.dict(os.environ, CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")


def _collect(procs, run_dir: pathlib.Path, timeout_s: float) -> list:
    R = len(procs)
    deadline, first_failure = time.monotonic() + timeout_s, None
    done, failed = {}, {}  # rank -> result / (kind, time, message)
    while len(done) + len(failed) < R:
        now = time.monotonic()
        if first_failure is not None and now > first_failure + GRACE_S:
            break
        if now > deadline:
            late = [r for r in range(R) if r not in done and r not in failed]
            where = _where(procs, late, run_dir, timeout_s)
            # A report that landed meanwhile wins (a peer's collective times out with the deadline).
            _scan(procs, run_dir, done, failed)
            failed.update({r: v for r, v in where.items() if r not in done and r not in failed})
            break
        _scan(procs, run_dir, done, failed)
        if failed and first_failure is None:
            first_failure = time.monotonic()
        time.sleep(POLL_S)
    if failed:
        # The cause: a rank that failed on its own (not inside a broken collective), earliest first.
        order = sorted(failed, key=lambda r: (failed[r][0] != "own", failed[r][1], r))
        first = order[0]
        others = "".join(f"\n  also rank {r}: {failed[r][2].splitlines()[0][:200]}" for r in order[1:])
        raise RankError(f"rank {first} of {R} {failed[first][2].rstrip()}{others}")
    return [torch.load(done[r], weights_only=False) for r in range(R)]


def _scan(procs, run_dir: pathlib.Path, done: dict, failed: dict) -> None:
    """Record each pending rank's report: a result, an error, or its death."""
    for r, p in enumerate(procs):
        if r in done or r in failed:
            continue
        if (run_dir / f"rank{r}.result").exists():
            done[r] = run_dir / f"rank{r}.result"
        elif (run_dir / f"rank{r}.error").exists():
            kind, at, text = (run_dir / f"rank{r}.error").read_text().split("\n", 2)
            failed[r] = (kind, float(at), "raised " + text)
        elif not p.is_alive():
            failed[r] = ("own", time.time(), _death(p.exitcode))


def _where(procs, late, run_dir: pathlib.Path, timeout_s: float) -> dict:
    """Late ranks' innermost Python frames (faulthandler, on SIGUSR1): a rank waiting inside
    torch.distributed is the symptom; one stuck anywhere else is the cause."""
    for r in late:
        if procs[r].is_alive():
            os.kill(procs[r].pid, signal.SIGUSR1)
    time.sleep(0.3)
    out = {}
    for r in late:
        path = run_dir / f"rank{r}.stack"
        frames = [ln.strip() for ln in (path.read_text() if path.exists() else "").splitlines()
                  if ln.strip().startswith("File ")]
        waiting = bool(frames) and "torch/distributed" in frames[0]
        where = f"; it was {'waiting in a collective' if waiting else 'at'}: {frames[0]}" if frames else ""
        if waiting:
            user = [f for f in frames if "torch/distributed" not in f]
            where += f" (called from {user[0]})" if user else ""
        out[r] = ("collective" if waiting else "own", time.time(),
                  f"did not finish within timeout_s={timeout_s:g} s{where}")
    return out


def _end(procs) -> None:
    procs = [p for p in procs if p.pid is not None]  # (a start may have failed)
    for p in procs:
        if p.is_alive():
            p.join(0.3)  # released ranks exit on their own within a poll
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join(1.0)


def init_from_env(backend: str = "auto", timeout_s: float = 120.0) -> tuple[int, int]:
    """Under torchrun: init the default group from RANK/WORLD_SIZE/MASTER_* (set by torchrun),
    with a timeout; NCCL on CUDA (rank on cuda:LOCAL_RANK), else gloo. Returns (rank, world_size)."""
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "RANK" not in os.environ:  # plain `python -m ...`: a world of one
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def fingerprint(t: torch.Tensor) -> str:
    """A tensor's content as 16 hex digits, the same on every device: its bits read as integers,
    each times a weight from its position, summed exactly in int64 (wrapping), so no reduction order
    or device changes it; a different value anywhere (a flipped bit, a swapped expert) changes it."""
    t = t.detach().contiguous().reshape(-1)
    nbytes = t.numel() * t.element_size()
    words = t.view(torch.uint8).view(torch.int32 if nbytes % 4 == 0 else torch.uint8).reshape(-1)
    acc = torch.zeros((), dtype=torch.int64, device=t.device)
    for start in range(0, words.numel(), 1 << 24):  # bounded scratch memory for big stacks
        w = words[start:start + (1 << 24)].long()
        pos = torch.arange(start, start + w.numel(), device=t.device, dtype=torch.int64)
        acc += (w * (pos % 1000003 + 1)).sum()
    text = f"{t.dtype}:{tuple(t.shape)}:{nbytes}:{int(acc)}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_same_everywhere(group=None, **items) -> None:
    """ValueError on every rank unless all ranks pass equal ``items`` (compared by a hash of repr)."""
    text = repr(sorted(items.items()))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (digest, text[:400]), group=group)
    if len({d for d, _ in gathered}) > 1:
        lines = "\n".join(f"  rank {r}: {t}" for r, (_, t) in enumerate(gathered))
        raise ValueError(f"ranks were given different configurations ({', '.join(items)}):\n{lines}")
