// A storm of ReceiveMessage long polls from @grpc/grpc-js: the second load generator of
// bench/storm.py, not Python, to tell a server's losses from the Python client's.
//
//   node bench/storm_node/storm.mjs '<json config>'
//
// config: {target, proto_root, polls, connections, window_s, await_ms, group, topic,
//          telemetry, warm, tls: {root_pem, name} | null, deadline_s}
// Opens `connections` channels of their own (each its own HTTP/2 connection) and sends
// `polls` ReceiveMessage calls spread over them, each at a random instant of the first
// `window_s` seconds (with `warm`, the connections are up before the window opens; with
// `telemetry`, each connection's client sends its SimpleConsumer settings over Telemetry
// first, as the official clients do). Prints one JSON line: every call's status and when it
// ended, in seconds from the window's start.
import fs from 'node:fs';
import path from 'node:path';
import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

const config = JSON.parse(process.argv[2]);
const definition = protoLoader.loadSync(
  path.join(config.proto_root, 'apache/rocketmq/v2/service.proto'),
  { includeDirs: [config.proto_root], keepCase: true, longs: Number, enums: String, defaults: false, oneofs: true },
);
const api = grpc.loadPackageDefinition(definition).apache.rocketmq.v2;
const codeName = Object.fromEntries(Object.entries(grpc.status).map(([k, v]) => [v, k]));

function duration(ms) {
  return { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1e6 };
}

function credentials() {
  if (!config.tls) return [grpc.credentials.createInsecure(), {}];
  return [
    grpc.credentials.createSsl(Buffer.from(config.tls.root_pem)),
    { 'grpc.ssl_target_name_override': config.tls.name, 'grpc.default_authority': config.tls.name },
  ];
}

const [creds, tlsOptions] = credentials();
const [host, port] = [config.target.slice(0, config.target.lastIndexOf(':')), config.target.slice(config.target.lastIndexOf(':') + 1)];
const runId = `${process.pid}-${Date.now()}`;

function makeClient(index) {
  const client = new api.MessagingService(config.target, creds, {
    ...tlsOptions,
    'grpc.use_local_subchannel_pool': 1, // a connection of its own
    'grpc.max_receive_message_length': 64 << 20,
  });
  const metadata = new grpc.Metadata();
  metadata.set('x-mq-client-id', `storm-node-${runId}-${index}`);
  metadata.set('x-mq-language', 'NODE_JS');
  metadata.set('x-mq-protocol', 'v2');
  metadata.set('x-mq-client-version', '5.0.0');
  return { client, metadata, telemetry: null };
}

function settings() {
  return {
    settings: {
      client_type: 'SIMPLE_CONSUMER',
      access_point: { scheme: 'IPv4', addresses: [{ host, port: Number(port) }] },
      request_timeout: duration(3000),
      subscription: {
        group: { name: config.group },
        subscriptions: [{ topic: { name: config.topic }, expression: { type: 'TAG', expression: '*' } }],
        long_polling_timeout: duration(config.await_ms),
      },
      user_agent: { language: 'NODE_JS', version: '5.0.0', platform: 'linux' },
    },
  };
}

function openTelemetry(c, deadlineMs) {
  return new Promise((resolve) => {
    const stream = c.client.Telemetry(c.metadata);
    c.telemetry = stream;
    const timer = setTimeout(() => resolve('DEADLINE'), deadlineMs);
    stream.once('data', () => { clearTimeout(timer); resolve('OK'); });
    stream.on('error', (e) => { clearTimeout(timer); resolve(codeName[e.code] ?? String(e.code)); });
    stream.write(settings());
  });
}

function waitReady(c, deadlineMs) {
  return new Promise((resolve) => {
    c.client.waitForReady(Date.now() + deadlineMs, (e) => resolve(e ? 'UNAVAILABLE' : 'OK'));
  });
}

function receiveRequest() {
  return {
    group: { name: config.group },
    message_queue: { topic: { name: config.topic }, broker: { name: '' } },
    filter_expression: { type: 'TAG', expression: '*' },
    batch_size: 1,
    invisible_duration: duration(30000),
    auto_renew: false,
    long_polling_timeout: duration(config.await_ms),
  };
}

function poll(c, start, record) {
  return new Promise((resolve) => {
    record.sent = (performance.now() - start) / 1000;
    const call = c.client.ReceiveMessage(receiveRequest(), c.metadata, {
      deadline: Date.now() + config.await_ms + (config.deadline_extra_ms ?? 3000),
    });
    call.on('data', (response) => {
      if (response.status) record.answer = response.status.code;
      else if (response.message) record.messages = (record.messages ?? 0) + 1;
    });
    call.on('error', (e) => {
      record.status = codeName[e.code] ?? String(e.code);
      record.details = e.details;
    });
    call.on('status', (s) => {
      record.ended = (performance.now() - start) / 1000;
      if (record.status === undefined) record.status = codeName[s.code] ?? String(s.code);
      resolve();
    });
  });
}

async function main() {
  const clients = Array.from({ length: config.connections }, (_, i) => makeClient(i));
  const setup = {};
  const count = (k) => { setup[k] = (setup[k] ?? 0) + 1; };
  const prepare = async (c) => {
    if (config.warm || config.telemetry) count(await waitReady(c, 30000));
    if (config.telemetry) count(`telemetry ${await openTelemetry(c, 30000)}`);
  };
  if (config.warm) await Promise.all(clients.map(prepare));
  const start = performance.now();
  const records = [];
  const calls = [];
  // Each connection's polls arrive at one instant of the window (a client coming back).
  const perConnection = clients.map(() => []);
  for (let i = 0; i < config.polls; i++) perConnection[i % clients.length].push(i);
  clients.forEach((c, k) => {
    const at = Math.random() * config.window_s * 1000;
    calls.push(new Promise((resolve) => setTimeout(async () => {
      if (!config.warm) await prepare(c);
      const mine = perConnection[k].map((i) => {
        const record = { conn: k };
        records.push(record);
        return poll(c, start, record);
      });
      await Promise.all(mine);
      resolve();
    }, at)));
  });
  await Promise.all(calls);
  for (const c of clients) {
    if (c.telemetry) c.telemetry.cancel();
    c.client.close();
  }
  // Exit once the line is flushed: a pipe takes it in pieces, and exit() drops the rest.
  process.stdout.write(JSON.stringify({ generator: 'node', setup, calls: records }) + '\n', () => process.exit(0));
}

main().catch((e) => { console.error(e); process.exit(1); });
