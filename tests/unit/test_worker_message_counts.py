"""The node counts what workers send it, so a benchmark can tell how many jobs each message
carries: ``timeshard_worker_messages_total`` by kind (claim, result) and
``timeshard_results_received_total``."""

from __future__ import annotations

import grpc
from google.protobuf.duration_pb2 import Duration

from tests.unit.helpers import embedded_server
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc


def counts(server: object) -> tuple[float, float, float]:
    registry = server.node.metrics.registry  # type: ignore[attr-defined]

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    return (
        value("timeshard_worker_messages_total", kind="claim"),
        value("timeshard_worker_messages_total", kind="result"),
        value("timeshard_results_received_total"),
    )


async def test_claims_and_results_are_counted_per_message_and_per_job() -> None:
    async with embedded_server() as server:
        address = f"127.0.0.1:{server.port}"
        async with grpc.aio.insecure_channel(address) as channel:
            jobs = pb_grpc.JobServiceStub(channel)
            work = pb_grpc.WorkerServiceStub(channel)
            req = pb.ScheduleJobsRequest(
                jobs=[pb.ScheduleJobRequest(type="t", delay=Duration()) for _ in range(3)]
            )
            await jobs.ScheduleJobs(req)
            assert counts(server) == (0, 0, 0)
            claimed: list[pb.ClaimedJob] = []
            for _ in range(20):  # each long poll answers as soon as some are ready
                resp = await work.Claim(
                    pb.ClaimRequest(
                        worker_id="w",
                        types=["t"],
                        max_jobs=3 - len(claimed),
                        wait=Duration(seconds=5),
                    )
                )
                claimed += resp.jobs
                if len(claimed) == 3:
                    break
            claim_messages = counts(server)[0]
            assert len(claimed) == 3 and claim_messages >= 1
            items = [pb.FinishItem(job_id=c.job.job_id, fence=c.fence) for c in claimed[:2]]
            await work.Finish(pb.FinishRequest(items=items))
            await work.Complete(
                pb.CompleteRequest(job_id=claimed[2].job.job_id, fence=claimed[2].fence)
            )
            assert counts(server) == (claim_messages, 2, 3)


async def test_a_streams_pushes_and_result_messages_are_counted_too() -> None:
    from tests.unit.test_worker_stream import Stream, schedule, serving

    async with serving() as (srv, channel):
        await schedule(srv, 6)
        s = Stream(channel)
        await s.hello(t=6)
        claimed = await s.until_jobs(6)
        registry = srv.node.metrics.registry

        def value(name: str, **labels: str) -> float:
            return registry.get_sample_value(name, labels) or 0.0

        pushes = value("timeshard_worker_messages_total", kind="claim")
        assert 1 <= pushes <= 6
        assert value("timeshard_jobs_claimed_total", type="t") == 6
        items = [pb.FinishItem(job_id=c.job.job_id, fence=c.fence) for c in claimed]
        await s.answer(await s.send(results=items[:4]))
        await s.answer(await s.send(results=items[4:]))
        assert value("timeshard_worker_messages_total", kind="result") == 2
        assert value("timeshard_results_received_total") == 6
