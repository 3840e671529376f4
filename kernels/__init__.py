"""Pure tensor kernels of the decoding methods (no lm-eval import here)."""
