"""``decodebench.vocabulary`` as it was imported before the data modules moved to decodebench.data (outside scripts
and test suites import it): this name is that module, decodebench/data/vocabulary.py."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("decodebench.data.vocabulary")
