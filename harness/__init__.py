"""decodebench: benchmark LLM decoding methods inside lm-evaluation-harness.

By role: commands/ (the CLI and what it runs), lmeval/ (the hooks into lm-eval), data/ (embedded model, task data,
corpora, infini-gram indexes, tokenizer fingerprints, paths; their old top-level names stay importable), stats.py,
measure/ and metrics/.

This package is imported at every interpreter start-up (through decodebench_lmeval_hook.pth),
so it must stay cheap: no lm_eval, torch or transformers import at package level.
"""

__version__ = "0.1.0"
