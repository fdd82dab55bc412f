// Starts an mcpyard gateway for the SDK tests: in front of the embedded demo toolkit by
// default, or in front of any exit binding given as YAML (for example a `client` binding
// to an upstream MCP server, see `clientExit`).
//
//   const gw = await startGateway({ workers: 2 });
//   const gw = await startGateway({ workers: 2, exitYaml: clientExit('http://127.0.0.1:3001/mcp') });
//   ... gw.url is http://127.0.0.1:PORT/mcp ...
//   assert.equal(await gw.stop(), 0);
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..', '..');

/** The release binary: $MCPYARD_BIN, else target/release/mcpyard of this repository. */
export const BINARY = process.env.MCPYARD_BIN ?? join(ROOT, 'target', 'release', 'mcpyard');

/** How long the gateway may take to listen, and to drain on SIGTERM. */
const START_TIMEOUT_MS = 10_000;
const STOP_TIMEOUT_MS = 10_000;

/** The exit binding's YAML for a `client` binding to the upstream MCP endpoint `url`. */
export function clientExit(url) {
  return `{ kind: client, server: ${JSON.stringify(url)} }`;
}

/**
 * The test configuration: a server binding `north` whose exit is the demo toolkit, or, with
 * `exitYaml` (the exit binding's value: a flow mapping such as `clientExit(url)`, or a block
 * of `key: value` lines), that binding under the name `up`.
 */
export function configYaml({ workers = 2, progressInterval = '20ms', exitYaml } = {}) {
  const exit = exitYaml === undefined ? null : String(exitYaml).trim();
  if (exit === '') throw new Error('configYaml: exitYaml is empty');
  const exitLines =
    exit === null
      ? [`  demo: { kind: demo, progress_interval: ${progressInterval} }`]
      : exit.includes('\n')
        ? ['  up:', ...exit.split('\n').map((line) => `    ${line}`)]
        : [`  up: ${exit}`];
  return [
    `runtime: { workers: ${workers}, io: auto }`,
    'telemetry: { metrics: 127.0.0.1:0 }',
    'bindings:',
    `  north: { kind: server, listen: 127.0.0.1:0, path: /mcp, exit: ${exit === null ? 'demo' : 'up'} }`,
    ...exitLines,
    '',
  ].join('\n');
}

/**
 * Writes the config (`options.yaml`, or `configYaml(options)`) to a temp file, spawns the
 * gateway and waits (no sleep) for its
 * `listening north 127.0.0.1:PORT` line. Resolves with { url, port, metrics, stop, output }.
 */
export async function startGateway(options = {}) {
  if (!existsSync(BINARY)) {
    throw new Error(`no gateway binary at ${BINARY}: run cargo build --release`);
  }
  const dir = mkdtempSync(join(tmpdir(), 'mcpyard-js-'));
  const config = join(dir, 'mcpyard.yaml');
  writeFileSync(config, options.yaml ?? configYaml(options));

  const child = spawn(BINARY, ['--config', config], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, RUST_BACKTRACE: '1' },
  });
  const output = [];
  let stderr = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (chunk) => {
    stderr += chunk;
  });
  const exited = new Promise((resolveExit) => {
    child.once('exit', (code, signal) => resolveExit({ code, signal }));
  });

  const listening = new Promise((resolveListen, rejectListen) => {
    let north = null;
    let metrics = null;
    const lines = createInterface({ input: child.stdout });
    lines.on('line', (line) => {
      output.push(line);
      const n = /^listening north (\S+:\d+)$/.exec(line);
      if (n) north = n[1];
      const m = /^listening metrics (\S+)$/.exec(line);
      if (m) metrics = m[1];
      if (north && metrics) resolveListen({ north, metrics });
    });
    child.once('error', rejectListen);
    exited.then(({ code, signal }) =>
      rejectListen(
        new Error(`gateway exited (code ${code}, signal ${signal}) before listening:\n${stderr}`),
      ),
    );
  });
  let timer;
  const timeout = new Promise((_, rejectTimeout) => {
    timer = setTimeout(
      () => rejectTimeout(new Error(`gateway did not listen within ${START_TIMEOUT_MS} ms:\n${stderr}`)),
      START_TIMEOUT_MS,
    );
  });
  let addrs;
  try {
    addrs = await Promise.race([listening, timeout]);
  } catch (err) {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
    throw err;
  } finally {
    clearTimeout(timer);
  }

  let stopping = null;
  /** SIGTERM, then the exit code once the gateway drained (SIGKILL and throw on a hang). */
  const stop = () => {
    stopping ??= (async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      let killTimer;
      const hang = new Promise((_, rejectHang) => {
        killTimer = setTimeout(() => {
          child.kill('SIGKILL');
          rejectHang(new Error(`gateway did not exit within ${STOP_TIMEOUT_MS} ms of SIGTERM:\n${stderr}`));
        }, STOP_TIMEOUT_MS);
      });
      try {
        const { code, signal } = await Promise.race([exited, hang]);
        if (signal) throw new Error(`gateway died of ${signal}:\n${stderr}`);
        return code;
      } finally {
        clearTimeout(killTimer);
        rmSync(dir, { recursive: true, force: true });
      }
    })();
    return stopping;
  };

  return {
    url: `http://${addrs.north}/mcp`,
    port: Number(addrs.north.split(':').pop()),
    metrics: addrs.metrics,
    output,
    stderr: () => stderr,
    stop,
  };
}
