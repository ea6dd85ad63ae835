"""TorchRec in, TorchRec out: the planner adapter, the ShardingPlan conversion and the export.
Imports torch/torchrec (lazily where it can): use it from a TorchRec program."""

import logging


class _UpstreamNotice(logging.Filter):
    """TorchRec 1.8's KeyedJaggedTensor asks torch 2.13's ``is_fx_tracing``, which logs a deprecation notice meant
    for TorchRec's own code the first time (``torch/fx/_symbolic_trace.py``): a program that builds a batch cannot act
    on it. That one notice is dropped; every other record of that logger stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("is_fx_tracing will return true for both")


logging.getLogger("torch.fx._symbolic_trace").addFilter(_UpstreamNotice())
