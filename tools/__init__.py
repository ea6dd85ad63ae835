"""Research benchmarks and one-off fits: ``python -m tools.<name> --help`` from the repository's root.

They write to ``outputs/bench/<study>/`` by default (ignored by git); the summaries the docs cite live in
``docs/results/``."""
