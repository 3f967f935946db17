// A fake node for the SDK's own tests of the worker protocol and the client's retries: an
// in-process gRPC server whose Claim, Heartbeat, Finish and ScheduleJob(s) a test scripts. (The
// conformance suites run against the real server; this one lets a test make a node answer late,
// refuse, or hold an answer, which a real one does only under load.)
import {
  Metadata,
  Server,
  ServerCredentials,
  status,
  type sendUnaryData,
  type ServerErrorResponse,
  type ServerUnaryCall,
  type UntypedServiceImplementation,
} from "@grpc/grpc-js";
import {
  type ClaimRequest,
  type ClaimResponse,
  type ClaimedJob,
  type FinishItem,
  type HeartbeatRequest,
  type HeartbeatResponse,
  Job,
  JobServiceService,
  JobState,
  ScheduleJobResponse,
  ScheduleJobsResponse,
  WorkerServiceService,
} from "../src/gen/timeshard/v1/timeshard.js";
import { durationOf } from "../src/time.js";

type Answer<T> = Promise<T | ServerErrorResponse>;

export interface FakeNode {
  address: string;
  claims: ClaimRequest[];
  heartbeats: HeartbeatRequest[];
  finished: FinishItem[];
  scheduleCalls: number;
  /** Scripted answers: undefined is a long poll that answers no job after its wait. */
  claim?: (n: number, req: ClaimRequest, cancelled: Promise<void>) => Answer<ClaimResponse>;
  /** undefined grants the lease asked for. */
  heartbeat?: (req: HeartbeatRequest) => Answer<HeartbeatResponse>;
  /** undefined takes the job; else the error to answer (with its trailing metadata). */
  schedule?: (n: number) => ServerErrorResponse | undefined;
  close(): Promise<void>;
}

export function refusal(code: status, details: string, trailers: Record<string, string> = {}): ServerErrorResponse {
  const metadata = new Metadata();
  for (const [k, v] of Object.entries(trailers)) metadata.set(k, v);
  return Object.assign(new Error(details), { code, details, metadata });
}

export function claimedJob(jobId: string, type: string, fence: number, leaseMs: number): ClaimedJob {
  return {
    job: Job.fromPartial({ jobId, type, attempt: 1, maxAttempts: 3, runAt: new Date(), state: JobState.JOB_STATE_RUNNING }),
    fence,
    leaseUntil: new Date(Date.now() + leaseMs),
    lease: durationOf(leaseMs),
    idempotencyKey: `${jobId}:${fence}`,
    startsIn: undefined, // at due time: this fake never hands a job over ahead
  };
}

function unary<Req, Res>(fn: (req: Req, call: ServerUnaryCall<Req, Res>) => Answer<Res>) {
  return (call: ServerUnaryCall<Req, Res>, callback: sendUnaryData<Res>): void => {
    fn(call.request, call).then(
      (res) => {
        if (res instanceof Error) callback(res as ServerErrorResponse, null);
        else callback(null, res);
      },
      (err: unknown) => callback({ code: status.INTERNAL, details: String(err) } as ServerErrorResponse, null),
    );
  };
}

export async function startFakeNode(): Promise<FakeNode> {
  const server = new Server();
  const node = {
    address: "",
    claims: [] as ClaimRequest[],
    heartbeats: [] as HeartbeatRequest[],
    finished: [] as FinishItem[],
    scheduleCalls: 0,
  } as FakeNode;
  const longPoll = (req: ClaimRequest, cancelled: Promise<void>): Promise<ClaimResponse> => {
    const waitMs = req.wait ? req.wait.seconds * 1000 + req.wait.nanos / 1e6 : 0;
    return Promise.race([new Promise((r) => setTimeout(r, waitMs)), cancelled]).then(() => ({ jobs: [] }));
  };
  const worker: UntypedServiceImplementation = {
    claim: unary<ClaimRequest, ClaimResponse>((req, call) => {
      node.claims.push(req);
      const cancelled = new Promise<void>((r) => call.on("cancelled", () => r()));
      return node.claim ? node.claim(node.claims.length, req, cancelled) : longPoll(req, cancelled);
    }),
    heartbeat: unary<HeartbeatRequest, HeartbeatResponse>(async (req) => {
      node.heartbeats.push(req);
      if (node.heartbeat) return node.heartbeat(req);
      return { lease: req.lease, leaseUntil: new Date(Date.now() + 3000) };
    }),
    finish: unary(async (req: { items: FinishItem[] }) => {
      node.finished.push(...req.items);
      return {
        results: req.items.map((item) => ({
          jobId: item.jobId,
          code: 0,
          message: "",
          state: item.giveBack ? JobState.JOB_STATE_SCHEDULED : JobState.JOB_STATE_SUCCEEDED,
        })),
      };
    }),
  };
  const scheduled = (): ServerErrorResponse | undefined => {
    node.scheduleCalls += 1;
    return node.schedule?.(node.scheduleCalls);
  };
  const jobs: UntypedServiceImplementation = {
    scheduleJob: unary(
      async (req: { type: string }) =>
        scheduled() ??
        ScheduleJobResponse.fromPartial({ job: Job.fromPartial({ jobId: "j", type: req.type }), created: true }),
    ),
    scheduleJobs: unary(async (req: { jobs: Array<{ type: string }> }) => {
      const refused = scheduled();
      if (refused) return refused;
      return ScheduleJobsResponse.fromPartial({
        results: req.jobs.map((j) => ({ job: Job.fromPartial({ jobId: "j", type: j.type }), created: true })),
      });
    }),
  };
  server.addService(WorkerServiceService, worker);
  server.addService(JobServiceService, jobs);
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  node.address = `127.0.0.1:${port}`;
  node.close = async () => server.forceShutdown();
  return node;
}
