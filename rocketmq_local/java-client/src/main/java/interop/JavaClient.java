/*
 * Drive the official RocketMQ 5 Java client (rocketmq-client-java 5.2.0) as a test peer.
 *
 * Built by `make rocketmq-java-client` into .cache/rocketmq/java-client (run it with
 * `java -Duser.home=DIR -cp interop-java-client.jar:lib/* interop.JavaClient ...`). Same command
 * line and output as testkit/official/python_client.py and node/client.mjs:
 *
 *   produce --endpoint HOST:PORT --topic T --count N [--tag X] [--keys K] [--body-prefix P]
 *           [--message-groups G] [--priority P] [--user-properties N[:B]]
 *       -> {"ids": [...]}            message i has the body "<P>-<i>"; with G, FIFO
 *                                    messages, message i in group "g<i mod G>"; with
 *                                    --priority, priority messages of priority P; with
 *                                    --user-properties, N user properties "p0000".. whose
 *                                    names and values take B UTF-8 bytes together (values
 *                                    "v" without B)
 *   consume --endpoint HOST:PORT --group G --topic T --await-seconds S --expect N
 *           [--max-rounds R] [--invisible-seconds I] [--ack] [--change-invisible-seconds C]
 *           [--no-ack-first] [--start-only] [--batch B] [--filter F] [--filter-type TAG|SQL92]
 *       -> {"messages": [{"id", "body", "tag", "keys", "topic", "attempt", "group",
 *                         "priority", "receive", "received_at", "ack_at"}],
 *           "receives": <calls>, "empty_receives": <count>, "errors": [...]}
 *           (received_at: epoch seconds the receive returned; ack_at: when the ack was sent)
 *       --start-only -> {"started": true, "endpoints": [...], "settings": true, "heartbeat": "OK"}
 *   push --endpoint HOST:PORT --group G --topic T --expect N [--fail-first]
 *        [--consume-seconds S] [--filter F] [--filter-type TAG|SQL92]
 *       -> {"fifo": <settings said FIFO>, "messages": [{"id", "body", "group", "attempt",
 *           "started_at", "ended_at", "result"}], "errors": [...]}
 *       A PushConsumer whose listener records every call; --fail-first answers FAILURE the
 *       first time an id arrives; stops once N distinct ids were consumed with SUCCESS.
 *   lite --endpoint HOST:PORT --group G --topic PARENT --lite-topics a,b [--other c] --push
 *        [--over-quota]
 *       -> {"quota", "max_size", "messages": [{"id", "body", "lite_topic"}],
 *           "over_quota": {"code", "type"} | null, "errors": [...]}
 *       A LitePushConsumer (RocketMQ 5.5; 5.2.0 has no lite simple consumer) of the lite group
 *       G bound to PARENT: subscribes a, b, sends one message to each lite topic (and to c),
 *       consumes until a and b each delivered one; --over-quota then subscribes one lite
 *       topic past the settings' quota and reports the client's error (code: null, the Java
 *       exception carries none).
 *   features --endpoint HOST:PORT --topic T --group G --delay-seconds D
 *       -> {"committed", "rolled_back", "orphan", "timed", "recalled": ids,
 *           "recall_answer": what RecallMessage returned, "deliver_ms": the timed message's
 *           delivery time (epoch ms), "checked": ids the transaction checker was asked about,
 *           "received": [{"id", "at_ms"}], "errors": [...]}
 *       A committed, a rolled-back and an orphaned (never ended) transactional message, whose
 *       checker commits what it is asked about; a message timed D seconds ahead, and another
 *       one recalled at once; then a SimpleConsumer receives (acking) until the committed, the
 *       orphan and the timed one came and two more seconds passed.
 *   soak --endpoints "H:P;H:P" --role ROLE --topic T --control-dir DIR [--group G] [--prefix PFX]
 *        [--rate R] [--message-groups N] [--consume-ms MS] [--invisible-seconds I]
 *        [--await-seconds A] [--batch B] [--consumers C]
 *       -> one JSON event a line, flushed as it happens ({"ev", "t": epoch ms, ...}): ready,
 *          sent, send_error, tx_end, checked, recv, ack, ack_error, recv_error, consumed,
 *          corrupt, done (last). One role of the official-client soak (bench/soak_official.py),
 *          kept alive through every fault: after start-up a client error is an event, never an
 *          exit. ROLE: produce, produce-fifo (message group "g<seq mod N>", N default 4) or
 *          produce-tx send R (default 10) messages a second, one at a time, body "<PFX>-<seq>"
 *          (PFX default "m"); produce-tx sends each in its own transaction and, by seq mod 4,
 *          rolls it back (0), leaves it open for the broker's check (1) or commits it, and its
 *          checker answers ROLLBACK for seq mod 4 == 0, else COMMIT. simple: a SimpleConsumer
 *          of G (batch B default 16, invisible I default 15 s, long polling A default 5 s) that
 *          acks everything; push: a PushConsumer of G whose listener takes MS (default 0) and
 *          returns SUCCESS. --consumers C (simple, push; default 1): C clients of G in this
 *          JVM, each built with its own connections, as an application runs many consumers in
 *          one process; ready once all are started, their events on the one stdout. DIR is
 *          polled every 200 ms: DIR/stop-producing stops a producer
 *          (produce-tx then waits for DIR/stop: late orphans are still checked),
 *          DIR/stop everyone; the client is closed, done printed, exit 0.
 *          --endpoints goes to ClientConfiguration as it is: 5.2.0's Endpoints splits it at ';'
 *          into the addresses of one gRPC channel ("ipv4:H:P,H:P", the first host's form picks
 *          ipv4 or ipv6 for all; a domain name takes one address only), which grpc-java's default
 *          pick_first policy connects to in turn. An error's kind is the client exception's
 *          class with the RocketMQ response code, which 5.2.0 keeps only in the message
 *          ("[request-id=R, response-code=C] ..."): "TooManyRequestsException:42900"; else a
 *          gRPC status in the cause chain by its code's name ("UNAVAILABLE"); else the root
 *          cause's class name. recv's queue is always null (the message's queue id is not kept
 *          by the client, see received()); offset and handle come from MessageViewImpl. The
 *          PushConsumer never hands a corrupted message to the listener: push has no corrupt.
 *          The run's deadline defaults to 6 hours.
 *
 * Every command takes --namespace NS: the client's namespace (ClientConfiguration.setNamespace).
 *
 * One JSON line on stdout and exit 0 (soak: a line per event); on failure a message on stderr and
 * a non-zero exit (1 for an error, for soak only a client that did not start, 2 for bad usage, 3
 * when the whole run overran --deadline-seconds). Errors of single
 * operations inside the receive loop are reported in "errors" instead. The client logs to
 * ${user.home}/logs/rocketmq/rocketmq-client.log: pass -Duser.home to move it.
 *
 * What this client (5.2.0) requires of the server, read from its source (the
 * rocketmq-client-java-5.2.0-sources.jar on Maven Central, java/client of apache/rocketmq-clients):
 * - TLS is on by default (and any server certificate is trusted). The driver leaves the client's
 *   default unless RMQ_INTEROP_TLS says otherwise: "0" turns TLS off (enableSsl(false)), "1" on.
 * - Startup (ClientImpl.startUp): QueryRoute for every topic, up to maxStartupAttempts (3) times,
 *   then throws. For each new broker endpoint of a route it opens a Telemetry stream, writes
 *   Settings and waits for the settings answer (ClientSessionImpl's settingsInitFuture, given
 *   up after 3 s plus the request timeout) before the route counts as fetched: startup success
 *   proves both. Settings are sent again whenever a Telemetry stream is reopened.
 * - ChangeInvisibleDuration: the response's receipt_handle replaces the message's handle.
 * - Heartbeat: sent every 10 s by the client itself; --start-only sends one now, like the
 *   other drivers, through the client's own ClientManager.
 * - Producer: with settings.publishing.validate_message_type, a queue's accept_message_types
 *   must contain the message's type (NORMAL, FIFO with a message group, DELAY with a delivery
 *   timestamp, TRANSACTION) or the send fails in the client. setDeliveryTimestamp takes epoch
 *   milliseconds. beginTransaction needs a TransactionChecker; a RecoverOrphanedTransaction
 *   command on the producer's Telemetry stream runs it and answers with EndTransaction (source
 *   SOURCE_SERVER_CHECK). recallMessage(topic, handle) sends RecallMessage with the send
 *   receipt's recall_handle and returns the response's message_id.
 * - PushConsumer (PushConsumerImpl, ProcessQueueImpl, StandardConsumeService, FifoConsumeService):
 *   - Settings it reads (PushSubscriptionSettings.sync): subscription.fifo, which picks the
 *     FIFO or the standard consume service ONCE, at startup; subscription.receive_batch_size
 *     (the batch is min(it, room in the cache: 1024 messages / 64 MiB spread over the queues),
 *     so 0 would ask for nothing); subscription.long_polling_timeout; backoff_policy, which must
 *     be exponential or customized (anything else throws and the settings are not taken).
 *   - QueryAssignment for every subscribed topic 1 s after startup and then every 5 s, sent to
 *     the access point if the route lists it; an empty answer is just retried later.
 *   - For every assigned queue (the proxy assigns queue id -1 of each broker) a loop of
 *     ReceiveMessage with auto_renew=true and NO invisible_duration, long_polling_timeout from
 *     the settings, a gRPC deadline of that plus the request timeout, and an attempt_id that is
 *     reused only after DEADLINE_EXCEEDED. The next receive is issued as soon as a response
 *     arrives (not after consumption); 1 s back-off after an error (20 ms after
 *     TooManyRequests), 1 s while the cache is full. A queue without a receive issued for
 *     3 x (long polling + request timeout) is dropped and recreated.
 *   - No invisible-time renewal in the client: while the listener runs it sends nothing; the
 *     server must keep an auto_renew message invisible for as long as consumption takes, and
 *     accept the receipt handle from ReceiveMessage for the ack (or nack) that follows.
 *   - Standard: every message of a batch goes to the consumption pool (20 threads) at once.
 *     SUCCESS -> AckMessage; FAILURE (or an exception) -> a nack: ChangeInvisibleDuration to the
 *     retry policy's delay for the message's delivery attempt. Both are retried every second
 *     until OK, except on INVALID_RECEIPT_HANDLE. The client never forwards a standard message
 *     to the dead-letter queue: the server does after max_attempts.
 *   - FIFO: the messages of one receive are consumed one after another in the order received
 *     (enableFifoConsumeAccelerator is off by default); a FAILURE is retried locally after the
 *     retry policy's delay, with the delivery attempt counted up by the client, until
 *     max_attempts, then ForwardMessageToDeadLetterQueue (retried every second until OK);
 *     SUCCESS -> AckMessage. The client does not order messages across receives: the server
 *     must not deliver a message of a group while an earlier one is in flight.
 *   - A corrupted message (body digest mismatch) is nacked (standard) or forwarded to the DLQ
 *     (FIFO) without reaching the listener. VerifyMessage commands on Telemetry are consumed
 *     and answered there.
 *   - close(): no new receives, waits for the receives in flight up to long polling + request
 *     timeout, drains the consumption pool, sleeps 1 s for the last acks, then
 *     NotifyClientTermination.
 */
package interop;

import apache.rocketmq.v2.Code;
import apache.rocketmq.v2.HeartbeatResponse;
import java.io.Closeable;
import java.lang.reflect.Method;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientConfigurationBuilder;
import org.apache.rocketmq.client.apis.ClientException;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.LitePushConsumer;
import org.apache.rocketmq.client.apis.consumer.MessageListener;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.ProducerBuilder;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.apis.producer.Transaction;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;
import org.apache.rocketmq.client.java.impl.ClientImpl;
import org.apache.rocketmq.client.java.impl.consumer.LitePushConsumerImpl;
import org.apache.rocketmq.client.java.impl.consumer.LitePushConsumerSettings;
import org.apache.rocketmq.client.java.impl.consumer.PushSubscriptionSettings;
import org.apache.rocketmq.client.java.message.MessageViewImpl;
import org.apache.rocketmq.client.java.route.Address;
import org.apache.rocketmq.client.java.route.Endpoints;
import org.apache.rocketmq.shaded.io.grpc.StatusException;
import org.apache.rocketmq.shaded.io.grpc.StatusRuntimeException;

public final class JavaClient {
    private static final int REQUEST_TIMEOUT_SECONDS = 3; // the client's default, stated
    private static final int MAX_MESSAGES_PER_RECEIVE = 16;
    /** The features command's SimpleConsumer: long polls and invisible time. */
    private static final int FEATURES_AWAIT_SECONDS = 5;
    private static final int FEATURES_INVISIBLE_SECONDS = 20;
    /** The soak command: its roles, defaults, control-file polling and longest run. */
    private static final Set<String> SOAK_ROLES = new LinkedHashSet<>(
        List.of("produce", "produce-fifo", "produce-tx", "simple", "push"));
    private static final int SOAK_MESSAGE_GROUPS = 4;
    private static final double SOAK_RATE = 10.0;
    private static final int SOAK_INVISIBLE_SECONDS = 15;
    private static final int SOAK_AWAIT_SECONDS = 5;
    private static final long SOAK_CONTROL_POLL_MILLIS = 200;
    private static final int SOAK_DETAIL_CHARS = 300;
    /** How many of a soak's --consumers are started at once. */
    private static final int SOAK_STARTING_AT_ONCE = 8;
    private static final double SOAK_DEADLINE_SECONDS = 6 * 3600;
    /**
     * A ClientException (BadRequestException, TooManyRequestsException, ...) keeps the response
     * code only in its message, "[request-id=R, response-code=C] ...": 5.2.0 has no getter. At
     * the start only: a ClientException wrapping a cause has the cause's text as its message.
     */
    private static final Pattern RESPONSE_CODE =
        Pattern.compile("\\[request-id=[^\\]]*response-code=(\\d+)\\]");

    private static final class UsageError extends Exception {
        UsageError(String message) {
            super(message);
        }
    }

    private final Map<String, String> opts = new HashMap<>();
    private final Set<String> flags = new HashSet<>();
    private String command;
    /** System.nanoTime() at which the watchdog ends the run. */
    private long deadlineNanos;
    /** The soak's event lines are printed under this lock; nothing after "done". */
    private final Object stdout = new Object();
    private boolean printedDone; // guarded by stdout

    private static final Set<String> COMMANDS =
        Set.of("produce", "consume", "push", "lite", "features", "soak");
    private static final Set<String> VALUED = Set.of("endpoint", "topic", "group", "count", "tag",
        "keys", "body-prefix", "message-groups", "priority", "filter", "await-seconds", "expect",
        "max-rounds", "invisible-seconds", "batch", "change-invisible-seconds", "consume-seconds",
        "delay-seconds", "deadline-seconds", "lite-topics", "other",
        "endpoints", "role", "control-dir", "prefix", "rate", "consume-ms", "user-properties",
        "consumers", "filter-type", "namespace");
    private static final Set<String> FLAGS = Set.of("ack", "no-ack-first", "start-only", "fail-first",
        "push", "over-quota");

    private void parse(String[] argv) throws UsageError {
        List<String> positionals = new ArrayList<>();
        for (int i = 0; i < argv.length; i++) {
            String a = argv[i];
            if (a.startsWith("--")) {
                String name = a.substring(2);
                if (FLAGS.contains(name)) {
                    flags.add(name);
                } else if (VALUED.contains(name)) {
                    if (i + 1 >= argv.length) {
                        throw new UsageError("--" + name + " needs a value");
                    }
                    opts.put(name, argv[++i]);
                } else {
                    throw new UsageError("unknown option --" + name);
                }
            } else {
                positionals.add(a);
            }
        }
        if (positionals.size() != 1 || !COMMANDS.contains(positionals.get(0))) {
            throw new UsageError(
                "usage: JavaClient produce|consume|push|lite|features --endpoint HOST:PORT --topic T ..."
                    + " | soak --endpoints \"H:P;H:P\" --role ROLE --topic T --control-dir DIR ...");
        }
        command = positionals.get(0);
        require("soak".equals(command) ? "endpoints" : "endpoint");
        require("topic");
        switch (command) {
            case "produce":
                integer("count", null, true);
                integer("message-groups", null, false);
                integer("priority", null, false);
                userProperties();
                break;
            case "consume":
                require("group");
                if (!flags.contains("start-only")) {
                    integer("await-seconds", null, true);
                    integer("expect", null, true);
                }
                if (flags.contains("no-ack-first") && !flags.contains("ack")) {
                    throw new UsageError("--no-ack-first only makes sense with --ack");
                }
                if (integer("batch", MAX_MESSAGES_PER_RECEIVE, false) < 1) {
                    throw new UsageError("--batch must be at least 1");
                }
                break;
            case "push":
                require("group");
                integer("expect", null, true);
                number("consume-seconds", 0.0);
                break;
            case "lite":
                require("group");
                require("lite-topics");
                if (!flags.contains("push")) {
                    throw new UsageError("lite needs --push (5.2.0 has only a LitePushConsumer)");
                }
                break;
            case "soak":
                require("role");
                require("control-dir");
                String role = opts.get("role");
                if (!SOAK_ROLES.contains(role)) {
                    throw new UsageError("--role must be one of " + String.join(", ", SOAK_ROLES));
                }
                if (!role.startsWith("produce")) {
                    require("group");
                }
                int consumers = integer("consumers", 1, false);
                if (consumers < 1 || consumers > 1 && role.startsWith("produce")) {
                    throw new UsageError("--consumers must be at least 1, and 1 for a producer");
                }
                if (integer("message-groups", SOAK_MESSAGE_GROUPS, false) < 1) {
                    throw new UsageError("--message-groups must be at least 1");
                }
                if (!(number("rate", SOAK_RATE) > 0)) {
                    throw new UsageError("--rate must be above 0");
                }
                integer("consume-ms", 0, false);
                integer("invisible-seconds", SOAK_INVISIBLE_SECONDS, false);
                integer("await-seconds", SOAK_AWAIT_SECONDS, false);
                if (integer("batch", MAX_MESSAGES_PER_RECEIVE, false) < 1) {
                    throw new UsageError("--batch must be at least 1");
                }
                break;
            default: // features
                require("group");
                integer("delay-seconds", 4, false);
                break;
        }
        number("deadline-seconds", 0.0);
    }

    /**
     * --user-properties N[:B]: N properties "p0000", "p0001", ... whose names and values take B
     * UTF-8 bytes together (the values share what the names leave, in "v"s), or "v" each.
     */
    private Map<String, String> userProperties() throws UsageError {
        Map<String, String> props = new LinkedHashMap<>();
        String raw = opts.get("user-properties");
        if (raw == null) {
            return props;
        }
        String[] parts = raw.split(":", 2);
        int count;
        int bytes;
        try {
            count = Integer.parseInt(parts[0]);
            bytes = parts.length > 1 ? Integer.parseInt(parts[1]) : count * 6;
        } catch (NumberFormatException e) {
            throw new UsageError("--user-properties must be N or N:BYTES");
        }
        int left = bytes - count * 5;
        if (count < 1 || left < 0) {
            throw new UsageError("--user-properties: N at least 1, BYTES at least 5 a property");
        }
        for (int i = 0; i < count; i++) {
            int size = left / count + (i < left % count ? 1 : 0);
            props.put(String.format("p%04d", i), "v".repeat(size));
        }
        return props;
    }

    private void require(String name) throws UsageError {
        if (!opts.containsKey(name) || opts.get(name).isEmpty()) {
            throw new UsageError(command + " needs --" + name);
        }
    }

    private Integer integer(String name, Integer fallback, boolean required) throws UsageError {
        String raw = opts.get(name);
        if (raw == null) {
            if (required) {
                throw new UsageError(command + " needs --" + name);
            }
            return fallback;
        }
        try {
            int n = Integer.parseInt(raw);
            if (n < 0) {
                throw new NumberFormatException();
            }
            return n;
        } catch (NumberFormatException e) {
            throw new UsageError("--" + name + " must be a whole number");
        }
    }

    private double number(String name, double fallback) throws UsageError {
        String raw = opts.get(name);
        if (raw == null) {
            return fallback;
        }
        try {
            double d = Double.parseDouble(raw);
            if (!(d >= 0) || Double.isInfinite(d)) {
                throw new NumberFormatException();
            }
            return d;
        } catch (NumberFormatException e) {
            throw new UsageError("--" + name + " must be a number (0 or more)");
        }
    }

    /** Start-up and shut-down allowance plus, for consume, every round at its gRPC deadline. */
    private double deadlineSeconds() throws UsageError {
        if (opts.containsKey("deadline-seconds")) {
            return number("deadline-seconds", 0.0);
        }
        switch (command) {
            case "produce":
                return 20 + integer("count", 0, true) * 3 * REQUEST_TIMEOUT_SECONDS;
            case "push":
                return 120;
            case "lite":
                return 90;
            case "features":
                return 60;
            case "soak":
                return SOAK_DEADLINE_SECONDS;
            default:
                break;
        }
        if (flags.contains("start-only")) {
            return 30;
        }
        int perRound = integer("await-seconds", 5, false) + REQUEST_TIMEOUT_SECONDS + 1;
        int perMessage = 2 * REQUEST_TIMEOUT_SECONDS;
        return 20 + integer("max-rounds", 5, false) * (perRound + MAX_MESSAGES_PER_RECEIVE * perMessage);
    }

    /** Seconds left before the watchdog ends the run. */
    private double remainingSeconds() {
        return (deadlineNanos - System.nanoTime()) / 1e9;
    }

    private ClientConfiguration configuration() {
        ClientConfigurationBuilder builder = ClientConfiguration.newBuilder()
            .setEndpoints(opts.get("soak".equals(command) ? "endpoints" : "endpoint"))
            .setRequestTimeout(Duration.ofSeconds(REQUEST_TIMEOUT_SECONDS));
        if (opts.containsKey("namespace")) {
            builder.setNamespace(opts.get("namespace"));
        }
        String tls = System.getenv("RMQ_INTEROP_TLS");
        if (tls != null && !tls.isEmpty()) {
            builder.enableSsl(!"0".equals(tls));
        }
        return builder.build();
    }

    /** Epoch seconds, microseconds as the fraction (the other drivers' time.time()). */
    private static double now() {
        Instant t = Instant.now();
        return t.getEpochSecond() + t.getNano() / 1e9;
    }

    private static String text(MessageView msg) {
        ByteBuffer body = msg.getBody().duplicate();
        byte[] bytes = new byte[body.remaining()];
        body.get(bytes);
        return new String(bytes, StandardCharsets.UTF_8);
    }

    private static Object group(MessageView msg) {
        return msg.getMessageGroup().isPresent() ? msg.getMessageGroup().get() : null;
    }

    private String produce() throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        String topic = opts.get("topic");
        String prefix = opts.getOrDefault("body-prefix", "msg");
        int count = integer("count", null, true);
        Integer groups = integer("message-groups", null, false);
        Integer priority = integer("priority", null, false);
        List<Object> ids = new ArrayList<>();
        try (Producer producer = provider.newProducerBuilder()
            .setClientConfiguration(configuration())
            .setTopics(topic)
            .build()) {
            for (int i = 0; i < count; i++) {
                MessageBuilder builder = provider.newMessageBuilder()
                    .setTopic(topic)
                    .setBody((prefix + "-" + i).getBytes(StandardCharsets.UTF_8));
                if (opts.containsKey("tag")) {
                    builder.setTag(opts.get("tag"));
                }
                if (opts.containsKey("keys")) {
                    builder.setKeys(opts.get("keys"));
                }
                if (groups != null && groups > 0) {
                    builder.setMessageGroup("g" + (i % groups));
                }
                if (priority != null) {
                    builder.setPriority(priority);
                }
                userProperties().forEach(builder::addProperty);
                Message message = builder.build();
                SendReceipt receipt = producer.send(message);
                ids.add(receipt.getMessageId().toString());
            }
        }
        return Json.object("ids", ids);
    }

    /** --filter (default "*") of --filter-type (TAG, the default, or SQL92). */
    private FilterExpression filterExpression() {
        return new FilterExpression(opts.getOrDefault("filter", "*"),
            FilterExpressionType.valueOf(opts.getOrDefault("filter-type", "TAG")));
    }

    private SimpleConsumer simpleConsumer(int awaitSeconds) throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        return provider.newSimpleConsumerBuilder()
            .setClientConfiguration(configuration())
            .setConsumerGroup(opts.get("group"))
            .setSubscriptionExpressions(Collections.singletonMap(opts.get("topic"), filterExpression()))
            .setAwaitDuration(Duration.ofSeconds(awaitSeconds))
            .build();
    }

    private String consume() throws Exception {
        SimpleConsumer consumer = simpleConsumer(integer("await-seconds", 5, false));
        try {
            return flags.contains("start-only") ? startOnly(consumer) : receiveLoop(consumer);
        } finally {
            consumer.close();
        }
    }

    /** build() has already proven QueryRoute and the Telemetry settings answer. */
    private String startOnly(SimpleConsumer consumer) throws Exception {
        ClientImpl client = (ClientImpl) consumer;
        // Protected in 5.2.0 (the client's own heartbeat loop uses it): read by reflection.
        Method routeEndpoints = ClientImpl.class.getDeclaredMethod("getTotalRouteEndpoints");
        routeEndpoints.setAccessible(true);
        @SuppressWarnings("unchecked")
        Set<Endpoints> all = (Set<Endpoints>) routeEndpoints.invoke(client);
        if (all.isEmpty()) {
            throw new IllegalStateException("startup succeeded but the route has no endpoints");
        }
        List<Object> facades = new ArrayList<>();
        for (Endpoints endpoints : all) {
            HeartbeatResponse res = client.getClientManager()
                .heartbeat(endpoints, client.wrapHeartbeatRequest(), Duration.ofSeconds(REQUEST_TIMEOUT_SECONDS))
                .get(REQUEST_TIMEOUT_SECONDS + 2, TimeUnit.SECONDS);
            if (res.getStatus().getCode() != Code.OK) {
                throw new IllegalStateException("Heartbeat to " + endpoints.getFacade() + ": code "
                    + res.getStatus().getCode() + " " + res.getStatus().getMessage());
            }
            // The facade carries a scheme prefix ("ipv4:"); the other drivers print host:port.
            List<String> addresses = new ArrayList<>();
            for (Address address : endpoints.getAddresses()) {
                addresses.add(address.getAddress());
            }
            facades.add(String.join(";", addresses));
        }
        facades.sort(null);
        return Json.object("started", true, "endpoints", facades, "settings", true, "heartbeat", "OK");
    }

    private static String describe(Throwable t) {
        return t.getClass().getSimpleName() + ": " + t.getMessage();
    }

    private String receiveLoop(SimpleConsumer consumer) throws Exception {
        int expect = integer("expect", null, true);
        int maxRounds = integer("max-rounds", 5, false);
        int invisible = integer("invisible-seconds", 30, false);
        int batchSize = integer("batch", MAX_MESSAGES_PER_RECEIVE, false);
        Integer change = integer("change-invisible-seconds", null, false);
        boolean ack = flags.contains("ack");
        boolean noAckFirst = flags.contains("no-ack-first");
        List<Object> messages = new ArrayList<>();
        List<Object> errors = new ArrayList<>();
        Set<String> seen = new HashSet<>();
        int receives = 0;
        int empty = 0;
        while (receives < maxRounds && (expect == 0 || messages.size() < expect)) {
            receives++;
            List<MessageView> batch;
            try {
                batch = consumer.receive(batchSize, Duration.ofSeconds(invisible));
            } catch (Exception e) {
                errors.add("receive #" + receives + ": " + describe(e));
                continue;
            }
            double receivedAt = now();
            if (batch.isEmpty()) {
                empty++;
            }
            for (MessageView msg : batch) {
                String id = msg.getMessageId().toString();
                List<String> keys = new ArrayList<>(msg.getKeys());
                Collections.sort(keys);
                Map<String, Object> record = new LinkedHashMap<>();
                record.put("id", id);
                record.put("body", text(msg));
                record.put("tag", msg.getTag().isPresent() ? msg.getTag().get() : null);
                record.put("keys", keys);
                record.put("topic", msg.getTopic());
                record.put("attempt", msg.getDeliveryAttempt());
                record.put("group", group(msg));
                record.put("priority", msg.getPriority().orElse(null));
                record.put("receive", receives);
                record.put("received_at", receivedAt);
                record.put("ack_at", null);
                messages.add(record);
                if (msg instanceof MessageViewImpl && ((MessageViewImpl) msg).isCorrupted()) {
                    errors.add("message " + id + ": body digest mismatch (corrupted)");
                }
                boolean firstTime = seen.add(id);
                try {
                    if (change != null) {
                        consumer.changeInvisibleDuration(msg, Duration.ofSeconds(change));
                    }
                    if (ack && !(noAckFirst && firstTime)) {
                        record.put("ack_at", now());
                        consumer.ack(msg);
                    }
                } catch (Exception e) {
                    errors.add("message " + id + ": " + describe(e));
                }
            }
        }
        return Json.object("messages", messages, "receives", receives, "empty_receives", empty,
            "errors", errors);
    }

    /**
     * A PushConsumer: the listener records each call; done once --expect ids succeeded (then a
     * moment for the last acks to leave).
     */
    private String push() throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        int expect = integer("expect", null, true);
        boolean failFirst = flags.contains("fail-first");
        long consumeMillis = Math.round(number("consume-seconds", 0.0) * 1000);
        List<Object> calls = new ArrayList<>();
        Set<String> seen = new HashSet<>();
        Set<String> succeeded = new HashSet<>();
        CountDownLatch done = new CountDownLatch(1);
        Object lock = new Object();
        PushConsumer consumer = pushConsumer(provider, message -> {
                double started = now();
                // Until the wall clock the record uses has passed (sleep keeps another clock).
                double until = started + consumeMillis / 1000.0;
                for (double left = until - now(); left > 0; left = until - now()) {
                    try {
                        Thread.sleep((long) (left * 1000) + 1);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                        break;
                    }
                }
                String id = message.getMessageId().toString();
                synchronized (lock) {
                    boolean first = seen.add(id);
                    boolean fail = failFirst && first;
                    ConsumeResult result = fail ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
                    Map<String, Object> call = new LinkedHashMap<>();
                    call.put("id", id);
                    call.put("body", text(message));
                    call.put("group", group(message));
                    call.put("attempt", message.getDeliveryAttempt());
                    call.put("started_at", started);
                    call.put("ended_at", now());
                    call.put("result", result.name());
                    calls.add(call);
                    if (!fail) {
                        succeeded.add(id);
                        if (succeeded.size() >= expect) {
                            done.countDown();
                        }
                    }
                    return result;
                }
            });
        try {
            // build() returned after QueryRoute and the Telemetry settings answer: the
            // settings' fifo has picked the consume service.
            boolean fifo = ((PushSubscriptionSettings) ((ClientImpl) consumer).getSettings()).isFifo();
            long waitMillis = (long) (Math.max(remainingSeconds() - 15, 1) * 1000);
            if (!done.await(waitMillis, TimeUnit.MILLISECONDS)) {
                synchronized (lock) {
                    List<Object> last = calls.subList(Math.max(0, calls.size() - 20), calls.size());
                    throw new IllegalStateException(succeeded.size() + " of " + expect
                        + " messages consumed; last calls: " + Json.value(last));
                }
            }
            Thread.sleep(2000); // the last acks leave the consumption threads
            synchronized (lock) {
                return Json.object("fifo", fifo, "messages", new ArrayList<>(calls), "errors", List.of());
            }
        } finally {
            closeWithin(consumer, "the PushConsumer");
        }
    }

    /** A LitePushConsumer bound to the parent --topic: see the usage at the top. */
    private String lite() throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        String parent = opts.get("topic");
        List<String> topics = new ArrayList<>();
        for (String t : opts.get("lite-topics").split(",")) {
            if (!t.isEmpty()) {
                topics.add(t);
            }
        }
        List<Object> got = new ArrayList<>();
        Set<String> seenTopics = new HashSet<>();
        CountDownLatch done = new CountDownLatch(1);
        Object lock = new Object();
        LitePushConsumer consumer = provider.newLitePushConsumerBuilder()
            .setClientConfiguration(configuration())
            .setConsumerGroup(opts.get("group"))
            .bindTopic(parent)
            .setMessageListener(message -> {
                synchronized (lock) {
                    Map<String, Object> m = new LinkedHashMap<>();
                    m.put("id", message.getMessageId().toString());
                    m.put("body", text(message));
                    m.put("lite_topic", message.getLiteTopic().orElse(null));
                    got.add(m);
                    message.getLiteTopic().ifPresent(seenTopics::add);
                    if (seenTopics.containsAll(topics)) {
                        done.countDown();
                    }
                }
                return ConsumeResult.SUCCESS;
            })
            .build();
        Producer producer = null;
        try {
            producer = provider.newProducerBuilder()
                .setClientConfiguration(configuration())
                .setTopics(parent)
                .build();
            LitePushConsumerSettings settings = ((LitePushConsumerImpl) consumer).getSettings();
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("quota", settings.getLiteSubscriptionQuota());
            out.put("max_size", settings.getMaxLiteTopicSize());
            out.put("over_quota", null);
            for (String t : topics) {
                consumer.subscribeLite(t);
            }
            List<String> sends = new ArrayList<>(topics);
            if (opts.containsKey("other")) {
                sends.add(opts.get("other"));
            }
            for (String t : sends) {
                producer.send(provider.newMessageBuilder()
                    .setTopic(parent)
                    .setBody((t + "-body").getBytes(StandardCharsets.UTF_8))
                    .setLiteTopic(t)
                    .build());
            }
            long waitMillis = (long) (Math.max(remainingSeconds() - 25, 1) * 1000);
            if (!done.await(waitMillis, TimeUnit.MILLISECONDS)) {
                synchronized (lock) {
                    throw new IllegalStateException("lite topics " + topics + ": got only " + Json.value(got));
                }
            }
            if (flags.contains("over-quota")) {
                try {
                    for (int i = 0; i <= settings.getLiteSubscriptionQuota() - topics.size(); i++) {
                        consumer.subscribeLite("extra-" + i);
                    }
                } catch (Exception e) {
                    Map<String, Object> err = new LinkedHashMap<>();
                    err.put("code", null);
                    err.put("type", e.getClass().getSimpleName());
                    out.put("over_quota", err);
                }
            }
            Thread.sleep(2000); // the last acks leave the consumption threads
            synchronized (lock) {
                out.put("messages", new ArrayList<>(got));
            }
            out.put("errors", List.of());
            return Json.value(out);
        } finally {
            if (producer != null) {
                closeWithin(producer, "the Producer");
            }
            closeWithin(consumer, "the LitePushConsumer");
        }
    }

    /**
     * close() that gives up (on stderr) before the deadline: a PushConsumer's close waits for
     * its receives in flight, up to long polling + request timeout each.
     */
    private void closeWithin(Closeable client, String what) {
        closeAllWithin(List.of(client), what);
    }

    /** Closes every client at once, each in a thread, and waits for them up to the run's deadline. */
    private void closeAllWithin(List<? extends Closeable> clients, String what) {
        List<Thread> closers = new ArrayList<>();
        for (Closeable client : clients) {
            Thread closer = new Thread(() -> {
                try {
                    client.close();
                } catch (Exception e) {
                    System.err.println("JavaClient: closing " + what + ": " + describe(e));
                }
            }, "close");
            closer.setDaemon(true);
            closer.start();
            closers.add(closer);
        }
        long until = System.nanoTime() + (long) (Math.max(remainingSeconds() - 3, 0.5) * 1e9);
        int open = 0;
        for (Thread closer : closers) {
            try {
                closer.join(Math.max(TimeUnit.NANOSECONDS.toMillis(until - System.nanoTime()), 1));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            open += closer.isAlive() ? 1 : 0;
        }
        if (open > 0) {
            System.err.printf("JavaClient: %d of %s did not close in time, leaving them%n", open, what);
        }
    }

    /**
     * Transactions (committed, rolled back, orphaned and checked), a timed message and a recalled
     * one; then a SimpleConsumer receives until the committed, the orphan and the timed one came.
     */
    private String features() throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        String topic = opts.get("topic");
        int delaySeconds = integer("delay-seconds", 4, false);
        List<Object> checked = new ArrayList<>();
        Map<String, Object> out = new LinkedHashMap<>();
        List<Object> errors = new ArrayList<>();
        out.put("errors", errors);
        SimpleConsumer consumer = simpleConsumer(FEATURES_AWAIT_SECONDS);
        Producer producer = null;
        try {
            producer = provider.newProducerBuilder()
                .setClientConfiguration(configuration())
                .setTopics(topic)
                .setTransactionChecker(messageView -> {
                    synchronized (checked) {
                        checked.add(messageView.getMessageId().toString());
                    }
                    return TransactionResolution.COMMIT;
                })
                .build();
            String[][] transactions = {{"committed", "commit"}, {"rolled_back", "rollback"}, {"orphan", null}};
            for (String[] tx : transactions) {
                Transaction transaction = producer.beginTransaction();
                SendReceipt receipt = producer.send(message(provider, tx[0]).build(), transaction);
                out.put(tx[0], receipt.getMessageId().toString());
                if ("commit".equals(tx[1])) {
                    transaction.commit();
                } else if ("rollback".equals(tx[1])) {
                    transaction.rollback();
                }
            }
            // The Java client takes epoch milliseconds.
            long deliverMs = System.currentTimeMillis() + delaySeconds * 1000L;
            out.put("timed", producer.send(
                message(provider, "timed").setDeliveryTimestamp(deliverMs).build()).getMessageId().toString());
            out.put("deliver_ms", deliverMs);
            SendReceipt recalled = producer.send(
                message(provider, "recalled").setDeliveryTimestamp(deliverMs).build());
            out.put("recalled", recalled.getMessageId().toString());
            out.put("recall_answer",
                producer.recallMessage(topic, recalled.getRecallHandle()).getMessageId().toString());
            Set<Object> wanted = Set.of(out.get("committed"), out.get("orphan"), out.get("timed"));
            Set<Object> got = new HashSet<>();
            List<Object> received = new ArrayList<>();
            // A receive takes up to the long poll plus the request timeout; leave time to close.
            double perReceive = FEATURES_AWAIT_SECONDS + REQUEST_TIMEOUT_SECONDS + 1;
            long doneAt = 0;
            while (remainingSeconds() > perReceive + 5 && (doneAt == 0 || System.nanoTime() < doneAt)) {
                List<MessageView> batch;
                try {
                    batch = consumer.receive(MAX_MESSAGES_PER_RECEIVE, Duration.ofSeconds(FEATURES_INVISIBLE_SECONDS));
                } catch (Exception e) { // one failed receive is reported, not fatal
                    errors.add("receive: " + describe(e));
                    continue;
                }
                for (MessageView msg : batch) {
                    String id = msg.getMessageId().toString();
                    received.add(Json.map("id", id, "at_ms", System.currentTimeMillis()));
                    got.add(id);
                    consumer.ack(msg);
                }
                if (doneAt == 0 && got.containsAll(wanted)) {
                    doneAt = System.nanoTime() + TimeUnit.SECONDS.toNanos(2);
                }
            }
            out.put("received", received);
            synchronized (checked) {
                out.put("checked", new ArrayList<>(checked));
            }
        } finally {
            if (producer != null) {
                closeWithin(producer, "the Producer");
            }
            closeWithin(consumer, "the SimpleConsumer");
        }
        return Json.value(out);
    }

    /** One role of the official-client soak until a control file says stop: see the usage at the top. */
    private String soak() throws Exception {
        String role = opts.get("role");
        if (role.startsWith("produce")) {
            soakProduce(role);
        } else if ("simple".equals(role)) {
            soakSimple();
        } else {
            soakPush();
        }
        emit("done");
        return null; // the events are the output
    }

    /**
     * One message a tick (--rate a second), each send waited for; a send that overran its tick
     * is followed at the next tick, no burst to catch up. produce-tx sends each message in its
     * own transaction and ends it by its seq (see the usage at the top).
     */
    private void soakProduce(String role) throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        boolean tx = "produce-tx".equals(role);
        boolean fifo = "produce-fifo".equals(role);
        int groups = integer("message-groups", SOAK_MESSAGE_GROUPS, false);
        String prefix = opts.getOrDefault("prefix", "m");
        long period = Math.max((long) (1e9 / number("rate", SOAK_RATE)), 1);
        ProducerBuilder builder = provider.newProducerBuilder()
            .setClientConfiguration(configuration())
            .setTopics(opts.get("topic"));
        if (tx) {
            // Asked on a RecoverOrphanedTransaction command: the outcome the seq meant (orphans,
            // seq % 4 == 1, commit; a lost rollback, seq % 4 == 0, rolls back; a body without a
            // seq is none of ours and rolls back).
            builder.setTransactionChecker(view -> {
                String body = text(view);
                Long seq = soakSeq(body);
                boolean commit = seq != null && seq % 4 != 0;
                emit("checked", "id", body, "answer", commit ? "COMMIT" : "ROLLBACK");
                return commit ? TransactionResolution.COMMIT : TransactionResolution.ROLLBACK;
            });
        }
        Producer producer = builder.build();
        emit("ready", "role", role, "lang", "java");
        CountDownLatch stop = controlFile("stop-producing", "stop");
        try {
            long next = System.nanoTime();
            for (long seq = 0; !stop.await(Math.max(next - System.nanoTime(), 0), TimeUnit.NANOSECONDS);
                 seq++) {
                String body = prefix + "-" + seq;
                Transaction transaction = null;
                SendReceipt receipt = null;
                try {
                    MessageBuilder message = message(provider, body);
                    if (fifo) {
                        message.setMessageGroup("g" + seq % groups);
                    }
                    if (tx) {
                        transaction = producer.beginTransaction();
                        receipt = producer.send(message.build(), transaction);
                    } else {
                        receipt = producer.send(message.build());
                    }
                } catch (Exception e) { // not retried: the next send takes the next seq
                    emit("send_error", "id", body, "kind", errorKind(e), "detail", detail(e));
                }
                if (receipt != null) {
                    emit("sent", "id", body, "msg_id", receipt.getMessageId().toString());
                    if (tx) {
                        endTransaction(transaction, body, seq);
                    }
                }
                next += period;
                long now = System.nanoTime();
                if (next < now) {
                    next += ((now - next) / period + 1) * period;
                }
            }
            if (tx) { // an orphan's check reaches this producer only while it runs
                controlFile("stop").await();
            }
        } finally {
            closeWithin(producer, "the Producer");
        }
    }

    /** seq % 4 == 0 rolls back, 1 is left open (an orphan for the broker's check), else commits. */
    private void endTransaction(Transaction transaction, String body, long seq) {
        String outcome = seq % 4 == 0 ? "rollback" : seq % 4 == 1 ? "none" : "commit";
        try {
            if ("commit".equals(outcome)) {
                transaction.commit();
            } else if ("rollback".equals(outcome)) {
                transaction.rollback();
            }
            emit("tx_end", "id", body, "outcome", outcome, "ok", true);
        } catch (Exception e) {
            emit("tx_end", "id", body, "outcome", outcome, "ok", false, "kind", errorKind(e));
        }
    }

    /**
     * --consumers SimpleConsumers, each in a thread of its own that receives (--batch,
     * --invisible-seconds, long polling --await-seconds) and acks everything.
     */
    private void soakSimple() throws Exception {
        int await = integer("await-seconds", SOAK_AWAIT_SECONDS, false);
        List<SimpleConsumer> consumers = startAll(() -> simpleConsumer(await));
        try {
            emit("ready", "role", "simple", "lang", "java", "consumers", consumers.size());
            CountDownLatch stop = controlFile("stop");
            int batchSize = integer("batch", MAX_MESSAGES_PER_RECEIVE, false);
            Duration invisible = Duration.ofSeconds(integer("invisible-seconds", SOAK_INVISIBLE_SECONDS, false));
            List<Thread> loops = new ArrayList<>();
            for (SimpleConsumer consumer : consumers) {
                Thread loop = new Thread(() -> receiveAndAck(consumer, stop, batchSize, invisible),
                    "receive-" + loops.size());
                loop.start();
                loops.add(loop);
            }
            for (Thread loop : loops) {
                loop.join();
            }
        } finally {
            closeAllWithin(consumers, "the SimpleConsumers");
        }
    }

    /** One SimpleConsumer's loop until the stop file: a stop is seen between receives. */
    private void receiveAndAck(SimpleConsumer consumer, CountDownLatch stop, int batchSize,
            Duration invisible) {
        try {
            // The receive in flight when the stop comes is finished and acked first.
            while (stop.getCount() > 0) {
                List<MessageView> batch;
                try {
                    batch = consumer.receive(batchSize, invisible);
                } catch (Exception e) {
                    emit("recv_error", "kind", errorKind(e), "detail", detail(e));
                    stop.await(1, TimeUnit.SECONDS); // a fleet that is down is not spun on
                    continue;
                }
                for (MessageView msg : batch) {
                    String id = received(msg);
                    try {
                        consumer.ack(msg);
                        emit("ack", "id", id);
                    } catch (Exception e) {
                        emit("ack_error", "id", id, "kind", errorKind(e), "detail", detail(e));
                    }
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /**
     * --consumers clients, started SOAK_STARTING_AT_ONCE at a time (each start is a route
     * query and a settings exchange, mostly waiting). If one fails to start, those started
     * are closed and its failure is thrown: the soak counts a client that did not start.
     */
    private <T extends Closeable> List<T> startAll(Callable<T> start) throws Exception {
        int count = integer("consumers", 1, false);
        ExecutorService starter = Executors.newFixedThreadPool(Math.min(count, SOAK_STARTING_AT_ONCE));
        List<Future<T>> starting = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            starting.add(starter.submit(start));
        }
        starter.shutdown();
        List<T> started = new ArrayList<>();
        Exception failure = null;
        for (Future<T> one : starting) {
            try {
                started.add(one.get());
            } catch (ExecutionException e) {
                failure = failure != null ? failure
                    : e.getCause() instanceof Exception ? (Exception) e.getCause() : e;
            }
        }
        if (failure != null) {
            closeAllWithin(started, "the clients started");
            throw failure;
        }
        return started;
    }

    /** A started PushConsumer of --group on --topic (--filter, --filter-type) with this listener. */
    private PushConsumer pushConsumer(ClientServiceProvider provider, MessageListener listener)
            throws ClientException {
        return provider.newPushConsumerBuilder()
            .setClientConfiguration(configuration())
            .setConsumerGroup(opts.get("group"))
            .setSubscriptionExpressions(Collections.singletonMap(opts.get("topic"), filterExpression()))
            .setMessageListener(listener)
            .build();
    }

    /**
     * --consumers PushConsumers, one listener: it takes --consume-ms and answers SUCCESS (the
     * client acks).
     */
    private void soakPush() throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        long consumeMillis = integer("consume-ms", 0, false);
        MessageListener listener = message -> {
                String id = received(message);
                if (consumeMillis > 0) {
                    try {
                        Thread.sleep(consumeMillis);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                }
                emit("consumed", "id", id); // just before the SUCCESS it returns
                return ConsumeResult.SUCCESS;
            };
        List<PushConsumer> consumers = startAll(() -> pushConsumer(provider, listener));
        try {
            emit("ready", "role", "push", "lang", "java", "consumers", consumers.size());
            controlFile("stop").await();
        } finally {
            closeAllWithin(consumers, "the PushConsumers");
        }
    }

    /**
     * The recv event of a received message (and corrupt when the client flagged its body digest);
     * returns its id, the body. MessageViewImpl (the client's only MessageView) gives the queue
     * offset (getOffset(), the message's system property queue_offset) and the receipt handle
     * (getReceiptHandle()). The queue stays null: MessageViewImpl.fromProtobuf drops the
     * message's queue_id, and getMessageQueue() is the queue the ReceiveMessage was sent to (a
     * route queue for a SimpleConsumer, queue -1 of the assignment for a PushConsumer), not the
     * message's. The PushConsumer never hands a corrupted message to its listener (it nacks it,
     * or forwards it to the DLQ when FIFO): corrupt only comes from the SimpleConsumer.
     */
    private String received(MessageView msg) {
        String id = text(msg);
        MessageViewImpl impl = msg instanceof MessageViewImpl ? (MessageViewImpl) msg : null;
        emit("recv", "id", id, "msg_id", msg.getMessageId().toString(),
            "attempt", msg.getDeliveryAttempt(), "group", group(msg), "queue", null,
            "offset", impl == null ? null : impl.getOffset(),
            "handle", impl == null ? null : impl.getReceiptHandle());
        if (impl != null && impl.isCorrupted()) {
            emit("corrupt", "id", id);
        }
        return id;
    }

    /** The seq of a soak body "<PFX>-<seq>", or null when it has none. */
    private static Long soakSeq(String body) {
        try {
            return Long.parseLong(body.substring(body.lastIndexOf('-') + 1));
        } catch (NumberFormatException e) {
            return null;
        }
    }

    /**
     * A latch released once one of the control files exists in --control-dir, which a daemon
     * thread looks for every 200 ms.
     */
    private CountDownLatch controlFile(String... names) {
        Path dir = Paths.get(opts.get("control-dir"));
        CountDownLatch there = new CountDownLatch(1);
        Thread poller = new Thread(() -> {
            try {
                while (true) {
                    for (String name : names) {
                        if (Files.exists(dir.resolve(name))) {
                            there.countDown();
                            return;
                        }
                    }
                    Thread.sleep(SOAK_CONTROL_POLL_MILLIS);
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }, "control");
        poller.setDaemon(true);
        poller.start();
        return there;
    }

    /**
     * One soak event line on stdout: {"ev", "t" (epoch ms), then the pairs}, written whole and
     * flushed under a lock (the checker and the listener threads emit too); nothing after done.
     */
    private void emit(String ev, Object... pairs) {
        Map<String, Object> event = new LinkedHashMap<>();
        event.put("ev", ev);
        event.put("t", System.currentTimeMillis());
        event.putAll(Json.map(pairs));
        String line = Json.value(event);
        synchronized (stdout) {
            if (printedDone) {
                return;
            }
            System.out.println(line);
            System.out.flush();
            printedDone = "done".equals(ev);
        }
    }

    /**
     * A short, stable name of a failure for the soak to count by: the first exception of the
     * cause chain that carries a code decides, a client exception with its RocketMQ response
     * code ("TooManyRequestsException:42900") or a gRPC status by its code's name
     * ("UNAVAILABLE", "DEADLINE_EXCEEDED"); otherwise the root cause's class name (a plain
     * ClientException wrapping, say, a TimeoutException gives "TimeoutException").
     */
    static String errorKind(Throwable t) {
        Throwable root = t;
        for (Throwable c = t; c != null; c = c.getCause() == c ? null : c.getCause()) {
            if (c instanceof ClientException) {
                Matcher code = RESPONSE_CODE.matcher(String.valueOf(c.getMessage()));
                if (code.lookingAt()) {
                    return c.getClass().getSimpleName() + ":" + code.group(1);
                }
            } else if (c instanceof StatusRuntimeException) {
                return ((StatusRuntimeException) c).getStatus().getCode().name();
            } else if (c instanceof StatusException) {
                return ((StatusException) c).getStatus().getCode().name();
            }
            root = c;
        }
        return root.getClass().getSimpleName();
    }

    private static String detail(Throwable t) {
        String text = describe(t);
        return text.length() <= SOAK_DETAIL_CHARS ? text : text.substring(0, SOAK_DETAIL_CHARS);
    }

    private MessageBuilder message(ClientServiceProvider provider, String body) {
        return provider.newMessageBuilder()
            .setTopic(opts.get("topic"))
            .setBody(body.getBytes(StandardCharsets.UTF_8));
    }

    private String run() throws Exception {
        switch (command) {
            case "produce":
                return produce();
            case "consume":
                return consume();
            case "push":
                return push();
            case "lite":
                return lite();
            case "soak":
                return soak();
            default:
                return features();
        }
    }

    public static void main(String[] argv) {
        JavaClient driver = new JavaClient();
        double deadline;
        try {
            driver.parse(argv);
            deadline = driver.deadlineSeconds();
        } catch (UsageError | NumberFormatException e) {
            System.err.println("JavaClient: " + e.getMessage());
            System.err.flush();
            Runtime.getRuntime().halt(2);
            return;
        }
        driver.deadlineNanos = System.nanoTime() + (long) (deadline * 1e9);
        // Bound the whole run: the client has waits without a timeout of their own.
        Thread watchdog = new Thread(() -> {
            try {
                Thread.sleep((long) (deadline * 1000));
            } catch (InterruptedException e) {
                return;
            }
            System.err.printf("JavaClient: deadline of %.0fs exceeded, giving up%n", deadline);
            System.err.flush();
            Runtime.getRuntime().halt(3);
        }, "deadline");
        watchdog.setDaemon(true);
        watchdog.start();
        long started = System.nanoTime();
        String result;
        try {
            result = driver.run();
        } catch (Throwable t) {
            t.printStackTrace(System.err);
            StringBuilder cause = new StringBuilder();
            for (Throwable c = t.getCause(); c != null && c != c.getCause(); c = c.getCause()) {
                cause.append(" <- ").append(describe(c));
            }
            System.err.printf("JavaClient %s failed after %.1fs: %s%s%n", driver.command,
                (System.nanoTime() - started) / 1e9, describe(t), cause);
            System.err.flush();
            // The client keeps non-daemon threads (gRPC, schedulers): leave at once.
            Runtime.getRuntime().halt(1);
            return;
        }
        if (result != null) { // soak printed its events as they came
            System.out.println(result);
            System.out.flush();
        }
        Runtime.getRuntime().halt(0);
    }

    /** Just enough JSON for the output contract: maps, lists, strings, numbers, booleans, null. */
    static final class Json {
        /** An object from alternating keys and values, in that order. */
        static String object(Object... pairs) {
            return value(map(pairs));
        }

        static Map<String, Object> map(Object... pairs) {
            Map<String, Object> m = new LinkedHashMap<>();
            for (int i = 0; i < pairs.length; i += 2) {
                m.put((String) pairs[i], pairs[i + 1]);
            }
            return m;
        }

        static String value(Object v) {
            StringBuilder b = new StringBuilder();
            write(b, v);
            return b.toString();
        }

        private static void write(StringBuilder b, Object v) {
            if (v == null) {
                b.append("null");
            } else if (v instanceof String) {
                string(b, (String) v);
            } else if (v instanceof Boolean || v instanceof Integer || v instanceof Long) {
                b.append(v);
            } else if (v instanceof Double) {
                // Fixed notation: epoch seconds with microseconds.
                b.append(String.format(Locale.ROOT, "%.6f", (Double) v));
            } else if (v instanceof Map) {
                b.append('{');
                String sep = "";
                for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                    b.append(sep);
                    string(b, (String) e.getKey());
                    b.append(": ");
                    write(b, e.getValue());
                    sep = ", ";
                }
                b.append('}');
            } else if (v instanceof List) {
                b.append('[');
                String sep = "";
                for (Object item : (List<?>) v) {
                    b.append(sep);
                    write(b, item);
                    sep = ", ";
                }
                b.append(']');
            } else {
                throw new IllegalArgumentException("no JSON for " + v.getClass());
            }
        }

        private static void string(StringBuilder b, String s) {
            b.append('"');
            for (int i = 0; i < s.length(); i++) {
                char c = s.charAt(i);
                switch (c) {
                    case '"': b.append("\\\""); break;
                    case '\\': b.append("\\\\"); break;
                    case '\n': b.append("\\n"); break;
                    case '\r': b.append("\\r"); break;
                    case '\t': b.append("\\t"); break;
                    default:
                        if (c < 0x20) {
                            b.append(String.format("\\u%04x", (int) c));
                        } else {
                            b.append(c);
                        }
                }
            }
            b.append('"');
        }
    }
}
