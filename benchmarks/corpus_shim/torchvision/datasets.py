"""Seeded synthetic data sets with torchvision's shapes, sized for a run of seconds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: samples per split: enough for a few batches, few enough for seconds per epoch
TRAIN_SIZE = 256
TEST_SIZE = 64


class _Images(torch.utils.data.Dataset[tuple[Any, int]]):
    """``data`` (uint8, NxHxW or NxHxWxC) and ``targets``, as torchvision's sets hold them."""

    def __init__(
        self,
        shape: tuple[int, ...],
        classes: int,
        size: int,
        seed: int,
        transform: Callable[[Any], Any] | None,
        target_transform: Callable[[Any], Any] | None,
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.targets = torch.randint(0, classes, (size,), generator=g)
        # class-dependent images, so that training has something to learn
        base = torch.rand((classes, *shape), generator=g)
        noise = torch.rand((size, *shape), generator=g)
        self.data = ((0.6 * base[self.targets] + 0.4 * noise) * 255).to(torch.uint8)
        self.transform = transform
        self.target_transform = target_transform
        self.classes = [str(i) for i in range(classes)]

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        img: Any = self.data[index]
        target: Any = int(self.targets[index])
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target


class MNIST(_Images):
    def __init__(
        self,
        root: str = "",
        train: bool = True,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        download: bool = False,
    ) -> None:
        size = TRAIN_SIZE if train else TEST_SIZE
        super().__init__((28, 28), 10, size, 1 if train else 2, transform, target_transform)


class FashionMNIST(MNIST):
    pass


class CIFAR10(_Images):
    def __init__(
        self,
        root: str = "",
        train: bool = True,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        download: bool = False,
    ) -> None:
        size = TRAIN_SIZE if train else TEST_SIZE
        super().__init__((32, 32, 3), 10, size, 3 if train else 4, transform, target_transform)


class FakeData(_Images):
    def __init__(
        self,
        size: int = 64,
        image_size: tuple[int, int, int] = (3, 224, 224),
        num_classes: int = 10,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        random_offset: int = 0,
    ) -> None:
        c, h, w = image_size
        super().__init__(
            (h, w, c), num_classes, min(size, 64), 5 + random_offset, transform, target_transform
        )
