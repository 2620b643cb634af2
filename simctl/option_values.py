"""Option values read without pydantic where the reading is plain (issue 42). typer 0.29 coerces every
option, given or not, through a pydantic `TypeAdapter` built for it (`typer._coercion.build_runtime_param`):
a run paid ~0.15 s of CPU to import pydantic and build 60 adapters, more than its 1,000 requests' loop.
`PlainValuesCommand` gives each option of a command a reader that returns what the adapter would for the
values a command line holds: a str, a plain decimal integer or number, a path, a list of them, a default
already of its type; for any other value (a malformed number, `inf`, `1_000`, spaces) it builds typer's own
adapter and defers to it, so what is accepted and every error message stay typer's. Where typer has no such
adapters (earlier typers coerce through click's types) the command is typer's own."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

from typer.core import TyperCommand, TyperGroup

# what pydantic reads as these numbers too (a correctly rounded decimal); anything else is pydantic's to read
_INT = re.compile(r"[+-]?[0-9]{1,18}\Z")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?\Z")
_EXACT_FLOAT = 2 ** 53  # an int default that float() turns into the same number pydantic does
OTHER = object()  # a value whose reading is left to typer's adapter


def plain_value(annotation: Any, value: Any) -> Any:
    """The value typer's pydantic adapter gives `value` for an option of type `annotation` (path checks
    aside), or OTHER where the reading is not plain."""
    kind = type(value)
    if annotation is str and kind is str:
        return value
    if annotation is int:
        if kind is int:
            return value
        if kind is str and _INT.match(value):
            return int(value)
    elif annotation is float:
        if kind is float:
            return value
        if kind is int and -_EXACT_FLOAT <= value <= _EXACT_FLOAT:
            return float(value)
        if kind is str and _FLOAT.match(value):
            return float(value)
    elif annotation is Path:
        if isinstance(value, Path):
            return value
        if kind is str and value and "\0" not in value:
            return Path(value)
    return OTHER


try:  # typer with pydantic adapters (0.29 here); earlier typers coerce through click's types
    from typer._coercion import RuntimeParam, build_runtime_param, resolve_type_descriptor
    from typer._param_types import coerce_cli_path
except ImportError:  # pragma: no cover - depends on the installed typer
    RuntimeParam = None


if RuntimeParam is not None:
    @dataclass(frozen=True)
    class PlainRuntimeParam(RuntimeParam):
        """typer's runtime coercion of one option, pydantic's adapter built only for a value that is not
        plain."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            many = get_origin(self.annotation) is list and isinstance(value, (list, tuple))
            kind = get_args(self.annotation)[0] if many else self.annotation
            read = [plain_value(kind, v) for v in (value if many else (value,))]
            if OTHER in read or self.parameter_info.min is not None or self.parameter_info.max is not None \
                    or self.parameter_info.path_type is not None:
                typer_own = build_runtime_param(resolve_type_descriptor(self.annotation, self.parameter_info))
                return typer_own._coerce_value(value, param=param, ctx=ctx)
            if kind is Path:  # typer's own checks of a path (exists, readable, ...), given a Path
                read = [coerce_cli_path(v, self.parameter_info, path_type=Path, param=param, ctx=ctx)
                        for v in read]
            return read if many else read[0]

    def read_plainly(params: list[Any]) -> None:
        """Give each option typer would coerce through a pydantic adapter a `PlainRuntimeParam`."""
        for param in params:
            descriptor = getattr(param, "type_descriptor", None)
            if descriptor is not None and descriptor.file_annotation is None \
                    and descriptor.parameter_info.parser is None and not descriptor.is_choice:
                param._runtime_param = PlainRuntimeParam(annotation=descriptor.annotation,
                                                         parameter_info=descriptor.parameter_info)

    class _ReadsPlainly:
        """Before a command or group parses its arguments, its options (its own --help included) get a
        `PlainRuntimeParam`."""

        def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
            read_plainly(self.get_params(ctx))  # type: ignore[attr-defined]
            return super().parse_args(ctx, args)  # type: ignore[misc]

    class PlainValuesCommand(_ReadsPlainly, TyperCommand):
        """A typer command whose options are read by `PlainRuntimeParam`."""

    class PlainValuesGroup(_ReadsPlainly, TyperGroup):
        """A typer group whose own options (--help) are read by `PlainRuntimeParam`."""
else:  # pragma: no cover
    PlainValuesCommand, PlainValuesGroup = TyperCommand, TyperGroup
