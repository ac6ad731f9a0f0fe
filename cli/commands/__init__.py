"""One module per command; importing this package imports each, and each adds itself to `cli.app.app`."""

import importlib
import pkgutil

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
