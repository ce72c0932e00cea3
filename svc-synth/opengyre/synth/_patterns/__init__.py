"""Every difficulty pattern, one module each; importing this package registers them."""

import importlib
import pkgutil

for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")

__all__: list[str] = []
