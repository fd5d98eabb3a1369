#!/usr/bin/env node
// Drive the official RocketMQ 5 Node.js client (rocketmq-client-nodejs 1.0.8) as a test peer.
// Installed by `make interop-deps` (npm ci in this directory). Same command line and output as
// ../python_client.py:
//
//   produce --endpoint HOST:PORT --topic T --count N [--tag X] [--keys K] [--body-prefix P]
//           [--message-groups G] [--priority P]
//       -> {"ids": [...]}            message i has the body "<P>-<i>"; with G, FIFO messages,
//                                    message i in group "g<i mod G>"; with --priority,
//                                    priority messages of priority P (1.0.8 types a priority
//                                    0 message NORMAL, though it sends the priority)
//   consume --endpoint HOST:PORT --group G --topic T --await-seconds S --expect N
//           [--max-rounds R] [--invisible-seconds I] [--ack] [--change-invisible-seconds C]
//           [--no-ack-first] [--start-only] [--batch B]
//       -> {"messages": [{"id", "body", "tag", "keys", "topic", "attempt", "group", "priority",
//                         "receive", "received_at", "ack_at"}],
//           "receives": <calls>, "empty_receives": <count>, "errors": [...]}
//           (received_at: epoch seconds the receive returned; ack_at: when the ack was sent)
//       --start-only -> {"started": true, "endpoints": [...], "settings": true, "heartbeat": "OK"}
//   push --endpoint HOST:PORT --group G --topic T --expect N [--fail-first] [--consume-seconds S]
//       -> {"fifo": <settings said FIFO>, "messages": [{"id", "body", "group", "attempt",
//           "started_at", "ended_at", "result"}], "errors": [...]}
//       A PushConsumer whose listener records every call; --fail-first answers FAILURE the first
//       time an id arrives; stops once N distinct ids were consumed with SUCCESS.
//   lite --endpoint HOST:PORT --group G --topic PARENT --lite-topics a,b [--other c] --push
//        [--over-quota]
//       -> {"quota", "max_size", "messages": [{"id", "body", "lite_topic"}],
//           "over_quota": {"code", "type"} | null, "errors": [...]}
//       A LitePushConsumer (RocketMQ 5.5; 1.0.8 has no lite simple consumer) of the lite group G
//       bound to PARENT: subscribes a, b, sends one message to each lite topic (and to c),
//       consumes until a and b each delivered one; --over-quota then subscribes one lite topic
//       past the settings' quota and reports the client's error.
//   features --endpoint HOST:PORT --topic T --group G --delay-seconds D
//       -> {"committed", "rolled_back", "orphan", "timed", "recalled": ids,
//           "recall_answer": the id RecallMessage returned, "deliver_ms": the timed message's
//           delivery time (epoch ms), "checked": ids the transaction checker was asked about,
//           "received": [{"id", "at_ms"}], "errors": [...]}
//       A committed, a rolled-back and an orphaned (never ended) transactional message, whose
//       checker commits what it is asked about; a message timed D seconds ahead, and another
//       one recalled at once; then a SimpleConsumer receives (acking) until the committed, the
//       orphan and the timed one came and two more seconds passed.
//   soak --endpoints "H:P;H:P" --role ROLE --topic T --control-dir DIR [--group G] [--prefix PFX]
//        [--rate R] [--message-groups N] [--consume-ms MS] [--invisible-seconds I]
//        [--await-seconds A] [--batch B]
//       -> one JSON event a line, as it happens, until the harness creates DIR/stop-producing
//          (producers; produce-tx then waits for DIR/stop, so late orphans are still
//          checked) or DIR/stop (everyone), looked for every 200 ms: ready, sent,
//          send_error, tx_end, checked, recv, ack, ack_error, recv_error, consumed, corrupt,
//          done (one role of the official-client soak, bench/soak_official.py, which
//          documents the events and their fields). ROLE: produce, produce-fifo (group
//          "g<seq mod N>", N 4) or produce-tx (seq mod 4 == 0 rolled back, == 1 left an
//          orphan, else committed; the checker answers ROLLBACK for seq mod 4 == 0, else
//          COMMIT), R (10) a second, one at a time on a fixed tick, message seq's body
//          "<PFX>-<seq>" (PFX "m"); simple: a SimpleConsumer of G receiving B (16) at a time,
//          invisible I s (15), long polls of A s (5), acking each; push: a PushConsumer of G
//          whose listener takes MS ms (0) and answers SUCCESS. No run deadline; errors after
//          start-up are events, never an exit; 1.0.8 takes only the first of --endpoints
//          (see soakAccessPoint). Exit 0 after done, 1 when the client did not start (within
//          60 s), 2 for bad usage.
//
// One JSON line on stdout and exit 0 (soak: a line per event); on failure a message on stderr
// and a non-zero exit (1 for an error, 2 for bad usage, 3 when the whole run overran
// --deadline-seconds, naming the phase it was in). Errors of single operations inside the
// receive loop are reported in "errors" instead. The client's own log goes to stderr
// (warnings and errors; everything with RMQ_INTEROP_VERBOSE=1).
//
// What this client (1.0.8) requires of the server, read from its source (src/ and dist/ in the
// package):
// - Startup: QueryRoute for every topic (3 attempts, 1 s then 2 s apart, each with a 3 s
//   deadline; throws when none succeeded), then a Telemetry stream per broker endpoint of the
//   route, on which it writes Settings. With topics configured (a SimpleConsumer and a
//   PushConsumer always; the producer here passes its topic) startup waits WITHOUT a timeout
//   for the first Telemetry answer carrying `settings`; an answer with neither settings nor
//   another known command is status-checked and rejects startup when not OK. If the server ends
//   the stream the client reopens it after 1 s and writes Settings again, forever.
// - Producer settings answer: `backoff_policy` must be exponential_backoff (an assert, thrown
//   inside the stream's data handler) and `publishing.max_body_size` replaces the 4 MiB default
//   (0 makes every send fail); `validate_message_type` is taken from it too.
// - QueryRoute: queues are used only if `id == 0` (the client compares the QUEUE id with
//   MASTER_BROKER_ID) and the permission fits (READ/READ_WRITE to receive, WRITE/READ_WRITE to
//   send): every broker needs a queue 0 or it is never used, and a route without one makes
//   receive throw "No readable message queue found". The gRPC target is host:port of
//   `broker.endpoints.addresses` (scheme unused). With validate_message_type, a send needs its
//   type in the queue's `accept_message_types`: NORMAL, FIFO (a message group), DELAY (a
//   delivery timestamp) or TRANSACTION. SendMessage is retried on other queues (up to 3
//   attempts) on error, except a transactional one; a FIFO message goes to the queue its
//   group's SipHash-2-4 picks.
// - Received messages: `system_properties.body_digest` must be set (an unset one throws
//   while decoding the batch); MD5/SHA1 are compared as upper-case hex, CRC32 as a decimal
//   string (Python wants hex, so use MD5). GZIP bodies are inflated. `delivery_attempt`,
//   `receipt_handle`, `message_id`, `tag`, `keys`, `message_group`, `queue_offset` are read
//   as sent.
// - ReceiveMessage: gRPC deadline = awaitDuration + requestTimeout (3 s); the stream is read to
//   its end and its `status` checked (MESSAGE_NOT_FOUND = empty list); INTERNAL_ERROR is
//   retried up to 3 times, 1 s apart. `long_polling_timeout` and `invisible_duration` are sent
//   with millisecond precision.
// - ChangeInvisibleDuration: the response's `receipt_handle` replaces the message's handle.
// - PushConsumer: no receiving before QueryAssignment, sent 1 s after startup and then every
//   5 s to the first endpoint of the topic's route, with `endpoints` = the access point; an
//   empty answer just means "ask again later". Each assignment's `message_queue` is used as
//   is (any queue id, its `broker.endpoints` is where the receives, acks and changes go) and
//   gets its own loop of ReceiveMessage: batch_size = min(settings' receive_batch_size,
//   1024 / assigned queues), `auto_renew` = true, NO invisible_duration, an `attempt_id`
//   (reused when a receive failed), long_polling_timeout = the settings' one (the default
//   30 s when unset), deadline = that + 3 s. A failed receive is retried 1 s later (20 ms
//   after TOO_MANY_REQUESTS); the next receive is sent as soon as a batch arrived, while it is
//   consumed. The client never renews an invisible time itself. Settings read from the
//   Telemetry answer (`subscription` case only): `fifo`, `receive_batch_size` (an unset 0
//   makes every batch_size 0), `long_polling_timeout`, and `backoff_policy` only when it is
//   exponential_backoff (whole seconds of initial/max, multiplier, max_attempts); a
//   customized_backoff (what this proxy answers, as the Apache proxy does for a group with the
//   default retry policy) is ignored, leaving NO retry policy: then a nack's delay is 0 (the
//   message is visible again at once) and a FIFO group's max attempts 1. Standard group: every message of a batch is consumed at once; SUCCESS ->
//   AckMessage, FAILURE -> ChangeInvisibleDuration to the back-off of its delivery attempt
//   (which 1.0.8 passes as a number of MILLISECONDS although the policy computes seconds; 0
//   without a policy), so the message comes back as the next attempt; a non-OK answer other
//   than INVALID_RECEIPT_HANDLE is retried every second. FIFO group (settings' fifo): a batch
//   is consumed one message after another; a FAILURE is retried locally (delivery attempt + 1)
//   until max_attempts, then ForwardMessageToDeadLetterQueue (delivery_attempt,
//   max_delivery_attempts); each message is acked before the next is consumed, so the server
//   must not hand out a group's next message before the ack (the receive that follows the
//   batch is already in flight). Shutdown stops the receive loops, waits for the in-flight
//   receives (up to long polling + 3 s) and the cached messages, 1 s more, then
//   NotifyClientTermination.
// - Transactions: SendMessage with message_type TRANSACTION; commit / rollback are
//   EndTransaction (source CLIENT) to the broker endpoints of the queue sent to. An orphan is
//   resolved through a RecoverOrphanedTransactionCommand on the producer's Telemetry stream
//   (its `message` must decode like a received message, body digest included, and carry
//   `transaction_id`); the checker's answer goes back as EndTransaction with source
//   SERVER_CHECK.
// - Timed messages: `delivery_timestamp` with millisecond precision, message type DELAY.
//   RecallMessage goes to the access point with the send receipt's `recall_handle`; a non-OK
//   status throws, the answer's `message_id` is returned.
// - Shutdown: NotifyClientTermination to every route endpoint (an RPC error fails shutdown).
// - Metadata: x-mq-client-id, x-mq-protocol=v2, x-mq-language=HTTP, x-mq-date-time,
//   x-mq-request-id, x-mq-client-version; no authorization header without credentials.

import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { format, parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import rocketmq from 'rocketmq-client-nodejs';
// Not re-exported by the package's index: the resolution a transaction checker returns.
import definition from 'rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb.js';

const { ClientException, ConsumeResult, LitePushConsumerBuilder, Producer, PushConsumer, SimpleConsumer } = rocketmq;
const { TransactionResolution } = definition;

const COMMANDS = [ 'produce', 'consume', 'push', 'lite', 'features', 'soak' ];
const SOAK_ROLES = [ 'produce', 'produce-fifo', 'produce-tx', 'simple', 'push' ];
const REQUEST_TIMEOUT_MS = 3000; // the client's default, stated so deadlines can be computed
const MAX_MESSAGES_PER_RECEIVE = 16;
const CODE_OK = 20000;
// A PushConsumer's shutdown waits for its in-flight receives: the settings' long polling
// (the proxy's 20 s at most) + the request timeout, then 1 s, then NotifyClientTermination.
const PUSH_SHUTDOWN_ALLOWANCE_S = 30;
// features: the SimpleConsumer's long poll, and how long its receives make invisible.
const FEATURES_AWAIT_MS = 5000;
const FEATURES_INVISIBLE_MS = 20000;
// soak: the control files are looked for every 200 ms; startup and shutdown are bounded.
const SOAK_POLL_MS = 200;
const SOAK_STARTUP_S = 60;
const SOAK_SHUTDOWN_S = PUSH_SHUTDOWN_ALLOWANCE_S;
const TIMED_OUT = Symbol('timed out');

class UsageError extends Error {}

// What the run is doing, for the deadline's message.
let phase = 'starting';

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
      'message-groups': { type: 'string' },
      priority: { type: 'string' },
      filter: { type: 'string', default: '*' },
      'await-seconds': { type: 'string' },
      expect: { type: 'string' },
      'max-rounds': { type: 'string', default: '5' },
      'invisible-seconds': { type: 'string' }, // consume: 30, soak: 15
      batch: { type: 'string', default: String(MAX_MESSAGES_PER_RECEIVE) },
      ack: { type: 'boolean', default: false },
      'change-invisible-seconds': { type: 'string' },
      'no-ack-first': { type: 'boolean', default: false },
      'start-only': { type: 'boolean', default: false },
      'fail-first': { type: 'boolean', default: false },
      'consume-seconds': { type: 'string', default: '0' },
      'delay-seconds': { type: 'string', default: '4' },
      'deadline-seconds': { type: 'string' },
      'lite-topics': { type: 'string' },
      other: { type: 'string' },
      push: { type: 'boolean', default: false },
      'over-quota': { type: 'boolean', default: false },
      endpoints: { type: 'string' },
      role: { type: 'string' },
      'control-dir': { type: 'string' },
      prefix: { type: 'string', default: 'm' },
      rate: { type: 'string', default: '10' },
      'consume-ms': { type: 'string', default: '0' },
    },
  });
  const command = positionals[0];
  if (positionals.length !== 1 || !COMMANDS.includes(command)) {
    throw new UsageError(`usage: client.mjs ${COMMANDS.join('|')} --endpoint HOST:PORT --topic T ... `
      + '(soak: --endpoints "H:P;H:P" --role ROLE --topic T --control-dir DIR ...)');
  }
  const int = (name, required, fallback) => {
    const raw = values[name] ?? fallback;
    if (raw === undefined) {
      if (required) throw new UsageError(`${command} needs --${name}`);
      return undefined;
    }
    const n = Number(raw);
    if (!Number.isInteger(n) || n < 0) throw new UsageError(`--${name} must be a whole number`);
    return n;
  };
  const soak = command === 'soak';
  for (const name of soak ? [ 'endpoints', 'role', 'topic', 'control-dir' ] : [ 'endpoint', 'topic' ]) {
    if (!values[name]) throw new UsageError(`${command} needs --${name}`);
  }
  const args = {
    command,
    endpoint: soak ? soakAccessPoint(values.endpoints) : values.endpoint,
    topic: values.topic,
    tag: values.tag,
    keys: values.keys,
    bodyPrefix: values['body-prefix'],
    filter: values.filter,
    ack: values.ack,
    noAckFirst: values['no-ack-first'],
    startOnly: values['start-only'],
  };
  if (soak && !SOAK_ROLES.includes(values.role)) throw new UsageError(`--role must be one of ${SOAK_ROLES.join('|')}`);
  if (command !== 'produce' && !(soak && values.role.startsWith('produce'))) {
    if (!values.group) throw new UsageError(`${command} ${soak ? `${values.role} ` : ''}needs --group`);
    args.group = values.group;
  }
  if (command === 'produce') {
    args.count = int('count', true);
    args.messageGroups = int('message-groups', false);
    if (args.messageGroups === 0) throw new UsageError('--message-groups must be positive');
    args.priority = int('priority', false);
  } else if (command === 'consume') {
    args.awaitSeconds = int('await-seconds', !args.startOnly);
    args.expect = int('expect', !args.startOnly);
    args.maxRounds = int('max-rounds', true);
    args.invisibleSeconds = int('invisible-seconds', true, 30);
    args.batch = int('batch', true);
    if (args.batch === 0) throw new UsageError('--batch must be positive');
    args.changeInvisibleSeconds = int('change-invisible-seconds', false);
    if (args.noAckFirst && !args.ack) throw new UsageError('--no-ack-first only makes sense with --ack');
  } else if (command === 'push') {
    args.expect = int('expect', true);
    args.failFirst = values['fail-first'];
    args.consumeSeconds = Number(values['consume-seconds']);
    if (!(args.consumeSeconds >= 0)) throw new UsageError('--consume-seconds must be a number >= 0');
  } else if (command === 'lite') {
    if (!values['lite-topics']) throw new UsageError('lite needs --lite-topics');
    if (!values.push) throw new UsageError('lite needs --push (1.0.8 has only a LitePushConsumer)');
    args.liteTopics = values['lite-topics'].split(',').filter(t => t);
    args.other = values.other;
    args.overQuota = values['over-quota'];
  } else if (command === 'soak') {
    args.role = values.role;
    args.controlDir = values['control-dir'];
    args.prefix = values.prefix;
    args.rate = Number(values.rate);
    if (!(args.rate > 0)) throw new UsageError('--rate must be a number > 0');
    args.messageGroups = int('message-groups', true, 4);
    if (args.messageGroups === 0) throw new UsageError('--message-groups must be positive');
    args.consumeMs = int('consume-ms', true);
    args.invisibleSeconds = int('invisible-seconds', true, 15);
    args.awaitSeconds = int('await-seconds', true, 5);
    args.batch = int('batch', true);
    if (args.batch === 0) throw new UsageError('--batch must be positive');
  } else {
    args.delaySeconds = int('delay-seconds', true);
  }
  const deadline = values['deadline-seconds'];
  args.deadlineSeconds = deadline === undefined ? defaultDeadline(args) : Number(deadline);
  if (args.deadlineSeconds !== null && !(args.deadlineSeconds > 0)) {
    throw new UsageError('--deadline-seconds must be positive');
  }
  return args;
}

// soak's --endpoints: every proxy of the fleet, "H:P;H:P". 1.0.8 cannot use more than one:
// its Endpoints splits the string on ';' but joins the addresses into ONE gRPC target,
// "H1:P1,H2:P2" (Endpoints.facade, RpcClient), which grpc-js 1.14 takes for a single DNS
// name: every QueryRoute fails with UNAVAILABLE "Name resolution failed for target
// dns:H1:P1,H2:P2" and startup gives up after its 3 attempts. (The Java client writes such a
// list as "ipv4:H1:P1,H2:P2", which grpc-js resolves to both addresses; 1.0.8 has no scheme
// prefix.) So the client gets the FIRST endpoint, the one form it accepts, unchanged when
// there is only one: that proxy is its access point for good (QueryRoute at startup and
// every 30 s). Everything else follows the route, whose broker endpoints are the address
// the answering proxy advertises (itself), so a Node role stays on the first proxy: while
// that proxy is down its calls fail, and it carries on once the proxy is back on its port.
function soakAccessPoint(endpoints) {
  const first = endpoints.split(';').map(e => e.trim()).find(e => e);
  if (!first) throw new UsageError('--endpoints names no endpoint');
  return first;
}

// Start-up and shut-down allowance plus, for consume, every round at its gRPC deadline.
function defaultDeadline(args) {
  const timeout = REQUEST_TIMEOUT_MS / 1000;
  if (args.command === 'soak') return null; // runs until its control file says stop
  if (args.command === 'produce') return 20 + args.count * 3 * timeout;
  if (args.command === 'push') return 120;
  if (args.command === 'lite') return 90;
  if (args.command === 'features') return 60;
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

function nowSeconds() {
  return Date.now() / 1000;
}

function newProducer(args, logger, checker) {
  return new Producer({
    endpoints: args.endpoint,
    namespace: '',
    topics: [ args.topic ],
    requestTimeout: REQUEST_TIMEOUT_MS,
    logger,
    checker,
  });
}

function newSimpleConsumer(args, logger, awaitMs) {
  return new SimpleConsumer({
    endpoints: args.endpoint,
    namespace: '',
    consumerGroup: args.group,
    subscriptions: new Map([[ args.topic, args.filter ]]),
    awaitDuration: awaitMs,
    requestTimeout: REQUEST_TIMEOUT_MS,
    logger,
  });
}

function newPushConsumer(args, logger, messageListener) {
  return new PushConsumer({
    endpoints: args.endpoint,
    namespace: '',
    consumerGroup: args.group,
    subscriptions: new Map([[ args.topic, '*' ]]),
    messageListener,
    requestTimeout: REQUEST_TIMEOUT_MS,
    logger,
  });
}

async function produce(args, logger) {
  const producer = newProducer(args, logger);
  phase = 'producer startup';
  await producer.startup();
  const ids = [];
  try {
    for (let i = 0; i < args.count; i++) {
      phase = `sending message ${i}`;
      const receipt = await producer.send({
        topic: args.topic,
        tag: args.tag,
        keys: args.keys ? [ args.keys ] : [],
        body: Buffer.from(`${args.bodyPrefix}-${i}`),
        messageGroup: args.messageGroups ? `g${i % args.messageGroups}` : undefined,
        priority: args.priority,
      });
      ids.push(receipt.messageId);
    }
  } finally {
    phase = 'producer shutdown';
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
    phase = `receive #${receives}`;
    let batch;
    try {
      batch = await consumer.receive(args.batch, args.invisibleSeconds * 1000);
    } catch (err) {
      errors.push(`receive #${receives}: ${describe(err)}`);
      continue;
    }
    const receivedAt = nowSeconds();
    if (batch.length === 0) empty++;
    for (const msg of batch) {
      const record = {
        id: msg.messageId,
        body: msg.body.toString('utf8'),
        tag: msg.tag || null,
        keys: [ ...msg.keys ].sort(),
        topic: msg.topic,
        attempt: msg.deliveryAttempt ?? null,
        group: msg.messageGroup || null,
        priority: msg.priority ?? null,
        receive: receives,
        received_at: receivedAt,
        ack_at: null,
      };
      messages.push(record);
      if (msg.corrupted) errors.push(`message ${msg.messageId}: body digest mismatch (corrupted)`);
      const firstTime = !seen.has(msg.messageId);
      seen.add(msg.messageId);
      try {
        if (args.changeInvisibleSeconds !== undefined) {
          await consumer.changeInvisibleDuration(msg, args.changeInvisibleSeconds * 1000);
        }
        if (args.ack && !(args.noAckFirst && firstTime)) {
          record.ack_at = nowSeconds();
          await consumer.ack(msg);
        }
      } catch (err) {
        errors.push(`message ${msg.messageId}: ${describe(err)}`);
      }
    }
  }
  return { messages, receives, empty_receives: empty, errors };
}

async function consume(args, logger) {
  const consumer = newSimpleConsumer(args, logger, (args.awaitSeconds ?? 5) * 1000);
  phase = 'consumer startup';
  await consumer.startup();
  try {
    return args.startOnly ? await startOnly(consumer) : await receiveLoop(consumer, args);
  } finally {
    phase = 'consumer shutdown';
    await consumer.shutdown();
  }
}

// A PushConsumer: the listener records each call; done once --expect ids succeeded (then a
// moment for the last acks to leave). The wait leaves the shutdown its allowance.
async function push(args, logger, startedMs) {
  const calls = [];
  const succeeded = new Set();
  const seen = new Set();
  let markDone;
  const done = new Promise(resolve => { markDone = resolve; });
  const messageListener = {
    async consume(message) {
      const startedAt = nowSeconds();
      // Until the wall clock the record uses has passed: a timer may fire a little early by it.
      const until = startedAt + args.consumeSeconds;
      for (let left = until - nowSeconds(); left > 0; left = until - nowSeconds()) {
        await sleep(left * 1000 + 1);
      }
      const first = !seen.has(message.messageId);
      seen.add(message.messageId);
      const fail = args.failFirst && first;
      const result = fail ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
      calls.push({
        id: message.messageId,
        body: message.body.toString('utf8'),
        group: message.messageGroup || null,
        attempt: message.deliveryAttempt ?? null,
        started_at: startedAt,
        ended_at: nowSeconds(),
        result: result.name,
      });
      if (!fail) {
        succeeded.add(message.messageId);
        if (succeeded.size >= args.expect) markDone(true);
      }
      return result;
    },
  };
  const consumer = newPushConsumer(args, logger, messageListener);
  phase = 'push consumer startup';
  await consumer.startup();
  try {
    phase = 'consuming';
    const waitMs = Math.max(startedMs + (args.deadlineSeconds - PUSH_SHUTDOWN_ALLOWANCE_S) * 1000 - Date.now(), 1000);
    let timer;
    const finished = await Promise.race([ done, new Promise(resolve => { timer = setTimeout(resolve, waitMs, false); }) ]);
    clearTimeout(timer);
    if (!finished) {
      throw new Error(`${succeeded.size} of ${args.expect} messages consumed within ${(waitMs / 1000).toFixed(0)}s: `
        + JSON.stringify(calls.slice(-20)));
    }
    await sleep(2000); // the last acks leave
    return { fifo: consumer.getPushConsumerSettings().isFifo(), messages: [ ...calls ], errors: [] };
  } finally {
    phase = 'push consumer shutdown';
    await consumer.shutdown();
  }
}

// A LitePushConsumer bound to the parent --topic: see the usage at the top.
async function lite(args, logger, startedMs) {
  const got = [];
  let markDone;
  const done = new Promise(resolve => { markDone = resolve; });
  const messageListener = {
    async consume(message) {
      got.push({ id: message.messageId, body: message.body.toString('utf8'), lite_topic: message.liteTopic ?? null });
      if (args.liteTopics.every(t => got.some(m => m.lite_topic === t))) markDone(true);
      return ConsumeResult.SUCCESS;
    },
  };
  phase = 'lite push consumer startup';
  const consumer = await new LitePushConsumerBuilder()
    .bindTopic(args.topic)
    .setClientConfiguration({ endpoints: args.endpoint, namespace: '', requestTimeout: REQUEST_TIMEOUT_MS, logger })
    .setConsumerGroup(args.group)
    .setMessageListener(messageListener)
    .build();
  const producer = newProducer(args, logger);
  try {
    phase = 'producer startup';
    await producer.startup();
    const manager = consumer.liteSubscriptionManager;
    const out = { quota: manager.liteSubscriptionQuota, max_size: manager.maxLiteTopicSize, over_quota: null };
    phase = 'subscribing';
    for (const topic of args.liteTopics) await consumer.subscribeLite(topic);
    phase = 'sending';
    for (const topic of [ ...args.liteTopics, ...(args.other ? [ args.other ] : []) ]) {
      await producer.send({ topic: args.topic, body: Buffer.from(`${topic}-body`), liteTopic: topic });
    }
    phase = 'consuming';
    const waitMs = Math.max(startedMs + (args.deadlineSeconds - PUSH_SHUTDOWN_ALLOWANCE_S) * 1000 - Date.now(), 1000);
    let timer;
    const finished = await Promise.race([ done, new Promise(resolve => { timer = setTimeout(resolve, waitMs, false); }) ]);
    clearTimeout(timer);
    if (!finished) throw new Error(`lite topics ${args.liteTopics}: got only ${JSON.stringify(got)}`);
    if (args.overQuota) {
      phase = 'subscribing over the quota';
      try {
        for (let i = 0; i <= out.quota - args.liteTopics.length; i++) await consumer.subscribeLite(`extra-${i}`);
      } catch (err) {
        out.over_quota = { code: err.code ?? null, type: err.name ?? 'Error' };
      }
    }
    await sleep(2000); // the last acks leave
    return { ...out, messages: [ ...got ], errors: [] };
  } finally {
    phase = 'lite shutdown';
    await producer.shutdown();
    await consumer.shutdown();
  }
}

async function features(args, logger, startedMs) {
  const checked = [];
  const checker = {
    async check(messageView) {
      checked.push(messageView.messageId);
      return TransactionResolution.COMMIT;
    },
  };
  const out = { errors: [] };
  const message = (body, extra = {}) => ({ topic: args.topic, body: Buffer.from(body), ...extra });
  const consumer = newSimpleConsumer(args, logger, FEATURES_AWAIT_MS);
  const producer = newProducer(args, logger, checker);
  phase = 'consumer startup';
  await consumer.startup();
  try {
    phase = 'producer startup';
    await producer.startup();
    try {
      for (const [ name, end ] of [[ 'committed', 'commit' ], [ 'rolled_back', 'rollback' ], [ 'orphan', null ]]) {
        phase = `transaction ${name}`;
        const tx = producer.beginTransaction();
        const receipt = await producer.send(message(name), tx);
        out[name] = receipt.messageId;
        if (end === 'commit') await tx.commit();
        if (end === 'rollback') await tx.rollback();
      }
      // Whole seconds, as the Python driver (its client sets Timestamp.seconds only).
      const deliverMs = (Math.floor(Date.now() / 1000) + args.delaySeconds) * 1000;
      phase = 'timed message';
      out.timed = (await producer.send(message('timed', { deliveryTimestamp: new Date(deliverMs) }))).messageId;
      out.deliver_ms = deliverMs;
      phase = 'recalled message';
      const receipt = await producer.send(message('recalled', { deliveryTimestamp: new Date(deliverMs) }));
      out.recalled = receipt.messageId;
      out.recall_answer = (await producer.recallMessage(args.topic, receipt.recallHandle)).messageId;
      const wanted = [ out.committed, out.orphan, out.timed ];
      const received = [];
      // A receive takes up to its long poll + the request timeout; the shutdowns need a moment.
      const endMs = startedMs + args.deadlineSeconds * 1000 - FEATURES_AWAIT_MS - REQUEST_TIMEOUT_MS - 5000;
      let doneAtMs = null;
      while (Date.now() < endMs && (doneAtMs === null || Date.now() < doneAtMs)) {
        phase = `receiving (${received.length} so far)`;
        let batch;
        try {
          batch = await consumer.receive(MAX_MESSAGES_PER_RECEIVE, FEATURES_INVISIBLE_MS);
        } catch (err) { // one failed receive is reported, not fatal
          out.errors.push(`receive: ${describe(err)}`);
          continue;
        }
        for (const msg of batch) {
          received.push({ id: msg.messageId, at_ms: Date.now() });
          await consumer.ack(msg);
        }
        const ids = new Set(received.map(r => r.id));
        if (doneAtMs === null && wanted.every(id => ids.has(id))) doneAtMs = Date.now() + 2000;
      }
      out.received = received;
      out.checked = [ ...checked ];
    } finally {
      phase = 'producer shutdown';
      await producer.shutdown();
    }
  } finally {
    phase = 'consumer shutdown';
    await consumer.shutdown();
  }
  return out;
}

// soak: one role of the official-client soak, see the usage at the top.

// One event, one line, written whole (a single write; the listener and the checker run on
// the same thread as the loops). exit() lets the writes drain before the process ends.
function emit(ev, fields = {}) {
  process.stdout.write(JSON.stringify({ ev, t: Date.now(), ...fields }) + '\n');
}

// gRPC status names by code, as grpc-js's ServiceError carries them (err.code, a number).
const GRPC_STATUS = [ 'OK', 'CANCELLED', 'UNKNOWN', 'INVALID_ARGUMENT', 'DEADLINE_EXCEEDED', 'NOT_FOUND',
  'ALREADY_EXISTS', 'PERMISSION_DENIED', 'RESOURCE_EXHAUSTED', 'FAILED_PRECONDITION', 'ABORTED',
  'OUT_OF_RANGE', 'UNIMPLEMENTED', 'INTERNAL', 'UNAVAILABLE', 'DATA_LOSS', 'UNAUTHENTICATED' ];

// A failure's short, stable kind: the client's exceptions (ClientException and its
// subclasses, thrown by StatusChecker for a non-OK RocketMQ status) -> "<class>:<code>", e.g.
// "TooManyRequestsException:42900"; a gRPC error (the RPC itself failed) -> its status name,
// e.g. "UNAVAILABLE", "DEADLINE_EXCEEDED"; anything else (the client's own Error/TypeError,
// e.g. "Producer is not running now", an AssertionError) -> its class name.
function errorKind(err) {
  if (err instanceof ClientException) return `${err.name}:${err.code}`;
  if (Number.isInteger(err?.code) && err?.metadata !== undefined && GRPC_STATUS[err.code]) {
    return GRPC_STATUS[err.code];
  }
  return err?.name ?? 'Error';
}

function errorFields(err) {
  return { kind: errorKind(err), detail: describe(err).slice(0, 300) };
}

// The seq of a body "<PFX>-<seq>"; null for any other body.
function soakSeq(body) {
  const match = /-(\d+)$/.exec(body);
  return match ? Number(match[1]) : null;
}

// What a recv event says of a MessageView. 1.0.8's MessageView has `offset` (the message's
// system_properties.queue_offset; read with a default, so 0 if a server left it unset) and
// `receiptHandle`; it keeps neither the broker name nor the queue id (it reads no queue_id,
// and of the MessageQueue received from only its broker endpoints, i.e. the proxy's
// address), so "queue" is null; this proxy's receipt handle names both (e.g. "... broker-a 3
// 0 ..." for queue 3 of broker-a at offset 0). A MessageView's deliveryAttempt and
// messageGroup read 0 / "" when unset: null here.
function soakView(message) {
  return {
    id: message.body.toString('utf8'),
    msg_id: message.messageId,
    attempt: message.deliveryAttempt || null,
    group: message.messageGroup || null,
    queue: null,
    offset: message.offset ?? null,
    handle: message.receiptHandle || null,
  };
}

// Sleeps up to ms (Infinity: for good), looking for any of the control files every 200 ms;
// true as soon as one is there.
async function soakWait(args, names, ms) {
  const until = Date.now() + ms;
  for (;;) {
    if (names.some(name => existsSync(join(args.controlDir, name)))) return true;
    const left = until - Date.now();
    if (left <= 0) return false;
    await sleep(Math.min(SOAK_POLL_MS, left));
  }
}

// Resolves as the promise does, or to TIMED_OUT after seconds.
async function within(promise, seconds) {
  let timer;
  const timeout = new Promise(resolve => { timer = setTimeout(resolve, seconds * 1000, TIMED_OUT); });
  try {
    return await Promise.race([ promise, timeout ]);
  } finally {
    clearTimeout(timer);
  }
}

// A PushConsumer discards a corrupted message without calling the listener, so `corrupt`
// comes from where every received batch is decoded, for both consumer roles: the client's
// receiveMessage (protected in TypeScript, a plain method at run time; SimpleConsumer.receive
// and the PushConsumer's ProcessQueue both call it), whose MessageViews carry `corrupted`.
function reportCorrupted(consumer) {
  const receiveMessage = consumer.receiveMessage;
  consumer.receiveMessage = async function (...params) {
    const views = await receiveMessage.apply(this, params);
    for (const view of views) {
      if (view.corrupted) emit('corrupt', { id: view.body.toString('utf8') });
    }
    return views;
  };
}

async function soakProduce(args, logger) {
  const tx = args.role === 'produce-tx';
  // The broker checks an orphan (seq % 4 == 1, meant to commit) and any transaction whose
  // end was lost: seq % 4 == 0 was meant to roll back, everything else to commit.
  const checker = {
    async check(messageView) {
      const id = messageView.body.toString('utf8');
      const seq = soakSeq(id);
      const answer = seq === null || seq % 4 === 0 ? 'ROLLBACK' : 'COMMIT';
      emit('checked', { id, answer });
      return TransactionResolution[answer];
    },
  };
  const producer = newProducer(args, logger, tx ? checker : undefined);
  await soakStart(args, producer);
  const periodMs = 1000 / args.rate;
  const startMs = Date.now();
  let dueMs = startMs;
  for (let seq = 0; !await soakWait(args, [ 'stop-producing', 'stop' ], dueMs - Date.now()); seq++) {
    phase = `sending message ${seq}`;
    const id = `${args.prefix}-${seq}`;
    try {
      const transaction = tx ? producer.beginTransaction() : undefined;
      const message = {
        topic: args.topic,
        body: Buffer.from(id),
        messageGroup: args.role === 'produce-fifo' ? `g${seq % args.messageGroups}` : undefined,
      };
      const receipt = await producer.send(message, transaction);
      emit('sent', { id, msg_id: receipt.messageId });
      if (tx) await soakEndTransaction(transaction, id, seq);
    } catch (err) { // the send failed (the client retried inside it); the next seq goes on
      emit('send_error', { id, ...errorFields(err) });
    }
    // The next tick, startMs + k * period, after this send: a missed one is skipped.
    dueMs = startMs + (Math.floor((Date.now() - startMs) / periodMs) + 1) * periodMs;
  }
  // An orphan's check reaches this producer only while it runs: stay until told to stop.
  if (tx) await soakWait(args, [ 'stop' ], Infinity);
  await soakShutdown(producer);
}

// A sent transactional message's intended end: rollback, none (an orphan), or commit.
async function soakEndTransaction(transaction, id, seq) {
  const outcome = { 0: 'rollback', 1: 'none' }[seq % 4] ?? 'commit';
  phase = `transaction ${outcome} of ${id}`;
  try {
    if (outcome !== 'none') await transaction[outcome]();
  } catch (err) {
    emit('tx_end', { id, outcome, ok: false, kind: errorKind(err) });
    return;
  }
  emit('tx_end', { id, outcome, ok: true });
}

async function soakSimple(args, logger) {
  const consumer = newSimpleConsumer(args, logger, args.awaitSeconds * 1000);
  reportCorrupted(consumer);
  await soakStart(args, consumer);
  // A receive in flight (up to its long poll + the request timeout) and its acks finish first.
  while (!await soakWait(args, [ 'stop' ], 0)) {
    phase = 'receiving';
    let batch;
    try {
      batch = await consumer.receive(args.batch, args.invisibleSeconds * 1000);
    } catch (err) {
      emit('recv_error', errorFields(err));
      await soakWait(args, [ 'stop' ], 1000); // a down fleet is not spun on
      continue;
    }
    for (const message of batch) {
      const view = soakView(message);
      emit('recv', view);
      phase = `acking ${view.id}`;
      try {
        await consumer.ack(message);
      } catch (err) {
        emit('ack_error', { id: view.id, ...errorFields(err) });
        continue;
      }
      emit('ack', { id: view.id });
    }
  }
  await soakShutdown(consumer);
}

async function soakPush(args, logger) {
  const messageListener = {
    async consume(message) {
      const view = soakView(message);
      emit('recv', view);
      if (args.consumeMs > 0) await sleep(args.consumeMs);
      emit('consumed', { id: view.id }); // the client acks it once SUCCESS is returned
      return ConsumeResult.SUCCESS;
    },
  };
  const consumer = newPushConsumer(args, logger, messageListener);
  reportCorrupted(consumer);
  await soakStart(args, consumer);
  phase = 'consuming';
  await soakWait(args, [ 'stop' ], Infinity);
  await soakShutdown(consumer);
}

// Startup is the one failure that ends the run (exit 1). It waits for the Telemetry
// settings answer without a timeout of its own: bounded here.
async function soakStart(args, client) {
  phase = `${args.role} startup`;
  if (await within(client.startup(), SOAK_STARTUP_S) === TIMED_OUT) {
    throw new Error(`startup did not finish within ${SOAK_STARTUP_S}s`);
  }
  emit('ready', { role: args.role, lang: 'node' });
}

// The client's own shutdown, bounded (a PushConsumer's waits for its in-flight receives and
// cached messages; NotifyClientTermination throws when a proxy is down). A shutdown that
// failed or overran is said on stderr; the run ends with `done` either way.
async function soakShutdown(client) {
  phase = 'shutdown';
  try {
    if (await within(client.shutdown(), SOAK_SHUTDOWN_S) === TIMED_OUT) {
      process.stderr.write(`client.mjs soak: shutdown did not finish within ${SOAK_SHUTDOWN_S}s\n`);
    }
  } catch (err) {
    process.stderr.write(`client.mjs soak: shutdown failed: ${describe(err)}\n`);
  }
  emit('done');
}

async function soak(args, logger) {
  // Errors after startup are events, never an exit: an error the client raises where nobody
  // awaits it (a timer, a stream handler) goes to its log on stderr instead of ending Node.
  process.on('unhandledRejection', err => logger.error('unhandled rejection: %s', describe(err)));
  process.on('uncaughtException', err => logger.error('uncaught exception: %s', describe(err)));
  const role = args.role.startsWith('produce') ? soakProduce : { simple: soakSimple, push: soakPush }[args.role];
  await role(args, logger);
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
  if (args.deadlineSeconds !== null) {
    setTimeout(() => {
      process.stderr.write(`client.mjs ${args.command}: deadline of ${args.deadlineSeconds}s exceeded during ${phase}, giving up\n`);
      process.exit(3);
    }, args.deadlineSeconds * 1000);
  }
  const started = Date.now();
  const logger = makeLogger();
  const command = { produce, consume, push, lite, features, soak }[args.command];
  let result;
  try {
    result = await command(args, logger, started);
  } catch (err) {
    const elapsed = ((Date.now() - started) / 1000).toFixed(1);
    let cause = '';
    for (let c = err?.cause; c; c = c.cause) cause += ` <- ${describe(c)}`;
    process.stderr.write(`client.mjs ${args.command} failed after ${elapsed}s during ${phase}: ${describe(err)}${cause}\n`);
    if (err?.stack) process.stderr.write(`${err.stack}\n`);
    return exit(1);
  }
  if (result !== undefined) process.stdout.write(JSON.stringify(result) + '\n'); // soak printed its events
  return exit(0);
}

main();
