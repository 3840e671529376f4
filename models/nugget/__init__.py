"""Nugget-compressed context (Qin et al.): ``--model nugget``, its selectors, compressor and training.

The package imports lazily: ``decodebench.models.nugget.training_settings`` (the command line's defaults)
loads without torch.
"""

__all__ = ["Nugget", "NuggetConfig"]


def __getattr__(name: str):
    if name == "Nugget":
        from decodebench.models.nugget.method import Nugget

        return Nugget
    if name == "NuggetConfig":
        from decodebench.models.nugget.config import NuggetConfig

        return NuggetConfig
    raise AttributeError(name)
