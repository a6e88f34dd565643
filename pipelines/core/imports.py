"""TensorFlow loaded once per process, with Python's cyclic garbage collector kept out of its way.

Every rank, calibration, sweep, probe and parameter-server task is a new process that imports
TensorFlow, and in each the cyclic collector took about a fifth of the process's CPU time (0.9 to
1.3 of 5 to 6.5 CPU-seconds for a short training rank; docs/ARCHITECTURE.md, "Process start-up"):

- while TensorFlow imports, the collector runs hundreds of times over a heap that grows to a few
  hundred thousand objects, none of which is garbage (0.5 of the 2.2 CPU-seconds of
  ``import tensorflow``);
- afterwards, each full collection walks those same objects again: modules, classes and functions
  that live as long as the process.

:func:`load_tensorflow` therefore imports TensorFlow with the collector paused, then moves every
object alive to the permanent generation (``gc.freeze``, the start-up pattern CPython's docs give
for long-lived state), so later collections walk only what the program creates; the collector runs
as usual afterwards. The cost: the few cycles the import leaves as garbage (about 1,500 objects,
well under a megabyte) stay frozen; collecting them first would cost 0.23 CPU-seconds a process.

Every lazy ``import tensorflow`` in ``pipelines`` goes through it: the first one in a process
decides, and a program does not have to know which of its paths loads TensorFlow first. Model
build functions (``pipelines.models.examples``, a user's module) import TensorFlow themselves;
:func:`pipelines.models.build_model` loads it through here before calling them.
"""

from __future__ import annotations

import gc
import sys
from types import ModuleType

__all__ = ["load_tensorflow"]


def load_tensorflow() -> ModuleType:
    """The ``tensorflow`` module, imported on the first call with the cyclic collector paused and
    the start-up heap frozen afterwards (see the module's docstring); later calls return it."""
    module = sys.modules.get("tensorflow")
    if module is not None:
        return module
    enabled = gc.isenabled()
    gc.disable()
    try:
        import tensorflow as tf
    finally:
        if enabled:
            gc.enable()
    gc.freeze()
    return tf
