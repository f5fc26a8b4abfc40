// A throwaway CA and a server certificate for 127.0.0.1, made with the openssl command.
import { execFile } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { Server, freePort, tempDir, type ServerOptions } from "./server.js";

function openssl(dir: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile("openssl", args, { cwd: dir, timeout: 60_000 }, (err, _out, stderr) => {
      if (err) reject(new Error(`openssl ${args.join(" ")}: ${err.message}\n${stderr}`));
      else resolve();
    });
  });
}

/** Certificate files in a fresh directory; `ca` is the CA certificate (PEM). */
export interface Certificates {
  dir: string;
  caFile: string;
  certFile: string;
  keyFile: string;
  ca: Buffer;
}

/** Makes a CA and a server certificate for IP 127.0.0.1 / DNS localhost signed by it. */
export async function makeCertificates(): Promise<Certificates> {
  const dir = tempDir("redis-lock-node-tls-");
  await openssl(dir, ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=redis-lock test CA"]);
  await openssl(dir, ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"]);
  writeFileSync(join(dir, "ext.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n");
  await openssl(dir, ["x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf"]);
  return {
    dir,
    caFile: join(dir, "ca.crt"),
    certFile: join(dir, "server.crt"),
    keyFile: join(dir, "server.key"),
    ca: readFileSync(join(dir, "ca.crt")),
  };
}

/** A server with the module and a TLS listener on `tlsPort` (clients need no certificate)
 *  besides its plain `port` (which the kit's own checks use). */
export class TlsServer extends Server {
  constructor(readonly tlsPort: number, readonly certs: Certificates, options: ServerOptions = {}) {
    super({
      ...options,
      args: [
        "--tls-port", String(tlsPort),
        "--tls-cert-file", certs.certFile,
        "--tls-key-file", certs.keyFile,
        "--tls-ca-cert-file", certs.caFile,
        "--tls-auth-clients", "no",
        ...(options.args ?? []),
      ],
    });
  }

  /** Makes certificates, picks a TLS port and starts the server. */
  static async startTls(options: ServerOptions = {}): Promise<TlsServer> {
    const certs = await makeCertificates();
    const s = new TlsServer(await freePort(), certs, options);
    await s.start();
    return s;
  }

  /** `rediss://127.0.0.1:tlsPort`. */
  get tlsUrl(): string {
    return `rediss://${this.host}:${this.tlsPort}`;
  }
}
