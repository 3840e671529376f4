"""Infini-gram agreement as decodebench's tasks compute it: the infini-gram paper's share of generated tokens whose
infinity-gram probability exceeds 0.5, each token given the generated tokens before it, on an infini-gram index
(decodebench's reference index by default), token-weighted over all predictions."""

import evaluate

from decodebench.metrics import infinigram_agreement
from decodebench.metrics.evaluate_modules import TEXTS, metric_info

_KWARGS = """
predictions: the model's generations (strings, tokenized with the index's tokenizer).
index: an infini-gram index folder built by `decodebench build-index` (default: decodebench's reference index).
Returns: infinigram_agreement (agreeing tokens over scored tokens), scored_tokens.
"""


class InfinigramAgreement(evaluate.Metric):
    def _info(self):
        return metric_info(
            __doc__,
            "Liu et al., Infini-gram: scaling unbounded n-gram language models to a trillion tokens",
            _KWARGS,
            TEXTS,
        )

    def _compute(self, predictions, index=None):
        tokens = agreeing = 0
        for prediction in predictions:
            agreement = infinigram_agreement(prediction, index)
            tokens, agreeing = tokens + agreement.tokens, agreeing + agreement.agreeing
        return {"infinigram_agreement": agreeing / tokens if tokens else None, "scored_tokens": tokens}
