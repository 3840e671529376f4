"""lm-eval model classes: an instrumented base per backend, the baseline and the methods."""
