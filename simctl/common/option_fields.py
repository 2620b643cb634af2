"""A configuration field that is also a command-line option: one declaration holds its default, its `--help`
text and, where needed, how the command line spells it and what bounds it. Policies' settings
(`policies.base.option`), the cluster's configuration and the CLI's sections are all declared with it, and
`simctl.config_options` turns any dataclass of such fields into options."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def option_field(default: Any, help: str, *, flags: tuple[str, ...] = (), metavar: str | None = None,
                 **checks: Any) -> Any:
    """A dataclass field with its `--help` text; `flags` replace the flag its name makes (`--json` for
    `as_json`), `metavar` the placeholder its type makes, and `checks` (min, max, choices) are what the
    owner's `validate` reads."""
    return field(default=default, metadata={"help": help, "flags": flags, "metavar": metavar, **checks})
