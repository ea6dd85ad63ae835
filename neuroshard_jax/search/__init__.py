"""The search stage: row splits before a searcher, and the pipeline that checks a task, builds the cost
model, runs a registered searcher (``searchers/``), validates and scores the plan."""
