// Starts the reference `@modelcontextprotocol/server-everything` (Streamable HTTP) for
// the tests that put it behind mcpyard: on a free port (it reads PORT and cannot use 0),
// proven to serve before the test goes on, stopped with SIGINT.
//
//   const everything = await startEverything();   // { url, port, stop, log }
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = dirname(fileURLToPath(import.meta.url));
const EVERYTHING = join(HERE, 'node_modules', '@modelcontextprotocol', 'server-everything', 'dist', 'index.js');

/** How long server-everything may take to listen, and to exit on SIGINT. */
const EVERYTHING_START_MS = 10_000;
const EVERYTHING_STOP_MS = 5_000;
/** A port that was free a moment ago: bind port 0 on loopback, read it, close. */
export function freePort() {
  return new Promise((resolvePort, rejectPort) => {
    const server = createServer();
    server.once('error', rejectPort);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolvePort(port));
    });
  });
}

/**
 * Spawns server-everything's Streamable HTTP transport on `port` (it reads PORT and cannot
 * use 0) and waits, bounded, until it serves there. Rejects with `inUse` set when it failed
 * because the port was taken meanwhile.
 *
 * Its "listening on port" line alone does not prove that it listens: Express 5 calls the
 * listen callback on a bind error too, so on EADDRINUSE it prints that line and then, in
 * the same tick, "Failed to start: Port N is already in use" and exits 1. So after the line,
 * a GET /mcp without a session must get server-everything's 400 answer, and by then no
 * failure may have been printed and the process must still run.
 */
async function spawnEverything(port) {
  const child = spawn(process.execPath, [EVERYTHING, 'streamableHttp'], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, PORT: String(port) },
  });
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);
  // It logs a line per request on stdout: keep reading both pipes (so it never blocks on
  // a full pipe), and keep the tail for error messages.
  let log = '';
  const exited = new Promise((resolveExit) => {
    child.once('exit', (code, signal) => {
      process.removeListener('exit', killOnExit);
      resolveExit({ code, signal });
    });
  });
  const failed = () => child.exitCode !== null || child.signalCode !== null || /Failed to start/.test(log);
  const failure = (what) => {
    const err = new Error(`server-everything on port ${port} ${what}:\n${log}`);
    err.inUse = /EADDRINUSE|already in use/.test(log);
    return err;
  };
  const listening = new Promise((resolveListen, rejectListen) => {
    const onData = (chunk) => {
      log = (log + chunk).slice(-16_384);
      if (/listening on port \d+/.test(log)) resolveListen();
    };
    for (const stream of [child.stdout, child.stderr]) {
      stream.setEncoding('utf8');
      stream.on('data', onData);
    }
    child.once('error', rejectListen);
    exited.then(({ code, signal }) => rejectListen(failure(`exited (code ${code}, signal ${signal}) before listening`)));
  });
  let timer;
  const timeout = new Promise((_, rejectTimeout) => {
    timer = setTimeout(() => rejectTimeout(failure(`did not listen within ${EVERYTHING_START_MS} ms`)), EVERYTHING_START_MS);
  });
  const url = `http://127.0.0.1:${port}/mcp`;
  const serving = async () => {
    await listening;
    assert.match(log, new RegExp(`listening on port ${port}\\b`), 'it listens on the PORT it was given');
    const probe = new AbortController();
    const answer = (async () => {
      try {
        const res = await fetch(url, { signal: probe.signal });
        await res.arrayBuffer();
        return res.status;
      } catch (err) {
        return String(err);
      }
    })();
    // Whatever holds a taken port may never answer: the child's exit settles it first.
    const status = await Promise.race([answer, exited.then(() => 'exited')]);
    probe.abort();
    await new Promise((resolveTick) => setImmediate(resolveTick));
    if (failed()) throw failure('failed to start');
    if (status !== 400) throw failure(`answered GET /mcp without a session with ${status}, not 400`);
  };
  try {
    await Promise.race([serving(), timeout]);
  } catch (err) {
    child.kill('SIGKILL');
    await exited;
    throw err;
  } finally {
    clearTimeout(timer);
  }

  let stopping = null;
  /** SIGINT (its shutdown handler exits 0), SIGKILL if it hangs; resolves with the exit. */
  const stop = () => {
    stopping ??= (async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGINT');
      let killTimer;
      const hang = new Promise((resolveHang) => {
        killTimer = setTimeout(() => {
          child.kill('SIGKILL');
          resolveHang(exited);
        }, EVERYTHING_STOP_MS);
      });
      try {
        return await Promise.race([exited, hang]);
      } finally {
        clearTimeout(killTimer);
      }
    })();
    return stopping;
  };
  return { url, port, stop, log: () => log };
}

/** server-everything on a free port; once more on a new port if that one was taken meanwhile. */
export async function startEverything() {
  try {
    return await spawnEverything(await freePort());
  } catch (err) {
    if (!err.inUse) throw err;
    return spawnEverything(await freePort());
  }
}

