"""decodebench inside lm-eval: the hooks that decodebench._startup runs around lm-eval's own modules when lm-eval
is imported (plugin.py: our models, tasks and per-request measurement) and the cache of lm-eval's task index
(task_index_cache.py)."""
