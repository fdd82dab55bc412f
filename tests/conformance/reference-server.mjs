// Reference MCP server for the conformance runs (tests/conformance/run.sh).
//
// Built on the official TypeScript SDK (@modelcontextprotocol/sdk, pinned in
// package.json) and written from the "Server Implementation Requirements" that
// each server scenario of @modelcontextprotocol/conformance prints. It is the
// upstream that the suite tests once directly and once through mcpyard
// (server -> client bindings), so the two runs differ only by the gateway.
//
// Streamable HTTP, stateful (one SDK Server per session), with an in-memory
// event store so SSE streams are resumable (Last-Event-ID, priming events,
// retry field) and the test_reconnection tool can close its stream mid-call.
//
// Usage: node reference-server.mjs [--port N]   (default 0: the kernel picks)
// Prints "listening http://127.0.0.1:PORT/mcp" on stdout when ready.

import { randomUUID } from 'node:crypto';
import { deflateSync, crc32 } from 'node:zlib';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { createMcpExpressApp } from '@modelcontextprotocol/sdk/server/express.js';
import {
  CallToolRequestSchema,
  CompleteRequestSchema,
  CreateMessageResultSchema,
  ElicitResultSchema,
  GetPromptRequestSchema,
  ListPromptsRequestSchema,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListToolsRequestSchema,
  McpError,
  ErrorCode,
  ReadResourceRequestSchema,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
  isInitializeRequest,
} from '@modelcontextprotocol/sdk/types.js';

// ---------------------------------------------------------------- test assets

function pngChunk(type, data) {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(data.length);
  const td = Buffer.concat([Buffer.from(type, 'ascii'), data]);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(td) >>> 0);
  return Buffer.concat([len, td, crc]);
}

// A 1x1 red RGB PNG, built here rather than pasted.
function redPixelPng() {
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(1, 0); // width
  ihdr.writeUInt32BE(1, 4); // height
  ihdr[8] = 8; // bit depth
  ihdr[9] = 2; // colour type: RGB
  const raw = Buffer.from([0, 0xff, 0x00, 0x00]); // filter byte + one pixel
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    pngChunk('IHDR', ihdr),
    pngChunk('IDAT', deflateSync(raw)),
    pngChunk('IEND', Buffer.alloc(0)),
  ]);
}

// 10 ms of 8 kHz mono 8-bit silence as a WAV file.
function silentWav() {
  const samples = 80;
  const b = Buffer.alloc(44 + samples, 0x80);
  b.write('RIFF', 0, 'ascii');
  b.writeUInt32LE(36 + samples, 4);
  b.write('WAVE', 8, 'ascii');
  b.write('fmt ', 12, 'ascii');
  b.writeUInt32LE(16, 16); // fmt chunk size
  b.writeUInt16LE(1, 20); // PCM
  b.writeUInt16LE(1, 22); // channels
  b.writeUInt32LE(8000, 24); // sample rate
  b.writeUInt32LE(8000, 28); // byte rate
  b.writeUInt16LE(1, 32); // block align
  b.writeUInt16LE(8, 34); // bits per sample
  b.write('data', 36, 'ascii');
  b.writeUInt32LE(samples, 40);
  return b;
}

const PNG_B64 = redPixelPng().toString('base64');
const WAV_B64 = silentWav().toString('base64');

// ---------------------------------------------------------------- event store

// Events are kept per stream in arrival order; an event id is
// "<streamId>~<seq>", so a Last-Event-ID names both the stream and the position.
class MemoryEventStore {
  constructor() {
    this.streams = new Map(); // streamId -> [{ seq, message }]
    this.seq = 0;
  }
  async storeEvent(streamId, message) {
    const seq = ++this.seq;
    if (!this.streams.has(streamId)) this.streams.set(streamId, []);
    this.streams.get(streamId).push({ seq, message });
    return `${streamId}~${seq}`;
  }
  parse(eventId) {
    const i = eventId.lastIndexOf('~');
    if (i <= 0) return undefined;
    const seq = Number(eventId.slice(i + 1));
    return Number.isInteger(seq) ? { streamId: eventId.slice(0, i), seq } : undefined;
  }
  async getStreamIdForEventId(eventId) {
    const p = this.parse(eventId);
    return p && this.streams.has(p.streamId) ? p.streamId : undefined;
  }
  async replayEventsAfter(lastEventId, { send }) {
    const p = this.parse(lastEventId);
    if (!p || !this.streams.has(p.streamId)) return '';
    for (const ev of this.streams.get(p.streamId)) {
      // Priming events are stored as {} and carry no message.
      if (ev.seq > p.seq && ev.message && Object.keys(ev.message).length > 0) {
        await send(`${p.streamId}~${ev.seq}`, ev.message);
      }
    }
    return p.streamId;
  }
}

// ---------------------------------------------------------------- definitions

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const noArgs = { type: 'object', properties: {} };

const TOOLS = [
  { name: 'test_simple_text', description: 'Returns one text block', inputSchema: noArgs },
  { name: 'test_image_content', description: 'Returns a PNG image block', inputSchema: noArgs },
  { name: 'test_audio_content', description: 'Returns a WAV audio block', inputSchema: noArgs },
  { name: 'test_embedded_resource', description: 'Returns an embedded text resource', inputSchema: noArgs },
  { name: 'test_multiple_content_types', description: 'Returns text, image and resource blocks', inputSchema: noArgs },
  { name: 'test_tool_with_logging', description: 'Sends three info log messages while it runs', inputSchema: noArgs },
  { name: 'test_error_handling', description: 'Always fails with isError: true', inputSchema: noArgs },
  { name: 'test_tool_with_progress', description: 'Reports progress 0, 50 and 100 of 100', inputSchema: noArgs },
  {
    name: 'test_sampling',
    description: 'Asks the client for an LLM completion (sampling/createMessage)',
    inputSchema: { type: 'object', properties: { prompt: { type: 'string' } }, required: ['prompt'] },
  },
  {
    name: 'test_elicitation',
    description: 'Asks the client for user input (elicitation/create)',
    inputSchema: { type: 'object', properties: { message: { type: 'string' } }, required: ['message'] },
  },
  { name: 'test_elicitation_sep1034_defaults', description: 'Elicitation with defaults for every primitive type', inputSchema: noArgs },
  { name: 'test_elicitation_sep1330_enums', description: 'Elicitation with the five enum schema shapes', inputSchema: noArgs },
  {
    name: 'json_schema_2020_12_tool',
    description: 'Tool whose input schema uses JSON Schema 2020-12 keywords',
    inputSchema: {
      $schema: 'https://json-schema.org/draft/2020-12/schema',
      type: 'object',
      $defs: {
        address: { type: 'object', properties: { street: { type: 'string' }, city: { type: 'string' } } },
      },
      properties: { name: { type: 'string' }, address: { $ref: '#/$defs/address' } },
      additionalProperties: false,
    },
  },
  { name: 'test_reconnection', description: 'Closes its SSE stream mid-call; the result is replayed on resume', inputSchema: noArgs },
];

const RESOURCES = [
  { uri: 'test://static-text', name: 'static-text', description: 'A fixed text resource', mimeType: 'text/plain' },
  { uri: 'test://static-binary', name: 'static-binary', description: 'A fixed PNG resource', mimeType: 'image/png' },
  { uri: 'test://watched-resource', name: 'watched-resource', description: 'A resource to subscribe to', mimeType: 'text/plain' },
];

const TEMPLATES = [
  {
    uriTemplate: 'test://template/{id}/data',
    name: 'template-data',
    description: 'Data for an id',
    mimeType: 'application/json',
  },
];

const PROMPTS = [
  { name: 'test_simple_prompt', description: 'A prompt without arguments' },
  {
    name: 'test_prompt_with_arguments',
    description: 'A prompt with two arguments',
    arguments: [
      { name: 'arg1', description: 'First argument', required: true },
      { name: 'arg2', description: 'Second argument', required: true },
    ],
  },
  {
    name: 'test_prompt_with_embedded_resource',
    description: 'A prompt embedding a resource',
    arguments: [{ name: 'resourceUri', description: 'URI to embed', required: true }],
  },
  { name: 'test_prompt_with_image', description: 'A prompt with an image' },
];

const text = (t) => ({ type: 'text', text: t });

async function callTool(server, req, extra) {
  const args = req.params.arguments ?? {};
  const log = (data) =>
    extra.sendNotification({ method: 'notifications/message', params: { level: 'info', logger: 'reference', data } });
  switch (req.params.name) {
    case 'test_simple_text':
      return { content: [text('This is a simple text response for testing.')] };
    case 'test_image_content':
      return { content: [{ type: 'image', data: PNG_B64, mimeType: 'image/png' }] };
    case 'test_audio_content':
      return { content: [{ type: 'audio', data: WAV_B64, mimeType: 'audio/wav' }] };
    case 'test_embedded_resource':
      return {
        content: [
          {
            type: 'resource',
            resource: { uri: 'test://embedded-resource', mimeType: 'text/plain', text: 'This is an embedded resource content.' },
          },
        ],
      };
    case 'test_multiple_content_types':
      return {
        content: [
          text('Multiple content types test:'),
          { type: 'image', data: PNG_B64, mimeType: 'image/png' },
          {
            type: 'resource',
            resource: {
              uri: 'test://mixed-content-resource',
              mimeType: 'application/json',
              text: JSON.stringify({ test: 'data', value: 123 }),
            },
          },
        ],
      };
    case 'test_tool_with_logging':
      await log('Tool execution started');
      await sleep(50);
      await log('Tool processing data');
      await sleep(50);
      await log('Tool execution completed');
      return { content: [text('Logging tool finished')] };
    case 'test_error_handling':
      return { isError: true, content: [text('This tool intentionally returns an error for testing')] };
    case 'test_tool_with_progress': {
      const token = req.params._meta?.progressToken;
      for (const [i, p] of [0, 50, 100].entries()) {
        if (i > 0) await sleep(50);
        if (token !== undefined) {
          await extra.sendNotification({
            method: 'notifications/progress',
            params: { progressToken: token, progress: p, total: 100, message: `step ${i + 1} of 3` },
          });
        }
      }
      return { content: [text('Progress tool finished')] };
    }
    case 'test_sampling': {
      if (!server.getClientCapabilities()?.sampling) {
        return { isError: true, content: [text('The client does not support sampling')] };
      }
      const r = await extra.sendRequest(
        {
          method: 'sampling/createMessage',
          params: { messages: [{ role: 'user', content: text(String(args.prompt ?? '')) }], maxTokens: 100 },
        },
        CreateMessageResultSchema,
      );
      const reply = r.content?.type === 'text' ? r.content.text : JSON.stringify(r.content);
      return { content: [text(`LLM response: ${reply}`)] };
    }
    case 'test_elicitation': {
      if (!server.getClientCapabilities()?.elicitation) {
        return { isError: true, content: [text('The client does not support elicitation')] };
      }
      const r = await extra.sendRequest(
        {
          method: 'elicitation/create',
          params: {
            message: String(args.message ?? ''),
            requestedSchema: {
              type: 'object',
              properties: {
                username: { type: 'string', description: "User's response" },
                email: { type: 'string', description: "User's email address" },
              },
              required: ['username', 'email'],
            },
          },
        },
        ElicitResultSchema,
      );
      return { content: [text(`User response: action=${r.action}, content=${JSON.stringify(r.content ?? {})}`)] };
    }
    case 'test_elicitation_sep1034_defaults': {
      const r = await extra.sendRequest(
        {
          method: 'elicitation/create',
          params: {
            message: 'Accept to use the defaults',
            requestedSchema: {
              type: 'object',
              properties: {
                name: { type: 'string', default: 'John Doe' },
                age: { type: 'integer', default: 30 },
                score: { type: 'number', default: 95.5 },
                status: { type: 'string', enum: ['active', 'inactive', 'pending'], default: 'active' },
                verified: { type: 'boolean', default: true },
              },
            },
          },
        },
        ElicitResultSchema,
      );
      return { content: [text(`Elicitation completed: action=${r.action}, content=${JSON.stringify(r.content ?? {})}`)] };
    }
    case 'test_elicitation_sep1330_enums': {
      const r = await extra.sendRequest(
        {
          method: 'elicitation/create',
          params: {
            message: 'Pick from each list',
            requestedSchema: {
              type: 'object',
              properties: {
                untitledSingle: { type: 'string', enum: ['option1', 'option2', 'option3'] },
                titledSingle: {
                  type: 'string',
                  oneOf: [
                    { const: 'value1', title: 'First Option' },
                    { const: 'value2', title: 'Second Option' },
                    { const: 'value3', title: 'Third Option' },
                  ],
                },
                legacyEnum: {
                  type: 'string',
                  enum: ['opt1', 'opt2', 'opt3'],
                  enumNames: ['Option One', 'Option Two', 'Option Three'],
                },
                untitledMulti: { type: 'array', items: { type: 'string', enum: ['option1', 'option2', 'option3'] } },
                titledMulti: {
                  type: 'array',
                  items: {
                    anyOf: [
                      { const: 'value1', title: 'First Choice' },
                      { const: 'value2', title: 'Second Choice' },
                      { const: 'value3', title: 'Third Choice' },
                    ],
                  },
                },
              },
            },
          },
        },
        ElicitResultSchema,
      );
      return { content: [text(`Elicitation completed: action=${r.action}, content=${JSON.stringify(r.content ?? {})}`)] };
    }
    case 'json_schema_2020_12_tool':
      return { content: [text(`Received: ${JSON.stringify(args)}`)] };
    case 'test_reconnection':
      // Give the priming event time to reach the client, then drop the stream;
      // the result below is stored in the event store and replayed when the
      // client comes back with Last-Event-ID.
      await sleep(50);
      extra.closeSSEStream?.();
      await sleep(100);
      return { content: [text('Reconnection test completed')] };
    default:
      throw new McpError(ErrorCode.InvalidParams, `Unknown tool: ${req.params.name}`);
  }
}

function readResource(uri) {
  if (uri === 'test://static-text') {
    return { contents: [{ uri, mimeType: 'text/plain', text: 'This is the content of the static text resource.' }] };
  }
  if (uri === 'test://static-binary') {
    return { contents: [{ uri, mimeType: 'image/png', blob: PNG_B64 }] };
  }
  if (uri === 'test://watched-resource') {
    return { contents: [{ uri, mimeType: 'text/plain', text: 'Watched resource content.' }] };
  }
  const m = /^test:\/\/template\/([^/]+)\/data$/.exec(uri);
  if (m) {
    const id = decodeURIComponent(m[1]);
    return {
      contents: [
        { uri, mimeType: 'application/json', text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }) },
      ],
    };
  }
  throw new McpError(-32002, `Resource not found: ${uri}`, { uri });
}

function getPrompt(req) {
  const args = req.params.arguments ?? {};
  switch (req.params.name) {
    case 'test_simple_prompt':
      return { messages: [{ role: 'user', content: text('This is a simple prompt for testing.') }] };
    case 'test_prompt_with_arguments':
      return {
        messages: [{ role: 'user', content: text(`Prompt with arguments: arg1='${args.arg1}', arg2='${args.arg2}'`) }],
      };
    case 'test_prompt_with_embedded_resource':
      return {
        messages: [
          {
            role: 'user',
            content: {
              type: 'resource',
              resource: { uri: String(args.resourceUri ?? ''), mimeType: 'text/plain', text: 'Embedded resource content for testing.' },
            },
          },
          { role: 'user', content: text('Please process the embedded resource above.') },
        ],
      };
    case 'test_prompt_with_image':
      return {
        messages: [
          { role: 'user', content: { type: 'image', data: PNG_B64, mimeType: 'image/png' } },
          { role: 'user', content: text('Please analyze the image above.') },
        ],
      };
    default:
      throw new McpError(ErrorCode.InvalidParams, `Unknown prompt: ${req.params.name}`);
  }
}

const COMPLETIONS = ['paris', 'park', 'party', 'test', 'testing', 'tested'];

function newServer() {
  const server = new Server(
    { name: 'mcpyard-conformance-reference', version: '1.0.0' },
    {
      capabilities: {
        tools: { listChanged: true },
        resources: { subscribe: true, listChanged: true },
        prompts: { listChanged: true },
        logging: {},
        completions: {},
      },
    },
  );
  const subscriptions = new Set();
  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: TOOLS }));
  server.setRequestHandler(CallToolRequestSchema, (req, extra) => callTool(server, req, extra));
  server.setRequestHandler(ListResourcesRequestSchema, async () => ({ resources: RESOURCES }));
  server.setRequestHandler(ListResourceTemplatesRequestSchema, async () => ({ resourceTemplates: TEMPLATES }));
  server.setRequestHandler(ReadResourceRequestSchema, async (req) => readResource(req.params.uri));
  server.setRequestHandler(SubscribeRequestSchema, async (req) => {
    subscriptions.add(req.params.uri);
    return {};
  });
  server.setRequestHandler(UnsubscribeRequestSchema, async (req) => {
    subscriptions.delete(req.params.uri);
    return {};
  });
  server.setRequestHandler(ListPromptsRequestSchema, async () => ({ prompts: PROMPTS }));
  server.setRequestHandler(GetPromptRequestSchema, async (req) => getPrompt(req));
  server.setRequestHandler(CompleteRequestSchema, async (req) => {
    const prefix = String(req.params.argument?.value ?? '');
    const values = COMPLETIONS.filter((v) => v.startsWith(prefix));
    return { completion: { values, total: values.length, hasMore: false } };
  });
  // logging/setLevel is answered by the SDK's Server because the logging
  // capability is declared.
  return server;
}

// ---------------------------------------------------------------- HTTP

const sessions = new Map(); // session id -> { transport, server }

function jsonRpcError(res, status, code, message) {
  res.status(status).json({ jsonrpc: '2.0', error: { code, message }, id: null });
}

// Host validation (DNS rebinding protection) comes with createMcpExpressApp
// for a loopback host: a non-local Host header is answered 403.
const app = createMcpExpressApp({ host: '127.0.0.1' });

app.post('/mcp', async (req, res) => {
  const sid = req.headers['mcp-session-id'];
  try {
    if (sid) {
      const s = sessions.get(sid);
      if (!s) return jsonRpcError(res, 404, -32001, 'Session not found');
      return await s.transport.handleRequest(req, res, req.body);
    }
    if (!isInitializeRequest(req.body)) {
      return jsonRpcError(res, 400, -32000, 'Bad Request: no session id and not an initialize request');
    }
    const server = newServer();
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      eventStore: new MemoryEventStore(),
      retryInterval: 500,
      onsessioninitialized: (id) => sessions.set(id, { transport, server }),
    });
    transport.onclose = () => {
      if (transport.sessionId) sessions.delete(transport.sessionId);
    };
    await server.connect(transport);
    await transport.handleRequest(req, res, req.body);
  } catch (e) {
    process.stderr.write(`reference-server: POST failed: ${e?.stack ?? e}\n`);
    if (!res.headersSent) jsonRpcError(res, 500, -32603, 'Internal server error');
  }
});

async function sessionRequest(req, res) {
  const sid = req.headers['mcp-session-id'];
  const s = sid ? sessions.get(sid) : undefined;
  if (!s) return jsonRpcError(res, sid ? 404 : 400, sid ? -32001 : -32000, sid ? 'Session not found' : 'Missing session id');
  try {
    await s.transport.handleRequest(req, res);
  } catch (e) {
    process.stderr.write(`reference-server: ${req.method} failed: ${e?.stack ?? e}\n`);
    if (!res.headersSent) jsonRpcError(res, 500, -32603, 'Internal server error');
  }
}
app.get('/mcp', sessionRequest);
app.delete('/mcp', sessionRequest);

const portArg = process.argv.indexOf('--port');
const port = portArg > 0 ? Number(process.argv[portArg + 1]) : 0;
const http = app.listen(port, '127.0.0.1', () => {
  const { port: bound } = http.address();
  process.stdout.write(`listening http://127.0.0.1:${bound}/mcp\n`);
});

function shutdown() {
  for (const { transport } of sessions.values()) transport.close().catch(() => {});
  http.close(() => process.exit(0));
  http.closeAllConnections?.();
  setTimeout(() => process.exit(0), 2000).unref();
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);
