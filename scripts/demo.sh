#!/usr/bin/env bash
# The whole hindsight-logging workflow on examples/train.py, in build/demo/:
# check -> record -> add a probe -> replay -> diff.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ROOT=$PWD
FT="$ROOT/.venv/bin/flortrain"
WORK=build/demo
rm -rf "$WORK" && mkdir -p "$WORK" && cp examples/train.py "$WORK/train.py"
cd "$WORK"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "0. Before training: would anything make this script unreplayable or nondeterministic?"
"$FT" check train.py

say "1. Train as usual, but under flortrain record (only the loss is logged)"
time "$FT" record train.py

say "2. Weeks later: what was the weight norm after each epoch? Probe it without editing the file"
LINE=$(grep -n 'scheduler.step()' train.py | cut -d: -f1)
time "$FT" replay train.py --probe "$LINE:round(model[0].weight.norm().item(), 6)"

say "3. And the gradient norm inside the batch loop? Add a print to train.py and replay"
sed -i 's/^\(        \)loss.backward()$/\1loss.backward()\n\1if step % 40 == 0: print(f"step {step} grad norm {model[0].weight.grad.norm():.6f}")/' train.py
grep -n "grad norm" train.py
time "$FT" replay train.py

say "4. Prove the replay faithful, and list the runs"
"$FT" diff
"$FT" runs
