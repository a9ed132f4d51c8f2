"""The paged cache's tensors and one step of the model over a scheduled batch, eager or graphed.

Host side, each running sequence owns a row of a numpy block table [max_seqs, M] that is updated
only when the sequence gains blocks, so building a step's tables is one fancy index, whatever the
contexts. A decode-only step of B rows runs in the smallest bucket of chapter 6's
:data:`dispatch.engine.BUCKETS` holding B: on CUDA as a CUDA graph captured once per bucket over
fixed buffers — token ids, positions, slots and the block tables are the graph's inputs, copied in
before each replay; the padding rows read and write the scratch block only. Steps that carry
prefill chunks run eagerly (their shapes change every step).
"""
from __future__ import annotations

import numpy as np
import torch

from dispatch.engine.engine import BUCKETS, bucket
from dispatch.engine.model import LeanModel
from dispatch.serve.model import StepBatch, new_kv_cache, paged_forward
from dispatch.serve.scheduler import Scheduled, Sequence


class ModelRunner:
    """The pool (``num_blocks`` blocks of ``block_size``), the tables, the step (see module docstring)."""

    def __init__(self, lean: LeanModel, *, num_blocks: int, block_size: int, max_seqs: int, max_model_len: int,
                 graphs: bool, kernels: bool):
        if graphs and lean.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.lean, self.dev, self.graphs, self.kernels = lean, lean.device, graphs, kernels
        self.block_size, self.num_blocks = block_size, num_blocks
        self.M = -(-max_model_len // block_size)  # table columns: blocks of the longest sequence
        self.kv = new_kv_cache(lean, num_blocks, block_size)
        self.scratch_block = num_blocks  # padding rows of a graph write here
        self.table = np.full((max_seqs, self.M), self.scratch_block, dtype=np.int32)
        self.known = np.zeros(max_seqs, dtype=np.int64)  # blocks of each row already written
        self.free_rows = list(range(max_seqs - 1, -1, -1))
        self.row_of: dict[int, int] = {}  # sequence id → its table row
        self.max_seqs = max_seqs
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._pool = None
        self._buf: dict[str, torch.Tensor] = {}

    # ---- host-side tables ----
    def _row(self, seq: Sequence) -> int:
        r = self.row_of.get(seq.id)
        if r is None:
            r = self.row_of[seq.id] = self.free_rows.pop()
            self.known[r] = 0
        blocks, k = seq.table.blocks, int(self.known[r])
        if len(blocks) > k:
            new = np.asarray(blocks[k:], dtype=np.int64)
            if len(blocks) > self.M or new.min() < 0 or new.max() >= self.num_blocks:
                raise RuntimeError(f"sequence {seq.id}: blocks {blocks[k:]} at columns {k}.. of a table of "
                                   f"{self.M}; the pool has {self.num_blocks} blocks")
            self.table[r, k:len(blocks)] = new
            self.known[r] = len(blocks)
        return r

    def release(self, seq: Sequence) -> None:
        """Forget ``seq``'s row (finished, aborted or preempted: its blocks went back)."""
        r = self.row_of.pop(seq.id, None)
        if r is not None:
            self.table[r] = self.scratch_block
            self.free_rows.append(r)

    def _slots(self, rows: np.ndarray, pos: np.ndarray) -> np.ndarray:
        bs = self.block_size
        return self.table[rows, pos // bs].astype(np.int64) * bs + pos % bs

    def build(self, step: Scheduled) -> tuple[StepBatch, list[Sequence]]:
        """The step's tensors and the sequences whose logits it returns (in row order)."""
        out = list(step.decode)
        B = len(out)
        rows = [self._row(seq) for seq in out]
        ids = [seq.tokens[seq.computed] for seq in out]
        pos = [seq.computed for seq in out]
        wanted = list(range(B))
        c_rows, q_start, q_len, ctx = [], [], [], []
        for seq, n in step.chunks:
            c_rows.append(self._row(seq))
            q_start.append(len(ids) - B)
            q_len.append(n)
            ctx.append(seq.computed)
            ids.extend(seq.tokens[seq.computed:seq.computed + n])
            pos.extend(range(seq.computed, seq.computed + n))
            rows.extend([c_rows[-1]] * n)
            if seq.computed + n == len(seq.tokens):  # the chunk completes the sequence: a token is due
                wanted.append(len(ids) - 1)
                out.append(seq)
        pos_np, rows_np = np.asarray(pos, dtype=np.int64), np.asarray(rows, dtype=np.int64)
        owned = self.known[rows_np] * self.block_size
        if (pos_np >= owned).any():  # a slot in a block the sequence does not hold: refused, never written
            t = int(np.argmax(pos_np >= owned))
            raise RuntimeError(f"token {t} of the step is at position {pos_np[t]}, past the {owned[t]} positions "
                               "its sequence's blocks hold")
        slots = self._slots(rows_np, pos_np)
        dev = self.dev

        def t(a, dtype=torch.long):
            return torch.as_tensor(np.asarray(a), dtype=dtype).to(dev, non_blocking=True)

        batch = StepBatch(
            ids_T=t(ids), pos_T=t(pos_np), slot_T=t(slots), table_BM=t(self.table[rows_np[:B]], torch.int32),
            table_CM=t(self.table[np.asarray(c_rows, dtype=np.int64)].reshape(len(c_rows), self.M), torch.int32),
            q_start_C=t(q_start), q_len_C=t(q_len), ctx_start_C=t(ctx), max_q_len=max(q_len, default=0),
            logit_rows_R=None if len(wanted) == len(ids) else t(wanted))
        return batch, out

    # ---- the step ----
    def run(self, step: Scheduled) -> tuple[torch.Tensor, list[Sequence]]:
        """Logits [R, V] (fp32) of the sequences that get a token this step, and those sequences."""
        batch, seqs = self.build(step)
        with torch.no_grad():
            if self.graphed(step):
                return self._replay(batch), seqs
            return paged_forward(self.lean, batch, self.kv, kernels=self.kernels).float(), seqs

    def graphed(self, step: Scheduled) -> bool:
        """Whether ``step`` replays a captured graph (decode rows only, at most the largest bucket)."""
        return self.graphs and not step.chunks and len(step.decode) <= BUCKETS[-1]

    def _buffers(self, G: int) -> StepBatch:
        """Fixed inputs of bucket G, all rows padding (scratch block, position 0)."""
        if not self._buf:
            n = BUCKETS[-1] if self.max_seqs > BUCKETS[-1] else bucket(self.max_seqs)
            z = dict(device=self.dev, dtype=torch.long)
            self._buf = {"ids": torch.zeros(n, **z), "pos": torch.zeros(n, **z),
                         "slot": torch.full((n,), self.scratch_block * self.block_size, **z),
                         "table": torch.full((n, self.M), self.scratch_block, device=self.dev, dtype=torch.int32)}
        b, e = self._buf, torch.empty(0, dtype=torch.long, device=self.dev)
        return StepBatch(b["ids"][:G], b["pos"][:G], b["slot"][:G], b["table"][:G],
                         torch.empty(0, self.M, dtype=torch.int32, device=self.dev), e, e, e, 0, None)

    def capture(self, G: int) -> None:
        """Record the decode step of bucket G (warm-up first: compilation and tile choices happen
        outside the capture). The padding rows touch only the scratch block."""
        if G in self._graphs:
            return
        batch = self._buffers(G)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            for _ in range(2):
                paged_forward(self.lean, batch, self.kv, kernels=self.kernels)
        torch.cuda.current_stream().wait_stream(s)
        self._pool = self._pool or torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._pool), torch.no_grad():
            self._buf[f"logits{G}"] = paged_forward(self.lean, batch, self.kv, kernels=self.kernels)
        self._graphs[G] = g

    def capture_all(self) -> None:
        """Capture every bucket a decode step can take (up to ``max_seqs`` rows), before serving."""
        top = bucket(min(self.max_seqs, BUCKETS[-1]))
        for G in BUCKETS:
            if G <= top:
                self.capture(G)

    def _replay(self, batch: StepBatch) -> torch.Tensor:
        B = batch.num_decode
        G = bucket(B)
        self.capture(G)
        b = self._buf
        b["ids"][:B].copy_(batch.ids_T)
        b["pos"][:B].copy_(batch.pos_T)
        b["slot"][:B].copy_(batch.slot_T)
        b["table"][:B].copy_(batch.table_BM)
        b["ids"][B:G].zero_()
        b["pos"][B:G].zero_()
        b["slot"][B:G].fill_(self.scratch_block * self.block_size)
        b["table"][B:G].fill_(self.scratch_block)
        self._graphs[G].replay()
        return b[f"logits{G}"][:B].float()
