"""The torch side of the wall: the only module that imports torch (and, for profiling, fbgemm_gpu).

Always run as a subprocess (``python -m neuroshard_jax.worker <command> ...``), never imported by
JAX code and never forked from a process that imported JAX.

Commands:
  dlrm-to-npz IN OUT   convert a DLRM benchmark file (torch.load -> indices, offsets, lengths) to .npz
"""

from __future__ import annotations

import sys

import numpy as np


def dlrm_to_npz(src: str, dst: str) -> None:
    import torch

    data = torch.load(src, map_location="cpu", weights_only=True)
    if not isinstance(data, (tuple, list)) or len(data) != 3:
        raise SystemExit(f"expected (indices, offsets, lengths), got {type(data).__name__}")
    indices, offsets, lengths = (torch.as_tensor(x).cpu().numpy() for x in data)
    np.savez(dst, indices=indices.astype(np.int64), offsets=offsets.astype(np.int64), lengths=lengths.astype(np.int64))


def main(argv: list[str]) -> None:
    if len(argv) == 3 and argv[0] == "dlrm-to-npz":
        try:
            dlrm_to_npz(argv[1], argv[2])
        except (OSError, RuntimeError, ValueError) as err:
            raise SystemExit(f"{type(err).__name__}: {err}") from None
        return
    raise SystemExit(f"usage: python -m neuroshard_jax.worker dlrm-to-npz IN OUT (got {argv})")


if __name__ == "__main__":
    main(sys.argv[1:])
