"""The ``flortrain`` command: click and nothing else. Exit codes: 0 success, 1 a finding or a
difference, 2 bad input or usage (one line on stderr, never a traceback). Above 500 lines: one
click declaration per command and option, with their help text; the work is in ``commands/``."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sqlite3
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from flortrain import __version__
from flortrain.determinism import MAX_SEED
from flortrain.errors import FlortrainError

F = TypeVar("F", bound=Callable[..., Any])


def _one_line_errors(fn: F) -> F:
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FlortrainError as e:
            click.echo(e.one_line(), err=True)
            sys.exit(2)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except sqlite3.Error as e:  # a damaged or locked database: the store's fault, not ours
            click.echo(
                f"flortrain: FT017 the store's database failed: {e} (locked by another process past"
                " FLORTRAIN_DB_TIMEOUT, or damaged)",
                err=True,
            )
            sys.exit(2)
        except Exception as e:
            if os.environ.get("FLORTRAIN_DEBUG"):
                raise
            click.echo(
                f"flortrain: internal error: {type(e).__name__}: {e} (FLORTRAIN_DEBUG=1 shows the traceback)",
                err=True,
            )
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


#: click >= 8.2 raises this usage error for a group invoked with no command
_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())


class _OneLineGroup(click.Group):
    """Usage errors are one line and exit 2, like every other bad input (click's default is a
    usage block plus the error)."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[call-overload]
        except _NO_ARGS_IS_HELP as e:
            # bare `flortrain` asks what the tool does: the help, on stdout, is the answer
            click.echo(e.ctx.get_help() if e.ctx is not None else "")
            sys.exit(0)
        except click.ClickException as e:
            click.echo(f"flortrain: {e.format_message()} (see `flortrain --help`)", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("flortrain: aborted", err=True)
            sys.exit(1)
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


@click.group(cls=_OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="flortrain")
@click.option(
    "--store",
    "store",
    envvar="FLORTRAIN_STORE",
    default=None,
    metavar="DIR",
    help="Store directory (default .flortrain in the working directory).",
)
@click.option(
    "--trust",
    is_flag=True,
    help="Load a store that is not provably yours (another owner, or a manifest that does not "
    "verify: a copied store). Its checkpoints are pickles: trust only stores you know.",
)
@click.pass_context
def cli(ctx: click.Context, store: str | None, trust: bool) -> None:
    """Hindsight logging for PyTorch training: record once, add prints later, replay."""
    ctx.obj = {"store": store, "trust": trust}


def _deterministic_options(fn: F) -> F:
    """``--deterministic`` and ``--seed``, as record and run take them."""
    fn = click.option(
        "--seed",
        type=click.IntRange(0, MAX_SEED),
        default=None,
        metavar="N",
        help="With --deterministic: the run seed the per-example generators derive from "
        "(default 0).",
    )(fn)
    return click.option(
        "--deterministic",
        is_flag=True,
        help="Per-example generators for what DataLoader workers and pools draw, deterministic "
        "algorithms, pinned threads (docs/determinism.md); replay applies the same.",
    )(fn)


def _seed_needs_flag(deterministic: bool, seed: int | None) -> None:
    if seed is not None and not deterministic:
        raise click.UsageError("--seed is only meaningful with --deterministic")


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--epsilon",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="EPS",
    help="Record overhead tolerance of the adaptive checkpoint period (default 1/15; "
    "env FLORTRAIN_EPSILON).",
)
@click.option(
    "--resume",
    "resume",
    type=int,
    default=None,
    metavar="RUN",
    help="Continue the killed record RUN of SCRIPT from its last committed main-loop boundary "
    "checkpoint, into the same run (its arguments are reused).",
)
@click.option(
    "--no-check",
    is_flag=True,
    help="Do not warn of `flortrain check`'s findings before training (env FLORTRAIN_CHECK=off).",
)
@_deterministic_options
@click.pass_context
@_one_line_errors
def record(
    ctx: click.Context,
    script: str,
    args: tuple[str, ...],
    epsilon: float | None,
    resume: int | None,
    no_check: bool,
    deterministic: bool,
    seed: int | None,
) -> None:
    """Run SCRIPT instrumented, checkpointing its memoized loops. Its stdout is unchanged.
    Options go before SCRIPT; everything after it is the script's."""
    from flortrain import knobs
    from flortrain.process.distributed import check_environment
    from flortrain.process.launcher import launch
    from flortrain.process.static_child import start_static_pass

    knobs.validate()
    _seed_needs_flag(deterministic, seed)
    check_environment(script, "record")
    launch()  # the launcher waits here for the training process, which goes on
    # forked off now, before the runtime's and torch's imports
    static = start_static_pass(script, not no_check and knobs.check(), deterministic)
    try:
        from flortrain.commands.record import record as do_record
    except BaseException:
        static.close()
        raise
    sys.exit(
        do_record(
            script,
            list(args),
            ctx.obj["store"],
            epsilon,
            ctx.obj["trust"],
            resume,
            static,
            seed if deterministic else None,
            deterministic,
        )
    )


@cli.command(
    "run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@_deterministic_options
@_one_line_errors
def run_command(script: str, args: tuple[str, ...], deterministic: bool, seed: int | None) -> None:
    """Run SCRIPT without recording; with --deterministic, as `record --deterministic` runs it
    (it prints what that record prints). Options go before SCRIPT."""
    _seed_needs_flag(deterministic, seed)
    from flortrain.commands.run import run

    sys.exit(run(script, list(args), seed if deterministic else None, deterministic))


@cli.command()
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--probe",
    "probes",
    multiple=True,
    metavar="LINE:EXPR",
    help="Log EXPR after the statement ending on LINE, without editing the file.",
)
@click.option(
    "--run",
    "run_id",
    type=int,
    default=None,
    help="Record run to replay (default: latest of SCRIPT).",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Parallel replay workers, each a fresh process replaying one segment of the main loop.",
)
@click.option(
    "--backend",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Where the workers run: this machine, or Ray tasks (RAY_ADDRESS, or a local Ray).",
)
@click.option(
    "--blobs",
    default=None,
    metavar="URL",
    help="Where workers read checkpoint blobs: a directory or an fsspec URL holding a copy of "
    "the store's blobs/ (default: the store's own).",
)
@click.option(
    "--allow-changed-inputs",
    is_flag=True,
    help="Replay even though files the record read have changed since (refused by default, "
    "FT033: the record's state would be restored under other inputs).",
)
@click.pass_context
@_one_line_errors
def replay(
    ctx: click.Context,
    script: str,
    args: tuple[str, ...],
    probes: tuple[str, ...],
    run_id: int | None,
    jobs: int,
    backend: str,
    blobs: str | None,
    allow_changed_inputs: bool,
) -> None:
    """Replay SCRIPT (with added probes) against its record. New script arguments go after `--`."""
    from flortrain.process.distributed import check_environment

    check_environment(script, "replay")
    from flortrain.replay.replayer import replay as do_replay

    sys.exit(
        do_replay(
            script,
            run_id,
            list(probes),
            list(args) if args else None,
            ctx.obj["store"],
            jobs,
            backend,
            blobs,
            ctx.obj["trust"],
            allow_changed_inputs,
        )
    )


@cli.command()
@click.argument("run_id", type=int, required=False)
@click.pass_context
@_one_line_errors
def diff(ctx: click.Context, run_id: int | None) -> None:
    """Compare a replay's output with its record's (default: the latest replay)."""
    from flortrain.replay.diff import diff_runs, resolve_replay
    from flortrain.store.db import open_store

    store = open_store(ctx.obj["store"], create=False, trust=ctx.obj["trust"])
    result = diff_runs(store, resolve_replay(store, run_id))
    for line in result.report():
        click.echo(line)
    sys.exit(0 if result.identical else 1)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "-k",
    "--resumes",
    type=click.IntRange(min=0),
    default=4,
    show_default=True,
    help="Boundary checkpoints of the first record to resume from, spread over the run.",
)
@click.option("--json", "as_json", is_flag=True, help="The report as JSON (docs/determinism.md).")
@click.option(
    "--keep",
    metavar="DIR",
    default=None,
    help="Keep the two records' store in DIR (default: a temporary store, removed at the end).",
)
@click.pass_context
@_one_line_errors
def verify(
    ctx: click.Context,
    script: str,
    args: tuple[str, ...],
    resumes: int,
    as_json: bool,
    keep: str | None,
) -> None:
    """Check that SCRIPT is reproducible: record it twice, resume it from recorded checkpoints,
    and compare the state and random streams of every run at every main-loop boundary and
    checkpoint. Exit 0 reproducible, 1 not (the first divergence is named), 2 bad input."""
    from flortrain.commands.verify import verify as do_verify

    sys.exit(do_verify(script, list(args), resumes, as_json, ctx.obj["trust"], keep))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run, as a list.")
@click.pass_context
@_one_line_errors
def runs(ctx: click.Context, as_json: bool) -> None:
    """List recorded and replayed runs."""
    from flortrain.store.db import NO_STORE, open_store, store_path

    try:
        store = open_store(ctx.obj["store"], create=False, trust=ctx.obj["trust"])
    except FlortrainError as e:
        if e.code != NO_STORE:  # a file in the store's place, an unreadable database: not "no runs"
            raise
        click.echo("[]" if as_json else f"no runs in {store_path(ctx.obj['store'])}")
        return
    rows = [
        {
            "id": r.id,
            "script": r.script,
            "kind": r.kind,
            "status": r.effective_status,
            "started": dt.datetime.fromtimestamp(r.started, dt.UTC).isoformat(timespec="seconds"),
            "duration": None if r.duration is None else round(r.duration, 3),
            "exit_code": r.exit_code,
            "replays": r.parent,
            "argv": r.argv,
        }
        for r in store.runs()
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no runs in {store.root}")
        return
    click.echo(f"{'id':>4}  {'kind':<7} {'status':<10} {'started':<25} {'duration':>9}  script")
    for r in rows:
        d = "" if r["duration"] is None else f"{r['duration']:.2f}s"
        of = f" (of {r['replays']})" if r["replays"] else ""
        click.echo(
            f"{r['id']:>4}  {r['kind']:<7} {r['status']:<10} {r['started']:<25} {d:>9}  {r['script']}{of}"
        )


@cli.command()
@click.argument("script")
@click.option("--explain", is_flag=True, help="Print the plan instead of the code.")
@click.option("--deterministic", is_flag=True, help="As `record --deterministic` instruments it.")
@_one_line_errors
def instrument(script: str, explain: bool, deterministic: bool) -> None:
    """Print SCRIPT instrumented for record (or, with --explain, the plan)."""
    from flortrain.instrument import explain_modules, instrument_file
    from flortrain.static.text import read_text

    source = read_text(script)
    if deterministic:
        from flortrain.determinism.rewrite import determinize

        rewritten = determinize(script, source)
        click.echo(f"flortrain: deterministic: {rewritten.summary()}", err=True)
        source = rewritten.text
    result = instrument_file(script, source)
    if explain:
        text = "\n".join([result.plan.explain(), *explain_modules(script, source)])
    else:
        text = _as_utf8(result.code_text)
    click.echo(text, nl=not text.endswith("\n"))


def _flag(name: str, help: str) -> Callable[[F], F]:
    """An on/off option of ``flortrain check``."""
    return click.option(name, is_flag=True, help=help)


def _codes(name: str, help: str) -> Callable[[F], F]:
    """A ``flortrain check`` option naming rule codes, given any number of times."""
    return click.option(name, multiple=True, metavar="CODES", help=help)


@cli.command()
@click.argument("paths", nargs=-1, type=click.Path())
@click.option(
    "--output-format",
    "fmt",
    type=click.Choice(["concise", "json", "github", "sarif"]),
    default="concise",
    show_default=True,
    help="How findings are printed (json: the schema in docs/check.md).",
)
@_flag("--fix", "Apply the fixes that cannot change a correct program.")
@_flag("--unsafe-fixes", "Count unsafe fixes as available too (with --fix: apply).")
@_flag("--diff", "Print the fixes as a diff instead of writing them.")
@_codes("--select", "Rules to run (comma-separated).")
@_codes("--extend-select", "Rules to add to select.")
@_codes("--ignore", "Rules not to run.")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="The pyproject.toml whose [tool.flortrain.check] governs every file.",
)
@_flag("--isolated", "Ignore every configuration file.")
@_flag("--force-exclude", "Apply excludes to files named on the command line too.")
@_flag("--exit-zero", "Exit 0 even when a finding is an error.")
@_one_line_errors
def check(
    paths: tuple[str, ...],
    fmt: str,
    fix: bool,
    unsafe_fixes: bool,
    diff: bool,
    select: tuple[str, ...],
    extend_select: tuple[str, ...],
    ignore: tuple[str, ...],
    config_path: str | None,
    isolated: bool,
    force_exclude: bool,
    exit_zero: bool,
) -> None:
    """Find what would make training scripts unreplayable or nondeterministic (PATHS: files or
    directories, default the current one). Static: nothing is run and torch is not imported.
    Exit 0 when no finding is an error, 1 when one is, 2 on bad usage or configuration."""
    from flortrain.check.command import Options, run

    options = Options(
        paths or (".",),
        fmt,
        fix,
        unsafe_fixes,
        diff,
        exit_zero,
        config_path,
        isolated,
        force_exclude,
        select,
        extend_select,
        ignore,
    )
    sys.exit(run(options))


#: PEP 263: a coding declaration on one of the first two lines
_CODING = re.compile(r"^([ \t\f]*#.*?coding[:=][ \t]*)([-\w.]+)")


def _as_utf8(code: str) -> str:
    """The printed code is UTF-8 text: a declaration of another encoding (``# coding: latin-1``)
    would make Python misread it, so it is rewritten to say utf-8."""
    lines = code.split("\n", 2)
    for i in range(min(2, len(lines))):
        m = _CODING.match(lines[i])
        if m:
            if m.group(2).lower().replace("_", "-") not in ("utf-8", "utf8"):
                lines[i] = lines[i][: m.start(2)] + "utf-8" + lines[i][m.end(2) :]
            break
    return "\n".join(lines)


def main() -> None:
    """The console script. A script ended by Ctrl-C makes flortrain die by SIGINT after the run
    is finalized, as ``python`` does, so a calling shell loop sees an interrupt, not a failure.
    The runner is looked up, not imported: if it never loaded, no script ran, and importing it
    here could fail again (a broken install) and turn the one-line error into a traceback."""
    from flortrain.process import launcher

    launcher.allowed = True  # this process is flortrain's own: `record` may fork from it
    try:
        cli(prog_name="flortrain")
    except SystemExit:
        as_main = sys.modules.get("flortrain.process.as_main")
        if as_main is not None and getattr(as_main, "interrupted", False):
            import signal

            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        raise


if __name__ == "__main__":
    main()
