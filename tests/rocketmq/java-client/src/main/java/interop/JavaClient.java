/*
 * Drive the official RocketMQ 5 Java client (rocketmq-client-java 5.2.0) as a test peer.
 *
 * Built by `make rocketmq-java-client` into .cache/rocketmq/java-client (run it with
 * `java -Duser.home=DIR -cp interop-java-client.jar:lib/* interop.JavaClient ...`). Same command
 * line and output as tests/interop/python_client.py and node/client.mjs:
 *
 *   produce --endpoint HOST:PORT --topic T --count N [--tag X] [--keys K] [--body-prefix P]
 *       -> {"ids": [...]}            message i has the body "<P>-<i>"
 *   consume --endpoint HOST:PORT --group G --topic T --await-seconds S --expect N
 *           [--max-rounds R] [--invisible-seconds I] [--ack] [--change-invisible-seconds C]
 *           [--no-ack-first] [--start-only]
 *       -> {"messages": [{"id", "body", "tag", "keys", "topic", "attempt"}],
 *           "receives": <calls>, "empty_receives": <count>, "errors": [...]}
 *       --start-only -> {"started": true, "endpoints": [...], "settings": true, "heartbeat": "OK"}
 *
 * One JSON line on stdout and exit 0; on failure a message on stderr and a non-zero exit (1 for
 * an error, 2 for bad usage, 3 when the whole run overran --deadline-seconds). Errors of single
 * operations inside the receive loop are reported in "errors" instead. The client logs to
 * ${user.home}/logs/rocketmq/rocketmq-client.log: pass -Duser.home to move it.
 *
 * What this client (5.2.0) requires of the server, read from its source (apache/rocketmq-clients,
 * tag java-5.2.0, java/client):
 * - TLS is on by default: the driver turns it off (enableSsl(false)), the proxy serves plaintext.
 * - Startup (ClientImpl.startUp): QueryRoute for every topic, up to maxStartupAttempts (3) times,
 *   then throws. For each new broker endpoint of a route it opens a Telemetry stream, writes
 *   Settings and waits WITHOUT a timeout for the settings answer (ClientSessionImpl's
 *   settingsInitFuture) before the route counts as fetched: startup success proves both.
 * - ChangeInvisibleDuration: the response's receipt_handle replaces the message's handle.
 * - Heartbeat: sent every 10 s by the client itself; --start-only sends one now, like the
 *   other drivers, through the client's own ClientManager.
 */
package interop;

import apache.rocketmq.v2.Code;
import apache.rocketmq.v2.HeartbeatResponse;
import java.lang.reflect.Method;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.java.impl.ClientImpl;
import org.apache.rocketmq.client.java.message.MessageViewImpl;
import org.apache.rocketmq.client.java.route.Address;
import org.apache.rocketmq.client.java.route.Endpoints;

public final class JavaClient {
    private static final int REQUEST_TIMEOUT_SECONDS = 3; // the client's default, stated
    private static final int MAX_MESSAGES_PER_RECEIVE = 16;

    private static final class UsageError extends Exception {
        UsageError(String message) {
            super(message);
        }
    }

    private final Map<String, String> opts = new HashMap<>();
    private final Set<String> flags = new HashSet<>();
    private String command;

    private static final Set<String> VALUED = Set.of("endpoint", "topic", "group", "count", "tag",
        "keys", "body-prefix", "filter", "await-seconds", "expect", "max-rounds",
        "invisible-seconds", "change-invisible-seconds", "deadline-seconds");
    private static final Set<String> FLAGS = Set.of("ack", "no-ack-first", "start-only");

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
        if (positionals.size() != 1
            || !(positionals.get(0).equals("produce") || positionals.get(0).equals("consume"))) {
            throw new UsageError("usage: JavaClient produce|consume --endpoint HOST:PORT --topic T ...");
        }
        command = positionals.get(0);
        require("endpoint");
        require("topic");
        if (command.equals("produce")) {
            integer("count", null, true);
        } else {
            require("group");
            if (!flags.contains("start-only")) {
                integer("await-seconds", null, true);
                integer("expect", null, true);
            }
            if (flags.contains("no-ack-first") && !flags.contains("ack")) {
                throw new UsageError("--no-ack-first only makes sense with --ack");
            }
        }
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

    /** Start-up and shut-down allowance plus, for consume, every round at its gRPC deadline. */
    private double deadlineSeconds() throws UsageError {
        String raw = opts.get("deadline-seconds");
        if (raw != null) {
            return Double.parseDouble(raw);
        }
        if (command.equals("produce")) {
            return 20 + integer("count", 0, true) * 3 * REQUEST_TIMEOUT_SECONDS;
        }
        if (flags.contains("start-only")) {
            return 30;
        }
        int perRound = integer("await-seconds", 5, false) + REQUEST_TIMEOUT_SECONDS + 1;
        int perMessage = 2 * REQUEST_TIMEOUT_SECONDS;
        return 20 + integer("max-rounds", 5, false) * (perRound + MAX_MESSAGES_PER_RECEIVE * perMessage);
    }

    private ClientConfiguration configuration() {
        return ClientConfiguration.newBuilder()
            .setEndpoints(opts.get("endpoint"))
            .enableSsl(false)
            .setRequestTimeout(Duration.ofSeconds(REQUEST_TIMEOUT_SECONDS))
            .build();
    }

    private String produce() throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        String topic = opts.get("topic");
        String prefix = opts.getOrDefault("body-prefix", "msg");
        int count = integer("count", null, true);
        List<String> ids = new ArrayList<>();
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
                Message message = builder.build();
                SendReceipt receipt = producer.send(message);
                ids.add(receipt.getMessageId().toString());
            }
        }
        return "{\"ids\": " + Json.strings(ids) + "}";
    }

    private String consume() throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        String topic = opts.get("topic");
        String filter = opts.getOrDefault("filter", "*");
        int awaitSeconds = integer("await-seconds", 5, false);
        SimpleConsumer consumer = provider.newSimpleConsumerBuilder()
            .setClientConfiguration(configuration())
            .setConsumerGroup(opts.get("group"))
            .setSubscriptionExpressions(
                Collections.singletonMap(topic, new FilterExpression(filter, FilterExpressionType.TAG)))
            .setAwaitDuration(Duration.ofSeconds(awaitSeconds))
            .build();
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
        List<String> facades = new ArrayList<>();
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
        Collections.sort(facades);
        return "{\"started\": true, \"endpoints\": " + Json.strings(facades)
            + ", \"settings\": true, \"heartbeat\": \"OK\"}";
    }

    private static String describe(Throwable t) {
        return t.getClass().getSimpleName() + ": " + t.getMessage();
    }

    private String receiveLoop(SimpleConsumer consumer) throws Exception {
        int expect = integer("expect", null, true);
        int maxRounds = integer("max-rounds", 5, false);
        int invisible = integer("invisible-seconds", 30, false);
        Integer change = integer("change-invisible-seconds", null, false);
        boolean ack = flags.contains("ack");
        boolean noAckFirst = flags.contains("no-ack-first");
        List<String> messages = new ArrayList<>();
        List<String> errors = new ArrayList<>();
        Set<String> seen = new HashSet<>();
        int receives = 0;
        int empty = 0;
        while (receives < maxRounds && (expect == 0 || messages.size() < expect)) {
            receives++;
            List<MessageView> batch;
            try {
                batch = consumer.receive(MAX_MESSAGES_PER_RECEIVE, Duration.ofSeconds(invisible));
            } catch (Exception e) {
                errors.add("receive #" + receives + ": " + describe(e));
                continue;
            }
            if (batch.isEmpty()) {
                empty++;
            }
            for (MessageView msg : batch) {
                String id = msg.getMessageId().toString();
                ByteBuffer body = msg.getBody().duplicate();
                byte[] bytes = new byte[body.remaining()];
                body.get(bytes);
                List<String> keys = new ArrayList<>(msg.getKeys());
                Collections.sort(keys);
                messages.add("{\"id\": " + Json.string(id)
                    + ", \"body\": " + Json.string(new String(bytes, StandardCharsets.UTF_8))
                    + ", \"tag\": " + (msg.getTag().isPresent() ? Json.string(msg.getTag().get()) : "null")
                    + ", \"keys\": " + Json.strings(keys)
                    + ", \"topic\": " + Json.string(msg.getTopic())
                    + ", \"attempt\": " + msg.getDeliveryAttempt() + "}");
                if (msg instanceof MessageViewImpl && ((MessageViewImpl) msg).isCorrupted()) {
                    errors.add("message " + id + ": body digest mismatch (corrupted)");
                }
                boolean firstTime = seen.add(id);
                try {
                    if (change != null) {
                        consumer.changeInvisibleDuration(msg, Duration.ofSeconds(change));
                    }
                    if (ack && !(noAckFirst && firstTime)) {
                        consumer.ack(msg);
                    }
                } catch (Exception e) {
                    errors.add("message " + id + ": " + describe(e));
                }
            }
        }
        return "{\"messages\": [" + String.join(", ", messages) + "], \"receives\": " + receives
            + ", \"empty_receives\": " + empty + ", \"errors\": " + Json.strings(errors) + "}";
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
        // Bound the whole run: startup waits for the Telemetry answer without a timeout.
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
            result = driver.command.equals("produce") ? driver.produce() : driver.consume();
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
        System.out.println(result);
        System.out.flush();
        Runtime.getRuntime().halt(0);
    }

    /** Just enough JSON for the output contract: strings and lists of strings. */
    static final class Json {
        static String string(String s) {
            StringBuilder b = new StringBuilder("\"");
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
            return b.append('"').toString();
        }

        static String strings(List<String> items) {
            List<String> quoted = new ArrayList<>();
            for (String s : items) {
                quoted.add(string(s));
            }
            return "[" + String.join(", ", quoted) + "]";
        }
    }
}
