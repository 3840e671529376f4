"""What a person runs: the ``decodebench`` CLI (cli.py) and its commands.

demo.py is the main job; compare.py and sweep.py measure a method against the baseline (sides.py: what both
need of the two sides' arguments), serve.py starts ``vllm serve`` with decodebench's plugins, and runs.py is the
``lm_eval`` command line every one of them runs.
"""
