"""The fast GGUF header reader agrees with the `gguf` package's reader: every metadata value (long arrays by
length), every tensor's type, shape, dtype and bytes."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from sarathi.model.embedded import embedded_gguf_path
from sarathi.model.gguf_header import GGUFHeader, LongArray


def test_header_equals_the_gguf_packages_reader() -> None:
    path = embedded_gguf_path()
    ours, theirs = GGUFHeader(path), gguf.GGUFReader(str(path))
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert (a.tensor_type, a.shape) == (b.tensor_type, tuple(int(n) for n in b.shape))
        assert (a.data.shape, a.data.dtype, a.n_bytes) == (b.data.shape, b.data.dtype, int(b.n_bytes))
        assert np.array_equal(np.asarray(a.data).view(np.uint8), np.asarray(b.data).view(np.uint8))
    keys = [k for k in theirs.fields if not k.startswith("GGUF.")]  # the reader's own pseudo-fields
    assert sorted(keys) == sorted(ours.metadata)
    for key in keys:
        value, want = ours.metadata[key], theirs.fields[key].contents()
        if isinstance(value, LongArray):
            assert value.length == len(want) > 64
        else:
            assert value == want, key


def test_a_file_that_is_not_gguf_is_named(tmp_path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFHeader(bad)
