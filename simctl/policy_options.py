"""CLI options generated from the policies' settings: every field of every registered policy's `Settings`
becomes one `--option` of the commands that build policies, with its help and per-policy defaults taken from
there."""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from collections.abc import Callable
from typing import Annotated, Any, get_type_hints

import typer

from policies.registry import POLICIES, setting_names


def _help(name: str, policies: list[str]) -> str:
    first = POLICIES[policies[0]].Settings.__dataclass_fields__[name]
    defaults = {p: POLICIES[p].Settings.__dataclass_fields__[name].default for p in policies}
    who = "every policy" if len(policies) == len(POLICIES) else ", ".join(policies)
    if None in defaults.values():  # derived from the deployment: the help text says how
        default = ""
    elif len(set(defaults.values())) == 1:
        default = f"; default {next(iter(defaults.values()))}"
    else:  # the most common default, then the policies that differ
        common = Counter(defaults.values()).most_common(1)[0][0]
        default = f"; default {common}, " + ", ".join(f"{p} {d}" for p, d in defaults.items() if d != common)
    text = first.metadata["help"]
    return f"{text[0].upper()}{text[1:]} ({who}{default})."


def with_policy_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give `command` one option per policy setting; it receives them together as `options` (None: not
    given)."""
    names = setting_names()
    signature = inspect.signature(command)
    hints = get_type_hints(command, include_extras=True)  # the command's own options, resolved
    params = [p.replace(annotation=hints[p.name]) for p in signature.parameters.values()
              if p.name != "options"]
    annotations = {p.name: p.annotation for p in params}
    for name, policies in names.items():
        choices = POLICIES[policies[0]].Settings.__dataclass_fields__[name].metadata.get("choices")
        # a choice is checked with the other settings (`Settings.validate`), its metavar lists the choices
        option = typer.Option(help=_help(name, policies), metavar="|".join(choices) if choices else None)
        annotation = Annotated[(str if choices else int) | None, option]
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=annotation))
        annotations[name] = annotation

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        options = {n: kwargs.pop(n) for n in names}
        return command(**kwargs, options=options)

    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = annotations
    return wrapper
