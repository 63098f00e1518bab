"""The notice bridge without Ray (tier 1): each provider's answers as its documentation gives them,
and the agent against a loopback metadata server that answers as each provider does, including
slow, malformed and error answers and an endpoint that is not up yet. The drain itself is a fake
here; tests/test_cluster_soak.py drains real raylets."""
from __future__ import annotations

import argparse
import signal
import socket
import threading
import time
from calendar import timegm

import pytest

from roll_spotlight.cluster.metadata_stub import MetadataStub
from roll_spotlight.cluster.notice_agent import (NodeLink, NoticeWatcher, SigtermNotice, _on_signals, build_parser,
                                               main, serve)
from roll_spotlight.spot.notices import (AwsImds, AzureScheduledEvents, BadAnswer, GcpMetadata, HttpAnswer,
                                         ProviderConfig, make_provider, parse_rfc1123, parse_utc)

NOW = 1_700_000_000.0
FAST = ProviderConfig(poll_s=0.02, timeout_s=0.5)
WAIT_S = 20.0  # generous: the machine is shared; every wait below ends as soon as its condition holds


def _answer(status, body=b"", **headers):
    return HttpAnswer(status, body, headers)


# ---------------------------------------------------------------------------------------------
# Providers (pure)


def test_aws_reads_instance_action_after_a_token_and_refreshes_an_expired_one():
    aws = AwsImds(ProviderConfig(endpoint="http://imds"))
    token_req = aws.next_request()
    assert (token_req.method, token_req.url, token_req.step) == ("PUT", "http://imds/latest/api/token", "token")
    assert token_req.headers["X-aws-ec2-metadata-token-ttl-seconds"] == "21600"
    assert aws.read(token_req, _answer(200, b"AQAEAtoken=="), NOW) is None
    req = aws.next_request()
    assert req.url == "http://imds/latest/meta-data/spot/instance-action"
    assert req.headers == {"X-aws-ec2-metadata-token": "AQAEAtoken=="}
    assert aws.read(req, _answer(404), NOW) is None  # no interruption scheduled
    notice = aws.read(req, _answer(200, b'{"action": "terminate", "time": "2017-09-18T08:22:00Z"}'), NOW)
    assert notice.deadline_s == timegm((2017, 9, 18, 8, 22, 0)) and notice.provider == "aws"
    assert aws.read(req, _answer(200, b'{"action": "hibernate", "time": "2017-09-18T08:22:00Z"}'), NOW).deadline_s == NOW
    assert aws.read(req, _answer(401), NOW) is None and aws.next_request().step == "token"


@pytest.mark.parametrize("answer", [_answer(200, b'{"action": "terminate", "time": '), _answer(200, b'{"action": "reboot"}'),
                                    _answer(200, b'{"action": "stop", "time": "soon"}'), _answer(500), _answer(403)])
def test_aws_bad_answers_are_not_notices(answer):
    aws = AwsImds(FAST)
    aws.token = "t"
    with pytest.raises(BadAnswer):
        aws.read(aws.next_request(), answer, NOW)


def test_gcp_reads_preempted_then_waits_for_a_change_of_its_etag():
    gcp = GcpMetadata(ProviderConfig(endpoint="http://md", notice_s=30.0))
    first = gcp.next_request()
    assert first.url == "http://md/computeMetadata/v1/instance/preempted" and first.headers == {"Metadata-Flavor": "Google"}
    assert gcp.read(first, _answer(200, b"FALSE", **{"Metadata-Flavor": "Google", "ETag": "e1"}), NOW) is None
    hanging = gcp.next_request()
    assert "wait_for_change=true" in hanging.url and "last_etag=e1" in hanging.url and hanging.timeout_s > 60
    assert gcp.pause_s(hanging) == 0.0
    notice = gcp.read(hanging, _answer(200, b"TRUE", **{"Metadata-Flavor": "Google", "ETag": "e2"}), NOW)
    assert notice.deadline_s == NOW + 30.0


@pytest.mark.parametrize("answer", [_answer(200, b"TRUE"),  # not from the metadata server
                                    _answer(200, b"MAYBE", **{"Metadata-Flavor": "Google"}), _answer(503)])
def test_gcp_bad_answers_are_not_notices_and_drop_the_etag(answer):
    gcp = GcpMetadata(FAST)
    gcp.etag = "e1"
    with pytest.raises(BadAnswer):
        gcp.read(gcp.next_request(), answer, NOW)
    assert gcp.etag is None and "wait_for_change" not in gcp.next_request().url


def _azure_document(*events):
    import json

    return json.dumps({"DocumentIncarnation": 3, "Events": list(events)}).encode()


def _event(kind="Preempt", resources=("vm-a",), not_before="Mon, 19 Sep 2016 18:29:47 GMT"):
    return {"EventId": "602d9444-d2cd-49c7-8624-8643e7171297", "EventType": kind, "ResourceType": "VirtualMachine",
            "Resources": list(resources), "EventStatus": "Scheduled", "NotBefore": not_before,
            "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}


def test_azure_asks_its_name_then_takes_only_a_preempt_of_this_vm():
    azure = AzureScheduledEvents(ProviderConfig(endpoint="http://imds"))
    name_req = azure.next_request()
    assert name_req.step == "name" and name_req.headers == {"Metadata": "true"} and "compute/name" in name_req.url
    assert azure.read(name_req, _answer(200, b"vm-a"), NOW) is None and azure.vm_name == "vm-a"
    req = azure.next_request()
    assert req.url == "http://imds/metadata/scheduledevents?api-version=2020-07-01"
    assert azure.read(req, _answer(200, _azure_document()), NOW) is None
    assert azure.read(req, _answer(200, _azure_document(_event(resources=("vm-b",)))), NOW) is None  # a sibling
    assert azure.read(req, _answer(200, _azure_document(_event(kind="Freeze"))), NOW) is None
    notice = azure.read(req, _answer(200, _azure_document(_event(resources=("vm-b", "vm-a")))), NOW)
    assert notice.deadline_s == timegm((2016, 9, 19, 18, 29, 47))
    assert azure.read(req, _answer(200, _azure_document(_event(not_before=""))), NOW).deadline_s == NOW  # started


@pytest.mark.parametrize("body", [b"{", b"[]", b'{"Events": "soon"}', b'{"Events": [1]}',
                                  _azure_document(_event(not_before="tomorrow"))])
def test_azure_bad_documents_are_not_notices(body):
    azure = AzureScheduledEvents(ProviderConfig(vm_name="vm-a"))
    with pytest.raises(BadAnswer):
        azure.read(azure.next_request(), _answer(200, body), NOW)


def test_time_parsers_and_unknown_provider():
    assert parse_utc("1970-01-01T00:01:00Z") == 60.0
    assert parse_rfc1123("Thu, 01 Jan 1970 00:01:00 GMT") == 60.0
    with pytest.raises(BadAnswer):
        parse_utc("2017-09-18T08:22:00")  # no zone: refuse to guess
    with pytest.raises(ValueError, match="--provider 'ibm'"):
        make_provider("ibm", FAST)
    with pytest.raises(ValueError, match="--poll-s"):
        ProviderConfig(poll_s=0.0)


# ---------------------------------------------------------------------------------------------
# The watcher against a loopback metadata server


def _watch_in_thread(watcher):
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("notice", watcher.watch()), daemon=True)
    thread.start()
    return thread, out


def _until(condition, what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_watcher_sees_the_notice_each_provider_answers(provider):
    stub = MetadataStub(provider)
    try:
        node = "spot-1"
        config = ProviderConfig(endpoint=stub.url(node), poll_s=0.02, timeout_s=2.0, notice_s=7.0)
        watcher = NoticeWatcher(make_provider(provider, config), retry_s=0.05)
        thread, out = _watch_in_thread(watcher)
        _until(lambda: stub.requests(node) >= 2, "a read (gcp: then a hanging GET)")
        assert thread.is_alive(), "no notice yet, the watcher keeps watching"
        deadline = time.time() + 30.0
        stub.set_notice(node, deadline)
        thread.join(WAIT_S)
        notice = out["notice"]
        expected = time.time() + 7.0 if provider == "gcp" else deadline  # gcp: TRUE + the 30 s (here 7 s)
        assert notice.provider == provider and notice.deadline_s == pytest.approx(expected, abs=1.5)
        assert watcher.stats.bad_answers == watcher.stats.unreachable == 0
    finally:
        stub.close()


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
@pytest.mark.parametrize("mode", ["slow", "malformed", "error"])
def test_bad_answers_are_logged_and_polled_again_never_a_notice(provider, mode, caplog):
    stub = MetadataStub(provider)
    try:
        node = "spot-1"
        config = ProviderConfig(endpoint=stub.url(node), poll_s=0.02, timeout_s=0.2)
        watcher = NoticeWatcher(make_provider(provider, config), retry_s=0.02)
        stub.set_mode(node, mode, delay_s=0.5)
        stub.set_notice(node, time.time() + 60.0)  # what a bad answer hides must not drain
        thread, out = _watch_in_thread(watcher)
        _until(lambda: watcher.stats.unreachable + watcher.stats.bad_answers >= 3, "three bad answers")
        assert thread.is_alive() and "notice" not in out
        assert (watcher.stats.unreachable if mode == "slow" else watcher.stats.bad_answers) >= 3
        assert "not draining" in caplog.text
        stub.set_mode(node, "ok")
        thread.join(WAIT_S)
        assert out["notice"] is not None, "a good answer after bad ones is still read"
    finally:
        stub.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_endpoint_down_at_start_is_retried_until_it_answers(caplog):
    port = _free_port()
    config = ProviderConfig(endpoint=f"http://127.0.0.1:{port}/spot-1", poll_s=0.02, timeout_s=0.5)
    watcher = NoticeWatcher(make_provider("aws", config), retry_s=0.02)
    thread, out = _watch_in_thread(watcher)
    _until(lambda: watcher.stats.unreachable >= 3, "retries of a refused endpoint")
    assert thread.is_alive() and "unreachable" in caplog.text
    stub = MetadataStub("aws", port=port)
    try:
        stub.set_notice("spot-1", time.time() + 60.0)
        thread.join(WAIT_S)
        assert out["notice"].provider == "aws"
    finally:
        stub.close()


# ---------------------------------------------------------------------------------------------
# The agent: notice -> drain (a fake drainer)


class FakeDrainer:
    """Unreachable for the first ``refuse`` lookups, then one node; records drains."""

    address, selector = "127.0.0.1:1", "node_name=spot-1"

    def __init__(self, refuse: int = 0) -> None:
        self.refuse, self.lookups, self.drains = refuse, 0, []

    def find(self):
        from ray.exceptions import RpcError

        self.lookups += 1
        if self.lookups <= self.refuse:
            raise RpcError("GCS unreachable")
        return "ab" * 28

    def drain(self, node_id, deadline_s, message):
        self.drains.append((node_id, deadline_s, message))
        return True, ""


def _agent_args(*extra):
    return build_parser().parse_args(["--address", "127.0.0.1:1", "--node-name", "spot-1", "--retry-s", "0.02",
                                      "--poll-s", "0.02", "--exit-after-drain", *extra])


def test_the_agent_drains_its_node_once_with_the_notice_deadline_after_the_gcs_comes_up():
    stub = MetadataStub("azure")
    try:
        drainer = FakeDrainer(refuse=2)
        args = _agent_args("--provider", "azure", "--endpoint", stub.url("spot-1"))
        result = {}
        thread = threading.Thread(target=lambda: result.setdefault("code", serve(args, drainer=drainer)), daemon=True)
        thread.start()
        _until(lambda: stub.requests("spot-1") >= 3 and drainer.lookups >= 3, "polls and a found node")
        assert drainer.drains == []
        deadline = time.time() + 40.0
        stub.set_notice("spot-1", deadline)
        thread.join(WAIT_S)
        assert result["code"] == 0
        ((node_id, drained_deadline, message),) = drainer.drains
        assert node_id == "ab" * 28 and drained_deadline == pytest.approx(deadline, abs=1.0) and "azure" in message
    finally:
        stub.close()


def test_the_agent_never_drains_on_bad_answers_and_stops_cleanly():
    stub = MetadataStub("gcp")
    try:
        stub.set_mode("spot-1", "malformed")
        stub.set_notice("spot-1", time.time() + 60.0)
        drainer, stop = FakeDrainer(), threading.Event()
        args = _agent_args("--provider", "gcp", "--endpoint", stub.url("spot-1"))
        result = {}
        thread = threading.Thread(target=lambda: result.setdefault("code", serve(args, drainer=drainer, stop=stop)),
                                  daemon=True)
        thread.start()
        _until(lambda: stub.requests("spot-1") >= 5, "polls of a malformed endpoint")
        stop.set()
        thread.join(WAIT_S)
        assert result["code"] == 0 and drainer.drains == []
    finally:
        stub.close()


def test_a_drain_that_never_gets_through_gives_up_after_the_deadline():
    from roll_spotlight.spot.notices import Notice

    class Unreachable(FakeDrainer):
        def find(self):
            from ray.exceptions import RpcError

            raise RpcError("GCS unreachable")

    link = NodeLink(Unreachable(), retry_s=0.01)
    assert link.drain(Notice("aws", time.time() + 0.1, "test")) is False
    link.stop.set()


def test_sigterm_is_the_k8s_notice_with_the_grace_period():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        stop, sigterm = threading.Event(), SigtermNotice(grace_s=45.0)
        _on_signals(stop, sigterm)
        sent = time.time()
        signal.raise_signal(signal.SIGTERM)
        notice = sigterm.wait(stop)
        assert notice.provider == "k8s" and notice.deadline_s == pytest.approx(sent + 45.0, abs=1.0)
        assert not stop.is_set(), "under k8s SIGTERM is the notice, not a stop"
        signal.raise_signal(signal.SIGINT)
        assert stop.is_set()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_bad_input_is_one_line_naming_the_option(capsys):
    assert main(["--provider", "ibm", "--address", "127.0.0.1:1", "--node-name", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--provider 'ibm'" in err
    assert main(["--provider", "aws", "--node-name", "x", "--address", ""]) == 2
    assert "--address" in capsys.readouterr().err
    assert main(["--provider", "aws", "--address", "127.0.0.1:1", "--node-name", "x", "--poll-s", "-1"]) == 2
    assert "--poll-s" in capsys.readouterr().err
    assert isinstance(build_parser().parse_args(["--provider", "k8s"]), argparse.Namespace)
