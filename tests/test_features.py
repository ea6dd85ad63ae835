import numpy as np
import pytest

from neuroshard_jax.core.features import FEATURE_NAMES, NUM_FEATURES, access_histogram, count_bins, feature_matrix


def oracle_bin(c: int) -> int:
    """(0,1] -> 0, (2^(k-1), 2^k] -> k, everything above 32768 -> 16."""
    k = 0
    while 2**k < c:
        k += 1
    return min(k, 16)


@pytest.mark.parametrize("c", [1, 2, 3, 4, 5, 8, 9, 16, 17, 1000, 32768, 32769, 10**7])
def test_count_bins_matches_oracle(c):
    assert count_bins(np.array([c]))[0] == oracle_bin(c)


def test_histogram_counts_rows_and_accesses():
    indices = np.array([5, 5, 5, 1, 2, 2, 9])  # row 5: 3 hits (bin 2), row 2: 2 (bin 1), rows 1, 9: 1 (bin 0)
    unique, accesses = access_histogram(indices, 10)
    assert unique[:3].tolist() == [2, 1, 1] and unique.sum() == 4
    assert accesses[:3].tolist() == [2, 2, 3] and accesses.sum() == len(indices)


def test_feature_order_is_the_documented_one():
    # the 21 every model reads, the kernel kind (mean pooling, weighted, sequence), the weights' element bytes
    assert NUM_FEATURES == 25
    assert FEATURE_NAMES[:3] == ("rows", "dim", "pooling_factor") and FEATURE_NAMES[20] == "size"
    assert FEATURE_NAMES[21:] == ("mean_pooling", "weighted", "sequence", "weight_bytes")
    row = feature_matrix([100], [8], [2.5], np.arange(17)[None] / 100)[0]
    assert row[0] == 100 and row[1] == 8 and row[2] == 2.5 and row[20] == 800 and row[3 + 16] == 0.16
    assert row[21:].tolist() == [0, 0, 0, 0]  # a sum-pooled bag, its bytes not given
    kinds = feature_matrix(
        [100] * 3, [8] * 3, [2.5] * 3, np.zeros((3, 17)), ["mean", "none", "sum"], [1, 0, 1], [4, 2, 4]
    )
    assert kinds[:, 21:].tolist() == [[1, 1, 0, 4], [0, 0, 1, 2], [0, 1, 0, 4]]
