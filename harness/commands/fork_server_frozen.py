"""Imported last by the fork server that decodebench's ``lm_eval`` runs are forked from (``decodebench.commands.runs``,
``FREEZE``): it moves every object the server holds, torch's, transformers' and lm-eval's modules, to the garbage
collector's permanent generation, as Python's documentation advises before ``fork()`` without ``exec()``. A run's
collections then walk only what the run made, instead of the server's million objects, whose pages each walk would
also copy into the run. Nothing else imports it."""

import gc

gc.freeze()
