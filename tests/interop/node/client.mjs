#!/usr/bin/env node
// Drive the official RocketMQ 5 Node.js client (rocketmq-client-nodejs 1.0.8) as a test peer.
// Installed by `make interop-deps` (npm ci in this directory). Same command line as
// ../python_client.py:
//
//   produce --endpoint HOST:PORT --topic T --count N [--tag X] [--keys K] [--body-prefix P]
//       -> {"ids": [...]}            message i has the body "<P>-<i>"
//   consume --endpoint HOST:PORT --group G --topic T --await-seconds S --expect N
//           [--max-rounds R] [--invisible-seconds I] [--ack] [--change-invisible-seconds C]
//           [--no-ack-first] [--start-only]
//       -> {"messages": [{"id", "body", "tag", "keys", "topic", "attempt"}],
//           "receives": <calls>, "empty_receives": <count>, "errors": [...]}
//       --start-only -> {"started": true, "endpoints": [...], "settings": true, "heartbeat": "OK"}
//
// One JSON line on stdout and exit 0; on failure a message on stderr and a non-zero exit (1 for
// an error, 2 for bad usage, 3 when the whole run overran --deadline-seconds). Errors of single
// operations inside the receive loop are reported in "errors" instead. The client's own log
// goes to stderr (warnings and errors; everything with RMQ_INTEROP_VERBOSE=1).
//
// What this client (1.0.8) requires of the server, read from its source (src/ in the package):
// - Startup: QueryRoute for every topic (3 attempts, 1 s then 2 s apart, each with a 3 s
//   deadline; throws when none succeeded), then a Telemetry stream per broker endpoint of the
//   route, on which it writes Settings. With topics configured (a SimpleConsumer always; the
//   producer here passes its topic) startup waits WITHOUT a timeout for the first Telemetry
//   answer carrying `settings`; an answer with neither settings nor another known command is
//   status-checked and rejects startup when not OK. If the server ends the stream the client
//   reopens it after 1 s and writes Settings again, forever.
// - Producer settings answer: `backoff_policy` must be exponential_backoff (an assert, thrown
//   inside the stream's data handler) and `publishing.max_body_size` replaces the 4 MiB default
//   (0 makes every send fail); `validate_message_type` is taken from it too.
// - QueryRoute: queues are used only if `id == 0` (the client compares the QUEUE id with
//   MASTER_BROKER_ID) and the permission fits (READ/READ_WRITE to receive, WRITE/READ_WRITE to
//   send): every broker needs a queue 0 or it is never used, and a route without one makes
//   receive throw "No readable message queue found". The gRPC target is host:port of
//   `broker.endpoints.addresses` (scheme unused). Sends require `accept_message_types` to
//   contain NORMAL. SendMessage is retried on other queues (up to 3 attempts) on error.
// - Received messages: `system_properties.body_digest` must be set (an unset one throws
//   while decoding the batch); MD5/SHA1 are compared as upper-case hex, CRC32 as a decimal
//   string (Python wants hex, so use MD5). GZIP bodies are inflated. `delivery_attempt`,
//   `receipt_handle`, `message_id`, `tag`, `keys`, `queue_offset` are read as sent.
// - ReceiveMessage: gRPC deadline = awaitDuration + requestTimeout (3 s); the stream is read to
//   its end and its `status` checked (MESSAGE_NOT_FOUND = empty list); INTERNAL_ERROR is
//   retried up to 3 times, 1 s apart. `long_polling_timeout` and `invisible_duration` are sent
//   with millisecond precision.
// - ChangeInvisibleDuration: the response's `receipt_handle` replaces the message's handle.
// - Shutdown: NotifyClientTermination to every route endpoint (an RPC error fails shutdown).
// - Metadata: x-mq-client-id, x-mq-protocol=v2, x-mq-language=HTTP, x-mq-date-time,
//   x-mq-request-id, x-mq-client-version; no authorization header without credentials.

import { format, parseArgs } from 'node:util';
import rocketmq from 'rocketmq-client-nodejs';

const { Producer, SimpleConsumer } = rocketmq;

const REQUEST_TIMEOUT_MS = 3000; // the client's default, stated so deadlines can be computed
const MAX_MESSAGES_PER_RECEIVE = 16;
const CODE_OK = 20000;

class UsageError extends Error {}

function parseCli(argv) {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    strict: true,
    options: {
      endpoint: { type: 'string' },
      topic: { type: 'string' },
      group: { type: 'string' },
      count: { type: 'string' },
      tag: { type: 'string' },
      keys: { type: 'string' },
      'body-prefix': { type: 'string', default: 'msg' },
      filter: { type: 'string', default: '*' },
      'await-seconds': { type: 'string' },
      expect: { type: 'string' },
      'max-rounds': { type: 'string', default: '5' },
      'invisible-seconds': { type: 'string', default: '30' },
      ack: { type: 'boolean', default: false },
      'change-invisible-seconds': { type: 'string' },
      'no-ack-first': { type: 'boolean', default: false },
      'start-only': { type: 'boolean', default: false },
      'deadline-seconds': { type: 'string' },
    },
  });
  const command = positionals[0];
  if (positionals.length !== 1 || (command !== 'produce' && command !== 'consume')) {
    throw new UsageError('usage: client.mjs produce|consume --endpoint HOST:PORT --topic T ...');
  }
  const int = (name, required) => {
    const raw = values[name];
    if (raw === undefined) {
      if (required) throw new UsageError(`${command} needs --${name}`);
      return undefined;
    }
    const n = Number(raw);
    if (!Number.isInteger(n) || n < 0) throw new UsageError(`--${name} must be a whole number`);
    return n;
  };
  for (const name of [ 'endpoint', 'topic' ]) {
    if (!values[name]) throw new UsageError(`${command} needs --${name}`);
  }
  const args = {
    command,
    endpoint: values.endpoint,
    topic: values.topic,
    tag: values.tag,
    keys: values.keys,
    bodyPrefix: values['body-prefix'],
    filter: values.filter,
    ack: values.ack,
    noAckFirst: values['no-ack-first'],
    startOnly: values['start-only'],
  };
  if (command === 'produce') {
    args.count = int('count', true);
  } else {
    if (!values.group) throw new UsageError('consume needs --group');
    args.group = values.group;
    args.awaitSeconds = int('await-seconds', !args.startOnly);
    args.expect = int('expect', !args.startOnly);
    args.maxRounds = int('max-rounds', true);
    args.invisibleSeconds = int('invisible-seconds', true);
    args.changeInvisibleSeconds = int('change-invisible-seconds', false);
    if (args.noAckFirst && !args.ack) throw new UsageError('--no-ack-first only makes sense with --ack');
  }
  const deadline = values['deadline-seconds'];
  args.deadlineSeconds = deadline === undefined ? defaultDeadline(args) : Number(deadline);
  return args;
}

// Start-up and shut-down allowance plus, for consume, every round at its gRPC deadline.
function defaultDeadline(args) {
  const timeout = REQUEST_TIMEOUT_MS / 1000;
  if (args.command === 'produce') return 20 + args.count * 3 * timeout;
  if (args.startOnly) return 30;
  const perRound = args.awaitSeconds + timeout + 1;
  const perMessage = 2 * timeout; // change + ack, in the worst case
  return 20 + args.maxRounds * (perRound + MAX_MESSAGES_PER_RECEIVE * perMessage);
}

// The client's own log, to stderr: the harness shows it when a run fails.
function makeLogger() {
  const verbose = process.env.RMQ_INTEROP_VERBOSE === '1';
  const write = (level, args) => process.stderr.write(`${new Date().toISOString()} ${level} ${format(...args)}\n`);
  return {
    info: (...args) => { if (verbose) write('INFO', args); },
    debug: (...args) => { if (verbose) write('DEBUG', args); },
    warn: (...args) => write('WARN', args),
    error: (...args) => write('ERROR', args),
    close: () => {},
  };
}

function describe(err) {
  return `${err?.name ?? 'Error'}: ${err?.message ?? String(err)}`;
}

async function produce(args, logger) {
  const producer = new Producer({
    endpoints: args.endpoint,
    namespace: '',
    topics: [ args.topic ],
    requestTimeout: REQUEST_TIMEOUT_MS,
    logger,
  });
  await producer.startup();
  const ids = [];
  try {
    for (let i = 0; i < args.count; i++) {
      const receipt = await producer.send({
        topic: args.topic,
        tag: args.tag,
        keys: args.keys ? [ args.keys ] : [],
        body: Buffer.from(`${args.bodyPrefix}-${i}`),
      });
      ids.push(receipt.messageId);
    }
  } finally {
    await producer.shutdown();
  }
  return { ids };
}

// startup() has already proven QueryRoute and the Telemetry settings answer.
async function startOnly(consumer) {
  // Protected in TypeScript, plain properties at run time: the client's own heartbeat request,
  // sent now instead of 10 s after startup.
  const endpointsList = consumer.getTotalRouteEndpoints();
  if (endpointsList.length === 0) throw new Error('startup succeeded but the route has no endpoints');
  for (const endpoints of endpointsList) {
    const res = await consumer.rpcClientManager.heartbeat(endpoints, consumer.wrapHeartbeatRequest(),
      REQUEST_TIMEOUT_MS);
    const status = res.getStatus();
    if (!status || status.getCode() !== CODE_OK) {
      throw new Error(`Heartbeat to ${endpoints.facade}: code ${status?.getCode()} ${status?.getMessage()}`);
    }
  }
  return { started: true, endpoints: endpointsList.map(e => e.facade).sort(), settings: true, heartbeat: 'OK' };
}

async function receiveLoop(consumer, args) {
  const messages = [];
  const errors = [];
  const seen = new Set();
  let receives = 0;
  let empty = 0;
  while (receives < args.maxRounds && (args.expect === 0 || messages.length < args.expect)) {
    receives++;
    let batch;
    try {
      batch = await consumer.receive(MAX_MESSAGES_PER_RECEIVE, args.invisibleSeconds * 1000);
    } catch (err) {
      errors.push(`receive #${receives}: ${describe(err)}`);
      continue;
    }
    if (batch.length === 0) empty++;
    for (const msg of batch) {
      messages.push({
        id: msg.messageId,
        body: msg.body.toString('utf8'),
        tag: msg.tag || null,
        keys: [ ...msg.keys ].sort(),
        topic: msg.topic,
        attempt: msg.deliveryAttempt ?? null,
      });
      if (msg.corrupted) errors.push(`message ${msg.messageId}: body digest mismatch (corrupted)`);
      const firstTime = !seen.has(msg.messageId);
      seen.add(msg.messageId);
      try {
        if (args.changeInvisibleSeconds !== undefined) {
          await consumer.changeInvisibleDuration(msg, args.changeInvisibleSeconds * 1000);
        }
        if (args.ack && !(args.noAckFirst && firstTime)) await consumer.ack(msg);
      } catch (err) {
        errors.push(`message ${msg.messageId}: ${describe(err)}`);
      }
    }
  }
  return { messages, receives, empty_receives: empty, errors };
}

async function consume(args, logger) {
  const consumer = new SimpleConsumer({
    endpoints: args.endpoint,
    namespace: '',
    consumerGroup: args.group,
    subscriptions: new Map([[ args.topic, args.filter ]]),
    awaitDuration: (args.awaitSeconds ?? 5) * 1000,
    requestTimeout: REQUEST_TIMEOUT_MS,
    logger,
  });
  await consumer.startup();
  try {
    return args.startOnly ? await startOnly(consumer) : await receiveLoop(consumer, args);
  } finally {
    await consumer.shutdown();
  }
}

function exit(code) {
  // Explicit exit: the client keeps timers and gRPC channels; the output is flushed first.
  process.stdout.write('', () => process.stderr.write('', () => process.exit(code)));
}

async function main() {
  let args;
  try {
    args = parseCli(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`client.mjs: ${err.message}\n`);
    return exit(2);
  }
  // Bound the whole run: startup waits for the Telemetry answer without a timeout.
  setTimeout(() => {
    process.stderr.write(`client.mjs: deadline of ${args.deadlineSeconds}s exceeded, giving up\n`);
    process.exit(3);
  }, args.deadlineSeconds * 1000);
  const started = Date.now();
  const logger = makeLogger();
  let result;
  try {
    result = args.command === 'produce' ? await produce(args, logger) : await consume(args, logger);
  } catch (err) {
    const elapsed = ((Date.now() - started) / 1000).toFixed(1);
    let cause = '';
    for (let c = err?.cause; c; c = c.cause) cause += ` <- ${describe(c)}`;
    process.stderr.write(`client.mjs ${args.command} failed after ${elapsed}s: ${describe(err)}${cause}\n`);
    return exit(1);
  }
  process.stdout.write(JSON.stringify(result) + '\n');
  return exit(0);
}

main();
