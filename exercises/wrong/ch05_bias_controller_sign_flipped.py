"""The bias moves the wrong way: up for the overloaded experts, which then get even more."""
import torch


def balance_by_bias(scores_TE: torch.Tensor, top_k: int, rate: float, target: float,
                    max_steps: int) -> tuple[torch.Tensor, list[float], torch.Tensor, torch.Tensor]:
    E = scores_TE.shape[1]
    s_TE = scores_TE.float()
    bias_E = torch.zeros(E)
    imbalances = []
    for _ in range(max_steps):
        ids_TK = (s_TE + bias_E).topk(top_k, dim=-1).indices  # the bias only chooses
        load_E = torch.bincount(ids_TK.reshape(-1), minlength=E).float()
        imbalances.append(float(load_E.max() / load_E.mean()))
        if imbalances[-1] <= target:
            w_TK = s_TE.gather(1, ids_TK)
            return bias_E, imbalances, w_TK / w_TK.sum(-1, keepdim=True), ids_TK
        bias_E = bias_E + rate * torch.sign(load_E - load_E.mean())
    raise ValueError(f"the loads did not balance within {max_steps} steps (imbalance {imbalances[-1]:.3f})")
