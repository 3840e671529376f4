"""Regression benchmarks (``tox -e bench``): kernels and a short decode on the embedded model.

benchmarks/check_regression.py runs them against this tree and against a baseline revision in the same run, in
rounds of alternating order, and pairs the two per round.
"""
