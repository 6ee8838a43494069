"""VectorIndex does every FAISS call of a search: the first stage of each index type × quantization, restricted to
allowed rows with the planner's widths, binary rescoring, the exact pass and reconstruction, equal to brute force
where they are exact."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from models.bundle.storage.rows import Allowed
from models.bundle.vectors.index import IndexWriter, VectorIndex
from models.bundle.vectors.index_spec import IndexType, Quantization, resolve_spec
from models.bundle.vectors.quantize import int8_decode
from models.contract import truncate
from models.search.planner import Planner

N, DIM = 1200, 64
KINDS = [("flat", q) for q in Quantization] + [("hnsw", q) for q in Quantization] + [("ivf", Quantization.BINARY)]


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    rng = np.random.default_rng(3)
    centers = rng.standard_normal((20, 768)).astype(np.float32)
    x = centers[rng.integers(0, 20, N)] + rng.standard_normal((N, 768)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def queries(vectors: np.ndarray) -> np.ndarray:
    q = vectors[:6] + 0.2 * np.random.default_rng(4).standard_normal((6, 768)).astype(np.float32)
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def _build(vectors: np.ndarray, kind: str, quantization: Quantization) -> VectorIndex:
    return VectorIndex.build(vectors, DIM, quantization, resolve_spec(kind, quantization, N), center=True, spin=True)


def _brute(index: VectorIndex, query: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """The top k of `rows` by the vectors the index scores with (float, or int8-decoded), ties by row."""
    scores = index.reconstruct(rows) @ truncate(query, DIM)
    return rows[np.lexsort((rows, -scores))[:k]]


@pytest.mark.parametrize(("kind", "quantization"), KINDS)
def test_a_saved_index_loads_and_searches_as_built(tmp_path: Path, vectors: np.ndarray, queries: np.ndarray,
                                                   kind: str, quantization: Quantization) -> None:
    built = VectorIndex.build(vectors, DIM, quantization, resolve_spec(kind, quantization, N))  # no center: the
    built.save(tmp_path)  # calibration is all of its space a bare directory holds
    loaded = VectorIndex.load(tmp_path, DIM, quantization, resolve_spec(kind, quantization, N))
    assert loaded.count == N and loaded.spec.type is IndexType(kind)
    for a, b in zip(built.search(queries, 10), loaded.search(queries, 10), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("kind", "quantization"), KINDS)
def test_a_restricted_search_returns_only_allowed_rows(vectors: np.ndarray, queries: np.ndarray, kind: str,
                                                       quantization: Quantization) -> None:
    index = _build(vectors, kind, quantization)
    mask = np.zeros(N, dtype=bool)
    mask[::7] = True
    allowed = Allowed(mask)
    scores, rows = index.search(queries, 10, 4, allowed, Planner())
    assert rows.shape == (len(queries), 10)
    for s, r in zip(scores, rows, strict=True):
        kept = r[r >= 0]
        assert len(kept) > 0 and mask[kept].all()
        assert list(s[: len(kept)]) == sorted(s[: len(kept)], reverse=True)
    with pytest.raises(ValueError, match="widening"):
        index.search(queries, 10, 4, allowed)


@pytest.mark.parametrize("quantization", [Quantization.FLOAT, Quantization.INT8])
def test_flat_search_and_the_exact_pass_equal_brute_force(vectors: np.ndarray, queries: np.ndarray,
                                                          quantization: Quantization) -> None:
    index = _build(vectors, "flat", quantization)
    every = np.arange(N)
    _, rows = index.search(queries, 10)
    subset = np.arange(3, N, 11)
    for q, r in zip(queries, rows, strict=True):
        want = _brute(index, q, every, 10)
        assert set(r) == set(want)  # FAISS's own tie order may differ from ours
        got_s, got_r = index.exact(q[None], 10, subset, 4)
        assert got_r.tolist() == _brute(index, q, subset, 10).tolist()
        assert list(got_s) == sorted(got_s, reverse=True)


def test_binary_rescoring_every_candidate_is_the_int8_brute_force(vectors: np.ndarray, queries: np.ndarray) -> None:
    index = _build(vectors, "flat", Quantization.BINARY)
    _, rows = index.search(queries, 10, oversample=N)  # every row a candidate: the int8 rescoring decides
    _, exact = index.exact(queries[:1], 10, np.arange(N), N)
    assert rows[0].tolist() == exact.tolist()
    for q, r in zip(queries, rows, strict=True):
        assert r.tolist() == _brute(index, q, np.arange(N), 10).tolist()


def test_reconstruction_gives_the_stored_vectors(vectors: np.ndarray) -> None:
    rows = np.array([0, 5, 17, N - 1])
    x = truncate(vectors, DIM)
    np.testing.assert_allclose(_build(vectors, "flat", Quantization.FLOAT).reconstruct(rows), x[rows], atol=1e-6)
    for quantization in (Quantization.INT8, Quantization.BINARY):
        index = _build(vectors, "flat", quantization)
        assert index.space.calibration is not None
        got = index.reconstruct(rows)
        assert np.all(np.abs(got - x[rows]) <= index.space.calibration.max_error() + 1e-6)
        if quantization is Quantization.BINARY:
            assert index.rescore_codes is not None
            np.testing.assert_array_equal(got, int8_decode(index.rescore_codes[rows], index.space.calibration))


def test_hamming_finds_a_document_by_its_own_vector(vectors: np.ndarray) -> None:
    index = _build(vectors, "flat", Quantization.BINARY)
    distances, rows = index.hamming(vectors[:5], 3)
    assert rows[:, 0].tolist() == [0, 1, 2, 3, 4] and not distances[:, 0].any()


def test_an_index_of_another_dimension_is_refused(tmp_path: Path, vectors: np.ndarray) -> None:
    VectorIndex.build(vectors, DIM, Quantization.FLOAT).save(tmp_path)
    with pytest.raises(ValueError, match="does not match"):
        VectorIndex.load(tmp_path, DIM * 2, Quantization.FLOAT)


@pytest.mark.parametrize("kind", ["flat", "ivf"])  # an HNSW graph depends on the order of its adds
def test_the_streaming_writer_writes_the_files_a_built_index_saves(tmp_path: Path, vectors: np.ndarray,
                                                                   kind: str) -> None:
    """A flat binary first stage is streamed to its file (no FAISS index held), the others are filled in RAM: the
    bytes equal those of VectorIndex.build(...).save() on the same vectors, chunked or not."""
    q = Quantization.BINARY
    spec = resolve_spec(kind, q, N)
    built = VectorIndex.build(vectors, DIM, q, spec, center=True, spin=True)
    (tmp_path / "whole").mkdir()
    built.save(tmp_path / "whole", space=False)
    streamed = tmp_path / "streamed"
    streamed.mkdir()
    x = built.space.project(vectors, DIM)
    writer = IndexWriter(streamed, N, DIM, q, spec, built.space)
    if writer.train_step is not None:
        writer.train(np.array_split(x, 7))
    for chunk in np.array_split(x, 7):
        writer.add(chunk)
    names = writer.finish()
    writer.close()
    assert sorted(names) == sorted(p.name for p in (tmp_path / "whole").iterdir())
    for name in names:
        assert (streamed / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    loaded = VectorIndex.load(streamed, DIM, q, spec, space=built.space)
    assert np.array_equal(loaded.search(vectors[:5], 10)[1], built.search(vectors[:5], 10)[1])


def test_the_rescoring_depth_an_index_records_is_a_floor(vectors: np.ndarray, queries: np.ndarray) -> None:
    """An index whose spec records a depth (large corpora: models.bundle.vectors.index_spec.rescore_depth) rescores at
    least that many candidates a hit, whatever the caller asks."""
    index = _build(vectors, "flat", Quantization.BINARY)
    deep = VectorIndex(index.quantization, index.dim, index.index, index.space, index.rescore_codes,
                       index.spec.model_copy(update={"oversample": N}))
    assert np.array_equal(deep.search(queries, 10, oversample=1)[1], index.search(queries, 10, oversample=N)[1])


def test_the_recorded_depth_is_spent_on_the_head_of_a_deeper_list(vectors: np.ndarray, queries: np.ndarray) -> None:
    """A hybrid search takes 100 dense candidates and gives back 10: the index's recorded depth rescores for the
    10 (`head`), the caller's own oversample for the rest; its 10 best are what a search for 10 returns."""
    index = _build(vectors, "flat", Quantization.BINARY)
    deep = VectorIndex(index.quantization, index.dim, index.index, index.space, index.rescore_codes,
                       index.spec.model_copy(update={"oversample": 60}))
    assert deep.rescore_pool(100, 4, head=10) == 600  # not 100 × 60 = 6,000
    assert deep.rescore_pool(100, 4) == 6000 and deep.rescore_pool(100, 8, head=1) == 800
    rows = deep.search(queries, 100, oversample=4, head=10)[1]
    assert np.array_equal(rows[:, :10], deep.search(queries, 10, oversample=4)[1])
    for q, found in zip(queries, rows, strict=True):  # 100 distinct rows, all among the 600 best by Hamming
        assert len(set(found)) == 100 and set(found) <= set(deep.hamming(q[None, :], 600)[1][0])
    every = np.arange(N)
    assert np.array_equal(deep.exact(queries[:1], 100, every, 4, head=10)[1][:10],
                          deep.exact(queries[:1], 10, every, 4)[1])


def test_rows_read_unmapped_answer_as_the_map_does_and_map_nothing(tmp_path: Path, vectors: np.ndarray,
                                                                     queries: np.ndarray) -> None:
    """A writer's sample reads the rescoring rows with pread (models.bundle.storage.row_file): the same answers, from
    the search and the exact pass, and no page of the file left mapped."""
    built = _build(vectors, "flat", Quantization.BINARY)
    built.save(tmp_path)
    index = VectorIndex.load(tmp_path, DIM, Quantization.BINARY, built.spec)
    want = index.search(queries, 10, 8), index.exact(queries[:1], 10, np.arange(N), 8)
    reader = index.read_rows_unmapped()
    assert reader is not None and len(reader) == N
    try:
        got = index.search(queries, 10, 8), index.exact(queries[:1], 10, np.arange(N), 8)
        for (ws, wr), (gs, gr) in zip(want, got, strict=True):
            assert np.array_equal(wr, gr) and np.array_equal(ws, gs)
        assert np.array_equal(reader[np.array([5, 0, N - 1])], np.load(tmp_path / "rescore.u8.npy")[[5, 0, N - 1]])
        with pytest.raises(IndexError):
            reader[np.array([N])]
        gc.collect()  # the map the index was loaded with is let go
        assert str(tmp_path / "rescore.u8.npy") not in Path("/proc/self/maps").read_text()
    finally:
        reader.close()


def _resident_kib(path: Path) -> int:
    """This process's resident pages of its mappings of `path` (smaps' Rss), in KiB."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5:  # a mapping's header: address range, perms, offset, dev, inode[, path]
            inside = len(head) == 6 and head[5] == str(path)
        elif inside and head[0] == "Rss:":
            total += int(head[1])
    return total


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_a_mapped_first_stage_answers_as_the_loaded_one_and_lets_its_pages_go(tmp_path: Path, vectors: np.ndarray,
                                                                              queries: np.ndarray, kind: str) -> None:
    """A writer's sample maps the first stage (VectorIndex.load(mapped=True)): the same answers as the one read
    into RAM, and after unmap_pages none of its file's pages counted in this process."""
    built = _build(vectors, kind, Quantization.BINARY)
    built.save(tmp_path)
    loaded = VectorIndex.load(tmp_path, DIM, Quantization.BINARY, built.spec, space=built.space)
    mapped = VectorIndex.load(tmp_path, DIM, Quantization.BINARY, built.spec, space=built.space, mapped=True)
    index_file = (tmp_path / "index.faiss").resolve()
    assert mapped.mapped_file == tmp_path / "index.faiss" and loaded.mapped_file is None
    for a, b in zip(mapped.search(queries, 10, 4), loaded.search(queries, 10, 4), strict=True):
        np.testing.assert_array_equal(a, b)
    assert _resident_kib(index_file) > 0
    mapped.unmap_pages()
    assert _resident_kib(index_file) == 0
    for a, b in zip(mapped.search(queries, 10, 4), loaded.search(queries, 10, 4), strict=True):
        np.testing.assert_array_equal(a, b)  # read again from the page cache


def test_an_ivf_keeps_its_codes_by_row_and_its_exact_pass_ranks_as_flat_does(tmp_path: Path, vectors: np.ndarray,
                                                                            queries: np.ndarray) -> None:
    """An IVF holds its codes by cell; the codes it writes by row let a filtered search's exact plan rank the
    allowed rows by Hamming distance, as a flat index does, instead of scoring each by its int8 vector."""
    flat, ivf = _build(vectors, "flat", Quantization.BINARY), _build(vectors, "ivf", Quantization.BINARY)
    ivf.save(tmp_path)
    loaded = VectorIndex.load(tmp_path, DIM, Quantization.BINARY, ivf.spec, space=ivf.space)
    assert loaded.row_codes is not None and np.array_equal(loaded.codes_by_row(), flat.codes_by_row())
    rows = np.arange(0, N, 3)
    for query in queries:
        rotated = flat.space.rotate(query[None, :])
        for a, b in zip(loaded.exact(rotated, 10, rows, 2), flat.exact(rotated, 10, rows, 2), strict=True):
            np.testing.assert_array_equal(a, b)
    (tmp_path / "codes.u8.npy").unlink()  # an IVF written before its codes were kept by row still loads
    assert VectorIndex.load(tmp_path, DIM, Quantization.BINARY, ivf.spec, space=ivf.space).codes_by_row() is None


def test_unmapping_the_codes_pages_keeps_every_answer(tmp_path: Path, vectors: np.ndarray,
                                                      queries: np.ndarray) -> None:
    """A writer lets go of the rescoring codes' mapped pages between batches of sample queries: the pages come back
    from the file on the next read, so the answers stay the same."""
    _build(vectors, "ivf", Quantization.BINARY).save(tmp_path)
    loaded = VectorIndex.load(tmp_path, DIM, Quantization.BINARY, resolve_spec("ivf", Quantization.BINARY, N))
    before = loaded.search(queries, 10)
    loaded.unmap_pages()
    for a, b in zip(before, loaded.search(queries, 10), strict=True):
        np.testing.assert_array_equal(a, b)
