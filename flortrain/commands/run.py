"""``flortrain run``: a script run as ``python`` runs it, nothing recorded.

With ``--deterministic`` it runs the per-example rewrite of the script under the deterministic
settings, as ``record --deterministic`` does, and prints what that record prints: the ground truth
of the correctness protocol in this mode. Its main loops count their own iterations (a record's
session counts them there), so every example is keyed as the record keys it.
"""

from __future__ import annotations

import os

from flortrain.determinism.settings import DEFAULT_SEED, Settings, said_rewrite
from flortrain.determinism.settings import apply as apply_settings
from flortrain.process.as_main import run_as_main
from flortrain.process.training import intra_op_threads
from flortrain.static.linemap import compile_for
from flortrain.static.text import project_uses_torch, read_text


def run(script: str, args: list[str], seed: int | None, deterministic: bool) -> int:
    text = read_text(script)
    path = os.path.abspath(script)
    if not deterministic:
        return run_as_main(compile(text, path, "exec", dont_inherit=True), script, args)
    from flortrain.determinism.rewrite import determinize

    rewritten = determinize(script, text, count_main_loops=True)
    code = compile_for(path, rewritten.text, text)
    uses_torch = project_uses_torch(script, text)
    said_rewrite(script, rewritten)
    settings = Settings(DEFAULT_SEED if seed is None else seed, intra_op_threads(uses_torch))
    apply_settings(settings, uses_torch)
    return run_as_main(code, script, args)
