// Where the nodes are and how to reach them, from options or the environment the Python SDK and
// CLI read: TIMESHARD_SERVER, TIMESHARD_TLS_DIR (ca.pem; client.pem and client-key.pem for mutual
// TLS), TIMESHARD_TLS_SERVER_NAME and TIMESHARD_TOKEN.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { credentials, Metadata, type ChannelCredentials, type ChannelOptions } from "@grpc/grpc-js";
import { ConfigError } from "./errors.js";

export const DEFAULT_SERVER = "127.0.0.1:50051";

/** How to reach the nodes. Every field left out comes from the environment. */
export interface ConnectOptions {
  /** Node addresses, `host:port` (default: TIMESHARD_SERVER, comma-separated, or 127.0.0.1:50051). */
  servers?: string[];
  /** A directory of PEM files, or false for plaintext (default: TIMESHARD_TLS_DIR, else plaintext). */
  tlsDir?: string | false;
  /** The name checked against the node's certificate (default: TIMESHARD_TLS_SERVER_NAME). */
  tlsServerName?: string;
  /** The role token, sent as `authorization: Bearer` (default: TIMESHARD_TOKEN; "" for none). */
  token?: string;
}

/** The resolved form: what every channel of a client or worker is made with. */
export interface Security {
  credentials: ChannelCredentials;
  options: ChannelOptions;
  metadata: Metadata;
}

export function resolveServers(servers?: string[]): string[] {
  const list = servers ?? (process.env.TIMESHARD_SERVER || DEFAULT_SERVER).split(",");
  const clean = list.map((s) => s.trim()).filter((s) => s.length > 0);
  if (clean.length === 0) {
    throw new ConfigError("no node address: pass servers or set TIMESHARD_SERVER=host:port");
  }
  for (const address of clean) {
    if (!/^(\[[0-9a-fA-F:]+\]|[^:\s]+):\d{1,5}$/.test(address)) {
      throw new ConfigError(`bad node address ${JSON.stringify(address)}: expected host:port`);
    }
  }
  return clean;
}

function readPem(dir: string, name: string): Buffer {
  const path = join(dir, name);
  let data: Buffer;
  try {
    data = readFileSync(path);
  } catch (err) {
    throw new ConfigError(`TLS: can not read ${path}: ${(err as Error).message}`);
  }
  if (!data.includes("-----BEGIN")) throw new ConfigError(`TLS: ${path} is not a PEM file`);
  return data;
}

export function resolveSecurity(opts: ConnectOptions = {}): Security {
  const dir = opts.tlsDir === undefined ? process.env.TIMESHARD_TLS_DIR || "" : opts.tlsDir;
  const token = (opts.token ?? process.env.TIMESHARD_TOKEN ?? "").trim();
  const metadata = new Metadata();
  if (token) metadata.set("authorization", `Bearer ${token}`);
  if (!dir) return { credentials: credentials.createInsecure(), options: {}, metadata };
  const ca = readPem(dir, "ca.pem");
  const hasCert = existsSync(join(dir, "client.pem")) || existsSync(join(dir, "client-key.pem"));
  const cert = hasCert ? readPem(dir, "client.pem") : null;
  const key = hasCert ? readPem(dir, "client-key.pem") : null;
  const serverName = opts.tlsServerName ?? process.env.TIMESHARD_TLS_SERVER_NAME ?? "";
  return {
    credentials: credentials.createSsl(ca, key, cert),
    options: serverName ? { "grpc.ssl_target_name_override": serverName } : {},
    metadata,
  };
}
