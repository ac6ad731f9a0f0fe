"""`python -m mlxinfer`: the installed `mlxinfer` command. Found through its entry point, so the library
never imports the CLI that stands on it."""

from importlib.metadata import entry_points

(script,) = entry_points(group="console_scripts", name="mlxinfer")
script.load()()
