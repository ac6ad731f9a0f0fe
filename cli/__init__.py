"""The `mlxinfer` command line: a thin layer that renders what the library returns."""
