"""Command-line options generated from configuration dataclasses, after Vidur's config classes that make
their own flags: a command's parameter whose type is a dataclass, with an instance of it as its default,
becomes one `--option` per field (the field's help, flags and metavar from `simctl.common.option_fields`, the
instance's value as its default), and the command is called with the dataclass built from them; a command
that does not take some fields annotates its section `Annotated[Section, Without("field", ...)]`, and those
keep the instance's values. Every
command's sections (workload, deployment, policy, cluster, and groups of its own options) go through this
one generator, so an option is declared once, where its configuration is."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace
from typing import Annotated, Any, get_args, get_origin, get_type_hints

import typer


class Without:
    """The fields of a section that a command does not take as options (`capacity` searches the rate, so
    its workload has no --qps): they keep the value of the section's default instance."""

    def __init__(self, *names: str) -> None:
        self.names = names


def _section(annotation: Any, default: Any) -> tuple[type, tuple[str, ...]] | None:
    """The section class and the fields left out, if the parameter is a section; else None."""
    kind, left_out = annotation, ()
    if get_origin(annotation) is Annotated:
        kind, *extras = get_args(annotation)
        left_out = tuple(n for e in extras if isinstance(e, Without) for n in e.names)
    if isinstance(kind, type) and is_dataclass(kind) and isinstance(default, kind):
        return kind, left_out
    return None


def _section_options(name: str, section: Any, left_out: tuple[str, ...]) -> list[inspect.Parameter]:
    """The options of one section, in field order (but those `left_out`), each defaulting to the section's
    value."""
    hints = get_type_hints(type(section))
    params = []
    for f in fields(section):
        if f.name in left_out:
            continue
        if "help" not in f.metadata:
            raise TypeError(f"{type(section).__name__}.{f.name} (section {name!r}) has no help: declare it "
                            "with simctl.common.option_fields.option_field")
        option = typer.Option(*f.metadata.get("flags", ()), help=f.metadata["help"],
                              metavar=f.metadata.get("metavar"))
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY,
                                        default=getattr(section, f.name),
                                        annotation=Annotated[hints[f.name], option]))
    return params


def with_config_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command` as typer sees it: each section parameter (a dataclass type, an instance as its default)
    spread into its fields' options; its other parameters as they are. Called with the sections rebuilt."""
    hints = get_type_hints(command, include_extras=True)
    params: list[inspect.Parameter] = []
    sections: dict[str, tuple[Any, list[str]]] = {}  # each section's default and the fields it takes
    for p in inspect.signature(command).parameters.values():
        section = _section(hints[p.name], p.default)
        if section is not None:
            options = _section_options(p.name, p.default, section[1])
            sections[p.name] = (p.default, [o.name for o in options])
            params += options
        else:
            params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[p.name]))
    names = [p.name for p in params]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise TypeError(f"{command.__name__}: options declared twice: {twice}")

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        for name, (default, taken) in sections.items():
            kwargs[name] = replace(default, **{f: kwargs.pop(f) for f in taken})
        return command(**kwargs)

    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper
