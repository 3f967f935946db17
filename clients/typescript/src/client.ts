// The client: jobs, waiting for them, schedules (cron) and dead letters, over JobService.
import {
  type ClusterInfoResponse,
  type FireTime,
  IfExists,
  type Job,
  JobState,
  ListJobsRequest,
  Schedule,
  type ScheduleJobRequest,
  type ScheduleRevision,
  type TypeFlow,
  type TypeInfo,
} from "./gen/timeshard/v1/timeshard.js";
import { type ConnectOptions, resolveSecurity, resolveServers } from "./config.js";
import { NodeConnection, serverStream, unary } from "./connection.js";
import {
  DeadlineExceededError,
  InvalidArgumentError,
  ResourceExhaustedError,
  UnavailableError,
} from "./errors.js";
import { sleep } from "./lease.js";
import { durationOf } from "./time.js";
import { Waiting } from "./waiting.js";
import type { Metadata } from "@grpc/grpc-js";
import { status } from "@grpc/grpc-js";

export { JobState };
export type { Job, FireTime, ClusterInfoResponse, TypeInfo, ScheduleRevision };
export { Schedule };

/** A job's payload: bytes, or a string sent as UTF-8. */
export type Payload = Uint8Array | string;

/** When a job is due: after a delay, or at a time (epoch ms or a Date); neither means now. */
export interface When {
  delayMs?: number;
  runAt?: Date | number;
}

export interface ScheduleOptions extends When {
  payload?: Payload;
  /** A repeat with the same key returns the same job; the same key with another body fails. */
  idempotencyKey?: string;
  /** 0 or unset: the server's default for the type; at most 1000. */
  maxAttempts?: number;
  /** No attempt starts after this time; a job not started by then ends expired. */
  deadline?: Date | number;
  /** As `deadline`, in milliseconds after the job is due (not with `deadline`). */
  deadlineInMs?: number;
  /** 0 (default, lowest) to 9: higher goes first among due jobs of its type, with aging. */
  priority?: number;
}

export interface JobSpec extends ScheduleOptions {
  type: string;
}

export interface Scheduled {
  job: Job;
  /** False when an idempotency key matched a job already there (that job is returned). */
  created: boolean;
}

export interface Page<T> {
  items: T[];
  /** "" on the last page. */
  nextPageToken: string;
}

export interface ListOptions {
  state?: JobState;
  type?: string;
  pageSize?: number;
  pageToken?: string;
}

/** A cron schedule to create: durations in milliseconds, the rest as `Schedule` names it. */
export interface ScheduleSpec {
  scheduleId: string;
  cron: string;
  type: string;
  timezone?: string;
  payload?: Payload;
  misfire?: "skip" | "once" | "all";
  misfireGraceMs?: number;
  maxCatchup?: number;
  overlap?: "skip" | "queue" | "allow";
  maxConcurrent?: number;
  jitterMs?: number;
  /** Each occurrence runs a stable offset in [0, spreadMs) after its time (from the id). */
  spreadMs?: number;
  dstGap?: "" | "shift" | "skip";
  dstFold?: "" | "first" | "both";
  paused?: boolean;
  maxAttempts?: number;
  /** Why: kept with the schedule's first revision. */
  reason?: string;
}

export interface PreviewOptions {
  timezone?: string;
  from?: Date | number;
  count?: number;
  dstGap?: string;
  dstFold?: string;
  /** With `scheduleId`: also say when each occurrence runs with this spread (`runsAt`). */
  spreadMs?: number;
  scheduleId?: string;
}

export interface WaitOptions {
  /** How long to wait, in ms (default: as long as it takes); 0 takes only the jobs finished
   * already. When it passes with jobs not finished, the wait fails with `WaitTimeoutError`. */
  timeoutMs?: number;
}

export interface ClientOptions extends ConnectOptions {
  /** Deadline of each call (default 30 s). */
  timeoutMs?: number;
  /** `schedule` and `scheduleMany` retry a node that refuses due-now jobs while overloaded
   * (`RESOURCE_EXHAUSTED` from a node started with --max-ready; it stored nothing, so a retry is
   * always safe) after the wait its `retry-after-ms` trailing metadata names (1 s if none; at most
   * 30 s a wait, plus up to a tenth more at random): at most this many retries per call (default
   * 5; 0: none), then the `ResourceExhaustedError` is thrown. */
  overloadRetries?: number;
  /** ... and at most this much waiting in all per call, in ms (default 60 s). */
  overloadBudgetMs?: number;
}

/** The wait before retrying an overloaded node that named none. */
export const DEFAULT_RETRY_AFTER_MS = 1000;

function bytes(payload: Payload | undefined): Buffer {
  if (payload === undefined) return Buffer.alloc(0);
  return typeof payload === "string" ? Buffer.from(payload, "utf8") : Buffer.from(payload);
}

function when(w: When): ScheduleJobRequest["when"] {
  if (w.delayMs !== undefined && w.runAt !== undefined) {
    throw new InvalidArgumentError(status.INVALID_ARGUMENT, "give delayMs or runAt, not both");
  }
  if (w.runAt !== undefined) {
    return { $case: "runAt", value: w.runAt instanceof Date ? w.runAt : new Date(w.runAt) };
  }
  return { $case: "delay", value: durationOf(w.delayMs ?? 0) };
}

/** Both fields as given: a call naming ids and a type is the server's to refuse. */
function deadLetterRequest(which: { jobIds: string[] } | { type: string }): { jobIds: string[]; type: string } {
  const w = which as { jobIds?: string[]; type?: string };
  return { jobIds: w.jobIds ?? [], type: w.type ?? "" };
}

function deadlineOf(spec: ScheduleOptions): ScheduleJobRequest["deadlineOf"] {
  if (spec.deadline !== undefined && spec.deadlineInMs !== undefined) {
    throw new InvalidArgumentError(
      status.INVALID_ARGUMENT,
      "give deadline or deadlineInMs, not both",
    );
  }
  if (spec.deadline !== undefined) {
    const at = spec.deadline instanceof Date ? spec.deadline : new Date(spec.deadline);
    return { $case: "deadline", value: at };
  }
  if (spec.deadlineInMs !== undefined) {
    return { $case: "deadlineIn", value: durationOf(spec.deadlineInMs) };
  }
  return undefined;
}

function jobRequest(spec: JobSpec): ScheduleJobRequest {
  return {
    type: spec.type,
    payload: bytes(spec.payload),
    when: when(spec),
    idempotencyKey: spec.idempotencyKey ?? "",
    maxAttempts: spec.maxAttempts ?? 0,
    deadlineOf: deadlineOf(spec),
    priority: spec.priority ?? 0,
    ifExists: IfExists.IF_EXISTS_UNSPECIFIED, // the server's check of a key's repeat
  };
}

/**
 * A client of the cluster: every method is one call to a node. A call that may safely be
 * repeated (reads, cancel, reschedule, schedules, a schedule with an idempotency key) moves on
 * to the next node listed when one is unavailable; a schedule without a key does not, since
 * the first node may have stored the job before its answer was lost.
 */
export class Client {
  private readonly nodes: NodeConnection[];
  private readonly metadata: Metadata;
  private readonly timeoutMs: number;
  private readonly overloadRetries: number;
  private readonly overloadBudgetMs: number;

  constructor(opts: ClientOptions = {}) {
    const security = resolveSecurity(opts);
    this.nodes = resolveServers(opts.servers).map((a) => new NodeConnection(a, security));
    this.metadata = security.metadata;
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.overloadRetries = Math.max(0, opts.overloadRetries ?? 5);
    this.overloadBudgetMs = Math.max(0, opts.overloadBudgetMs ?? 60_000);
  }

  close(): void {
    for (const n of this.nodes) n.close();
  }

  private async call<T>(retryable: boolean, fn: (n: NodeConnection) => Promise<T>): Promise<T> {
    let last: unknown;
    for (const node of retryable ? this.nodes : this.nodes.slice(0, 1)) {
      try {
        return await fn(node);
      } catch (err) {
        if (!(err instanceof UnavailableError)) throw err;
        last = err;
      }
    }
    throw last;
  }

  /** A scheduling call, made again while the node answers RESOURCE_EXHAUSTED (overloaded: it
   * refuses due-now jobs before storing anything) after the wait it names, within the budget:
   * `overloadRetries` retries and `overloadBudgetMs` of waiting in all. Not a loop without a
   * bound: that would only add load to a node that said it has too much. */
  private async retryOverload<T>(fn: () => Promise<T>): Promise<T> {
    let waited = 0;
    for (let retries = 0; ; retries++) {
      try {
        return await fn();
      } catch (err) {
        if (!(err instanceof ResourceExhaustedError)) throw err;
        const named = err.retryAfterMs ?? DEFAULT_RETRY_AFTER_MS;
        const wait = named + Math.random() * named * 0.1; // refused together, not back together
        if (retries >= this.overloadRetries || waited + wait > this.overloadBudgetMs) throw err;
        await sleep(wait);
        waited += wait;
      }
    }
  }

  private get settings() {
    return { timeoutMs: this.timeoutMs };
  }

  // -- jobs --------------------------------------------------------------------------------

  /** Schedule one job, due after `delayMs` or at `runAt` (now when neither is given). A node
   * refusing due-now jobs while overloaded is asked again after the wait it names, within the
   * client's budget (`overloadRetries`, `overloadBudgetMs`); then `ResourceExhaustedError`. */
  async schedule(type: string, opts: ScheduleOptions = {}): Promise<Scheduled> {
    const request = jobRequest({ ...opts, type });
    const res = await this.retryOverload(() =>
      this.call(Boolean(opts.idempotencyKey), (n) =>
        unary(n.jobs.scheduleJob.bind(n.jobs), request, this.metadata, this.settings),
      ),
    );
    return { job: res.job!, created: res.created };
  }

  /** Schedule up to 1000 jobs in one call: all are checked first, and one bad item fails all.
   * An overloaded node is retried as for `schedule`. */
  async scheduleMany(specs: JobSpec[]): Promise<Scheduled[]> {
    const request = { jobs: specs.map(jobRequest) };
    const res = await this.retryOverload(() =>
      this.call(
        specs.every((s) => Boolean(s.idempotencyKey)),
        (n) => unary(n.jobs.scheduleJobs.bind(n.jobs), request, this.metadata, this.settings),
      ),
    );
    return res.results.map((r) => ({ job: r.job!, created: r.created }));
  }

  async get(jobId: string): Promise<Job> {
    return this.call(true, (n) =>
      unary(n.jobs.getJob.bind(n.jobs), { jobId }, this.metadata, this.settings),
    );
  }

  async list(opts: ListOptions = {}): Promise<Page<Job>> {
    const request = ListJobsRequest.fromPartial({
      state: opts.state ?? JobState.JOB_STATE_UNSPECIFIED,
      type: opts.type ?? "",
      pageSize: opts.pageSize ?? 0,
      pageToken: opts.pageToken ?? "",
    });
    const res = await this.call(true, (n) =>
      unary(n.jobs.listJobs.bind(n.jobs), request, this.metadata, this.settings),
    );
    return { items: res.jobs, nextPageToken: res.nextPageToken };
  }

  /** Cancel a job: a running one's handler is told at its next heartbeat. */
  async cancel(jobId: string): Promise<Job> {
    return this.call(true, (n) =>
      unary(n.jobs.cancelJob.bind(n.jobs), { jobId }, this.metadata, this.settings),
    );
  }

  async reschedule(jobId: string, to: When): Promise<Job> {
    const request = { jobId, when: when(to) };
    return this.call(true, (n) =>
      unary(n.jobs.rescheduleJob.bind(n.jobs), request, this.metadata, this.settings),
    );
  }

  // -- waiting for jobs --------------------------------------------------------------------

  /** The job once it is finished: succeeded, dead, cancelled or expired (`resultOf(job)` reads
   * what its handler returned). Fails with `WaitTimeoutError` once `timeoutMs` has passed, and
   * with `NotFoundError` for an unknown id. */
  async wait(jobId: string, opts: WaitOptions = {}): Promise<Job> {
    return (await this.waitMany([jobId], opts)).get(jobId)!;
  }

  /** Every job once it is finished, by id in the order given (see `asFinished`). */
  async waitMany(jobIds: Iterable<string>, opts: WaitOptions = {}): Promise<Map<string, Job>> {
    const ids = [...new Set(jobIds)];
    const done = new Map<string, Job>();
    for await (const job of this.asFinished(ids, opts)) done.set(job.jobId, job);
    return new Map(ids.map((id) => [id, done.get(id)!]));
  }

  /**
   * Each job as soon as it is finished, in the order they finish; an id given twice comes once.
   * The node streams them (`WaitJobs`): nothing is polled from here. A wait for over 1000 jobs
   * asks for them 1000 at a time, and one longer than the node's cap (600 s) is made of several
   * calls. An unavailable node is left for the next one listed. Leaving the loop early ends the
   * call.
   */
  async *asFinished(jobIds: Iterable<string>, opts: WaitOptions = {}): AsyncGenerator<Job, void, undefined> {
    const waiting = new Waiting(jobIds, opts.timeoutMs);
    let node = 0;
    let unavailable = 0; // nodes tried in a row without a job
    while (waiting.pending.size > 0) {
      const n = this.nodes[node]!;
      const request = waiting.request();
      const settings = { timeoutMs: waiting.waitMs + this.timeoutMs };
      try {
        for await (const res of serverStream(n.jobs.waitJobs.bind(n.jobs), request, this.metadata, settings)) {
          unavailable = 0;
          yield waiting.got(res.job!);
        }
      } catch (err) {
        if (err instanceof UnavailableError && ++unavailable < this.nodes.length) {
          node = (node + 1) % this.nodes.length;
        } else if (!(err instanceof DeadlineExceededError)) {
          throw err;
        } // else the node's cap or this wait's timeout, which checkDeadline tells apart
      }
      waiting.checkDeadline();
    }
  }

  // -- schedules ---------------------------------------------------------------------------

  async createSchedule(spec: ScheduleSpec): Promise<Schedule> {
    const schedule = Schedule.fromPartial({
      scheduleId: spec.scheduleId,
      cron: spec.cron,
      type: spec.type,
      timezone: spec.timezone ?? "",
      payload: bytes(spec.payload),
      misfire: spec.misfire ?? "",
      misfireGrace: spec.misfireGraceMs === undefined ? undefined : durationOf(spec.misfireGraceMs),
      maxCatchup: spec.maxCatchup ?? 0,
      overlap: spec.overlap ?? "",
      maxConcurrent: spec.maxConcurrent ?? 0,
      jitter: spec.jitterMs === undefined ? undefined : durationOf(spec.jitterMs),
      spread: spec.spreadMs === undefined ? undefined : durationOf(spec.spreadMs),
      dstGap: spec.dstGap ?? "",
      dstFold: spec.dstFold ?? "",
      paused: spec.paused ?? false,
      maxAttempts: spec.maxAttempts ?? 0,
    });
    const reason = spec.reason ?? "";
    return this.call(true, (n) =>
      unary(n.jobs.createSchedule.bind(n.jobs), { schedule, reason }, this.metadata, this.settings),
    );
  }

  async getSchedule(scheduleId: string): Promise<Schedule> {
    return this.call(true, (n) =>
      unary(n.jobs.getSchedule.bind(n.jobs), { scheduleId }, this.metadata, this.settings),
    );
  }

  async listSchedules(opts: { pageSize?: number; pageToken?: string } = {}): Promise<Page<Schedule>> {
    const request = { pageSize: opts.pageSize ?? 0, pageToken: opts.pageToken ?? "" };
    const res = await this.call(true, (n) =>
      unary(n.jobs.listSchedules.bind(n.jobs), request, this.metadata, this.settings),
    );
    return { items: res.schedules, nextPageToken: res.nextPageToken };
  }

  /** `reason` is kept with the revision the change makes. */
  async pauseSchedule(scheduleId: string, opts: { reason?: string } = {}): Promise<Schedule> {
    const request = { scheduleId, reason: opts.reason ?? "" };
    return this.call(true, (n) =>
      unary(n.jobs.pauseSchedule.bind(n.jobs), request, this.metadata, this.settings),
    );
  }

  /** `reason` is kept with the revision the change makes. */
  async resumeSchedule(scheduleId: string, opts: { reason?: string } = {}): Promise<Schedule> {
    const request = { scheduleId, reason: opts.reason ?? "" };
    return this.call(true, (n) =>
      unary(n.jobs.resumeSchedule.bind(n.jobs), request, this.metadata, this.settings),
    );
  }

  /** Returns the revision the delete made (its history is kept for the ledger retention, then
   * purged). */
  async deleteSchedule(scheduleId: string, opts: { reason?: string } = {}): Promise<number> {
    const request = { scheduleId, reason: opts.reason ?? "" };
    const res = await this.call(true, (n) =>
      unary(n.jobs.deleteSchedule.bind(n.jobs), request, this.metadata, this.settings),
    );
    return res.revision;
  }

  /** A page of the schedule's revisions, newest first (also a deleted schedule's): who changed
   * it (`actor`, the caller's token name), when (`at`), how (`change`), why (`reason`), and the
   * schedule as it was right after. `pageSize` 0 or unset: 20, at most 100; the token of the
   * next page is "" on the last. An unknown schedule: NotFoundError. */
  async scheduleHistory(
    scheduleId: string,
    opts: { pageSize?: number; pageToken?: string } = {},
  ): Promise<Page<ScheduleRevision>> {
    const request = { scheduleId, pageSize: opts.pageSize ?? 0, pageToken: opts.pageToken ?? "" };
    const res = await this.call(true, (n) =>
      unary(n.jobs.listScheduleRevisions.bind(n.jobs), request, this.metadata, this.settings),
    );
    return { items: res.revisions, nextPageToken: res.nextPageToken };
  }

  /** Revision `revision` of the schedule; one not kept (never made, or older than the newest
   * 100): NotFoundError naming the revisions kept. */
  async getScheduleRevision(scheduleId: string, revision: number): Promise<ScheduleRevision> {
    return this.call(true, (n) =>
      unary(n.jobs.getScheduleRevision.bind(n.jobs), { scheduleId, revision }, this.metadata, this.settings),
    );
  }

  /** A new revision whose definition (cron, time zone, DST rules, job template, policies) is
   * revision `revision`'s; the schedule stays paused or running as it is. Returns the schedule
   * (`revision`: the one made, or the current one when it has that definition already, so a
   * retry changes nothing). A revision not kept: NotFoundError; a deleted schedule:
   * FailedPreconditionError; nothing changed either way. */
  async rollbackSchedule(scheduleId: string, revision: number, opts: { reason?: string } = {}): Promise<Schedule> {
    const request = { scheduleId, revision, reason: opts.reason ?? "" };
    return this.call(true, (n) =>
      unary(n.jobs.rollbackSchedule.bind(n.jobs), request, this.metadata, this.settings),
    );
  }

  /** The next fire times of a cron expression, without creating anything. */
  async previewSchedule(cron: string, opts: PreviewOptions = {}): Promise<FireTime[]> {
    const from = opts.from === undefined ? undefined : new Date(opts.from);
    const request = {
      cron,
      timezone: opts.timezone ?? "",
      from,
      count: opts.count ?? 0,
      dstGap: opts.dstGap ?? "",
      dstFold: opts.dstFold ?? "",
      spread: opts.spreadMs === undefined ? undefined : durationOf(opts.spreadMs),
      scheduleId: opts.scheduleId ?? "",
    };
    const res = await this.call(true, (n) =>
      unary(n.jobs.previewSchedule.bind(n.jobs), request, this.metadata, this.settings),
    );
    return res.times;
  }

  // -- dead letters ------------------------------------------------------------------------

  async listDeadLetters(
    opts: { type?: string; since?: Date | number; pageSize?: number; pageToken?: string } = {},
  ): Promise<Page<Job>> {
    const request = {
      type: opts.type ?? "",
      since: opts.since === undefined ? undefined : new Date(opts.since),
      pageSize: opts.pageSize ?? 0,
      pageToken: opts.pageToken ?? "",
    };
    const res = await this.call(true, (n) =>
      unary(n.jobs.listDeadLetters.bind(n.jobs), request, this.metadata, this.settings),
    );
    return { items: res.jobs, nextPageToken: res.nextPageToken };
  }

  /** Schedule dead jobs again, now (by id, or up to 1000 of a type per call). */
  async replayDeadLetters(which: { jobIds: string[] } | { type: string }): Promise<Job[]> {
    const request = deadLetterRequest(which);
    const res = await this.call(true, (n) =>
      unary(n.jobs.replayDeadLetters.bind(n.jobs), request, this.metadata, this.settings),
    );
    return res.jobs;
  }

  /** Delete dead jobs for good; the ids purged. */
  async purgeDeadLetters(which: { jobIds: string[] } | { type: string }): Promise<string[]> {
    const request = deadLetterRequest(which);
    const res = await this.call(true, (n) =>
      unary(n.jobs.purgeDeadLetters.bind(n.jobs), request, this.metadata, this.settings),
    );
    return res.jobIds;
  }

  // -- job types: rate limits and pauses (admin calls) -------------------------------------

  /** At most `rate` jobs of `type` start per second across the cluster, `burst` at once (0:
   * half a second's worth); `rate` 0 removes the limit. The type as the node now applies it. */
  async setTypeRate(type: string, rate: number, burst = 0): Promise<TypeInfo> {
    return this.setFlow({ type, rate, burst });
  }

  /** Hold every due job of `type` (stored, handed to no worker) until `resumeType`. */
  async pauseType(type: string): Promise<TypeInfo> {
    return this.setFlow({ type, burst: 0, paused: true });
  }

  /** Let a paused type's jobs start again, at its rate if it has one. */
  async resumeType(type: string): Promise<TypeInfo> {
    return this.setFlow({ type, burst: 0, paused: false });
  }

  /** The types with a policy or a flow ("" for all), as the node called applies them, with
   * their due jobs waiting there and why they are held (`held`: "paused", "rate" or ""). */
  async listTypes(type = ""): Promise<TypeInfo[]> {
    const res = await this.call(true, (n) =>
      unary(n.admin.listTypes.bind(n.admin), { type }, this.metadata, this.settings),
    );
    return res.types;
  }

  private async setFlow(flow: TypeFlow): Promise<TypeInfo> {
    const res = await this.call(true, (n) =>
      unary(n.admin.setTypeFlows.bind(n.admin), { flows: [flow] }, this.metadata, this.settings),
    );
    const info = res.types.find((t) => t.type === flow.type);
    if (info === undefined) {
      throw new UnavailableError(status.UNAVAILABLE, `the node did not answer for type ${flow.type}`);
    }
    return info;
  }

  /** Every node of the cluster, as the first node that answers knows them. */
  async clusterInfo(): Promise<ClusterInfoResponse> {
    return this.call(true, (n) =>
      unary(n.admin.clusterInfo.bind(n.admin), {}, this.metadata, this.settings),
    );
  }
}
