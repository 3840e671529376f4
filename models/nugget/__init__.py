"""Nugget-compressed context (Qin et al.): ``--model nugget``, its selectors, scorer and training."""

from decodebench.models.nugget.config import NuggetConfig
from decodebench.models.nugget.method import Nugget

__all__ = ["Nugget", "NuggetConfig"]
