"""Chapter 5, exercise 2: the loss-free bias, run until the loads balance.

A frozen router gives the tokens of a batch the same scores s_TE (in (0, 1), [T, E]) at every
step. DeepSeek-V3's auxiliary-loss-free balancing keeps a per-expert bias b, added to the scores
only to *choose* experts, and after every step moves it towards balance:
b_e += rate · sign(mean load − load_e). Simulate the controller from b = 0. Each step:

* every token chooses the K experts of largest s + b;
* load_e = rows routed to expert e; imbalance = max load / mean load;
* if imbalance ≤ ``target`` the loads have balanced: stop; else update b and take the next step.

Complete ``balance_by_bias(scores_TE, top_k, rate, target, max_steps)``. Return
``(bias_E, imbalances, weights_TK, ids_TK)``: b when the loads balanced, the imbalance of every
step taken (the last one ≤ target), and that last step's routing, whose weights are the chosen
experts' scores s (what does the bias have to do with them?) divided by their sum. Raise
ValueError when the loads have not balanced within ``max_steps`` steps.
"""
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
        bias_E = bias_E + rate * torch.sign(load_E.mean() - load_E)
    raise ValueError(f"the loads did not balance within {max_steps} steps (imbalance {imbalances[-1]:.3f})")
