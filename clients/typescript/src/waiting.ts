// What a wait for jobs (Client.asFinished) has still to hear of: the ids not yet finished, its
// deadline on the monotonic clock, and the next WaitJobs request. One request names at most
// MAX_WAIT_IDS jobs and waits at most MAX_WAIT_MS (the server's limits): a wait for more, or
// for longer, is made of several requests.
import { status } from "@grpc/grpc-js";
import type { Job, WaitJobsRequest } from "./gen/timeshard/v1/timeshard.js";
import { InvalidArgumentError, WaitTimeoutError } from "./errors.js";
import { now } from "./lease.js";
import { durationOf } from "./time.js";

/** The longest one WaitJobs call waits (the server caps a longer timeout to it). */
export const MAX_WAIT_MS = 600_000;
/** The most job ids one WaitJobs call may name. */
export const MAX_WAIT_IDS = 1000;

export class Waiting {
  /** The ids not known to be finished, each once, in the order given. */
  readonly pending: Set<string>;
  /** How long the current request waits. */
  waitMs = 0;
  private readonly deadline: number;

  /** `timeoutMs` undefined: as long as it takes; negative: as 0 (only what is finished). */
  constructor(
    jobIds: Iterable<string>,
    private readonly timeoutMs: number | undefined,
  ) {
    if (Number.isNaN(timeoutMs)) {
      throw new InvalidArgumentError(status.INVALID_ARGUMENT, "timeoutMs: not a number");
    }
    this.pending = new Set(jobIds);
    this.deadline = timeoutMs === undefined ? Infinity : now() + Math.max(0, timeoutMs);
  }

  request(): WaitJobsRequest {
    this.waitMs = Math.max(0, Math.min(this.deadline - now(), MAX_WAIT_MS));
    const jobIds: string[] = [];
    for (const id of this.pending) {
      if (jobIds.length === MAX_WAIT_IDS) break;
      jobIds.push(id);
    }
    return { jobIds, timeout: durationOf(Math.round(this.waitMs)) };
  }

  got(job: Job): Job {
    this.pending.delete(job.jobId);
    return job;
  }

  /** After a request ended: a `WaitTimeoutError` if jobs are left and the time is up. */
  checkDeadline(): void {
    if (this.pending.size > 0 && now() >= this.deadline) {
      throw new WaitTimeoutError([...this.pending], Math.max(0, this.timeoutMs ?? 0));
    }
  }
}
