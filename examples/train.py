"""A small classifier trained the way most scripts are: a DataLoader, an epoch loop in main(),
and a train_one_epoch() function holding the batch loop. It logs only the loss.

The data is synthetic (10 Gaussian clusters in 64 dimensions), so the demo needs no download.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(n: int, seed: int) -> TensorDataset:
    centers = torch.randn(10, 64, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    x = centers[labels] + 1.5 * torch.randn(n, 64, generator=g)
    return TensorDataset(x, labels)


def train_one_epoch(model, loader, optimizer, loss_fn):
    model.train()
    total = 0.0
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total / (step + 1)


def evaluate(model, loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
    return correct / len(loader.dataset)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    train = DataLoader(make_data(4000, 1), batch_size=32, shuffle=True)
    test = DataLoader(make_data(1000, 2), batch_size=256)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        loss = train_one_epoch(model, train, optimizer, loss_fn)
        acc = evaluate(model, test)
        scheduler.step()
        print(f"epoch {epoch} loss {loss:.6f} acc {acc:.4f}")


if __name__ == "__main__":
    main()
