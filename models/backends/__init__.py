"""The backends, in their own room: ``base.py`` (``BackendLM``: the one ``generate_until`` every backend runs, the
measurement set-up, the ``--use_cache`` identity), and each backend's own steps over lm-eval's model class:
``hf.py`` (transformers, ``HFLM``), ``vllm.py`` (vLLM in this process, ``VLLM``), ``served.py`` (any
OpenAI-compatible server, ``LocalCompletionsAPI``; its load and SLOs in ``served_load.py``), and ``vllm_cpu_fix.py``
(vLLM 0.32.0's CPU build, fixed). No backend names a method, and no method imports a backend: methods ask
``capabilities`` (``models/method.py``). Their table by name is ``models/registry.py``.
"""
