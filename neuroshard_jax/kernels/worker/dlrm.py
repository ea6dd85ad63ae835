"""DLRM benchmark files (torch.load) converted to .npz, so the pool loader never imports torch."""

from __future__ import annotations

import numpy as np


def dlrm_to_npz(src: str, dst: str) -> None:
    import torch

    data = torch.load(src, map_location="cpu", weights_only=True)
    if not isinstance(data, (tuple, list)) or len(data) != 3:
        raise SystemExit(f"expected (indices, offsets, lengths), got {type(data).__name__}")
    indices, offsets, lengths = (torch.as_tensor(x).cpu().numpy() for x in data)
    np.savez(dst, indices=indices.astype(np.int64), offsets=offsets.astype(np.int64), lengths=lengths.astype(np.int64))
