"""Shell completion: Typer's --install-completion and --show-completion, each taking the shell by name.

Typer's own pair are flags that detect the shell running the command, so `--show-completion zsh` typed
in bash prints bash's script (the `zsh` is ignored). Here each takes an optional value: the shell's name,
or nothing for the shell running mlxinfer (detected, else $SHELL). The scripts call `mlxinfer` with
_MLXINFER_COMPLETE set; Click answers from the commands' declarations, with no model and no mlx loaded.
"""

from __future__ import annotations

import os

import click

SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")
_HELP = {  # Typer's two flags, by their parameter names
    "install_completion": "Install completion for SHELL",
    "show_completion": "Print the completion script for SHELL, to copy it or customize the installation",
}


def by_name(params: list) -> list:
    """`params` with Typer's two completion flags replaced by options whose value names the shell."""
    out = []
    for p in params:
        if p.name in _HELP and getattr(p, "is_flag", False):
            p = click.Option(
                list(p.opts),
                is_flag=False,
                flag_value="",
                expose_value=False,
                is_eager=True,
                metavar="[SHELL]",
                callback=_named(p.callback),
                help=f"{_HELP[p.name]} (bash, zsh, fish or powershell; default: the shell running mlxinfer).",
            )
        out.append(p)
    return out


def _named(typer_callback):
    def callback(ctx, param, value):
        if value is None or ctx.resilient_parsing:
            return None
        shell = value or _running_shell()
        if shell is None:
            raise click.BadParameter("cannot tell which shell runs mlxinfer; name it, e.g. bash", ctx, param)
        if shell not in SHELLS:
            raise click.BadParameter(f"takes one of {', '.join(SHELLS)}; got {shell!r}", ctx, param)
        return typer_callback(ctx, param, shell)

    return callback


def _running_shell() -> str | None:
    try:
        import shellingham

        return shellingham.detect_shell()[0]
    except Exception:  # noqa: BLE001 - not installed, or no shell among the parents
        name = os.path.basename(os.environ.get("SHELL", ""))
        return name or None
