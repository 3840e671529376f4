"""Multi-token assisted decoding (Qin et al.): ``--model mtad``, its modes and drafters."""

from decodebench.models.mtad.config import MTADConfig
from decodebench.models.mtad.method import MTAD

__all__ = ["MTAD", "MTADConfig"]
