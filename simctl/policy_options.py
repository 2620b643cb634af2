"""The policy section: `--policy` and one option per policy setting, generated from the registered policies'
`Settings` fields (their help and per-policy defaults) as the fields of a dataclass, which
`simctl.config_options` renders like any other section. `PolicyLists` (`run`, `capacity`, `plan`) takes a
comma list of policies and of each setting's values to compare (`simctl.option_grid`); `PolicyChoice`
(`real`) one policy and one value each."""

from __future__ import annotations

from collections import Counter
from dataclasses import fields, make_dataclass
from typing import Any

from simctl.common.errors import InputError
from simctl.common.option_fields import option_field
from simctl.policies.registry import POLICIES, setting_names

POLICY_HELP = f"Scheduler: {', '.join(POLICIES)} (see `simctl list`)."


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


class _Settings:
    """What both sections do with the settings given: parse them (None: not given)."""

    policy: str

    def given(self) -> dict[str, list[Any] | None]:
        given = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "policy"}  # type: ignore
        return {n: None if v is None else setting_values(n, v) for n, v in given.items()}


class _Lists(_Settings):
    def settings(self) -> dict[str, list[Any] | None]:
        """Each setting's values to compare."""
        return self.given()


class _Values(_Settings):
    def settings(self) -> dict[str, Any]:
        """Each setting's one value; InputError for a comma list."""
        values = self.given()
        for n, v in values.items():
            if v is not None and len(v) > 1:
                raise InputError(f"--{n.replace('_', '-')} takes one value here (compare several with "
                                 "`simctl capacity` or `simctl run`)")
        return {n: None if v is None else v[0] for n, v in values.items()}


def _section(name: str, base: type, lists: bool) -> type:
    """A frozen dataclass: `policy`, then every setting as an optional string option."""
    policy = option_field("sarathi", POLICY_HELP + (" A comma list compares them." if lists else ""))
    settings = []
    for setting, policies in setting_names().items():
        choices = POLICIES[policies[0]].Settings.__dataclass_fields__[setting].metadata.get("choices")
        # a choice is checked with the other settings (`Settings.validate`), its metavar lists the choices
        metavar = ("|".join(choices) if choices else "INTEGER") + ("[,...]" if lists else "")
        settings.append((setting, str | None, option_field(None, _help(setting, policies, lists),
                                                           metavar=metavar)))
    return make_dataclass(name, [("policy", str, policy), *settings], bases=(base,), frozen=True)


PolicyLists = _section("PolicyLists", _Lists, lists=True)
PolicyChoice = _section("PolicyChoice", _Values, lists=False)
