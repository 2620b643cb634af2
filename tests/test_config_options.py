"""The command line's options generated from configuration dataclasses (`simctl.config_options`), in-process:
a section's fields become options with their help and the command's defaults, the command receives the
section rebuilt, an option declared twice is refused, and every option of every command has help text."""

from __future__ import annotations

from dataclasses import dataclass

import click
import pytest
import typer
from typer.testing import CliRunner

from simctl.cli import app
from simctl.common.option_fields import option_field
from simctl.config_options import with_config_options

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Pair:
    size: int = option_field(1, "How many.")
    name: str | None = option_field(None, "What it is called.", metavar="NAME")


@dataclass(frozen=True)
class Other:
    size: int = option_field(2, "The same name again.")


def _commands() -> dict[str, click.Command]:
    return typer.main.get_command(app).commands  # type: ignore[attr-defined]


def test_a_section_becomes_options_and_comes_back_as_the_dataclass() -> None:
    seen: list[tuple[Pair, bool]] = []

    def command(pair: Pair = Pair(size=3), flag: bool = False) -> None:
        seen.append((pair, flag))

    one = typer.Typer()
    one.command()(with_config_options(command))
    runner = CliRunner()
    assert runner.invoke(one, ["--name", "x", "--flag"]).exit_code == 0
    assert runner.invoke(one, ["--size", "5"]).exit_code == 0
    assert seen == [(Pair(3, "x"), True), (Pair(5, None), False)]  # the instance declared is the default
    text = " ".join(runner.invoke(one, ["--help"]).output.split())
    assert "--size" in text and "How many. [default: 3]" in text and "--name NAME" in text


def test_an_option_declared_twice_is_refused() -> None:
    def command(pair: Pair = Pair(), other: Other = Other()) -> None:
        pass

    with pytest.raises(TypeError, match="declared twice.*size"):
        with_config_options(command)


@dataclass(frozen=True)
class Bare:
    size: int = 1


def test_a_field_without_help_is_refused() -> None:
    def command(bare: Bare = Bare()) -> None:
        pass

    with pytest.raises(TypeError, match="Bare.size"):
        with_config_options(command)


def test_every_option_of_every_command_teaches() -> None:
    for name, command in _commands().items():
        for param in command.params:
            if isinstance(param, click.Option) and param.name != "help":
                assert (param.help or "").strip(), f"simctl {name} {param.opts[0]} has no help text"


def test_each_command_keeps_its_own_defaults_for_a_shared_section() -> None:
    defaults = {name: {p.name: p.default for p in c.params} for name, c in _commands().items()}
    assert defaults["run"]["trace"] == "arxiv" and defaults["capacity"]["trace"] == "sharegpt"
    assert defaults["run"]["policy"] == "sarathi" and defaults["plan"]["policy"] == "vllm,sarathi"
    assert defaults["real"]["scale"] == 0.05 and defaults["run"]["scale"] == 1.0
    # the policies' settings: one option each, given or not (None: the policy's own default)
    assert defaults["run"]["token_budget"] is None and defaults["real"]["token_budget"] is None
