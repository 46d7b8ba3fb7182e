"""``python -m jaxloader.profile module:make_loader --steps 300``: the profile report from the
command line (``jaxloader.profiling``; in Python, ``jl.profile``).

Importing this module sets ``jaxloader.profile`` to it, where ``jaxloader`` had put the
function ``profile``: so that ``jl.profile(...)`` still works after that, the module is
callable and calls the function.
"""

import sys
import types
from typing import Any

from jaxloader.profiling import main, profile


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return profile(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    main()
