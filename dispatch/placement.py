"""Which rank holds which experts: the :class:`Placement` map, contiguous blocks by default.

``slots_RS[r]`` lists the expert ids rank r holds, in its local slot order (slot s of rank r
holds expert ``slots_RS[r][s]``). An expert may sit on several ranks (replicas); a routed row
then goes to one replica by a fixed rule, :meth:`Placement.dest_rank_N`, so every run and every
world size agrees on who computes it. That rule deals an expert's rows out round-robin, an
equal split over its replicas, so the load a placement puts on each rank follows from the
experts' loads alone (:meth:`Placement.rank_loads`): what the load-balance chapter
(``dispatch.balance.greedy_placement``) plans with.

    >>> Placement.contiguous(8, 2).slots_RS
    ((0, 1, 2, 3), (4, 5, 6, 7))
    >>> Placement(4, 2, ((0, 1, 2), (0, 3))).rank_loads([4, 1, 1, 2])  # expert 0 on both ranks
    [4.0, 4.0]
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class Placement:
    num_experts: int  # E
    num_ranks: int  # R
    slots_RS: tuple[tuple[int, ...], ...]  # expert id of each local slot of each rank (rows may differ in length)

    def __post_init__(self):
        E, R = self.num_experts, self.num_ranks
        if not isinstance(E, int) or E < 1 or not isinstance(R, int) or R < 1:
            raise ValueError(f"Placement needs num_experts >= 1 and num_ranks >= 1, got {E}, {R}")
        slots = tuple(tuple(int(e) for e in row) for row in self.slots_RS)
        object.__setattr__(self, "slots_RS", slots)
        if len(slots) != R:
            raise ValueError(f"Placement.slots_RS must have one row per rank ({R}), got {len(slots)}")
        for r, row in enumerate(slots):
            if len(set(row)) != len(row):
                raise ValueError(f"rank {r} holds an expert twice: {row}")
            bad = [e for e in row if not 0 <= e < E]
            if bad:
                raise ValueError(f"rank {r} holds expert ids outside [0, {E}): {bad}")
        missing = sorted(set(range(E)) - {e for row in slots for e in row})
        if missing:
            raise ValueError(f"every expert must sit on at least one rank; nobody holds {missing}")

    @classmethod
    def contiguous(cls, num_experts: int, num_ranks: int) -> "Placement":
        """Rank r holds a contiguous block of experts, blind to load; block sizes differ by at most one."""
        for name, v in (("num_experts", num_experts), ("num_ranks", num_ranks)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"contiguous placement needs a positive int {name}, got {v!r}")
        if num_ranks > num_experts:
            raise ValueError(f"contiguous placement needs num_ranks ({num_ranks}) <= num_experts ({num_experts})")
        base, extra = divmod(num_experts, num_ranks)
        rows, start = [], 0
        for r in range(num_ranks):
            n = base + (r < extra)
            rows.append(tuple(range(start, start + n)))
            start += n
        return cls(num_experts, num_ranks, tuple(rows))

    @property
    def slots_per_rank(self) -> int:
        """Local slots of the fullest rank (S)."""
        return max(len(row) for row in self.slots_RS)

    def replicas(self, expert: int) -> tuple[int, ...]:
        """Ranks holding ``expert``, ascending; each serves ``1 / len(replicas)`` of its rows."""
        return tuple(r for r, row in enumerate(self.slots_RS) if expert in row)

    def replica_loads(self, load_E) -> list[list[float]]:
        """Rows each slot computes [R][S] when expert e receives ``load_E[e]`` rows, split equally
        over its replicas."""
        load_E = [float(v) for v in load_E]
        if len(load_E) != self.num_experts:
            raise ValueError(f"load_E must have {self.num_experts} entries, got {len(load_E)}")
        n_E = [0] * self.num_experts
        for row in self.slots_RS:
            for e in row:
                n_E[e] += 1
        return [[load_E[e] / n_E[e] for e in row] for row in self.slots_RS]

    def rank_loads(self, load_E) -> list[float]:
        """Rows each rank computes [R] when expert e receives ``load_E[e]`` rows."""
        return [sum(row) for row in self.replica_loads(load_E)]

    def max_over_mean(self, load_E) -> float:
        """Busiest rank / mean rank: the slowdown of a step that waits for the busiest rank."""
        loads = self.rank_loads(load_E)
        mean = sum(loads) / len(loads)
        return max(loads) / mean if mean else 1.0

    def tables(self, device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Lookup tensors: replica_EX (ranks of each expert, -1 padded), num_replicas_E, slot_RE
        (local slot of expert e on rank r, -1 where r does not hold e). All int64; cached per device."""
        return _tables(self, str(torch.device(device or "cpu")))

    def _build_tables(self, device):
        E, R = self.num_experts, self.num_ranks
        reps = [self.replicas(e) for e in range(E)]
        X = max(len(r) for r in reps)
        replica_EX = torch.full((E, X), -1, dtype=torch.int64)
        for e, rs in enumerate(reps):
            replica_EX[e, : len(rs)] = torch.tensor(rs)
        slot_RE = torch.full((R, E), -1, dtype=torch.int64)
        for r, row in enumerate(self.slots_RS):
            slot_RE[r, list(row)] = torch.arange(len(row))
        n_E = torch.tensor([len(rs) for rs in reps], dtype=torch.int64)
        return replica_EX.to(device), n_E.to(device), slot_RE.to(device)

    def dest_rank_N(self, ids_TK: torch.Tensor, origin_rank: int) -> torch.Tensor:
        """Destination rank of every routed row n = t·K + k of ``origin_rank``'s tokens.

        Replica rule: expert e with replicas (r_0 < r_1 < ...) is served for token t of rank
        ``origin_rank`` by r_j, j = (origin_rank + t) mod #replicas — fixed, so deterministic.
        """
        replica_EX, n_E, _ = self.tables(ids_TK.device)
        T, K = ids_TK.shape
        ids = ids_TK.long()
        if replica_EX.shape[1] == 1:  # no replicas: the owner table says it all
            return replica_EX[:, 0][ids].reshape(T * K)
        t_TK = torch.arange(T, device=ids.device).unsqueeze(1).expand(T, K)
        j_TK = (origin_rank + t_TK) % n_E[ids]
        return replica_EX[ids, j_TK].reshape(T * K)


@lru_cache(maxsize=64)
def _tables(placement: Placement, device: str):
    return placement._build_tables(device)

