"""Row comparison: a tensor as rows (its last dimension), and each row's relative error against
an expected tensor. The verifier's reference check, the pipeline's steps, the benchmark's
correctness check after timing and the throughput step all compare this way."""

from __future__ import annotations

from kernalin_ci.lazy import torch


def rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(1, -1) if t.dim() < 2 else t.reshape(-1, t.shape[-1])


def row_errors(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """||a - e|| / ||e|| per row (last dim); NaN where the actual row is not finite."""
    a, e = rows(actual), rows(expected)
    return (a - e).norm(dim=-1) / e.norm(dim=-1).clamp_min(1e-30)
