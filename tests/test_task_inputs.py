"""make_inputs: seeded generator streams, every dtype, and pinned .npy files."""

import hashlib
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from harness.task_model import C_TYPES, DTYPES, TaskError
from harness.task import load_task, make_inputs
from tests.test_task import (  # noqa: F401 - task is a fixture
    edited,
    integer_aware_task,
    load_error,
    task,
    valid_task,
    write_task,
)


def write_npy(folder: Path, name: str, array: np.ndarray) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / name, array)
    return hashlib.sha256((folder / name).read_bytes()).hexdigest()


# -------------------------------------------------------------- make_inputs

def test_make_inputs_follows_the_documented_streams(task):
    dims = task.case("odd").dims
    arrays = make_inputs(task, dims, seed=7)
    assert set(arrays) == {"a", "b"}

    def rng(name):
        entropy = np.random.SeedSequence([7, zlib.crc32(name.encode())])
        return np.random.Generator(np.random.PCG64(entropy))

    np.testing.assert_array_equal(arrays["a"], rng("a").uniform(-1.0, 1.0, (31, 29)).astype(np.float32))
    np.testing.assert_array_equal(arrays["b"], rng("b").normal(0.0, 1.0, (29, 37)).astype(np.float32))


def test_make_inputs_is_deterministic_and_seed_sensitive(task):
    dims = task.case("odd").dims
    first, again, other = (make_inputs(task, dims, s) for s in (1, 1, 2))
    for name in ("a", "b"):
        np.testing.assert_array_equal(first[name], again[name])
        assert not np.array_equal(first[name], other[name])
        assert first[name].flags.c_contiguous
        assert first[name].dtype == np.float32


def test_inputs_with_the_same_generator_get_different_values(tmp_path):
    data = edited(valid_task(), {"inputs.b": {"kind": "uniform", "low": -1.0, "high": 1.0},
                                 "params.1.shape": ["m", "k"]})
    task = load_task(write_task(tmp_path, data))
    arrays = make_inputs(task, {"m": 8, "n": 8, "k": 8}, seed=0)
    assert not np.array_equal(arrays["a"], arrays["b"])


def test_generated_values_respect_their_ranges(task):
    arrays = make_inputs(task, {"m": 300, "n": 300, "k": 300}, seed=3)
    assert arrays["a"].min() >= -1.0 and arrays["a"].max() <= 1.0
    assert abs(float(arrays["b"].mean())) < 0.02 and abs(float(arrays["b"].std()) - 1.0) < 0.02


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_float_dtypes(tmp_path, dtype):
    task = load_task(write_task(tmp_path, integer_aware_task(dtype, C_TYPES[dtype])))
    a = make_inputs(task, {"m": 64, "n": 2, "k": 64}, seed=5)["a"]
    assert a.dtype == DTYPES[dtype]
    values = a.astype(np.float64)
    assert values.min() >= -1.0 and values.max() <= 1.0 and len(np.unique(values)) > 50


@pytest.mark.parametrize(("dtype", "low", "high"), [
    ("int8", -128, 128), ("uint8", 0, 256), ("int32", -5, 5), ("uint32", 2**32 - 4, 2**32),
    ("int64", -(2**62), 2**62)])
def test_integer_generator(tmp_path, dtype, low, high):
    data = integer_aware_task(dtype, C_TYPES[dtype])
    data["inputs"]["a"] = {"kind": "integers", "low": low, "high": high}
    task = load_task(write_task(tmp_path, data))
    a = make_inputs(task, {"m": 100, "n": 2, "k": 100}, seed=9)["a"]
    assert a.dtype == DTYPES[dtype]
    assert int(a.min()) >= low and int(a.max()) < high


def test_integer_generator_excludes_high(tmp_path):
    data = integer_aware_task("int32", "int")
    data["inputs"]["a"] = {"kind": "integers", "low": 0, "high": 2}
    task = load_task(write_task(tmp_path, data))
    a = make_inputs(task, {"m": 50, "n": 2, "k": 50}, seed=1)["a"]
    assert set(np.unique(a).tolist()) == {0, 1}


# ----------------------------------------------------------------------- npy

def npy_task(folder: Path, array: np.ndarray, dtype: str = "float32", sha: str | None = None,
             name: str = "data/a.npy") -> Path:
    digest = write_npy(folder / Path(name).parent, Path(name).name, array)
    data = integer_aware_task(dtype, C_TYPES[dtype])
    data["inputs"]["a"] = {"kind": "npy", "file": name, "sha256": sha or digest}
    data["cases"] = [{"name": "only", "role": "performance", "dims": {"m": 3, "n": 2, "k": 4},
                      "seed": 0}]
    return write_task(folder, data)


def test_npy_input_loads_and_is_returned_as_is(tmp_path):
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    task = load_task(npy_task(tmp_path, array))
    a = make_inputs(task, {"m": 3, "n": 2, "k": 4}, seed=0)["a"]
    np.testing.assert_array_equal(a, array)
    assert a.flags.c_contiguous
    assert task.root / "data" / "a.npy" in task.files()


def test_npy_uppercase_hash_is_accepted(tmp_path):
    array = np.zeros((3, 4), np.float32)
    sha = write_npy(tmp_path / "data", "a.npy", array).upper()
    assert load_task(npy_task(tmp_path, array, sha=sha)).inputs["a"].sha256 == sha


def test_npy_bfloat16_round_trips(tmp_path):
    array = np.linspace(-1, 1, 12).astype(ml_dtypes.bfloat16).reshape(3, 4)
    task = load_task(npy_task(tmp_path, array, dtype="bfloat16"))
    a = make_inputs(task, {"m": 3, "n": 2, "k": 4}, seed=0)["a"]
    assert a.dtype == DTYPES["bfloat16"]
    np.testing.assert_array_equal(a.astype(np.float32), array.astype(np.float32))


def npy_error(folder: Path, **kwargs) -> TaskError:
    with pytest.raises(TaskError) as info:
        load_task(npy_task(folder, **kwargs))
    return info.value


def test_npy_hash_mismatch(tmp_path):
    err = npy_error(tmp_path, array=np.zeros((3, 4), np.float32), sha="ab" * 32)
    assert err.field == "inputs.a.sha256"
    assert "does not match a.npy (its SHA-256 is " in err.message


def test_npy_wrong_shape(tmp_path):
    err = npy_error(tmp_path, array=np.zeros((4, 3), np.float32))
    assert err.field == "inputs.a.file"
    assert "a.npy has shape (4, 3), expected (3, 4)" in err.message


def test_npy_wrong_dtype(tmp_path):
    err = npy_error(tmp_path, array=np.zeros((3, 4), np.float64))
    assert err.field == "inputs.a.file" and "holds float64, expected float32" in err.message


def test_npy_object_arrays_are_refused(tmp_path):
    err = npy_error(tmp_path, array=np.array([[None] * 4] * 3, dtype=object))
    assert err.field == "inputs.a.file" and "not a readable .npy" in err.message


def test_npy_that_is_not_npy(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.npy").write_bytes(b"not numpy")
    sha = hashlib.sha256(b"not numpy").hexdigest()
    data = integer_aware_task("float32", "float")
    data["inputs"]["a"] = {"kind": "npy", "file": "data/a.npy", "sha256": sha}
    err = load_error(tmp_path, data)
    assert err.field == "inputs.a.file" and "not a readable .npy" in err.message


def test_npy_escaping_through_a_symlink(tmp_path):
    outside = tmp_path / "outside"
    digest = write_npy(outside, "a.npy", np.zeros((3, 4), np.float32))
    folder = tmp_path / "task"
    folder.mkdir()
    (folder / "link.npy").symlink_to(outside / "a.npy")
    data = integer_aware_task("float32", "float")
    data["inputs"]["a"] = {"kind": "npy", "file": "link.npy", "sha256": digest}
    err = load_error(folder, data)
    assert err.field == "inputs.a.file" and "escapes the task folder" in err.message


def test_npy_changed_after_load_is_caught(tmp_path):
    task = load_task(npy_task(tmp_path, np.zeros((3, 4), np.float32)))
    np.save(tmp_path / "data" / "a.npy", np.ones((3, 4), np.float32))
    with pytest.raises(TaskError) as info:
        make_inputs(task, {"m": 3, "n": 2, "k": 4}, seed=0)
    assert info.value.field == "inputs.a.sha256"


def test_npy_shape_must_fit_the_requested_dims(tmp_path):
    task = load_task(npy_task(tmp_path, np.zeros((3, 4), np.float32)))
    with pytest.raises(TaskError, match=r"expected \(5, 4\)"):
        make_inputs(task, {"m": 5, "n": 2, "k": 4}, seed=0)
