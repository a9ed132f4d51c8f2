"""Run a function on N ranks: from a notebook or a test (:func:`launch`), or under torchrun
(:func:`init_from_env`). Faults end the whole job with the original message, never a hang.

    results = launch(workers.check_equal, 4, cfg, seed)   # gloo on CPU: one process per rank

``fn`` must be picklable (a module-level function: see ``dispatch.parallel.workers``); it runs
after ``init_process_group`` and its return value comes back per rank. If any rank raises, the
others are stopped, the message is posted to the rendezvous store (ranks stuck on a broken
collective re-raise *it*), and :func:`launch` raises :class:`RankError` with the original
traceback. Collectives time out after ``timeout_s``; the launcher itself gives up after that too.
"""
from __future__ import annotations

import datetime
import hashlib
import os
import queue as queue_mod
import socket
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ERROR_KEY = "dispatch/first_error"


class RankError(RuntimeError):
    """A rank of a multi-process job failed; the message carries the original traceback."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post_error(rank: int, text: str) -> None:
    """First failing rank wins: its message is what every rank (and the caller) reports."""
    try:
        store = dist.distributed_c10d._get_default_store()
        store.compare_set(ERROR_KEY, "", f"rank {rank}: {text}")
    except Exception:  # noqa: BLE001  (no store: the process group never came up)
        pass


def _posted_error() -> str | None:
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(datetime.timedelta(seconds=2))
        return store.get(ERROR_KEY).decode() if store.check([ERROR_KEY]) else None
    except Exception:  # noqa: BLE001
        return None


def run_guarded(fn, *args, **kwargs):
    """Call ``fn`` on this rank; on an exception, post it for the others, or re-raise a peer's."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        posted = _posted_error() if dist.is_initialized() else None
        if posted and f"rank {dist.get_rank()}:" not in posted[:12]:
            raise RankError(f"another rank failed first: {posted}") from exc
        if dist.is_initialized():
            _post_error(dist.get_rank(), "".join(traceback.format_exception(exc)))
        raise


def _entry(rank, world_size, port, backend, timeout_s, fn, args, kwargs, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        else:
            torch.set_num_threads(1)  # N ranks share the CPU cores
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        out = run_guarded(fn, *args, **kwargs)
        results.put((rank, "ok", out))
        dist.barrier()  # nobody tears the group down while a peer still talks to it
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001
        results.put((rank, "error", "".join(traceback.format_exception(exc))))
    finally:
        results.close()
        results.join_thread()
    # A failed rank exits at once (no destroy: its peers may be mid-collective); its closed sockets
    # make the peers' gloo collectives fail fast instead of waiting for the timeout.
    os._exit(0)


def launch(fn, world_size: int, *args, backend: str = "gloo", timeout_s: float = 60.0, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` fresh processes; return their results by rank.

    backend: "gloo" (CPU ranks) or "nccl" (rank r on cuda:r). Raises :class:`RankError` with the
    failing rank's traceback if any rank fails; ``TimeoutError`` after ``timeout_s`` (+ start-up).
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"nccl with {world_size} ranks needs {world_size} GPUs, found {torch.cuda.device_count()}")
    # gloo: one forkserver imports torch and dispatch once, then forks each rank in milliseconds
    # (spawn would re-import torch in every rank).
    # CUDA cannot be used in a forked child: NCCL ranks are spawned (each imports torch itself).
    if backend == "nccl":
        ctx = mp.get_context("spawn")
    else:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["dispatch.parallel.workers"])
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world_size, port, backend, timeout_s, fn, args, kwargs, results),
                         daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    out, errors = {}, {}
    deadline = time.monotonic() + timeout_s + 60  # + process start-up and imports
    try:
        while len(out) + len(errors) < world_size:
            if errors and time.monotonic() > first_error_at + 3:
                break  # the other ranks had their chance to report; stop them
            if time.monotonic() > deadline:
                raise TimeoutError(f"launch: ranks {sorted(set(range(world_size)) - set(out))} did not finish "
                                   f"within {timeout_s} s")
            try:
                rank, status, value = results.get(timeout=0.2)
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in out and r not in errors]
                for r in dead:  # died without reporting (killed, segfault)
                    if results.empty():
                        errors[r] = f"rank {r} exited with code {procs[r].exitcode} without a result"
                        first_error_at = time.monotonic()
                continue
            if status == "ok":
                out[rank] = value
            elif rank not in out:  # (a rank that already returned may still fail in teardown)
                if not errors:
                    first_error_at = time.monotonic()
                errors[rank] = value
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    if errors:
        # Prefer the rank that failed first (peers report "another rank failed first: ...").
        first = sorted(errors, key=lambda r: ("another rank failed first" in errors[r], r))[0]
        raise RankError(f"rank {first} of {world_size} failed:\n{errors[first]}")
    return [out[r] for r in range(world_size)]


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


def check_same_everywhere(group=None, **items) -> None:
    """ValueError on every rank unless all ranks pass equal ``items`` (compared by a hash of repr)."""
    text = repr(sorted(items.items()))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (digest, text[:400]), group=group)
    if len({d for d, _ in gathered}) > 1:
        lines = "\n".join(f"  rank {r}: {t}" for r, (_, t) in enumerate(gathered))
        raise ValueError(f"ranks were given different configurations ({', '.join(items)}):\n{lines}")
