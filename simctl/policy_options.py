"""CLI options generated from the policies' settings: every field of every registered policy's `Settings`
becomes one `--option` of the commands that build policies, with its help and per-policy defaults taken from
there. Each takes one value, or in `capacity` and `run` a comma list of values to compare
(`simctl.option_grid`)."""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from collections.abc import Callable
from typing import Annotated, Any, get_type_hints

import typer

from common.errors import InputError
from policies.registry import POLICIES, setting_names


def _help(name: str, policies: list[str], lists: bool) -> str:
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
    more = " A comma list compares the values." if lists else ""
    return f"{text[0].upper()}{text[1:]} ({who}{default}).{more}"


def setting_values(name: str, text: str) -> list[Any]:
    """The values of `--name text` (one, or a comma list): integers unless the setting is a choice (checked
    with the other settings, `Settings.validate`); InputError for anything else, in one line."""
    field = POLICIES[setting_names()[name][0]].Settings.__dataclass_fields__[name]
    items = [t.strip() for t in str(text).split(",")]
    flag = f"--{name.replace('_', '-')}"
    if not all(items):
        raise InputError(f"{flag} {text!r}: an empty value in the list")
    if field.metadata.get("choices"):
        return items
    try:
        return [int(t) for t in items]
    except ValueError:
        bad = next(t for t in items if not t.lstrip("-").isdigit())
        raise InputError(f"{flag} {text!r}: {bad!r} is not an integer") from None


def with_policy_options(command: Callable[..., Any] | None = None, *, lists: bool = False) -> Any:
    """Give `command` one option per policy setting; it receives them together as `options` (None: not
    given), each a value, or with `lists` a list of the values given (a comma list compares them)."""
    if command is None:
        return functools.partial(with_policy_options, lists=lists)
    names = setting_names()
    signature = inspect.signature(command)
    hints = get_type_hints(command, include_extras=True)  # the command's own options, resolved
    params = [p.replace(annotation=hints[p.name]) for p in signature.parameters.values()
              if p.name != "options"]
    annotations = {p.name: p.annotation for p in params}
    for name, policies in names.items():
        choices = POLICIES[policies[0]].Settings.__dataclass_fields__[name].metadata.get("choices")
        # a choice is checked with the other settings (`Settings.validate`), its metavar lists the choices
        metavar = ("|".join(choices) if choices else "INTEGER") + ("[,...]" if lists else "")
        option = typer.Option(help=_help(name, policies, lists), metavar=metavar)
        annotation = Annotated[str | None, option]
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=annotation))
        annotations[name] = annotation

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        given = {n: kwargs.pop(n) for n in names}
        values = {n: None if v is None else setting_values(n, v) for n, v in given.items()}
        if lists:
            return command(**kwargs, options=values)
        for n, v in values.items():
            if v is not None and len(v) > 1:
                raise InputError(f"--{n.replace('_', '-')} takes one value here (compare several with "
                                 "`simctl capacity` or `simctl run`)")
        return command(**kwargs, options={n: None if v is None else v[0] for n, v in values.items()})

    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = annotations
    return wrapper
