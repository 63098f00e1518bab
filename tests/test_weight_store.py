"""Weight store: version bookkeeping and the numpy codec (tier 1), the Ray store (tier 3)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from roll_spotlight.weights import WeightVersions
from roll_spotlight.weights.codec import numpy_to_state_dict, state_dict_to_numpy
from roll_spotlight.weights.packed import NumpyStateDict


# ------------------------------------------------------------------------- WeightVersions
def test_versions_keep_the_newest_two_and_return_the_evicted():
    held = WeightVersions[str](keep=2)
    assert held.latest_version is None and held.versions == ()
    assert held.publish(0, "h0") == []
    assert held.publish(1, "h1") == []
    assert held.publish(5, "h5") == [(0, "h0")]
    assert held.versions == (1, 5) and held.latest_version == 5
    assert held.get(1) == "h1" and 5 in held and 0 not in held


def test_get_of_missing_version_names_the_available_ones():
    held = WeightVersions[str](keep=2)
    for v in range(3):
        held.publish(v, f"h{v}")
    with pytest.raises(KeyError, match=r"weight version 0 is not held; available versions: \[1, 2\]"):
        held.get(0)


def test_versions_must_increase_and_keep_must_be_positive():
    held = WeightVersions[str]()
    held.publish(3, "h3")
    with pytest.raises(ValueError, match="not newer than the latest, 3"):
        held.publish(3, "again")
    with pytest.raises(ValueError, match="keep"):
        WeightVersions(keep=0)
    with pytest.raises(ValueError, match="version"):
        held.publish(-1, "neg")


# ------------------------------------------------------------------------- codec
def sample_state_dict() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(8, 4)
    return {
        "w_fp32": torch.randn(4, 8, generator=gen),
        "w_bf16": torch.randn(3, 5, generator=gen).to(torch.bfloat16),
        "w_fp16": torch.randn(6, generator=gen).half(),
        "w_fp8": torch.randn(7, generator=gen).to(torch.float8_e4m3fn),
        "steps": torch.tensor(17, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "transposed": torch.randn(5, 3, generator=gen).t(),
        "param": linear.weight,  # requires grad
    }


def test_codec_round_trip_is_bit_exact_for_every_dtype():
    original = sample_state_dict()
    packed = state_dict_to_numpy(original)
    assert packed.dtypes["w_bf16"] == "bfloat16" and packed.arrays["w_bf16"].dtype == np.int16
    assert packed.arrays["w_fp8"].dtype == np.uint8
    restored = numpy_to_state_dict(packed)
    assert restored.keys() == original.keys()
    for name, tensor in original.items():
        back = restored[name]
        assert back.dtype == tensor.dtype and back.shape == tensor.shape, name
        as_bytes = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in (back, tensor)]
        assert torch.equal(*as_bytes), name


def test_codec_views_share_memory_unless_copy_is_asked():
    packed = state_dict_to_numpy({"w": torch.arange(6.0)})
    view = numpy_to_state_dict(packed)["w"]
    copied = numpy_to_state_dict(packed, copy=True)["w"]
    assert view.data_ptr() == packed.arrays["w"].ctypes.data
    assert copied.data_ptr() != packed.arrays["w"].ctypes.data


def test_codec_rejects_non_tensors_and_mismatched_keys():
    with pytest.raises(ValueError, match="'bad'"):
        state_dict_to_numpy({"bad": np.zeros(3)})
    with pytest.raises(ValueError, match="same keys"):
        NumpyStateDict({"a": np.zeros(1)}, {"b": "float32"})


def test_restored_tensors_load_into_a_model():
    source, target = torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)
    packed = state_dict_to_numpy(source.to(torch.bfloat16).state_dict())
    target.to(torch.bfloat16).load_state_dict(numpy_to_state_dict(packed))
    assert torch.equal(target.weight, source.weight)


# ------------------------------------------------------------------------- Ray store
@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def weights(version: int) -> dict[str, torch.Tensor]:
    # 64k bf16 values = 128 KiB: large enough for Ray's shared-memory store (not inlined).
    return {
        "proj.weight": torch.full((256, 256), float(version), dtype=torch.bfloat16),
        "proj.bias": torch.arange(4, dtype=torch.float32) + version,
    }


@pytest.mark.ray
def test_store_publishes_fetches_and_keeps_two_versions(ray_cluster):
    from roll_spotlight.weights import WeightStore

    store = WeightStore.create(keep=2)
    assert store.latest_version is None
    assert store.publish(0, weights(0)) == []
    assert store.publish(1, weights(1)) == []
    assert store.publish(2, weights(2)) == [0]
    assert store.versions == (1, 2) and store.latest_version == 2
    for version in (1, 2):
        fetched = store.fetch(version)
        assert all(torch.equal(fetched[k], v) for k, v in weights(version).items())
    with pytest.raises(KeyError, match=r"available versions: \[1, 2\]"):
        store.fetch(0)
    with pytest.raises(KeyError, match="weight version 7"):
        store.fetch(7)


@pytest.mark.ray
def test_fetch_maps_the_object_store_without_copying(ray_cluster):
    from roll_spotlight.weights import WeightStore

    store = WeightStore.create()
    store.publish(0, weights(0))
    first, second = store.fetch(0), store.fetch(0)
    # Both fetches view the same shared-memory buffer: no per-fetch copy.
    assert first["proj.weight"].data_ptr() == second["proj.weight"].data_ptr()
    copied = store.fetch(0, copy=True)["proj.weight"]
    assert copied.data_ptr() != first["proj.weight"].data_ptr()
    copied += 1  # a copy is writable
    model = torch.nn.Linear(256, 4).to(torch.bfloat16)
    model.load_state_dict({"weight": first["proj.weight"][:4], "bias": first["proj.bias"].bfloat16()})
    assert torch.equal(model.weight, torch.zeros(4, 256, dtype=torch.bfloat16))


@pytest.mark.ray
def test_weights_outlive_the_publisher(ray_cluster):
    """The store actor owns the objects, so killing the publishing process loses nothing."""
    ray = ray_cluster
    from roll_spotlight.weights import WeightStore

    @ray.remote(num_cpus=0)
    class Publisher:
        def publish(self, actor, version: int) -> list[int]:
            arrays = {"w": np.full((200, 200), version, dtype=np.float32)}  # 160 KB; no torch
            return ray.get(actor.publish.remote(version, NumpyStateDict(arrays, {"w": "float32"})))

    store = WeightStore.create()
    publisher = Publisher.remote()
    assert ray.get(publisher.publish.remote(store.actor, 3)) == []
    ray.kill(publisher)
    fetched = store.fetch(3)["w"]
    assert fetched.shape == (200, 200) and bool((fetched == 3).all())
