"""decodebench: benchmark LLM decoding methods inside lm-evaluation-harness.

This package is imported at every interpreter start-up (through decodebench_lmeval_hook.pth),
so it must stay cheap: no lm_eval, torch or transformers import at package level.
"""

__version__ = "0.1.0"
