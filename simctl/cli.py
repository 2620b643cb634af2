"""The `simctl` command line."""

from __future__ import annotations

import errno
import importlib
import os
import signal
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import typer

from simctl.common.errors import InputError
from simctl.config_options import with_config_options
from simctl.option_values import PlainValuesCommand, PlainValuesGroup
from simctl.options import Attention, Eager
from simctl.usage_errors import error_types, fail, given_value, usage_message


def profile(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="Folder for profile.csv and meta.json, e.g. profiles/my-gpu.")],
    engine: Annotated[str, typer.Option(help="Whose iterations to time: simctl (its own executor) or vllm "
                                        "(the installed vLLM's engine steps, host overhead included, on the "
                                        "CPU; `make vllm` installs it).")] = "simctl",
    model: Annotated[str, typer.Option(help="Model shape to build with random weights (Llama-style "
                                       "catalogue entries; `tiny` and `tiny-2l` suit a CPU).")] = "tiny",
    device: Annotated[str, typer.Option(help="cpu, or cuda (uses CUDA events and synchronizes).")] = "cpu",
    dtype: Annotated[str, typer.Option(help="float32, float16 or bfloat16.")] = "float32",
    threads: Annotated[int | None, typer.Option(help="CPU threads [default: every core available].")] = None,
    quick: Annotated[bool, typer.Option(help="A coarse grid (about a minute on a CPU).")] = False,
    protocol: Annotated[str, typer.Option(help=(
        "served: a shape's repetitions move its cached contexts by a few tokens and its KV slab rows, as "
        "serving does, so no per-shape cache flatters it; fixed: the "
        "same shape every repetition."))] = "served",
    attention: Attention = "auto",
    eager: Eager = None,
) -> None:
    """Time real prefill, decode, hybrid and padded iterations of a model on this device.

    The model is built from its config with random weights: nothing is downloaded. Fit the result with
    `simctl fit`. Example: simctl profile --model tiny --device cpu --out profiles/cpu
    vLLM's own steps: simctl profile --engine vllm --model tiny --device cpu --out profiles/vllm-tiny
    """
    from rich.console import Console
    from rich.markup import escape

    from simctl.profiler.profile import profile as run_profile

    if engine not in ("simctl", "vllm"):
        raise InputError(f"--engine {engine!r}: choose simctl or vllm")
    try:
        if engine == "vllm":
            from simctl.profiler.vllm_profile import profile_vllm

            for name in ("threads", "protocol", "attention", "eager"):
                if ctx.get_parameter_source(name).name != "DEFAULT":
                    raise InputError(f"--{name} applies to --engine simctl; vLLM steps run with its own "
                                     f"threads and attention, each timed as served")
            if device != "cpu":
                raise InputError(f"--device {device}: the vLLM profile runs the installed CPU build "
                                 "(--device cpu)")
            path = profile_vllm(model, dtype, quick, out)
        else:
            path = run_profile(model, device, dtype, threads, quick, out, protocol=protocol,
                               attention=attention, eager=eager)
    except RuntimeError as e:  # the timing child crashed: its last words are in the message
        raise InputError(f"profiling failed: {e}") from None
    Console().print(escape(f"wrote {path}/profile.csv and meta.json; next: simctl fit {path}"))


def fit(
    ctx: typer.Context,
    profile_dir: Annotated[Path, typer.Argument(help=(
        "A folder written by `simctl profile`, or operator profiles in Vidur's layout "
        "(compute/GPU/ORG/MODEL/mlp.csv, network/)."))],
    out: Annotated[Path | None, typer.Option(help="Where to write cost_model.json (and fit.png) [default: "
                                             "the profile folder; required for operator profiles].")] = None,
    holdout: Annotated[float, typer.Option(help=(
        "Share of each kind of iteration (operator profiles: of the token counts and attention rows) held "
        "out to measure the error."))] = 0.2,
    seed: Annotated[int, typer.Option(help="Seed of the holdout split.")] = 0,
    roofline_gpu: Annotated[str | None, typer.Option(help="Also calibrate the roofline's efficiencies "
                                                     "(mfu, mbu, overhead) for this catalogue GPU.")] = None,
    model: Annotated[str | None, typer.Option(help=(
        "Operator profiles: the model (catalogue name or config.json); the profile of "
        "its layer shape is used."))] = None,
    gpu: Annotated[str | None, typer.Option(help="Operator profiles: the catalogue GPU.")] = None,
    tp: Annotated[int, typer.Option(help="Operator profiles: the tensor-parallel degree.")] = 1,
    execution: Annotated[str, typer.Option(help=(
        "Operator profiles: eager or cuda-graph, whose step overheads the fit assumes (the "
        "profiles time kernels only)."))] = "cuda-graph",
) -> None:
    """Fit a cost model to a profile and report its held-out error per kind of iteration (per operator class
    for operator profiles).

    Example: simctl fit profiles/cpu, then simctl run --gpu cpu --model tiny
    --cost profiles/cpu/cost_model.json; simctl fit ../shared/reference/gpu_profiles --model llama-2-70b
    --gpu h100 --tp 4 --out fits/h100-70b-tp4
    """
    operators = (Path(profile_dir) / "compute").is_dir()
    given = [n for n in ("model", "gpu", "tp", "execution") if ctx.get_parameter_source(n).name != "DEFAULT"]
    if operators:
        from simctl.catalogue.models import get_model
        from simctl.profiler.fit_operators import fit_operator_profile, format_operator_report

        if roofline_gpu is not None:
            raise InputError("--roofline-gpu calibrates on a simctl profile; operator profiles are fitted "
                             "as they are")
        if model is None or gpu is None:
            raise InputError(f"{profile_dir} holds operator profiles: give --model and --gpu (and --tp) "
                             "to fit")
        report = fit_operator_profile(profile_dir, get_model(model), gpu, tp, execution, out, holdout, seed)
        print(format_operator_report(report))
        return
    if given:
        raise InputError(f"--{given[0]} applies to operator profiles (a folder with compute/); "
                         f"{profile_dir} is fitted as a simctl profile")
    from simctl.profiler.fit import fit_profile
    from simctl.profiler.fit_report import format_report

    report = fit_profile(profile_dir, out=out, holdout=holdout, seed=seed, roofline_gpu=roofline_gpu)
    print(format_report(report))


def list_catalogue() -> None:
    """Show the policies, traces, models and GPUs simctl knows."""
    from rich.table import Table

    from simctl.catalogue.gpus import GPUS
    from simctl.catalogue.models import MODELS
    from simctl.costs.overheads import EXECUTION_MODES, StepOverheads
    from simctl.costs.roofline import DEFAULT_ATTN_MFU, DEFAULT_MBU, DEFAULT_MFU
    from simctl.display import out_console
    from simctl.policies.registry import POLICIES
    from simctl.traces import PROFILES
    from simctl.traces.session_defaults import SESSION_TRACE
    from simctl.traces.sessions import DESCRIPTION as SESSIONS_DESCRIPTION

    console = out_console()
    for title, rows in (
        ("policies", [(n, f"{c.summary}; settings: " + ", ".join(
            f"--{k.replace('_', '-')} {v if v is not None else '(derived)'}"
            for k, v in c.Settings().as_dict().items())) for n, c in POLICIES.items()]),
        ("traces", [(n, p.description) for n, p in PROFILES.items()]
         + [(SESSION_TRACE, SESSIONS_DESCRIPTION),
            ("PATH", ("a CSV (num_prefill_tokens,num_decode_tokens[,arrived_at]; sessions: session_id,"
                      "num_new_tokens,num_decode_tokens[,think_s,arrived_at]) or JSONL trace file"))]),
        ("models", [(n, m.description) for n, m in MODELS.items()]),
        ("gpus", [(n, g.description) for n, g in GPUS.items()]),
        ("cost models", [
            ("roofline", ("published specs x efficiencies, mfu/mbu as runs use them: measured "
                         + ", ".join(f"{n} {g.mfu or DEFAULT_MFU:g}/{g.mbu or DEFAULT_MBU:g}"
                                     for n, g in GPUS.items() if g.mfu or g.mbu)
                         + f", {DEFAULT_MFU:g}/{DEFAULT_MBU:g} on the other GPUs; attention mfu "
                         f"{DEFAULT_ATTN_MFU}; tile per GPU; step overheads by execution mode:")),
            *((f"  {mode}", StepOverheads.defaults(mode, 32).describe() + " for 32 layers")
              for mode in EXECUTION_MODES),
            ("fitted", ("--cost cost_model.json of `simctl fit`: a simctl profile's steps, or operator "
                       "profiles (Vidur's layout) with the execution mode's step overheads; "
                       "summary.json: cost_assumptions")),
        ]),
    ):
        table = Table(title=title, show_header=False, title_justify="left")
        table.add_column(style="bold")
        table.add_column()
        for name, text in rows:
            table.add_row(name, text)
        console.print(table)


# every command, in the order `simctl --help` lists them, as module:function; a command's sections become its
# options. A command line imports and builds only the command it names (its help lists no other).
COMMANDS = {"run": "simctl.run_cmd:run", "capacity": "simctl.capacity_cmd:capacity",
            "plan": "simctl.plan_cmd:plan_cmd", "real": "simctl.real_cmd:real",
            "validate": "simctl.validate_cmd:validate", "profile": "simctl.cli:profile",
            "fit": "simctl.cli:fit",
            "prefill-bench": "simctl.prefill_bench_cmd:prefill_bench",
            "query-set": "simctl.query_set_cmd:query_set_cmd", "plot": "simctl.plot_cmd:plot",
            "sweep": "simctl.sweep_cmd:sweep", "list": "simctl.cli:list_catalogue"}


def make_app(names: Iterable[str] = COMMANDS) -> typer.Typer:
    """The app with these commands; a group even with one (typer would make a lone command the app itself),
    so that `simctl run ...` parses, helps and fails as with all of them."""
    app = typer.Typer(
        help="Simulate LLM inference serving: pick a scheduler, trace, model and GPU; get TTFT, TBT, E2E, "
             "throughput and capacity before spending GPU hours.",
        no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
        cls=PlainValuesGroup,
    )
    names = list(names)
    for name in names:
        module, _, function = COMMANDS[name].partition(":")
        command = getattr(importlib.import_module(module), function)
        app.command(name, cls=PlainValuesCommand)(with_config_options(command))
    if len(names) == 1:
        app.callback()(_group)
    return app


def _group() -> None:
    """A lone command's group (see make_app)."""


def __getattr__(name: str) -> Any:
    """`simctl.cli.app`: the app with every command (typer's test runner, tests that list the options)."""
    if name == "app":
        return make_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Interrupted(BaseException):
    """Ctrl-C or SIGTERM, raised where the program is so that it unwinds: `finally` blocks remove
    temporaries, a serving child or pool workers are stopped, and --out is left as it was. Not a
    KeyboardInterrupt, which typer would turn into a silent exit code."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.exit_code = 128 + signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app non-standalone so that every error becomes one line on stderr, exit 2; an
    interruption (Ctrl-C, SIGTERM) stops children, removes temporaries and exits 130 (143 for SIGTERM)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args:
        args = ["--help"]
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_interrupted)
    try:
        if given_value(args, ["--out"]) == "":
            raise InputError("--out is empty; give a folder")
        app = make_app([args[0]] if args[0] in COMMANDS else COMMANDS)
        rv = app(args=args, prog_name="simctl", standalone_mode=False)
        sys.stdout.flush()  # a full disk or closed pipe fails here, not at exit
    except InputError as e:
        fail(str(e))
    except error_types()[0] as e:
        fail(usage_message(e, args, tuple(COMMANDS)))
    except Interrupted as e:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal must not cut the message short
            signal.signal(sig, signal.SIG_IGN)
        print("simctl: interrupted", file=sys.stderr)
        # not sys.exit: the interpreter's exit joins multiprocessing children, and one killed while it frees
        # many GB may take minutes; every `finally` has run, and children were stopped (common.children)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                pass
        os._exit(e.exit_code)
    except error_types()[1]:  # click's answer to end of input at a prompt
        print("simctl: aborted", file=sys.stderr)
        sys.exit(1)
    except OSError as e:
        if e.filename is not None or e.errno not in (errno.ENOSPC, errno.EPIPE, errno.EIO, errno.EDQUOT):
            raise  # not writing stdout: a bug to report with its traceback
        _discard_stdout()
        fail(f"cannot write the output ({e.strerror or e})")
    sys.exit(rv if isinstance(rv, int) else 0)


def _discard_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush of unwritable output stays quiet."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    main()
