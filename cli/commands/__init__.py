"""One module per command, each a plain function; cli/app.py lists and registers them."""
