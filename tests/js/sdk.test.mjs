// Scenario tests of mcpyard with the official MCP TypeScript SDK (Streamable HTTP,
// protocol 2025-11-25), against the embedded demo toolkit, with one and two workers.
import { describe, before, after, test } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  CallToolResultSchema,
  LATEST_PROTOCOL_VERSION,
  LoggingMessageNotificationSchema,
  ResourceUpdatedNotificationSchema,
  ToolListChangedNotificationSchema,
} from '@modelcontextprotocol/sdk/types.js';
import { startGateway } from './gateway.mjs';

/** Per-request SDK timeout, and per-test timeout: a hang fails fast. */
const RPC = { timeout: 5_000 };
const TEST_TIMEOUT_MS = 15_000;
/** How long a test waits for a server notification. */
const NOTIFY_TIMEOUT_MS = 5_000;

const BUILTIN_TOOLS = ['echo', 'add', 'progress', 'add_tool', 'remove_tool', 'touch_resource', 'log'];

/** A queue of notifications of one kind: `next()` resolves with the next one, or rejects. */
function inbox(client, schema) {
  const items = [];
  const waiters = [];
  client.setNotificationHandler(schema, (notification) => {
    const waiter = waiters.shift();
    if (waiter) waiter(notification);
    else items.push(notification);
  });
  return {
    pending: () => items.length,
    /** Drops the queued notifications that `keep` refuses. */
    discard(keep) {
      const kept = items.filter(keep);
      items.length = 0;
      items.push(...kept);
    },
    next(what, ms = NOTIFY_TIMEOUT_MS) {
      if (items.length > 0) return Promise.resolve(items.shift());
      return new Promise((resolveNext, rejectNext) => {
        const timer = setTimeout(() => {
          const i = waiters.indexOf(deliver);
          if (i >= 0) waiters.splice(i, 1);
          rejectNext(new Error(`no ${what} notification within ${ms} ms`));
        }, ms);
        const deliver = (n) => {
          clearTimeout(timer);
          resolveNext(n);
        };
        waiters.push(deliver);
      });
    },
  };
}

/**
 * Resolves once the client's GET event stream is attached: events sent before that are
 * not delivered (a fresh GET starts at the present), and the SDK opens it in the
 * background after `initialize`, with no hook. So: ask the `log` tool for an emergency
 * message (above any level) until one arrives on the stream; a bounded number of tries.
 */
async function getStreamReady(client, messages) {
  for (let attempt = 1; attempt <= 40; attempt++) {
    const data = `probe-${attempt}`;
    await client.callTool({ name: 'log', arguments: { level: 'emergency', message: data } }, undefined, RPC);
    try {
      await messages.next('probe notifications/message', 250);
      messages.discard((n) => !String(n.params.data).startsWith('probe-'));
      return;
    } catch {
      // The GET stream is not attached yet: try again.
    }
  }
  throw new Error('the GET event stream never delivered a notifications/message');
}

/** The text of a tool result's one text content. */
function text(result) {
  assert.equal(result.content.length, 1, JSON.stringify(result));
  assert.equal(result.content[0].type, 'text');
  return result.content[0].text;
}

for (const workers of [1, 2]) {
  describe(`mcpyard with ${workers} worker(s), via the TypeScript SDK`, { timeout: 120_000 }, () => {
    let gateway;
    let client;
    let transport;
    let toolsChanged;
    let resourcesUpdated;
    let logMessages;

    before(async () => {
      gateway = await startGateway({ workers });
      client = new Client({ name: 'mcpyard-js-tests', version: '0.1.0' });
      toolsChanged = inbox(client, ToolListChangedNotificationSchema);
      resourcesUpdated = inbox(client, ResourceUpdatedNotificationSchema);
      logMessages = inbox(client, LoggingMessageNotificationSchema);
      transport = new StreamableHTTPClientTransport(new URL(gateway.url));
      await client.connect(transport, RPC);
      await getStreamReady(client, logMessages);
    });

    after(async () => {
      try {
        await client?.close();
      } finally {
        if (gateway) assert.equal(await gateway.stop(), 0, 'gateway exit code after SIGTERM');
      }
    });

    test('initialize: server info, protocol version, capabilities', { timeout: TEST_TIMEOUT_MS }, () => {
      const info = client.getServerVersion();
      assert.equal(info.name, 'mcpyard');
      assert.match(info.version, /^\d+\.\d+\.\d+/);
      assert.equal(transport.protocolVersion, LATEST_PROTOCOL_VERSION);
      assert.match(transport.sessionId, /^[\x21-\x7e]+$/, 'a visible-ASCII session id');
      const caps = client.getServerCapabilities();
      assert.deepEqual(caps.tools, { listChanged: true });
      assert.equal(caps.resources.subscribe, true);
      assert.equal(typeof caps.resources.listChanged, 'boolean');
      assert.equal(typeof caps.prompts, 'object');
      assert.deepEqual(caps.logging, {});
      assert.deepEqual(caps.completions, {});
    });

    test('tools/list: the built-in catalog', { timeout: TEST_TIMEOUT_MS }, async () => {
      const { tools, nextCursor } = await client.listTools({}, RPC);
      assert.equal(nextCursor, undefined);
      assert.deepEqual(
        tools.map((t) => t.name),
        BUILTIN_TOOLS,
      );
      const add = tools.find((t) => t.name === 'add');
      assert.equal(add.title, 'Add');
      assert.deepEqual(add.inputSchema.required, ['a', 'b']);
      assert.deepEqual(add.outputSchema.properties, { sum: { type: 'number' } });
    });

    test('prompts/list: greet', { timeout: TEST_TIMEOUT_MS }, async () => {
      const { prompts } = await client.listPrompts({}, RPC);
      assert.equal(prompts.length, 1);
      assert.equal(prompts[0].name, 'greet');
      assert.deepEqual(
        prompts[0].arguments.map((a) => [a.name, a.required]),
        [
          ['name', true],
          ['style', false],
        ],
      );
    });

    test('resources/list: two pages, three resources', { timeout: TEST_TIMEOUT_MS }, async () => {
      const first = await client.listResources({}, RPC);
      assert.equal(first.resources.length, 2);
      assert.equal(first.nextCursor, 'page-2');
      const second = await client.listResources({ cursor: first.nextCursor }, RPC);
      assert.equal(second.nextCursor, undefined);
      const all = [...first.resources, ...second.resources];
      assert.deepEqual(
        all.map((r) => [r.uri, r.name, r.mimeType]),
        [
          ['demo://readme', 'readme', 'text/markdown'],
          ['demo://config', 'config', 'application/json'],
          ['demo://status', 'status', 'text/plain'],
        ],
      );
    });

    test('resources/templates/list: demo://items/{id}', { timeout: TEST_TIMEOUT_MS }, async () => {
      const { resourceTemplates } = await client.listResourceTemplates({}, RPC);
      assert.equal(resourceTemplates.length, 1);
      assert.equal(resourceTemplates[0].uriTemplate, 'demo://items/{id}');
      assert.equal(resourceTemplates[0].name, 'item');
      assert.equal(resourceTemplates[0].mimeType, 'text/plain');
    });

    test('tools/call echo and add (structuredContent)', { timeout: TEST_TIMEOUT_MS }, async () => {
      const echo = await client.callTool({ name: 'echo', arguments: { text: 'héllo "yard"\n' } }, undefined, RPC);
      assert.notEqual(echo.isError, true);
      assert.equal(text(echo), 'héllo "yard"\n');

      const add = await client.callTool({ name: 'add', arguments: { a: 2, b: 40 } }, undefined, RPC);
      assert.notEqual(add.isError, true);
      assert.deepEqual(add.structuredContent, { sum: 42 });
      assert.equal(text(add), '42');

      const float = await client.callTool({ name: 'add', arguments: { a: 0.5, b: 0.25 } }, undefined, RPC);
      assert.deepEqual(float.structuredContent, { sum: 0.75 });

      const refused = await client.callTool({ name: 'add', arguments: { a: 1 } }, undefined, RPC);
      assert.equal(refused.isError, true);
      assert.match(text(refused), /required/);
    });

    test('tools/call of an unknown tool is a JSON-RPC error', { timeout: TEST_TIMEOUT_MS }, async () => {
      await assert.rejects(
        client.callTool({ name: 'no_such_tool', arguments: {} }, undefined, RPC),
        (err) => err.code === -32602 && /Unknown tool/.test(err.message),
      );
    });

    test('tools/call progress: increasing progress, then the result', { timeout: TEST_TIMEOUT_MS }, async () => {
      const steps = 5;
      const seen = [];
      const result = await client.callTool({ name: 'progress', arguments: { steps } }, CallToolResultSchema, {
        ...RPC,
        onprogress: (p) => seen.push(p),
      });
      assert.equal(text(result), `done after ${steps} steps`);
      assert.deepEqual(
        seen.map((p) => [p.progress, p.total]),
        Array.from({ length: steps }, (_, i) => [i + 1, steps]),
      );
      assert.equal(seen[0].message, `step 1 of ${steps}`);
    });

    test('prompts/get greet', { timeout: TEST_TIMEOUT_MS }, async () => {
      const plain = await client.getPrompt({ name: 'greet', arguments: { name: 'Ada' } }, RPC);
      assert.equal(plain.description, 'A greeting for Ada');
      assert.deepEqual(plain.messages, [{ role: 'user', content: { type: 'text', text: 'Please greet Ada.' } }]);
      const formal = await client.getPrompt({ name: 'greet', arguments: { name: 'Ada', style: 'formal' } }, RPC);
      assert.equal(formal.messages[0].content.text, 'Please write a formal greeting addressed to Ada.');
      await assert.rejects(
        client.getPrompt({ name: 'greet', arguments: { name: 'Ada', style: 'rude' } }, RPC),
        (err) => err.code === -32602,
      );
    });

    test('resources/read demo://readme and demo://items/42', { timeout: TEST_TIMEOUT_MS }, async () => {
      const readme = await client.readResource({ uri: 'demo://readme' }, RPC);
      assert.equal(readme.contents.length, 1);
      assert.equal(readme.contents[0].uri, 'demo://readme');
      assert.equal(readme.contents[0].mimeType, 'text/markdown');
      assert.match(readme.contents[0].text, /^# mcpyard demo toolkit\n/);

      const item = await client.readResource({ uri: 'demo://items/42' }, RPC);
      assert.deepEqual(item.contents, [{ uri: 'demo://items/42', mimeType: 'text/plain', text: 'item 42' }]);

      await assert.rejects(client.readResource({ uri: 'demo://nope' }, RPC), (err) => err.code === -32002);
    });

    test('completion/complete for a prompt and a template', { timeout: TEST_TIMEOUT_MS }, async () => {
      const style = await client.complete(
        { ref: { type: 'ref/prompt', name: 'greet' }, argument: { name: 'style', value: 'f' } },
        RPC,
      );
      assert.deepEqual(style.completion, { values: ['formal'], total: 1, hasMore: false });
      const ids = await client.complete(
        { ref: { type: 'ref/resource', uri: 'demo://items/{id}' }, argument: { name: 'id', value: '4' } },
        RPC,
      );
      assert.deepEqual(ids.completion.values, ['42']);
    });

    test('logging/setLevel filters the log tool', { timeout: TEST_TIMEOUT_MS }, async () => {
      assert.deepEqual(await client.setLoggingLevel('warning', RPC), {});
      const below = await client.callTool({ name: 'log', arguments: { level: 'info', message: 'quiet' } }, undefined, RPC);
      assert.equal(text(below), 'not sent: below the session level warning');
      const sent = await client.callTool({ name: 'log', arguments: { level: 'error', message: 'loud' } }, undefined, RPC);
      assert.equal(text(sent), 'logged at error');
      const message = await logMessages.next('notifications/message');
      assert.deepEqual(message.params, { level: 'error', logger: 'demo', data: 'loud' });
      // The info message, sent first on the same stream, would have come before.
      logMessages.discard((n) => !String(n.params.data).startsWith('probe-'));
      assert.equal(logMessages.pending(), 0, 'nothing but the error message was sent');
    });

    test('resources/subscribe + touch_resource -> resources/updated', { timeout: TEST_TIMEOUT_MS }, async () => {
      assert.deepEqual(await client.subscribeResource({ uri: 'demo://status' }, RPC), {});
      const touched = await client.callTool({ name: 'touch_resource', arguments: { uri: 'demo://status' } }, undefined, RPC);
      assert.equal(text(touched), 'touched demo://status: notified 1 session(s)');
      const updated = await resourcesUpdated.next('notifications/resources/updated');
      assert.deepEqual(updated.params, { uri: 'demo://status' });
      const status = await client.readResource({ uri: 'demo://status' }, RPC);
      assert.match(status.contents[0].text, /^demo status: ok\ntouches: [1-9]\d*\n$/);

      assert.deepEqual(await client.unsubscribeResource({ uri: 'demo://status' }, RPC), {});
      const again = await client.callTool({ name: 'touch_resource', arguments: { uri: 'demo://status' } }, undefined, RPC);
      assert.equal(text(again), 'touched demo://status: notified 0 session(s)');
    });

    test('add_tool -> tools/list_changed, listTools shows it; remove_tool', { timeout: TEST_TIMEOUT_MS }, async (t) => {
      const name = `shout_w${workers}`;
      const other = new Client({ name: 'mcpyard-js-tests-2', version: '0.1.0' });
      const otherToolsChanged = inbox(other, ToolListChangedNotificationSchema);
      const otherMessages = inbox(other, LoggingMessageNotificationSchema);
      await other.connect(new StreamableHTTPClientTransport(new URL(gateway.url)), RPC);
      t.after(() => other.close());
      await getStreamReady(other, otherMessages);
      assert.notEqual(other.transport.sessionId, transport.sessionId);
      const added = await client.callTool({ name: 'add_tool', arguments: { name } }, undefined, RPC);
      assert.equal(text(added), `added tool ${name}`);
      const changed = await toolsChanged.next('notifications/tools/list_changed (add)');
      assert.equal(changed.method, 'notifications/tools/list_changed');
      // Every session hears of it, on whichever worker it lives.
      const otherChanged = await otherToolsChanged.next('notifications/tools/list_changed on the 2nd session');
      assert.equal(otherChanged.method, 'notifications/tools/list_changed');
      const seenByOther = await other.listTools({}, RPC);
      assert.ok(seenByOther.tools.some((t) => t.name === name));

      const { tools } = await client.listTools({}, RPC);
      assert.deepEqual(
        tools.map((t) => t.name),
        [...BUILTIN_TOOLS, name],
      );
      const called = await client.callTool({ name, arguments: { text: 'HEY' } }, undefined, RPC);
      assert.equal(text(called), 'HEY');

      const removed = await client.callTool({ name: 'remove_tool', arguments: { name } }, undefined, RPC);
      assert.equal(text(removed), `removed tool ${name}`);
      await toolsChanged.next('notifications/tools/list_changed (remove)');
      await otherToolsChanged.next('notifications/tools/list_changed (remove) on the 2nd session');
      const after = await client.listTools({}, RPC);
      assert.deepEqual(
        after.tools.map((t) => t.name),
        BUILTIN_TOOLS,
      );
    });

    test('terminateSession: DELETE, then the session id gets 404', { timeout: TEST_TIMEOUT_MS }, async () => {
      const sessionId = transport.sessionId;
      assert.ok(sessionId);
      await transport.terminateSession();
      assert.equal(transport.sessionId, undefined);
      const res = await fetch(gateway.url, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
          'mcp-session-id': sessionId,
          'mcp-protocol-version': LATEST_PROTOCOL_VERSION,
        },
        body: JSON.stringify({ jsonrpc: '2.0', id: 99, method: 'tools/list', params: {} }),
        signal: AbortSignal.timeout(5_000),
      });
      await res.arrayBuffer();
      assert.equal(res.status, 404);
    });
  });
}
