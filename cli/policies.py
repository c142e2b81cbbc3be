"""The ``--policy`` option's choices: the built-in replay policies and the installed plug-ins.

The choices are read when an option is parsed or its help is shown, not when the command
is defined, so a plug-in installed (or put on ``sys.path``) after ``bursar`` was imported
is a choice too. A plug-in entry point refused at discovery (a clash with a built-in, a
name two distributions claim) is reported as one warning line on stderr by the commands
that replay.
"""

from __future__ import annotations

from typing import Any

import click

from bursar.sim.replay.policies import GROUP, POLICIES, plugin_problems, policy_names

__all__ = ["PolicyChoice", "policies_help", "warn_refused_plugins"]


class PolicyChoice(click.Choice):  # type: ignore[type-arg]
    """``click.Choice`` over ``policy_names()``, read afresh each time."""

    def __init__(self) -> None:
        super().__init__((), case_sensitive=True)

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:
        return tuple(policy_names())

    @choices.setter
    def choices(self, value: Any) -> None:
        # click.Choice.__init__ assigns its list; the live one above is the one used.
        pass

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value not in self.choices:
            # A plug-in refused at discovery: say why, not only that it is no choice.
            for line in plugin_problems():
                if line.startswith(f"replay policy plug-in {value!r}"):
                    self.fail(f"{line}; allowed: {', '.join(self.choices)}", param, ctx)
        return super().convert(value, param, ctx)


def policies_help() -> str:
    return (
        f"Policies: {', '.join(POLICIES)}, and any plug-in installed under the entry-point "
        f"group {GROUP} (the --policy choices list them)."
    )


def warn_refused_plugins() -> None:
    for line in plugin_problems():
        click.echo(f"warning: {line}", err=True)
