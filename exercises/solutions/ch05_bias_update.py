"""Chapter 5, exercise 2: the auxiliary-loss-free bias step.

After a batch, each expert's bias moves by ``rate`` towards balance: down if the expert got more
rows than the mean, up if fewer, unchanged if exactly at the mean. Return the new bias (fp32, the
input is not modified). Example: counts [6, 2, 4], rate 0.1 → bias + [-0.1, +0.1, 0].
"""
import torch


def update_bias(bias_E: torch.Tensor, counts_E: torch.Tensor, rate: float) -> torch.Tensor:
    c = counts_E.float()
    return bias_E + rate * torch.sign(c.mean() - c)
