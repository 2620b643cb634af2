"""The vLLM settings `simctl real --engine vllm` passes through (`engine.vllm_real.VLLM_SETTINGS`), as options
of the command. A setting some policy already has under the same name (a policy modelling vLLM) is that
policy's generated option (`simctl.policy_options`), not a second one: the command reads it from both."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any, get_type_hints

import typer

from engine.vllm_real import VLLM_SETTINGS
from policies.registry import setting_names


def with_vllm_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give `command` (already wrapped by `with_policy_options`, so it takes the policy settings as options)
    one option per vLLM setting no policy has; it receives them all as `vllm_settings` (None: not given)."""
    shared = set(setting_names())
    signature = inspect.signature(command)
    hints = get_type_hints(command, include_extras=True)
    params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values()
              if p.name != "vllm_settings"]
    own = [name for name in VLLM_SETTINGS if name not in shared]
    for name in own:
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
            int | None, typer.Option(help=f"{VLLM_SETTINGS[name]}.")]))

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        settings = {n: kwargs.pop(n) for n in own} | {n: kwargs.get(n) for n in VLLM_SETTINGS if n in shared}
        return command(**kwargs, vllm_settings=settings)

    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper
