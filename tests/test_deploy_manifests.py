"""The deployment files under deploy/ carry what the notice bridge and the spot pool rely on:
the spot resource and labels, a notice agent whose command line parses and names a known
provider and this pod's or VM's node, grace periods at least the provider's notice, and a raylet
that outlives the deadline the agent announces. Plain file checks (tier 1)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from roll_spotlight.cluster.notice_agent import build_parser
from roll_spotlight.runtime.actors import ONDEMAND, SPOT
from roll_spotlight.spot.market import NOTICE_S_BY_PROVIDER
from roll_spotlight.spot.notices import PROVIDERS

ROOT = Path(__file__).resolve().parents[1]
KUBERAY = ROOT / "deploy" / "kuberay"
VM = ROOT / "deploy" / "vm"
SPOT_LABEL = "spotlight.io/pool=spot"


def _raycluster() -> dict:
    return yaml.safe_load((KUBERAY / "raycluster.yaml").read_text())


def _groups() -> dict[str, dict]:
    return {g["groupName"]: g for g in _raycluster()["spec"]["workerGroupSpecs"]}


def _spot_groups() -> dict[str, dict]:
    (eks,) = yaml.safe_load((KUBERAY / "spot-group-eks.yaml").read_text())
    return {"gke": _groups()["spot-gpu"], "eks": eks}


def _container(group: dict, name: str) -> dict:
    return next(c for c in group["template"]["spec"]["containers"] if c["name"] == name)


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) substitution from the container's env (unknown names stay as written)."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def _agent_args(group: dict):
    agent = _container(group, "notice-agent")
    env = {e["name"]: e.get("value", f"<{e['name']}>") for e in agent.get("env", [])}
    command = [_expand(part, env) for part in agent["command"]]
    assert command[:2] == ["spotlight", "notice-agent"]
    return build_parser().parse_args(command[2:]), agent


def test_both_spot_groups_declare_the_pool_resource_labels_and_market_type():
    for cloud, group in _spot_groups().items():
        params = group["rayStartParams"]
        assert f'\\"{SPOT}\\"' in params["resources"] and params["num-gpus"] == "0", cloud
        assert params["labels"] == SPOT_LABEL, cloud
        ray_env = {e["name"]: e.get("value") for e in _container(group, "ray-worker")["env"]}
        assert ray_env["RAY_NODE_MARKET_TYPE"] == "spot", cloud  # Ray's ray.io/market-type label
        assert ray_env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0", cloud
    assert _spot_groups()["gke"]["rayStartParams"] == _spot_groups()["eks"]["rayStartParams"]


@pytest.mark.parametrize("cloud, selector, notice", [("gke", ("cloud.google.com/gke-spot", "true"), NOTICE_S_BY_PROVIDER["gcp"]),
                                                     ("eks", ("eks.amazonaws.com/capacityType", "SPOT"), NOTICE_S_BY_PROVIDER["aws"])])
def test_spot_pods_land_on_spot_nodes_and_outlive_the_notice(cloud, selector, notice):
    group = _spot_groups()[cloud]
    spec = group["template"]["spec"]
    key, value = selector
    assert spec["nodeSelector"][key] == value and spec["nodeSelector"]["spotlight.io/pool"] == "spot"
    grace = spec["terminationGracePeriodSeconds"]
    assert grace >= notice, f"{cloud}: the pod would be killed before the provider's notice runs out"
    args, _ = _agent_args(group)
    assert args.provider in PROVIDERS and args.provider == "k8s" and 0 < args.grace_s <= grace
    sleep = _container(group, "ray-worker")["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep" and args.grace_s <= float(sleep[1]) <= grace, "the raylet must outlive the deadline"


def test_the_agent_finds_its_node_by_pod_ip_and_the_gcs_by_the_head_service():
    name = _raycluster()["metadata"]["name"]
    for cloud, group in _spot_groups().items():
        args, agent = _agent_args(group)
        pod_ip = next(e for e in agent["env"] if e["name"] == "POD_IP")
        assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP" and args.node_ip == "<POD_IP>", cloud
        assert args.address == f"{name}-head-svc:6379", cloud


def test_the_on_demand_group_is_not_spot():
    group = _groups()["ondemand-gpu"]
    params = group["rayStartParams"]
    assert f'\\"{ONDEMAND}\\"' in params["resources"] and SPOT not in params["resources"]
    assert "gke-spot" not in str(group["template"]["spec"].get("nodeSelector"))


def _unit(path: Path) -> dict[str, list[str]]:
    """A systemd unit as key -> every value (Environment= may repeat)."""
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def _env_file() -> dict[str, str]:
    return dict(line.split("=", 1) for line in (VM / "spotlight.env").read_text().splitlines()
                if line and not line.startswith("#"))


def _exec_argv(unit: dict[str, list[str]], env: dict[str, str]) -> list[str]:
    """The command ExecStart's `sh -c '...'` runs, with the EnvironmentFile's ${VAR}s filled in."""
    (exec_start,) = unit["ExecStart"]
    script = shlex.split(exec_start)[-1]
    return shlex.split(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], script))[1:]  # drop `exec`


def test_vm_units_start_spot_raylets_and_the_agent_for_a_known_provider():
    env = _env_file()
    spot = _unit(VM / "ray-spot-node.service")
    argv = _exec_argv(spot, env)
    assert argv[0].endswith("/bin/ray") and argv[1:3] == ["start", "--address"] and "--block" in argv
    assert argv[argv.index("--num-gpus") + 1] == "0" and SPOT in argv[argv.index("--resources") + 1]
    assert argv[argv.index("--labels") + 1] == SPOT_LABEL
    assert {"RAY_NODE_MARKET_TYPE=spot", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0"} <= set(spot["Environment"])
    agent = _unit(VM / "spotlight-notice-agent.service")
    argv = _exec_argv(agent, env)
    assert argv[0].endswith("/bin/spotlight") and argv[1] == "notice-agent"
    args = build_parser().parse_args(argv[2:])
    assert args.provider in PROVIDERS and args.provider != "k8s" and args.address == env["RAY_HEAD"]
    assert agent["BindsTo"] == ["ray-spot-node.service"] and agent["Restart"] == ["always"]
    head = _exec_argv(_unit(VM / "ray-head.service"), env)
    assert "--head" in head and ONDEMAND in head[head.index("--resources") + 1]
