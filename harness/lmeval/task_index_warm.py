"""Imported by the fork server that decodebench's ``lm_eval`` runs are forked from (``decodebench.commands.runs``):
it builds lm-eval's task index as the server starts, so that each run forked from it starts with the index built
(``decodebench.lmeval.task_index_cache``). Nothing else imports it."""

import logging

from decodebench.lmeval.task_index_cache import warm

try:
    warm()
except Exception as exc:  # the fork server must start whatever the task folders hold: each run then says it
    logging.getLogger(__name__).debug("lm-eval's task index was not built ahead of the runs: %s", exc)
