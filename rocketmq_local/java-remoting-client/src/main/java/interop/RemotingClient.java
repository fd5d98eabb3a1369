/*
 * Drive the official RocketMQ Java client's remoting API (rocketmq-client 5.5.0, the API of the
 * 4.x clients) as a test peer of a proxy's remoting port.
 *
 * Built by `make rocketmq-java-remoting-client` into .cache/rocketmq/java-remoting-client (run it
 * with `java -Duser.home=DIR -cp interop-java-remoting-client.jar:lib/* interop.RemotingClient`).
 * Every client is built as an application builds it: a name server address (here the proxy's
 * remoting address) and a group, nothing else changed. Output is JSON lines: {"ready": true}
 * once the client has started, then one result line, then exit 0. Every command takes
 * --access-key AK --secret-key SK: the client's ACL hook (AclClientRPCHook) signs each request;
 * and --tls: the client connects with TLS (ClientConfig.setUseTLS; the client's default TLS
 * test mode trusts any server certificate).
 *
 *   produce --namesrv H:P --group PG --topic T --count N [--kind normal|orderly|delay|transaction]
 *           [--order-keys K] [--delay-level L] [--body-prefix P] [--check-seconds S]
 *           [--interval-ms W]
 *       message i has the body "<P>-<i>" (P default "m"), one every W ms (default at once). orderly: key "k<i mod K>" (K default 4),
 *       sent to the queue the key hashes to (a MessageQueueSelector). delay: delay level L
 *       (default 1: one second). transaction: a TransactionMQProducer whose local transaction
 *       commits i mod 3 == 0, rolls back i mod 3 == 1 and leaves i mod 3 == 2 unknown; its checker
 *       commits what it is asked about; it waits up to S seconds (default 90) for every unknown
 *       one to be checked.
 *       -> {"sent": [{"body", "id", "broker", "queue", "status"}], "committed": [bodies],
 *           "rolled_back": [bodies], "checked": [bodies], "errors": [...]}
 *   push --namesrv H:P --group G --topic T --expect N [--orderly] [--broadcast] [--seconds S]
 *       a DefaultMQPushConsumer (concurrent, or orderly; clustering, or broadcasting) subscribed
 *       to every tag of T from the first offset; stops once N distinct bodies were consumed,
 *       or after S seconds (default 60).
 *   litepull --namesrv H:P --group G --topic T --expect N [--seconds S]
 *       a DefaultLitePullConsumer subscribed to T from the first offset; polls until N distinct
 *       bodies, or S seconds.
 *       push and litepull -> {"messages": [{"body", "key", "broker", "queue", "offset",
 *                              "reconsume", "born_ms", "stored_ms", "at_ms"}], "errors": [...]}
 */
package interop;

import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.RPCHook;
import org.apache.rocketmq.remoting.protocol.heartbeat.MessageModel;

public final class RemotingClient {
    private final Map<String, String> opts = new HashMap<>();
    private final Set<String> flags = new HashSet<>();
    private final List<String> errors = Collections.synchronizedList(new ArrayList<>());

    private RemotingClient(String[] args) {
        for (int i = 1; i < args.length; i++) {
            String name = args[i].substring(2);
            if (i + 1 < args.length && !args[i + 1].startsWith("--")) {
                opts.put(name, args[++i]);
            } else {
                flags.add(name);
            }
        }
    }

    public static void main(String[] args) throws Exception {
        RemotingClient driver = new RemotingClient(args);
        String result;
        switch (args[0]) {
            case "produce": result = driver.produce(); break;
            case "push": result = driver.push(); break;
            case "litepull": result = driver.litePull(); break;
            default: throw new IllegalArgumentException("unknown command " + args[0]);
        }
        System.out.println(result);
        System.out.flush();
        System.exit(0);
    }

    private String opt(String name, String otherwise) {
        return opts.getOrDefault(name, otherwise);
    }

    private String need(String name) {
        String value = opts.get(name);
        if (value == null) {
            throw new IllegalArgumentException("--" + name + " is required");
        }
        return value;
    }

    /** The 4.x clients' ACL hook with --access-key and --secret-key, else none. */
    private RPCHook hook() {
        String accessKey = opts.get("access-key");
        if (accessKey == null) {
            return null;
        }
        return new AclClientRPCHook(new SessionCredentials(accessKey, need("secret-key")));
    }

    private static void ready() {
        System.out.println("{\"ready\": true}");
        System.out.flush();
    }

    // -- produce --------------------------------------------------------------------------

    private String produce() throws Exception {
        String kind = opt("kind", "normal");
        String topic = need("topic");
        int count = Integer.parseInt(need("count"));
        String prefix = opt("body-prefix", "m");
        int orderKeys = Integer.parseInt(opt("order-keys", "4"));
        List<String> committed = Collections.synchronizedList(new ArrayList<>());
        List<String> rolledBack = Collections.synchronizedList(new ArrayList<>());
        List<String> checked = Collections.synchronizedList(new ArrayList<>());
        int unknown = 0;
        DefaultMQProducer producer;
        if (kind.equals("transaction")) {
            TransactionMQProducer tx = new TransactionMQProducer(need("group"), hook());
            tx.setTransactionListener(new TransactionListener() {
                @Override
                public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                    String body = new String(msg.getBody());
                    int i = Integer.parseInt(body.substring(body.lastIndexOf('-') + 1));
                    if (i % 3 == 0) {
                        committed.add(body);
                        return LocalTransactionState.COMMIT_MESSAGE;
                    }
                    if (i % 3 == 1) {
                        rolledBack.add(body);
                        return LocalTransactionState.ROLLBACK_MESSAGE;
                    }
                    return LocalTransactionState.UNKNOW;
                }

                @Override
                public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                    String body = new String(msg.getBody());
                    if (!checked.contains(body)) {
                        checked.add(body);
                    }
                    return LocalTransactionState.COMMIT_MESSAGE;
                }
            });
            producer = tx;
        } else {
            producer = new DefaultMQProducer(need("group"), hook());
        }
        producer.setNamesrvAddr(need("namesrv"));
        producer.setUseTLS(flags.contains("tls"));
        producer.start();
        ready();
        StringBuilder sent = new StringBuilder();
        long intervalMs = Long.parseLong(opt("interval-ms", "0"));
        for (int i = 0; i < count; i++) {
            if (intervalMs > 0 && i > 0) {
                Thread.sleep(intervalMs);
            }
            String body = prefix + "-" + i;
            Message msg = new Message(topic, "t", body.getBytes());
            try {
                SendResult result;
                if (kind.equals("orderly")) {
                    String key = "k" + (i % orderKeys);
                    msg.setKeys(key);
                    result = producer.send(msg, (queues, m, arg) ->
                        queues.get(Math.abs(arg.hashCode()) % queues.size()), key);
                } else if (kind.equals("transaction")) {
                    result = producer.sendMessageInTransaction(msg, null);
                    if (i % 3 == 2) {
                        unknown++;
                    }
                } else {
                    if (kind.equals("delay")) {
                        msg.setDelayTimeLevel(Integer.parseInt(opt("delay-level", "1")));
                    }
                    result = producer.send(msg);
                }
                MessageQueue queue = result.getMessageQueue();
                if (sent.length() > 0) {
                    sent.append(", ");
                }
                sent.append("{\"body\": ").append(quote(body))
                    .append(", \"id\": ").append(quote(result.getMsgId()))
                    .append(", \"broker\": ").append(quote(queue.getBrokerName()))
                    .append(", \"queue\": ").append(queue.getQueueId())
                    .append(", \"status\": ").append(quote(result.getSendStatus().name())).append("}");
            } catch (Exception e) {
                errors.add(body + ": " + describe(e));
            }
        }
        if (kind.equals("transaction")) {
            long deadline = System.currentTimeMillis() + 1000L * Integer.parseInt(opt("check-seconds", "90"));
            while (checked.size() < unknown && System.currentTimeMillis() < deadline) {
                Thread.sleep(100);
            }
        }
        producer.shutdown();
        return "{\"sent\": [" + sent + "], \"committed\": " + list(committed)
            + ", \"rolled_back\": " + list(rolledBack) + ", \"checked\": " + list(checked)
            + ", \"errors\": " + list(errors) + "}";
    }

    // -- consume --------------------------------------------------------------------------

    /** What a consumer saw, in the order its listener was called. */
    private final class Seen {
        private final int expect = Integer.parseInt(need("expect"));
        private final List<String> lines = Collections.synchronizedList(new ArrayList<>());
        private final Set<String> bodies = ConcurrentHashMap.newKeySet();
        private final CountDownLatch done = new CountDownLatch(1);

        void record(MessageExt msg) {
            String body = new String(msg.getBody());
            lines.add("{\"body\": " + quote(body) + ", \"key\": " + quote(msg.getKeys())
                + ", \"broker\": " + quote(msg.getBrokerName()) + ", \"queue\": " + msg.getQueueId()
                + ", \"offset\": " + msg.getQueueOffset() + ", \"reconsume\": " + msg.getReconsumeTimes()
                + ", \"born_ms\": " + msg.getBornTimestamp() + ", \"stored_ms\": " + msg.getStoreTimestamp()
                + ", \"at_ms\": " + System.currentTimeMillis() + "}");
            bodies.add(body);
            if (bodies.size() >= expect) {
                done.countDown();
            }
        }

        boolean await() throws InterruptedException {
            return done.await(Long.parseLong(opt("seconds", "60")), TimeUnit.SECONDS);
        }

        String result() {
            synchronized (lines) {
                return "{\"messages\": [" + String.join(", ", lines) + "], \"errors\": " + list(errors) + "}";
            }
        }
    }

    private String push() throws Exception {
        Seen seen = new Seen();
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(need("group"), hook());
        consumer.setNamesrvAddr(need("namesrv"));
        consumer.setUseTLS(flags.contains("tls"));
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        if (flags.contains("broadcast")) {
            consumer.setMessageModel(MessageModel.BROADCASTING);
        }
        consumer.subscribe(need("topic"), "*");
        if (flags.contains("orderly")) {
            consumer.registerMessageListener((MessageListenerOrderly) (msgs, context) -> {
                msgs.forEach(seen::record);
                return ConsumeOrderlyStatus.SUCCESS;
            });
        } else {
            consumer.registerMessageListener((MessageListenerConcurrently) (msgs, context) -> {
                msgs.forEach(seen::record);
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
        }
        consumer.start();
        ready();
        if (!seen.await()) {
            errors.add("timed out");
        }
        consumer.shutdown();
        return seen.result();
    }

    private String litePull() throws Exception {
        Seen seen = new Seen();
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(need("group"), hook());
        consumer.setNamesrvAddr(need("namesrv"));
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(need("topic"), "*");
        consumer.start();
        ready();
        long deadline = System.currentTimeMillis() + 1000L * Long.parseLong(opt("seconds", "60"));
        while (seen.done.getCount() > 0 && System.currentTimeMillis() < deadline) {
            for (MessageExt msg : consumer.poll(1000)) {
                seen.record(msg);
            }
        }
        if (seen.done.getCount() > 0) {
            errors.add("timed out");
        }
        consumer.shutdown();
        return seen.result();
    }

    /** An exception with its causes: a retried send's says only that it failed. */
    private static String describe(Throwable e) {
        StringBuilder out = new StringBuilder(e.toString());
        for (Throwable cause = e.getCause(); cause != null && cause != cause.getCause(); cause = cause.getCause()) {
            out.append(" <- ").append(cause);
        }
        return out.toString();
    }

    // -- JSON -------------------------------------------------------------------------------

    private static String list(List<String> items) {
        synchronized (items) {
            List<String> quoted = new ArrayList<>();
            for (String item : items) {
                quoted.add(quote(item));
            }
            return "[" + String.join(", ", quoted) + "]";
        }
    }

    private static String quote(String text) {
        if (text == null) {
            return "null";
        }
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }
}
