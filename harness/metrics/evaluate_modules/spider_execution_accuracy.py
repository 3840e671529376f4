"""Spider execution accuracy as decodebench's spider tasks compute it: the first SQL statement of each generation
run on its database, read-only and bounded, its result compared with the gold query's by the test-suite evaluation's
semantics (values as values, DISTINCT removed, column permutations, multisets or lists under ORDER BY)."""

import evaluate

from decodebench.metrics import spider_execution_accuracy
from decodebench.metrics.evaluate_modules import TEXT_PAIRS, metric_info

_KWARGS = """
predictions: the model's generations (strings; the first SQL statement is scored).
references: the gold SQL queries.
db_paths: each question's SQLite database file.
Returns: execution_accuracy (the mean over predictions, in [0, 1]).
"""


class SpiderExecutionAccuracy(evaluate.Metric):
    def _info(self):
        return metric_info(
            __doc__,
            "Yu et al., Spider; Zhong et al., Semantic evaluation for text-to-SQL with distilled test suites",
            _KWARGS,
            TEXT_PAIRS,
        )

    def _compute(self, predictions, references, db_paths):
        if len(db_paths) != len(predictions):
            raise ValueError(f"db_paths: {len(db_paths)} databases for {len(predictions)} predictions; give one each")
        scores = [
            spider_execution_accuracy(p, gold, db)
            for p, gold, db in zip(predictions, references, db_paths, strict=True)
        ]
        return {"execution_accuracy": sum(scores) / len(scores) if scores else None}
