"""Counting, on the CPU, the calls that would make the host wait for a GPU.

On CUDA, reading a device value on the host (``.item()``, ``.tolist()``, ``bool(t)``, a boolean mask as an index,
``nonzero``) waits for every kernel queued before it, and so does making a tensor from a Python list straight on the
device (a pageable copy). Here every tensor lives on the host, so such calls are caught by what they are, through
torch's function-mode hook: ``HostSyncs`` records each one made while it is active. Making a tensor from host data
(not from a tensor) is counted when a ``device`` other than the string ``"cpu"`` is named (vLLM's
``async_tensor_h2d`` stages on ``"cpu"``, pinned, then copies without blocking).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

READS = {
    "item",
    "tolist",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "__array__",
    "numpy",
    "cpu",
    "nonzero",
    "masked_select",
    "unique",
    "unique_consecutive",
    "repeat_interleave",  # without output_size it reads the counts
}
CREATIONS = {"tensor", "as_tensor"}


class HostSyncs(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls: list[str] = []
        self.active = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if self.active and self._syncs(name, args, kwargs):
            self.calls.append(name)
        return func(*args, **kwargs)

    @staticmethod
    def _syncs(name: str, args, kwargs) -> bool:
        if name == "repeat_interleave":
            return "output_size" not in kwargs
        if name in READS:
            return True
        if name in CREATIONS:  # host data made into a tensor straight on a device (a tensor is only moved or kept)
            return kwargs.get("device") not in (None, "cpu") and not isinstance(args[0] if args else None, torch.Tensor)
        if name in ("__getitem__", "__setitem__") and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
        return False

    def paused(self):
        """A context in which nothing is counted (code that is not under test, such as vLLM's own rule)."""
        mode = self

        class _Paused:
            def __enter__(self):
                mode.active = False

            def __exit__(self, *exc):
                mode.active = True

        return _Paused()
