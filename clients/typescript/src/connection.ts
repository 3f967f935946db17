// One node's channel and stubs, and a promise for each unary call (an async iterator for each
// server-streaming one) with the token's metadata and a deadline.
import type {
  CallOptions,
  ClientReadableStream,
  ClientUnaryCall,
  Metadata,
  ServiceError,
} from "@grpc/grpc-js";
import {
  AdminServiceClient,
  JobServiceClient,
  WorkerServiceClient,
} from "./gen/timeshard/v1/timeshard.js";
import type { Security } from "./config.js";
import { translate } from "./errors.js";

/** The largest reply a worker accepts (the server's cap on what a claim may declare). */
export const MAX_REPLY_BYTES = 64 * 1024 * 1024;

type Unary<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options: Partial<CallOptions>,
  callback: (error: ServiceError | null, response: Res) => void,
) => ClientUnaryCall;

export interface CallSettings {
  /** The call's deadline, from now. */
  timeoutMs: number;
  /** Cancels the call (it then fails with CANCELLED). */
  signal?: AbortSignal;
}

/** A unary call as a promise; a refusal comes out as a typed error (`errors.ts`). */
export function unary<Req, Res>(
  method: Unary<Req, Res>,
  request: Req,
  metadata: Metadata,
  { timeoutMs, signal }: CallSettings,
): Promise<Res> {
  return new Promise<Res>((resolve, reject) => {
    const deadline = new Date(Date.now() + timeoutMs);
    const call = method(request, metadata, { deadline }, (err, res) => {
      signal?.removeEventListener("abort", cancel);
      if (err) reject(translate(err));
      else resolve(res);
    });
    function cancel(): void {
      call.cancel();
    }
    if (signal?.aborted) call.cancel();
    else signal?.addEventListener("abort", cancel, { once: true });
  });
}

type ServerStreaming<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options: Partial<CallOptions>,
) => ClientReadableStream<Res>;

/** A server-streaming call as an async iterator of its messages: every message the node sent,
 * then its refusal, if any, as a typed error. Leaving the loop early cancels the call. */
export async function* serverStream<Req, Res>(
  method: ServerStreaming<Req, Res>,
  request: Req,
  metadata: Metadata,
  { timeoutMs }: CallSettings,
): AsyncGenerator<Res, void, undefined> {
  const call = method(request, metadata, { deadline: new Date(Date.now() + timeoutMs) });
  try {
    for await (const message of call) yield message as Res;
  } catch (err) {
    throw translate(err);
  } finally {
    // Cancelling an ended call does nothing. One left early is cancelled, and grpc-js then
    // emits CANCELLED on the stream: the listener keeps that from ever being an uncaught error,
    // whatever listeners the stream's iterator left behind.
    call.on("error", () => undefined);
    call.cancel();
  }
}

/** One node: its three services over one channel. */
export class NodeConnection {
  readonly address: string;
  readonly jobs: JobServiceClient;
  readonly worker: WorkerServiceClient;
  readonly admin: AdminServiceClient;

  constructor(address: string, security: Security, receiveLimit?: number) {
    this.address = address;
    const options = {
      ...security.options,
      ...(receiveLimit ? { "grpc.max_receive_message_length": receiveLimit } : {}),
    };
    this.jobs = new JobServiceClient(address, security.credentials, options);
    // The other two share the first one's channel.
    const channel = { channelOverride: this.jobs.getChannel() };
    this.worker = new WorkerServiceClient(address, security.credentials, channel);
    this.admin = new AdminServiceClient(address, security.credentials, channel);
  }

  close(): void {
    this.jobs.close();
  }
}
