"""Searchers: registered by name, selected with ``searcher=<name>``.

Importing this package registers every built-in searcher.
"""

from searchers import baselines, neuroshard, portfolio, rl, torchrec  # noqa: F401  (registers the built-in searchers)
from searchers.registry import Searcher, make_searcher, register, registered, searcher_names, searcher_options

__all__ = ["Searcher", "make_searcher", "register", "registered", "searcher_names", "searcher_options"]
