import collections

import gymnasium as gym
import numpy as np
import pytest
import torch

import replaybuffer as rb
from replaybuffer.specs import as_leaf_array, can_store, check_leaf, spec_from_dict


def test_array_spec_normalises_shape_and_dtype():
    spec = rb.ArraySpec([3, 2], "float32", "camera")
    assert spec.shape == (3, 2) and spec.dtype == np.float32 and spec.name == "camera"
    assert spec.nbytes == 24
    assert spec == rb.ArraySpec((3, 2), np.float32, "camera")
    assert spec != rb.ArraySpec((3, 2), np.float32, "lidar")
    assert spec != rb.ArraySpec((3, 2), np.float64, "camera")
    assert spec.zeros((4,)).shape == (4, 3, 2)
    assert hash(spec) == hash(rb.ArraySpec((3, 2), np.float32, "camera"))


@pytest.mark.parametrize("shape", [(None, 3), (-1,), 5])
def test_array_spec_rejects_bad_shapes(shape):
    with pytest.raises(rb.SpecError, match="shape"):
        rb.ArraySpec(shape, np.float32)


def test_array_spec_rejects_object_dtype():
    with pytest.raises(rb.SpecError, match="object"):
        rb.ArraySpec((), object)


def test_bounded_spec_broadcasts_and_checks_bounds():
    spec = rb.BoundedArraySpec((2,), np.int64, 0, [3, 4])
    assert spec.minimum.tolist() == [0, 0] and spec.maximum.tolist() == [3, 4]
    with pytest.raises(rb.SpecError, match="exceeds"):
        rb.BoundedArraySpec((), np.int64, 5, 1)
    with pytest.raises(rb.SpecError, match="broadcast"):
        rb.BoundedArraySpec((2,), np.int64, 0, [1, 2, 3])
    assert spec != rb.BoundedArraySpec((2,), np.int64, 0, [3, 5])
    assert spec.replace(name="a").name == "a"


def test_spec_dict_round_trip():
    for spec in (rb.ArraySpec((3,), np.uint8, "x"), rb.BoundedArraySpec((2,), np.float32, -1, 1)):
        assert spec_from_dict(spec.to_dict()) == spec


def test_spec_from_space_covers_the_fixed_shape_spaces():
    space = gym.spaces.Dict({
        "box": gym.spaces.Box(-1.0, 2.0, shape=(3,), dtype=np.float32),
        "disc": gym.spaces.Discrete(4, start=1),
        "multi": gym.spaces.MultiDiscrete([2, 5]),
        "bin": gym.spaces.MultiBinary(3),
        "tup": gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(0, 255, (2, 2), np.uint8))),
    })
    spec = rb.spec_from_space(space)
    assert spec["box"] == rb.BoundedArraySpec((3,), np.float32, -1.0, 2.0)
    assert spec["disc"].shape == () and spec["disc"].minimum == 1 and spec["disc"].maximum == 4
    assert spec["multi"].maximum.tolist() == [1, 4]
    assert spec["bin"].shape == (3,) and spec["bin"].dtype == np.int8
    assert isinstance(spec["tup"], tuple) and spec["tup"][1].dtype == np.uint8


def test_spec_from_space_rejects_unbounded_shapes():
    with pytest.raises(rb.SpecError, match="Text"):
        rb.spec_from_space(gym.spaces.Text(5))


class FakeTensorSpec:
    """Stands in for tf.TensorSpec: a shape with as_list(), a dtype with as_numpy_dtype."""

    class Shape(tuple):
        def as_list(self):
            return list(self)

    class DType:
        as_numpy_dtype = np.float32

    def __init__(self, shape, name):
        self.shape = self.Shape(shape)
        self.dtype = self.DType()
        self.name = name


def test_spec_from_tensor_specs_and_tensors():
    spec = rb.spec_from_tensor_spec(FakeTensorSpec((5,), "lidar"))
    assert spec == rb.ArraySpec((5,), np.float32, "lidar")
    assert rb.spec_from_tensor_spec(torch.zeros(2, 3, dtype=torch.int16)) == \
        rb.ArraySpec((2, 3), np.int16)
    with pytest.raises(rb.SpecError, match="unknown dimension"):
        rb.spec_from_tensor_spec(FakeTensorSpec((None, 5), "x"))


def test_as_data_spec_mixes_leaf_kinds():
    Obs = collections.namedtuple("Obs", "pixels action")
    spec = rb.as_data_spec(Obs(gym.spaces.Box(0, 1, (2,)), FakeTensorSpec((3,), "a")))
    assert isinstance(spec, Obs)
    assert spec.pixels.shape == (2,) and spec.action.name == "a"
    with pytest.raises(rb.SpecError, match=r"leaf \[1\] is 'nope' \(str\): expected an ArraySpec"):
        rb.as_data_spec((rb.ArraySpec((), np.int32), "nope"))
    with pytest.raises(rb.SpecError, match="no array leaves"):
        rb.as_data_spec(())


def test_spec_from_example():
    spec = rb.spec_from_example({"obs": np.zeros((4,), np.float32), "r": 1.0, "done": True})
    assert spec == {"obs": rb.ArraySpec((4,), np.float32), "r": rb.ArraySpec((), np.float64),
                    "done": rb.ArraySpec((), np.bool_)}


@pytest.mark.parametrize("src,dst,ok", [
    (np.float64, np.float32, True), (np.int64, np.uint8, True), (np.int64, np.float32, True),
    (np.bool_, np.float32, True), (np.float32, np.int32, False), (np.int64, np.bool_, False),
    (np.complex64, np.float32, False)])
def test_can_store_rules(src, dst, ok):
    assert can_store(np.dtype(src), np.dtype(dst)) is ok


def test_check_leaf_messages_name_path_expected_and_got():
    spec = rb.ArraySpec((5,), np.float32)
    with pytest.raises(rb.SpecError, match=r"leaf \[1\]\[0\]: expected shape \(32, 5\).*got \(3, 5\)"):
        check_leaf("[1][0]", (3, 5), np.dtype(np.float32), spec, (32,), "[batch_size=32]")
    with pytest.raises(rb.SpecError, match=r"leaf \.obs: expected dtype int32.*got float32"):
        check_leaf(".obs", (32, 5), np.dtype(np.float32), rb.ArraySpec((5,), np.int32), (32,), "")


def test_as_leaf_array_refuses_containers():
    with pytest.raises(rb.SpecError, match="got a list"):
        as_leaf_array([[1.0, 2.0]], "['obs']")
    assert as_leaf_array(1.5, "x").dtype == np.float64
