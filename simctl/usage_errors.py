"""Every way the command line can fail, as one line on stderr and exit code 2: input errors, and click/typer
usage errors rewritten to name the bad value and the command whose --help explains it."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

import typer


def error_types() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """Usage-error and abort exception types: typer's (it vendors click) and click's, if click is loaded (only
    then can one of its exceptions exist, so start-up need not import it: called once an error is raised)."""
    usage: list[type[BaseException]] = [typer.TyperException] if hasattr(typer, "TyperException") else []
    aborts: list[type[BaseException]] = [typer.Abort]
    click = sys.modules.get("click")
    if click is not None:
        usage.append(click.ClickException)
        aborts.append(click.exceptions.Abort)
    return tuple(usage), tuple(aborts)



def one_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())



def fail(message: str) -> NoReturn:
    print(f"simctl: error: {one_line(message)}", file=sys.stderr)
    sys.exit(2)



def warn_all(warnings: Iterable[str]) -> None:
    """Warnings a result carries (also recorded with it), one line each on stderr."""
    for w in warnings:
        print(f"simctl: warning: {one_line(w)}", file=sys.stderr)


def note_replaced(out: Path, files: tuple[str, ...]) -> None:
    from simctl.results.output import earlier_outputs

    earlier = earlier_outputs(out, files)
    if earlier:
        print(f"simctl: replacing the earlier {', '.join(earlier)} in {out}", file=sys.stderr)


def given_value(args: list[str], opts: list[str]) -> str | None:
    """The value the command line gave an option (the last one, as click takes), if it can be found."""
    value = None
    for i, a in enumerate(args):
        for o in opts:
            if a == o and i + 1 < len(args):
                value = args[i + 1]
            elif a.startswith(o + "="):
                value = a[len(o) + 1:]
    return value



def usage_message(e: Exception, args: list[str], commands: tuple[str, ...]) -> str:
    """A click/typer usage error as one line: the bad value when known, the reason, where to get help."""
    param = getattr(e, "param", None)
    opts = list(getattr(param, "opts", None) or [])
    value = given_value(args, opts) if opts else None
    if value is not None and hasattr(e, "message"):
        text = f"invalid value {value!r} for {'/'.join(opts)}: {e.message}"
    else:
        text = e.format_message() if hasattr(e, "format_message") else str(e)
    ctx = getattr(e, "ctx", None)
    command = ctx.command_path if ctx is not None else "simctl"
    if command == "simctl" and args and args[0] in commands:  # an option error is raised in the group's ctx
        command = f"simctl {args[0]}"
    return f"{one_line(text).rstrip('.')}; see '{command} --help'"

