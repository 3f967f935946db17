"""A type's flow over the API, the SDK and ``timeshard types``: set, shown, applied, and
refused with a clear error when the input is bad; a worker declaring its policy never undoes
an operator's pause or rate."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

from tests.unit.helpers import embedded_server
from timeshard.cli.main import main
from timeshard.client import AsyncClient
from timeshard.node import JobSpec
from timeshard.security.auth import Role, required_role
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc


async def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


async def test_pause_show_and_resume_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    async with embedded_server() as server:
        node, at = server.node, ["--server", server.address]
        code, _, _ = await cli(capsys, *at, "types", "pause", "invoice.send")
        assert code == 0 and node.claims.held("invoice.send") == "paused"
        now = node.clock.now_ms()
        for _ in range(3):
            await node.jobs.schedule(JobSpec(job_type="invoice.send", payload=b"", run_at=now))
        await wait_until(lambda: node.ready.count() == 3, what="jobs ready")
        got = await node.claims.claim(
            worker="w", types=["invoice.send"], limit=5, wait_s=0, lease_s=30
        )
        assert got == []
        code, out, _ = await cli(capsys, *at, "types", "show", "--json")
        (row,) = json.loads(out)
        assert code == 0
        assert row["type"] == "invoice.send" and row["paused"] is True
        assert row["ready"] == 3 and row["held"] == "paused"
        code, out, _ = await cli(capsys, *at, "types", "show")
        assert "invoice.send" in out and "paused" in out
        code, out, _ = await cli(capsys, *at, "status")
        assert "invoice.send: 3 waiting" in out and "(paused)" in out
        code, out, _ = await cli(capsys, *at, "status", "--json")
        (waiting,) = [t for t in json.loads(out)["unclaimed"] if t["jobs"]]
        assert waiting["held"] == "paused"
        code, out, _ = await cli(capsys, *at, "types", "set", "invoice.send", "--rate", "2.5")
        assert code == 0 and "2.5" in out
        code, _, _ = await cli(capsys, *at, "types", "resume", "invoice.send", "--json")
        assert code == 0
        got = await node.claims.claim(
            worker="w", types=["invoice.send"], limit=5, wait_s=5, lease_s=30
        )
        assert 1 <= len(got) <= 2, "released at its rate (burst 2), not all three at once"


async def test_a_worker_declaring_its_policy_keeps_the_pause_and_the_rate() -> None:
    async with embedded_server() as server:
        async with AsyncClient(server.address) as c:
            await c.pause_type("email.send")
            await c.set_type_rate("email.send", 50, burst=10)
            await c.set_type_policy("email.send", concurrency=4)  # what a worker does at start
            (info,) = await c.list_types("email.send")
        assert info.paused and info.rate == 50 and info.burst == 10
        assert info.policy is not None and info.policy.concurrency == 4
        await server.node.type_policies.load()  # and after the next refresh
        assert server.node.claims.held("email.send") == "paused"


async def test_the_sdk_sets_and_reads_flows() -> None:
    async with embedded_server() as server, AsyncClient(server.address) as c:
        info = await c.set_type_rate("report", 7)
        assert (info.rate, info.burst, info.paused) == (7.0, 4, False)  # half a second's
        info = await c.pause_type("report")
        assert info.paused and info.rate == 7
        info = await c.resume_type("report")
        assert not info.paused
        info = await c.set_type_rate("report", 0)  # no limit
        assert info.rate == 0 and info.burst == 0
        assert [t.job_type for t in await c.list_types()] == ["report"]


@pytest.mark.parametrize(
    ("flow", "field"),
    [
        (pb.TypeFlow(type="a.b", rate=-2), "flows[0].rate"),
        (pb.TypeFlow(type="a.b", rate=float("inf")), "flows[0].rate"),
        (pb.TypeFlow(type="a.b", rate=5, burst=-1), "flows[0].burst"),
        (pb.TypeFlow(type="a.b", burst=5), "flows[0].burst"),
        (pb.TypeFlow(type="a.b"), "flows[0]"),
        (pb.TypeFlow(type="no spaces", paused=True), "flows[0].type"),
    ],
)
async def test_bad_flows_are_invalid_argument_naming_the_field(
    flow: pb.TypeFlow, field: str
) -> None:
    async with embedded_server() as server:
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = pb_grpc.AdminServiceStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.SetTypeFlows(pb.SetTypeFlowsRequest(flows=[flow]))
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith(f"{field}: ")
        assert server.node.type_policies.flows() == {}, "nothing was applied"


async def test_a_type_named_twice_is_refused_whole() -> None:
    async with embedded_server() as server:
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = pb_grpc.AdminServiceStub(ch)
            flows = [pb.TypeFlow(type="a.b", paused=True), pb.TypeFlow(type="a.b", rate=3)]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.SetTypeFlows(pb.SetTypeFlowsRequest(flows=flows))
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert server.node.type_policies.flows() == {}


def test_flows_are_for_admins_only() -> None:
    assert required_role("/timeshard.v1.AdminService/SetTypeFlows") is Role.ADMIN
    assert required_role("/timeshard.v1.AdminService/ListTypes") is Role.ADMIN


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["types", "set", "a.b"], "--rate: give the rate"),
        (["types", "set", "--rate", "3"], "type: name the job type"),
        (["types", "set", "a.b", "--rate", "0", "--burst", "3"], "--burst: a burst needs a rate"),
        (["types", "pause", "bad type"], "not a job type"),
    ],
)
async def test_bad_cli_input_exits_2_with_the_field(
    capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    async with embedded_server() as server:
        code, _, err = await cli(capsys, "--server", server.address, *args)
    assert code == 2
    last = err.strip().splitlines()[-1]  # (a node's log lines may come before it)
    assert last.startswith("error (INVALID_ARGUMENT): ") and says in last, err


async def test_types_set_from_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "types.json"
    path.write_text(
        json.dumps(
            {
                "email.send": {"rate": 20, "burst": 5, "concurrency": 3},
                "invoice.send": {"paused": True},
            }
        )
    )
    async with embedded_server() as server:
        code, out, _ = await cli(
            capsys, "--server", server.address, "types", "set", "--file", str(path), "--json"
        )
        flows = server.node.type_policies.flows()
        policies = server.node.config.types
    assert code == 0
    rows = {r["type"]: r for r in json.loads(out)}
    assert rows["email.send"]["rate"] == 20 and rows["email.send"]["concurrency"] == 3
    assert rows["invoice.send"]["paused"] is True and rows["invoice.send"]["rate"] is None
    assert flows["email.send"].rate == 20 and flows["email.send"].burst == 5
    assert flows["invoice.send"].paused and policies["email.send"].concurrency == 3


async def test_a_bad_types_file_is_refused_naming_the_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "types.json"
    path.write_text(json.dumps({"email.send": {"rate": "fast"}}))
    async with embedded_server() as server:
        code, _, err = await cli(
            capsys, "--server", server.address, "types", "set", "--file", str(path)
        )
        assert server.node.type_policies.flows() == {}
    assert code == 2
    assert "email.send: rate must be a number of jobs per second" in err.strip().splitlines()[-1]
