"""collate stacks arrays in one copy where the rows allow it, and row by row (numpy's rules) where not."""

import numpy as np
import pytest
import torch

from episodepipes.pipes.batch import collate


def _samples(rows):
    return [{"episode": "e", "prompt": "", "frame": i, "timestamp": i / 2, "valid": i % 2 == 0, "x": r}
            for i, r in enumerate(rows)]


@pytest.mark.parametrize("rows", [
    [np.arange(6, dtype="<f4").reshape(2, 3) + i for i in range(4)],
    [np.array(i, np.int16) for i in range(3)],  # 0-d rows
    [np.arange(3, dtype=">f8"), np.arange(3, dtype="<f8")],  # another byte order: stacked native, same values
    [np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int64)],  # another dtype: cast as numpy assigns it
    [np.ones((1, 3)), np.zeros(3)],  # another shape that broadcasts into the row
])
def test_arrays_stack_into_the_first_rows_dtype_and_shape(rows):
    out = collate(_samples(rows))
    want = np.empty((len(rows), *np.shape(rows[0])), np.asarray(rows[0]).dtype.newbyteorder("="))
    for i, r in enumerate(rows):
        want[i] = r
    assert out["x"].dtype == torch.from_numpy(want).dtype and np.array_equal(out["x"].numpy(), want)
    assert out["frame"].tolist() == list(range(len(rows))) and out["frame"].dtype == torch.int64
    assert out["timestamp"].dtype == torch.float64 and out["valid"].dtype == torch.bool
    assert out["valid"].tolist() == [i % 2 == 0 for i in range(len(rows))]


def test_rows_of_other_shapes_with_the_same_total_size_are_refused_not_run_together():
    with pytest.raises(ValueError):
        collate(_samples([np.arange(2), np.arange(3), np.arange(1)]))  # 6 values, but not three rows of 2
