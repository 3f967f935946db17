export * from "./client.js";
export * from "./errors.js";
export { type ConnectOptions, DEFAULT_SERVER } from "./config.js";
export {
  Worker,
  type WorkerOptions,
  type Handler,
  type HandlerOptions,
  type JobContext,
  type WorkerEvent,
  STOP_GRACE_MS,
  NOT_STARTED,
} from "./worker.js";
export { LeaseLostError } from "./lease.js";
export { resultOf, MAX_RESULT_BYTES } from "./returns.js";
