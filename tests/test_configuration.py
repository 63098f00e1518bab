"""Strict YAML -> dataclass mapping: unknown keys, wrong types and impossible values name the key."""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from roll_spotlight.checks import require_choice, require_int, require_literals, require_number
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


@pytest.mark.parametrize("check, args, message", [
    (require_int, ("a.n", 0), "a.n must be an integer >= 1, got 0"),
    (require_int, ("a.n", True), "a.n must be an integer >= 1, got True"),
    (require_int, ("a.n", 2.0, ">= 0"), "a.n must be an integer >= 0, got 2.0"),
    (require_number, ("a.x", 1.0, "[0, 1)"), "a.x must be a finite number in [0, 1), got 1.0"),
    (require_number, ("a.x", float("nan"), ">= 0"), "a.x must be a finite number >= 0, got nan"),
    (require_number, ("a.x", None), "a.x must be a finite number > 0, got None"),
    (require_choice, ("a.c", "z", ("p", "q")), "a.c must be one of ['p', 'q'], got 'z'"),
])
def test_helpers_name_the_key_the_rule_and_the_value(check, args, message):
    with pytest.raises(ValueError) as err:
        check(*args)
    assert str(err.value) == message


def test_helpers_accept_what_the_rule_allows():
    require_int("a.n", 1024, "[1, 1024]")
    require_number("a.x", 0.0, "[0, 1)")
    require_number("a.x", None, optional=True)
    require_choice("a.c", None, ("p",), optional=True)
    with pytest.raises(ValueError, match=r"a\.x must be null or a finite number > 0 \(why\), got -1"):
        require_number("a.x", -1, optional=True, why="(why)")


def test_literal_fields_are_checked_for_configs_built_in_python():
    @dataclass
    class Choice:
        mode: Literal["on", "off"] = "on"
        phase: Literal["a", "b"] | None = None

        def __post_init__(self):
            require_literals(self, "sec")

    Choice(phase="b")
    with pytest.raises(ValueError, match=r"sec\.mode must be one of \['on', 'off'\], got 'maybe'"):
        Choice(mode="maybe")
    with pytest.raises(ValueError, match=r"sec\.phase must be null or one of"):
        Choice(phase="c")
