"""The transforms the corpus's scripts compose, on uint8 tensors (HxW or HxWxC) for PIL images."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F


class Compose:
    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x


class ToTensor:
    def __call__(self, img: Any) -> torch.Tensor:
        t = torch.as_tensor(img)
        if t.dim() == 2:
            t = t.unsqueeze(-1)
        out = t.permute(2, 0, 1).contiguous()
        return out.float().div(255) if out.dtype == torch.uint8 else out.float()


class Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(list(mean)).view(-1, 1, 1)
        self.std = torch.tensor(list(std)).view(-1, 1, 1)

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return (t - self.mean) / self.std


class Lambda:
    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, x: Any) -> Any:
        return self.fn(x)


def _chw(img: Any) -> tuple[torch.Tensor, bool]:
    """An image as a float CxHxW tensor, and whether it came as an HxW(xC) uint8 image."""
    t = torch.as_tensor(img)
    if t.dtype == torch.uint8:
        t = t.unsqueeze(-1) if t.dim() == 2 else t
        return t.permute(2, 0, 1).float(), True
    return t, False


def _back(t: torch.Tensor, was_image: bool) -> Any:
    return t.round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).squeeze(-1) if was_image else t


class Resize:
    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = (size, size) if isinstance(size, int) else tuple(size)

    def __call__(self, img: Any) -> Any:
        t, was = _chw(img)
        if tuple(t.shape[-2:]) == self.size:
            return img
        return _back(
            F.interpolate(t[None], size=self.size, mode="bilinear", align_corners=False)[0], was
        )


class CenterCrop:
    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = (size, size) if isinstance(size, int) else tuple(size)

    def __call__(self, img: Any) -> Any:
        t, was = _chw(img)
        h, w = t.shape[-2:]
        top, left = (h - self.size[0]) // 2, (w - self.size[1]) // 2
        return _back(t[..., top : top + self.size[0], left : left + self.size[1]], was)


class Pad:
    def __init__(self, padding: int) -> None:
        self.padding = padding

    def __call__(self, img: Any) -> Any:
        t, was = _chw(img)
        return _back(F.pad(t, [self.padding] * 4), was)


class RandomCrop:
    """Draws from torch's global generator, as torchvision does."""

    def __init__(self, size: int | Sequence[int], padding: int = 0) -> None:
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.padding = padding

    def __call__(self, img: Any) -> Any:
        t, was = _chw(img)
        if self.padding:
            t = F.pad(t, [self.padding] * 4)
        h, w = t.shape[-2:]
        top = int(torch.randint(0, h - self.size[0] + 1, (1,)))
        left = int(torch.randint(0, w - self.size[1] + 1, (1,)))
        return _back(t[..., top : top + self.size[0], left : left + self.size[1]], was)


class RandomHorizontalFlip:
    """Draws from torch's global generator, as torchvision does."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, img: Any) -> Any:
        if float(torch.rand(1)) < self.p:
            t, was = _chw(img)
            return _back(t.flip(-1), was)
        return img
