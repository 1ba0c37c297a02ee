"""State that lives outside the obvious places, each replayed under the protocol against a plain
run: loose parameters, module attributes and non-persistent buffers, modules created inside a
skipped loop, containers filled by library functions, and RNG objects used inside expressions.

Scripts train by hand unless the optimizer is part of the subject (the ids of a fold's optimizer,
LBFGS's closure): torch.optim's first call imports torch._dynamo, about a CPU-second per process."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.protocol import replay_matches_plain

EVERY = {"FLORTRAIN_PERIOD": "every"}


def test_parameters_that_belong_to_no_module(tmp_path: Path) -> None:
    text = textwrap.dedent(
        """\
        import torch
        torch.manual_seed(0)
        X = torch.randn(64, 4)
        Y = X @ torch.tensor([[1.0], [2.0], [-1.0], [0.5]]) + 0.3
        W = torch.zeros(4, 1, requires_grad=True)
        b = torch.zeros(1, requires_grad=True)
        for epoch in range(4):
            for i in range(8):
                W.grad = None
                b.grad = None
                loss = ((X[i * 8:(i + 1) * 8] @ W + b - Y[i * 8:(i + 1) * 8]) ** 2).mean()
                loss.backward()
                with torch.no_grad():
                    W.sub_(0.05 * W.grad)
                    b.sub_(0.05 * b.grad)
            print("epoch", epoch, loss.item())
            #PROBE
        """
    )
    rep = replay_matches_plain(
        tmp_path,
        text,
        'print("PROBE", epoch, W.sum().item(), b.item(), W.grad.norm().item())',
        EVERY,
    )
    assert "4 block instances skipped" in rep.err


def test_module_attributes_and_non_persistent_buffers(tmp_path: Path) -> None:
    text = textwrap.dedent(
        """\
        import torch
        from torch import nn

        class Counting(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 1)
                self.calls = 0
                self.register_buffer("seen", torch.zeros(()), persistent=False)

            def forward(self, x):
                self.calls += 1
                self.seen += x.shape[0]
                return self.fc(x)

        torch.manual_seed(0)
        X = torch.randn(32, 4)
        model = Counting()
        for epoch in range(3):
            for i in range(4):
                model.zero_grad()
                model(X[i * 8:(i + 1) * 8]).pow(2).mean().backward()
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.1 * p.grad
            print("epoch", epoch)
            #PROBE
        """
    )
    replay_matches_plain(
        tmp_path,
        text,
        'print("PROBE", model.calls, model.seen.item(), model.fc.bias.item())',
        EVERY,
    )


def test_module_containers_and_private_generators_changed_in_forward(tmp_path: Path) -> None:
    # State a custom module keeps for itself and changes on every call: a dict of counters, a
    # list, a dict of tensors updated in place and rebound, a private generator for noise.
    text = textwrap.dedent(
        """\
        import torch
        from torch import nn

        class Tracked(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 1)
                self.stats = {"n": 0, "hist": []}
                self.running = {"mean": torch.zeros(4)}
                self.noise = torch.Generator().manual_seed(3)

            def forward(self, x):
                self.stats["n"] += 1
                self.stats["hist"].append(round(x.mean().item(), 6))
                self.running["mean"].mul_(0.9).add_(0.1 * x.mean(0))
                self.running["std"] = x.std(0)
                return self.fc(x + 0.01 * torch.randn(x.shape, generator=self.noise))

        torch.manual_seed(0)
        X = torch.randn(32, 4)
        model = Tracked()
        for epoch in range(4):
            for i in range(4):
                model.zero_grad()
                model(X[i * 8:(i + 1) * 8]).pow(2).mean().backward()
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.1 * p.grad
            #PROBE
            print("epoch", epoch, model.stats["n"], f"{model.fc.bias.item():.8f}")
        print("final", model.stats["hist"][-3:], model.running["mean"].tolist())
        """
    )
    probe = 'print("PROBE", model.stats["n"], len(model.stats["hist"]), model.running["std"].tolist(), model.noise.initial_seed())'
    for env in (EVERY, {}):
        replay_matches_plain(tmp_path, text, probe, env)


def test_modules_created_inside_a_skipped_loop_keep_ids_aligned(tmp_path: Path) -> None:
    # `crit = nn.MSELoss()` inside the batch loop: on replay the skipped loop creates no module,
    # and the next fold's model and optimizer must still be found under their recorded ids.
    text = textwrap.dedent(
        """\
        import torch
        from torch import nn
        torch.manual_seed(0)
        X = torch.randn(48, 4)
        Y = X.sum(1, keepdim=True)
        for fold in range(3):
            model = nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            total = 0.0
            for epoch in range(3):
                for i in range(6):
                    crit = nn.MSELoss()
                    opt.zero_grad()
                    loss = crit(model(X[i * 8:(i + 1) * 8]), Y[i * 8:(i + 1) * 8])
                    loss.backward()
                    opt.step()
                    total += loss.item()
            print("fold", fold, total)
            #PROBE
        """
    )
    rep = replay_matches_plain(
        tmp_path, text, 'print("PROBE", fold, model.weight.sum().item())', EVERY
    )
    assert "re-executing" not in rep.err


def test_containers_filled_by_library_functions_and_rng_in_expressions(tmp_path: Path) -> None:
    text = textwrap.dedent(
        """\
        import heapq
        from collections import deque
        import numpy as np
        import torch
        torch.manual_seed(0)
        rng = np.random.default_rng(0)
        X = np.random.default_rng(1).standard_normal((64, 4)).astype(np.float32)
        Y = (X.sum(1) > 0).astype(np.int64)
        model = torch.nn.Linear(4, 2)
        worst = []
        window = deque(maxlen=3)
        confusion = np.zeros((2, 2), dtype=np.int64)
        for epoch in range(4):
            for i in range(0, 64, 16):
                x = torch.from_numpy(X[i:i + 16] + 0.1 * rng.standard_normal((16, 4)).astype(np.float32))
                if rng.random() < 0.5:
                    x = -x
                y = torch.from_numpy(Y[i:i + 16])
                model.zero_grad()
                out = model(x)
                loss = torch.nn.functional.cross_entropy(out, y)
                loss.backward()
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.1 * p.grad
                heapq.heappush(worst, (-loss.item(), epoch, i))
                window.append(loss.item())
                np.add.at(confusion, (y.numpy(), out.argmax(1).numpy()), 1)
            print("epoch", epoch, f"{loss.item():.8f}")
            #PROBE
        """
    )
    replay_matches_plain(
        tmp_path,
        text,
        'print("PROBE", epoch, worst[0], list(window), confusion.tolist(), rng.bit_generator.state["state"]["state"])',
        EVERY,
    )
    # and with the default adaptive period, where un-checkpointed instances re-execute after
    # restored ones: the RNG object must have been restored for them to draw the same numbers
    replay_matches_plain(
        tmp_path, text, 'print("PROBE", epoch, worst[0], list(window), confusion.tolist())'
    )


def test_generators_a_data_loader_draws_from(tmp_path: Path) -> None:
    # Three streams that only iterating a loader advances, none named by any statement: the
    # loader's own generator (shuffle order), a weighted sampler's generator, and a dataset's
    # private numpy generator used for augmentation in __getitem__.
    text = textwrap.dedent(
        """\
        import numpy as np
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, Dataset, TensorDataset, WeightedRandomSampler

        class Jitter(Dataset):
            def __init__(self, x, y):
                self.x, self.y = x, y
                self.rng = np.random.default_rng(7)

            def __len__(self):
                return len(self.x)

            def __getitem__(self, i):
                noise = torch.from_numpy(self.rng.normal(0, 0.1, 4).astype("float32"))
                return self.x[i] + noise, self.y[i]

        torch.manual_seed(0)
        X, Y = torch.randn(32, 4), torch.randn(32, 1)
        shuffled = DataLoader(TensorDataset(X, Y), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1))
        weights = torch.linspace(0.1, 1.0, 32)
        weighted = DataLoader(TensorDataset(X, Y), batch_size=8,
                              sampler=WeightedRandomSampler(weights, 32, generator=torch.Generator().manual_seed(2)))
        jittered = DataLoader(Jitter(X, Y), batch_size=8)
        model = nn.Linear(4, 1)
        for epoch in range(4):
            for loader in (shuffled, weighted, jittered):
                for x, y in loader:
                    model.zero_grad()
                    loss = (model(x) - y).pow(2).mean()
                    loss.backward()
                    with torch.no_grad():
                        for p in model.parameters():
                            p -= 0.05 * p.grad
            #PROBE
            print("epoch", epoch, f"{loss.item():.10f}")
        print("next batches", [next(iter(dl))[0][0].tolist() for dl in (shuffled, weighted, jittered)])
        """
    )
    probe = 'print("PROBE", epoch, model.weight.sum().item())'
    for env in (EVERY, {}):
        replay_matches_plain(tmp_path, text, probe, env)


def test_state_changed_by_forward_and_backward_hooks(tmp_path: Path) -> None:
    # No statement in the loops names `acts` or `peak`: hooks change them whenever the model runs.
    text = textwrap.dedent(
        """\
        import torch
        from torch import nn

        acts = {}
        peak = 0.0

        def save(name):
            def hook(mod, inp, out):
                acts[name] = round(out.detach().abs().mean().item(), 8)
            return hook

        def track(mod, grad_in, grad_out):
            global peak
            peak = max(peak, grad_out[0].abs().max().item())

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        model[0].register_forward_hook(save("fc1"))
        model[2].register_forward_hook(save("fc2"))
        model[2].register_full_backward_hook(track)
        X, Y = torch.randn(64, 4), torch.randn(64, 1)
        for epoch in range(3):
            for i in range(0, 64, 16):
                loss = (model(X[i:i + 16]) - Y[i:i + 16]).pow(2).mean()
                model.zero_grad()
                loss.backward()
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.1 * p.grad
            #PROBE
            print(epoch, acts, f"{peak:.8f}")
        """
    )
    for env in (EVERY, {}):
        replay_matches_plain(tmp_path, text, 'print("PROBE", epoch, acts["fc1"], peak)', env)


def test_lbfgs_closure_and_a_function_defined_in_the_loop(tmp_path: Path) -> None:
    # `opt.step(closure)` runs the closure: the global counter it bumps is state of the loop.
    # `report` is defined inside the loop and called after it: that loop is refused (a function
    # cannot be restored) and runs as plain code, so its output is still exact.
    text = textwrap.dedent(
        """\
        import torch
        from torch import nn
        import torch.nn.functional as F

        torch.manual_seed(0)
        x = torch.randn(128, 5)
        y = torch.sin(x @ torch.randn(5, 1))
        model = nn.Sequential(nn.Linear(5, 10), nn.Tanh(), nn.Linear(10, 1))
        opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5, history_size=5)
        evals = 0
        for epoch in range(3):
            for i in range(0, 128, 32):
                xb, yb = x[i:i + 32], y[i:i + 32]
                def closure():
                    global evals
                    evals += 1
                    opt.zero_grad()
                    loss = F.mse_loss(model(xb), yb)
                    loss.backward()
                    return loss
                opt.step(closure)
            for j in range(2):
                def report(tag, e=epoch, j=j):
                    return f"{tag} {e} {j} {F.mse_loss(model(x), y).item():.8f}"
            #PROBE
            print(report("epoch"), evals)
        """
    )
    probe = 'print("PROBE", epoch, evals, opt.state[model[0].weight]["n_iter"])'
    for env in (EVERY, {}):
        rep = replay_matches_plain(tmp_path, text, probe, env)
        assert "function `report` is defined inside the loop" in rep.err


def test_objects_changed_through_a_loop_over_a_literal(tmp_path: Path) -> None:
    # The ImageNet-example meters: reset each epoch by `for m in (a, b): m.reset()`, a loop of
    # its own whose changeset is the meters it walks, not the loop variable.
    text = textwrap.dedent(
        """\
        import random

        class AverageMeter:
            def __init__(self):
                self.reset()

            def reset(self):
                self.sum, self.count = 0.0, 0

            def update(self, v, n=1):
                self.sum += v * n
                self.count += n

        random.seed(0)
        loss_m, n_m = AverageMeter(), AverageMeter()
        for epoch in range(4):
            for m in (loss_m, n_m):
                m.reset()
            for b in range(5):
                loss_m.update(random.random(), 2)
                n_m.update(1)
                #PROBE
            print(epoch, loss_m.sum / loss_m.count, n_m.count)
        """
    )
    for env in (EVERY, {}):
        replay_matches_plain(
            tmp_path, text, 'print("PROBE", epoch, b, loss_m.count, n_m.count)', env
        )
