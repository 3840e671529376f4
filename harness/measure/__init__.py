"""The one measurement layer every method and every baseline goes through (recorder, energy, machine)."""

from decodebench.measure.recorder import FINISH_REASONS, Recorder, RequestRecord, Window, sum_numeric_stats

__all__ = ["FINISH_REASONS", "Recorder", "RequestRecord", "Window", "sum_numeric_stats"]
