"""The LZ penalty (Ginart et al.): ``--model lz``, its transformers and vLLM logits processors."""

from decodebench.models.lz.config import LZConfig
from decodebench.models.lz.method import LZ

__all__ = ["LZ", "LZConfig"]
