"""One module per command; importing this package registers them all on `cli.app.app`."""

from cli.commands import count, topk  # noqa: F401
