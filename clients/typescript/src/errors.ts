// Typed errors mirroring the gRPC status a node answered with, and the handler's PermanentError.
import { status, type ServiceError } from "@grpc/grpc-js";
import { JobState } from "./gen/timeshard/v1/timeshard.js";

/** The root of every error this package raises for a call a node refused or did not answer. */
export class TimeshardError extends Error {
  /** The gRPC status code (`status` of @grpc/grpc-js). */
  readonly code: status;
  /** The node's message, without the code. */
  readonly details: string;

  constructor(code: status, details: string, options?: { cause?: unknown }) {
    super(`${status[code] ?? `code ${code}`}: ${details}`, options);
    this.name = new.target.name;
    this.code = code;
    this.details = details;
  }
}

/** No such job, schedule or dead letter. */
export class NotFoundError extends TimeshardError {}
/** A malformed request; the message names the field. */
export class InvalidArgumentError extends TimeshardError {}
/** The job is not in a state that allows this (finished, or a stale fence). */
export class FailedPreconditionError extends TimeshardError {}
/** An idempotency key or schedule id already used with another body. */
export class AlreadyExistsError extends TimeshardError {}
/** The node, its store or the shard's owner is away: retry, perhaps on another node. */
export class UnavailableError extends TimeshardError {}
/** No bearer token, or one the node does not know (TIMESHARD_TOKEN). */
export class UnauthenticatedError extends TimeshardError {}
/** The token's role may not make this call. */
export class PermissionDeniedError extends TimeshardError {}
/** The call's deadline passed before the node answered. */
export class DeadlineExceededError extends TimeshardError {}
/** A limit of the node was reached: a request or reply too large, or (ScheduleJob and
 * ScheduleJobs) a node started with --max-ready refusing due-now jobs while too many wait for a
 * worker on it; the client retries that within its budget before it throws this. */
export class ResourceExhaustedError extends TimeshardError {
  /** How long the node asked the caller to wait before trying again (its `retry-after-ms`
   * trailing metadata, at most 30 s); undefined when it named none. */
  retryAfterMs: number | undefined;
}
/** A conflict the caller may retry (a concurrent write won). */
export class AbortedError extends TimeshardError {}

/** A wait (`Client.wait`, `waitMany`, `asFinished`) whose timeout passed with jobs not finished;
 * the jobs it returned or yielded before stay valid. */
export class WaitTimeoutError extends DeadlineExceededError {
  /** The ids of the jobs not known to be finished, in the order given. */
  readonly pending: string[];
  readonly timeoutMs: number;

  constructor(pending: string[], timeoutMs: number) {
    const shown = pending.slice(0, 5).map((id) => JSON.stringify(id)).join(", ");
    super(
      status.DEADLINE_EXCEEDED,
      `${pending.length} job(s) not finished within ${timeoutMs} ms: ${shown}` +
        `${pending.length > 5 ? " ..." : ""}; wait again, or look at them with \`timeshard jobs get\``,
    );
    this.pending = pending;
    this.timeoutMs = timeoutMs;
  }
}

const BY_CODE: Partial<Record<status, typeof TimeshardError>> = {
  [status.NOT_FOUND]: NotFoundError,
  [status.INVALID_ARGUMENT]: InvalidArgumentError,
  [status.FAILED_PRECONDITION]: FailedPreconditionError,
  [status.ALREADY_EXISTS]: AlreadyExistsError,
  [status.UNAVAILABLE]: UnavailableError,
  [status.UNAUTHENTICATED]: UnauthenticatedError,
  [status.PERMISSION_DENIED]: PermissionDeniedError,
  [status.DEADLINE_EXCEEDED]: DeadlineExceededError,
  [status.RESOURCE_EXHAUSTED]: ResourceExhaustedError,
  [status.ABORTED]: AbortedError,
};

/** The typed error for a status code and message. */
export function errorFor(code: status, details: string, cause?: unknown): TimeshardError {
  const Cls = BY_CODE[code] ?? TimeshardError;
  return new Cls(code, details, { cause });
}

export function isServiceError(err: unknown): err is ServiceError {
  return err instanceof Error && typeof (err as Partial<ServiceError>).code === "number";
}

/** A grpc-js call error as a typed error; anything else is returned unchanged. */
export function translate(err: unknown): unknown {
  if (!isServiceError(err)) return err;
  const typed = errorFor(err.code, err.details || err.message, err);
  if (typed instanceof ResourceExhaustedError) {
    typed.retryAfterMs = readRetryAfter(err.metadata?.get(RETRY_AFTER_KEY)[0]);
  }
  return typed;
}

/** The trailing metadata of a RESOURCE_EXHAUSTED answer that says how long to wait, in ms. */
export const RETRY_AFTER_KEY = "retry-after-ms";
/** One wait for an overloaded node is never longer. */
export const MAX_RETRY_AFTER_MS = 30_000;

/** A `retry-after-ms` value in ms, capped at MAX_RETRY_AFTER_MS; undefined when absent or not a
 * number of milliseconds. */
export function readRetryAfter(value: string | Buffer | undefined): number | undefined {
  if (value === undefined) return undefined;
  const text = value.toString().trim();
  const ms = text === "" ? NaN : Number(text);
  if (!(ms >= 0)) return undefined; // (NaN too)
  return Math.min(ms, MAX_RETRY_AFTER_MS);
}

/**
 * Thrown by a handler for a failure that retrying can not fix: the job goes to the dead-letter
 * queue at once, with this message as its error. Any other error is retried with the type's
 * backoff until the job's max attempts.
 */
export class PermanentError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "PermanentError";
  }
}

/** `resultOf` asked for the result of a job that has none (to read): not finished, finished
 * without succeeding, its handler returned nothing, or an encoding this SDK does not know. */
export class NoResultError extends Error {
  readonly jobId: string;
  readonly state: JobState;
  /** The job's `resultEncoding`: "" when it has no result. */
  readonly encoding: string;

  constructor(jobId: string, state: JobState, encoding: string, lastError = "") {
    super(noResultMessage(jobId, state, encoding, lastError));
    this.name = "NoResultError";
    this.jobId = jobId;
    this.state = state;
    this.encoding = encoding;
  }
}

function noResultMessage(jobId: string, state: JobState, encoding: string, lastError: string): string {
  const name = (JobState[state] ?? `state ${state}`).replace(/^JOB_STATE_/, "").toLowerCase();
  const job = `job ${JSON.stringify(jobId)}`;
  switch (state) {
    case JobState.JOB_STATE_SUCCEEDED:
      return encoding
        ? `${job} has a result encoded as ${JSON.stringify(encoding)}, which this SDK can not read (it reads json and bytes)`
        : `${job} succeeded without a result: its handler returned nothing`;
    case JobState.JOB_STATE_DEAD:
    case JobState.JOB_STATE_CANCELLED:
    case JobState.JOB_STATE_EXPIRED:
      return `${job} is ${name}, so it has no result${lastError ? ` (last error: ${lastError})` : ""}`;
    default:
      return `${job} is ${name}, not finished: it has no result yet (wait for it first: Client.wait)`;
  }
}

/** A worker or client setting that can not work (a missing TLS file, a bad address). */
export class ConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ConfigError";
  }
}
