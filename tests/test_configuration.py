"""Strict YAML -> dataclass mapping: unknown keys, wrong types and impossible values name the key."""
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from roll_spotlight.config.strict import ConfigError, from_dict, load_config, to_dict
from roll_spotlight.config.run import RunConfig

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Inner:
    rate: float = 1.0
    name: str = "x"
    window: tuple[int, int] = (0, 1)

    def __post_init__(self):
        if self.rate < 0:
            raise ValueError(f"rate must be >= 0, got {self.rate}")


@dataclass
class Outer:
    steps: int = 1
    flag: bool = False
    tags: tuple[str, ...] | None = None
    inner: Inner = field(default_factory=Inner)


def test_round_trip_and_int_to_float():
    cfg = from_dict(Outer, {"steps": 3, "inner": {"rate": 2, "window": [1, 2]}, "tags": ["a"]})
    assert cfg.inner.rate == 2.0 and isinstance(cfg.inner.rate, float)
    assert cfg.inner.window == (1, 2) and cfg.tags == ("a",)
    assert from_dict(Outer, to_dict(cfg)) == cfg


@pytest.mark.parametrize("data, key", [
    ({"stpes": 1}, "stpes"),
    ({"inner": {"rat": 1}}, "inner.rat"),
    ({"steps": "3"}, "steps"),
    ({"steps": True}, "steps"),
    ({"inner": {"window": [1]}}, "inner.window"),
    ({"inner": {"rate": -1}}, "inner"),
    ({"inner": 3}, "inner"),
])
def test_errors_name_the_key(data, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        from_dict(Outer, data)


def test_shipped_tiny_config_loads():
    cfg = load_config(RunConfig, REPO / "configs" / "tiny_shapes.yaml")
    assert cfg.train.group_size >= 2 and cfg.model.preset == "tiny"


def test_file_named_in_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("exp_name: x\ntrain:\n  group_size: 1\n")
    with pytest.raises(ConfigError, match="train.group_size") as err:
        load_config(RunConfig, bad)
    assert "bad.yaml" in str(err.value)
    bad.write_text("exp_name: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_config(RunConfig, bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(RunConfig, tmp_path / "missing.yaml")


def test_overrides(tmp_path):
    cfg = load_config(RunConfig, REPO / "configs" / "tiny_shapes.yaml", ["train.learning_rate=0.001", "max_steps=2"])
    assert cfg.train.learning_rate == 1e-3 and cfg.max_steps == 2


def test_spotlight_twin_differs_only_in_exploration():
    vanilla = to_dict(load_config(RunConfig, REPO / "configs" / "tiny_shapes.yaml"))
    spotlight = to_dict(load_config(RunConfig, REPO / "configs" / "tiny_shapes_spotlight.yaml"))
    differing = {k for k in vanilla if vanilla[k] != spotlight[k]}
    assert differing == {"exploration"}
    assert spotlight["exploration"]["mode"] == "stale" and vanilla["exploration"]["mode"] == "off"


def test_quickstart_config_loads():
    cfg = load_config(RunConfig, REPO / "configs" / "quickstart.yaml")
    assert cfg.exp_name == "quickstart"
