"""lm-eval model classes: the method contract, the backends (``backends/``), the baseline and one folder per method."""
