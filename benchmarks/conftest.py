"""Regression benchmarks (``tox -e bench``): kernels and a short decode on the embedded model.

Every benchmark is compared with benchmarks/baseline.json by check_regression.py: directly when the machine
is the same, otherwise as a ratio to ``test_calibration_matmul`` measured in the same run.
"""
