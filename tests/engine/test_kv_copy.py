"""The partial KV copies a GPU's prefix reuse does (one row's first positions, out of and into a
slot buffer): the strided layout checked with the same 2-D copy contract on host memory."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.engine.kv_copy import host_copy, read_row, row_span, write_row


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_rows_first_positions_come_out_and_go_in_without_touching_the_rest(dtype: type) -> None:
    shape = [3, 2, 16, 4]  # rows, kv heads, capacity, head size
    rng = np.random.default_rng(1)
    buffer = rng.standard_normal(shape).astype(dtype)
    for row, tokens in ((0, 5), (2, 16), (1, 1), (1, 0)):
        got = read_row(buffer.ctypes.data, shape, buffer.dtype, row, tokens, host_copy)
        assert got.shape == (2, tokens, 4) and np.array_equal(got, buffer[row, :, :tokens])
    before = buffer.copy()
    new = rng.standard_normal((2, 7, 4)).astype(dtype)
    write_row(buffer.ctypes.data, shape, 1, new, host_copy)
    assert np.array_equal(buffer[1, :, :7], new)
    untouched = np.ones(shape, dtype=bool)
    untouched[1, :, :7] = False
    assert np.array_equal(buffer[untouched], before[untouched])  # other rows, and the row's later positions


def test_a_span_later_in_a_row_comes_out_and_goes_in_at_its_positions() -> None:
    shape = [2, 3, 20, 4]
    rng = np.random.default_rng(2)
    buffer = rng.standard_normal(shape).astype(np.float32)
    got = read_row(buffer.ctypes.data, shape, buffer.dtype, 1, 6, host_copy, start=9)
    assert np.array_equal(got, buffer[1, :, 9:15])
    before = buffer.copy()
    new = rng.standard_normal((3, 5, 4)).astype(np.float32)
    write_row(buffer.ctypes.data, shape, 0, new, host_copy, start=15)
    assert np.array_equal(buffer[0, :, 15:20], new)
    untouched = np.ones(shape, dtype=bool)
    untouched[0, :, 15:20] = False
    assert np.array_equal(buffer[untouched], before[untouched])
    with pytest.raises(IndexError):
        row_span(shape, 4, row=0, tokens=6, start=15)  # past the capacity


def test_the_span_is_one_run_per_head_and_out_of_range_is_refused() -> None:
    span = row_span([4, 8, 100, 64], 2, row=3, tokens=10)
    assert (span.offset, span.pitch, span.width, span.runs) == (3 * 8 * 100 * 64 * 2, 100 * 64 * 2, 10 * 64 * 2, 8)
    with pytest.raises(IndexError):
        row_span([4, 8, 100, 64], 2, row=4, tokens=1)
    with pytest.raises(IndexError):
        row_span([4, 8, 100, 64], 2, row=0, tokens=101)
