// mcpyard's `proxy` binding in front of three real MCP servers, driven by the official
// TypeScript SDK client: two Python-SDK upstreams (tests/py/upstreams/sdk_upstream.py,
// `alpha`, and `beta` behind a bearer token that its client binding forwards from the
// agent) and the reference server-everything (`every`). The merged lists must be each
// upstream's own items with `<toolkit>__` / `<toolkit>+` on their names, in route order;
// calls, prompts, resources and completions must reach their own upstream; the
// upstreams' sampling and elicitation requests must reach this client and their answers
// go back to the route that asked.
import { describe, before, after, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CreateMessageRequestSchema, ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { startGateway } from './gateway.mjs';
import { startEverything } from './everything.mjs';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..', '..');
const PYTHON = join(ROOT, '.venv', 'bin', 'python');
const SDK_UPSTREAM = join(ROOT, 'tests', 'py', 'upstreams', 'sdk_upstream.py');

const RPC = { timeout: 5_000 };
const TEST_TIMEOUT_MS = 30_000;
const TOKEN = 's3cret-beta';
const BETA_TOOLS = ['echo', 'add', 'whoami', 'sample', 'elicit_name'];
const EVERY_TOOLS = ['echo', 'get-*', 'trigger-sampling-request', 'trigger-elicitation-request'];

/** `*`-only globs, as the proxy's allow-lists. */
function globMatch(pattern, name) {
  const re = new RegExp(`^${pattern.split('*').map((p) => p.replace(/[.+?^${}()|[\]\\]/g, '\\$&')).join('.*')}$`);
  return re.test(name);
}

/** Starts the Python SDK upstream; resolves with { url, stop }. */
async function startSdkUpstream(name, token) {
  if (!existsSync(PYTHON)) throw new Error(`${PYTHON} is missing: run tests/py/run.sh first (tests/run.sh does)`);
  const args = [SDK_UPSTREAM, '--mode', 'sse-resumable', '--name', name];
  if (token) args.push('--token', token);
  const child = spawn(PYTHON, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (c) => {
    stderr = (stderr + c).slice(-8_000);
  });
  const url = await new Promise((resolveUrl, rejectUrl) => {
    const timer = setTimeout(() => rejectUrl(new Error(`upstream ${name} did not listen:\n${stderr}`)), 15_000);
    createInterface({ input: child.stdout }).on('line', (line) => {
      const m = /^listening (\S+)$/.exec(line);
      if (m) {
        clearTimeout(timer);
        resolveUrl(m[1]);
      }
    });
    child.once('exit', (code) => rejectUrl(new Error(`upstream ${name} exited ${code}:\n${stderr}`)));
  });
  return {
    url,
    stop: () => {
      child.kill('SIGTERM');
      return new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)));
    },
  };
}

function proxyYaml(urls) {
  const route = (name, tools) =>
    `      - { toolkit: ${name}, exit: ${name}${tools ? `, tools: ${JSON.stringify(tools)}` : ''} }`;
  return [
    'runtime: { workers: 2, io: auto }',
    'telemetry: { metrics: 127.0.0.1:0 }',
    'bindings:',
    '  north: { kind: server, listen: 127.0.0.1:0, path: /mcp, exit: tools }',
    '  tools:',
    '    kind: proxy',
    '    routes:',
    route('alpha'),
    route('beta', BETA_TOOLS),
    route('every', EVERY_TOOLS),
    `  alpha: { kind: client, server: "${urls.alpha}" }`,
    `  beta: { kind: client, server: "${urls.beta}", authorization: forward }`,
    `  every: { kind: client, server: "${urls.every}" }`,
    '',
  ].join('\n');
}

/** A client with sampling and elicitation, answering both and recording what it was asked. */
async function connect(url, headers = {}) {
  const client = new Client({ name: 'mcpyard-js-proxy', version: '0.1.0' }, { capabilities: { sampling: {}, elicitation: {} } });
  const asked = { sampling: [], elicitation: [] };
  client.setRequestHandler(CreateMessageRequestSchema, async (request) => {
    asked.sampling.push(request.params);
    return { model: 'test-model', role: 'assistant', content: { type: 'text', text: 'pong' }, stopReason: 'endTurn' };
  });
  client.setRequestHandler(ElicitRequestSchema, async (request) => {
    asked.elicitation.push(request.params);
    return { action: 'accept', content: { name: 'Ada' } };
  });
  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
  await client.connect(transport, RPC);
  return { client, transport, asked };
}

async function allPages(fetch, key) {
  const items = [];
  let cursor;
  for (let i = 0; i < 1000; i++) {
    const page = await fetch(cursor ? { cursor } : undefined, RPC);
    items.push(...page[key]);
    cursor = page.nextCursor;
    if (!cursor) return items;
  }
  throw new Error('more than 1000 pages');
}

const LISTS = [
  ['tools', (c) => c.listTools.bind(c), 'name', '__'],
  ['prompts', (c) => c.listPrompts.bind(c), 'name', '__'],
  ['resources', (c) => c.listResources.bind(c), 'uri', '+'],
  ['resourceTemplates', (c) => c.listResourceTemplates.bind(c), 'uriTemplate', '+'],
];

describe('the proxy in front of two SDK upstreams and server-everything', { timeout: 120_000 }, () => {
  let upstreams;
  let gateway;
  let via;

  before(async () => {
    const [alpha, beta, every] = await Promise.all([
      startSdkUpstream('alpha'),
      startSdkUpstream('beta', TOKEN),
      startEverything(),
    ]);
    upstreams = { alpha, beta, every };
    gateway = await startGateway({ yaml: proxyYaml({ alpha: alpha.url, beta: beta.url, every: every.url }) });
    via = await connect(gateway.url, { authorization: `Bearer ${TOKEN}` });
  });

  after(async () => {
    if (via) {
      await via.transport.terminateSession().catch(() => {});
      await via.client.close();
    }
    if (gateway) assert.equal(await gateway.stop(), 0);
    if (upstreams) await Promise.all(Object.values(upstreams).map((u) => u.stop()));
  });

  test('every list is the routes\' items, all pages, renamed and filtered', { timeout: TEST_TIMEOUT_MS }, async () => {
    const want = Object.fromEntries(LISTS.map(([k]) => [k, []]));
    for (const route of ['alpha', 'beta', 'every']) {
      const headers = route === 'beta' ? { authorization: `Bearer ${TOKEN}` } : {};
      const direct = await connect(upstreams[route].url, headers);
      try {
        for (const [kind, fetchOf, key, sep] of LISTS) {
          const allow = { beta: BETA_TOOLS, every: EVERY_TOOLS }[route];
          for (const item of await allPages(fetchOf(direct.client), kind)) {
            if (kind === 'tools' && allow && !allow.some((p) => globMatch(p, item.name))) continue;
            want[kind].push({ ...item, [key]: `${route}${sep}${item[key]}` });
          }
        }
      } finally {
        await direct.transport.terminateSession().catch(() => {});
        await direct.client.close();
      }
    }
    for (const [kind, fetchOf] of LISTS) {
      const page = await fetchOf(via.client)(undefined, RPC);
      assert.equal(page.nextCursor, undefined, 'one merged page');
      assert.deepEqual(page[kind], want[kind], kind);
    }
  });

  test('calls, prompts, resources and completions reach their own upstream', { timeout: TEST_TIMEOUT_MS }, async () => {
    const beta = await via.client.callTool({ name: 'beta__whoami', arguments: {} }, undefined, RPC);
    assert.deepEqual(beta.structuredContent, { name: 'beta', authorization: `Bearer ${TOKEN}` });
    const alpha = await via.client.callTool({ name: 'alpha__add', arguments: { a: 1, b: 2 } }, undefined, RPC);
    assert.deepEqual(alpha.structuredContent, { sum: 3 });
    const sum = await via.client.callTool({ name: 'every__get-sum', arguments: { a: 40, b: 2 } }, undefined, RPC);
    assert.match(sum.content[0].text, /42/);
    const prompt = await via.client.getPrompt({ name: 'alpha__greet', arguments: { name: 'Ada' } }, RPC);
    assert.equal(prompt.messages[0].content.text, 'Please greet Ada.');
    const read = await via.client.readResource({ uri: 'beta+res://readme' }, RPC);
    assert.equal(read.contents[0].uri, 'beta+res://readme');
    const done = await via.client.complete(
      { ref: { type: 'ref/resource', uri: 'alpha+res://items/{id}' }, argument: { name: 'id', value: '4' } },
      RPC,
    );
    assert.deepEqual(done.completion.values, ['4', '40', '41', '42']);
    await assert.rejects(
      via.client.callTool({ name: 'every__gzip-file-as-resource', arguments: {} }, undefined, RPC),
      /Unknown tool: every__gzip-file-as-resource/,
    );
  });

  test('sampling and elicitation from two routes come back to the route that asked', { timeout: TEST_TIMEOUT_MS }, async () => {
    const [a, b] = await Promise.all([
      via.client.callTool({ name: 'alpha__elicit_name', arguments: { via: 'request' } }, undefined, RPC),
      via.client.callTool({ name: 'beta__elicit_name', arguments: { via: 'request' } }, undefined, RPC),
    ]);
    assert.equal(a.content[0].text, 'accept: Ada');
    assert.equal(b.content[0].text, 'accept: Ada');
    const sampled = await via.client.callTool({ name: 'beta__sample', arguments: { prompt: 'ping' } }, undefined, RPC);
    assert.equal(sampled.content[0].text, 'beta heard: pong');
    const before = via.asked.sampling.length;
    const everySampled = await via.client.callTool(
      { name: 'every__trigger-sampling-request', arguments: { prompt: 'hi', maxTokens: 10 } },
      undefined,
      RPC,
    );
    assert.match(JSON.stringify(everySampled.content), /pong/);
    assert.equal(via.asked.sampling.length, before + 1);
  });
});
