// A job's result, both ways: what a handler's end sends (the value it returned, encoded for the
// job's `result`, and the stack of the error it threw), and what a client reads back from a
// finished job. As the Python SDK (src/timeshard/worker/returns.py) does it:
//
// - `undefined` and `null` are no result. A `Uint8Array` (a `Buffer` too) is stored as it is
//   (encoding "bytes"); anything else is stored as its `JSON.stringify` text (encoding "json").
// - A value JSON.stringify can not encode (a BigInt, a cycle, a function) or a result over
//   MAX_RESULT_BYTES is a `ResultError`: the attempt fails permanently (dead-letter queue) with
//   a message saying why. The handler's effects have happened; a retry would repeat them for
//   the same unstorable value.
// - A traceback is cut to MAX_TRACEBACK_BYTES, keeping its end.
import { JobState, type Job } from "./gen/timeshard/v1/timeshard.js";
import { NoResultError } from "./errors.js";

/** The largest result a job keeps (see FinishItem.result in the proto). */
export const MAX_RESULT_BYTES = 256 * 1024;
/** The longest traceback an attempt keeps (see FinishItem.traceback in the proto). */
export const MAX_TRACEBACK_BYTES = 8000;

export type ResultEncoding = "" | "json" | "bytes";

export interface EncodedResult {
  result: Buffer;
  encoding: ResultEncoding;
}

/** A handler's return value that can not be stored as its job's result. */
export class ResultError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ResultError";
  }
}

const NO_RESULT: EncodedResult = { result: Buffer.alloc(0), encoding: "" };
const SUPPORTED = "return JSON-serialisable data, a Buffer or Uint8Array, or undefined";

/** The result and its encoding for a handler's return value; a `ResultError` if it can not be
 * stored. */
export function encodeResult(value: unknown): EncodedResult {
  if (value === undefined || value === null) return NO_RESULT;
  if (value instanceof Uint8Array) {
    checkSize(value.byteLength);
    return { result: Buffer.from(value), encoding: "bytes" }; // a copy: the handler keeps its own
  }
  const result = Buffer.from(jsonOf(value), "utf8");
  checkSize(result.length);
  return { result, encoding: "json" };
}

function checkSize(bytes: number): void {
  if (bytes > MAX_RESULT_BYTES) {
    throw new ResultError(
      `the handler's result is ${bytes} bytes, over the limit of ${MAX_RESULT_BYTES} bytes; ` +
        "keep large output elsewhere and return a reference to it",
    );
  }
}

function jsonOf(value: unknown): string {
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch (err) {
    // A BigInt, a cycle, or a toJSON that threw.
    throw new ResultError(
      `the handler returned ${kindOf(value)} that is not JSON-serialisable (${String(err)}); ${SUPPORTED}`,
    );
  }
  if (text === undefined) {
    // A function or a symbol (or a toJSON that returned one): JSON has nothing to say for it.
    throw new ResultError(`the handler returned ${kindOf(value)}, which JSON can not encode; ${SUPPORTED}`);
  }
  return text;
}

/** "a bigint", "an Object", "a Map": what the handler returned, for a message. */
function kindOf(value: unknown): string {
  const kind = typeof value === "object" && value !== null ? (value.constructor?.name || "Object") : typeof value;
  return `${/^[aeiou]/i.test(kind) ? "an" : "a"} ${kind}`;
}

/** The error's stack as Node prints it, with those of its causes, the end kept; "" for a thrown
 * value that is not an Error (it has no stack). */
export function tracebackOf(err: unknown): string {
  const parts: string[] = [];
  const seen = new Set<unknown>();
  for (let e = err; e instanceof Error && !seen.has(e); e = e.cause) {
    seen.add(e);
    parts.push(e.stack ?? `${e.name}: ${e.message}`);
  }
  return truncateTraceback(parts.join("\nCaused by: "));
}

/** A traceback cut to its last `maxBytes` of UTF-8 (the end names the error and where it was
 * thrown), at a character boundary, saying so at the start (as the server and the Python SDK
 * cut it). */
export function truncateTraceback(text: string, maxBytes = MAX_TRACEBACK_BYTES): string {
  const data = Buffer.from(text, "utf8");
  if (data.length <= maxBytes) return text;
  const note = `(truncated from ${data.length} bytes) ...\n`;
  let start = data.length - (maxBytes - Buffer.byteLength(note, "utf8"));
  while (start < data.length && (data[start]! & 0xc0) === 0x80) start += 1; // a character's tail
  return note + data.subarray(start).toString("utf8");
}

/**
 * What a succeeded job's handler returned: the parsed value of a JSON result, the bytes (a
 * `Buffer`) of a bytes result. `T` is what the caller knows the handler returns; it is not
 * checked. Throws `NoResultError` when there is none: the job is not finished, did not
 * succeed, or its handler returned nothing.
 */
export function resultOf<T = unknown>(job: Job): T {
  if (job.state !== JobState.JOB_STATE_SUCCEEDED || !job.resultEncoding) {
    throw new NoResultError(job.jobId, job.state, job.resultEncoding, job.lastError);
  }
  if (job.resultEncoding === "json") return JSON.parse(job.result.toString("utf8")) as T;
  if (job.resultEncoding === "bytes") return job.result as T;
  throw new NoResultError(job.jobId, job.state, job.resultEncoding, job.lastError);
}
