"""``save_image`` and ``make_grid`` without PIL: the file holds a digest of the image."""

from __future__ import annotations

import hashlib
from typing import Any

import torch


def make_grid(
    tensor: Any, nrow: int = 8, padding: int = 2, normalize: bool = False, **kwargs: Any
) -> torch.Tensor:
    t = torch.as_tensor(tensor) if not isinstance(tensor, list) else torch.stack(tensor)
    return t.reshape(-1, *t.shape[-2:]) if t.dim() == 4 else t


def save_image(
    tensor: Any, fp: Any, nrow: int = 8, padding: int = 2, normalize: bool = False, **kwargs: Any
) -> None:
    t = torch.as_tensor(tensor) if not isinstance(tensor, list) else torch.stack(tensor)
    digest = hashlib.sha256(t.detach().cpu().contiguous().float().numpy().tobytes()).hexdigest()
    if hasattr(fp, "write"):
        fp.write(digest.encode())
        return
    with open(fp, "w") as f:
        f.write(f"{tuple(t.shape)} {digest}\n")
