import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;

import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.RecallReceipt;
import org.apache.rocketmq.client.apis.producer.SendReceipt;

/**
 * The RocketMQ 5 side of the differential suite's v5 rows: runs one named workload through
 * RocketMQ 5's Java gRPC client against the proxy and prints what it observed, one JSON object
 * a line on stdout, as RocketMQDriver does. The topics and consumer groups are created
 * beforehand (RocketMQDriver's "v5admin" workload): a v5 client creates neither.
 *
 * Usage: RocketMQV5Driver WORKLOAD PROXY_ENDPOINT key=value...
 */
public final class RocketMQV5Driver {
    private static final long START = System.currentTimeMillis();
    private static final Map<String, Long> SENT_AT = new ConcurrentHashMap<>();
    private static Map<String, String> args;

    private RocketMQV5Driver() {
    }

    // --- output -----------------------------------------------------------------------------
    /** Print one event (DriverOutput's JSON line): emit("consume", "key", k, "t", 12, ...). */
    static void emit(String ev, Object... kv) {
        DriverOutput.emit(ev, kv);
    }

    static long now() {
        return System.currentTimeMillis() - START;
    }

    static String arg(String name) {
        String v = args.get(name);
        if (v == null) {
            throw new IllegalArgumentException("missing argument " + name + "=...");
        }
        return v;
    }

    static int intArg(String name) {
        return Integer.parseInt(arg(name));
    }

    static boolean await(BooleanSupplier condition, long deadline) throws InterruptedException {
        while (now() < deadline) {
            if (condition.getAsBoolean()) {
                return true;
            }
            Thread.sleep(50);
        }
        return condition.getAsBoolean();
    }

    static String keyOf(MessageView m) {
        return m.getKeys().isEmpty() ? null : m.getKeys().iterator().next();
    }

    /** Record a received message: its key, group, delivery attempt and user properties. */
    static void emitView(String ev, MessageView m, Object... extra) {
        long t = now();
        String key = keyOf(m);
        Long sent = key == null ? null : SENT_AT.get(key);
        Object[] base = {
            "key", key,
            "body", StandardCharsets.UTF_8.decode(m.getBody().duplicate()).toString(),
            "topic", m.getTopic(),
            "tags", m.getTag().orElse(null),
            "group", m.getMessageGroup().orElse(null),
            "attempt", m.getDeliveryAttempt(),
            "msg_id", m.getMessageId().toString(),
            "props", new HashMap<>(m.getProperties()),
            "t", t,
            "since_sent", sent == null ? null : t - sent,
        };
        Object[] all = new Object[base.length + extra.length];
        System.arraycopy(base, 0, all, 0, base.length);
        System.arraycopy(extra, 0, all, base.length, extra.length);
        emit(ev, all);
    }

    // --- clients -------------------------------------------------------------------------
    static final ClientServiceProvider PROVIDER = ClientServiceProvider.loadService();

    static ClientConfiguration configuration(String endpoint) {
        return ClientConfiguration.newBuilder()
            .setEndpoints(endpoint)
            .enableSsl(false)
            // A new topic's first request can be slow on a loaded 2-core machine.
            .setRequestTimeout(Duration.ofSeconds(15))
            .build();
    }

    static Producer producer(String endpoint, String topic) throws Exception {
        return PROVIDER.newProducerBuilder()
            .setClientConfiguration(configuration(endpoint))
            .setTopics(topic)
            .build();
    }

    /** The workloads' message: body and keys {@code name}, tag T, property p, and the message
     * group if given. */
    static Message message(String topic, String name, String group) {
        MessageBuilder b = PROVIDER.newMessageBuilder()
            .setTopic(topic)
            .setBody(name.getBytes(StandardCharsets.UTF_8))
            .setKeys(name)
            .setTag("T")
            .addProperty("p", name);
        if (group != null) {
            b.setMessageGroup(group);
        }
        return b.build();
    }

    static void send(Producer producer, Message msg, String name) throws Exception {
        SENT_AT.put(name, now());
        SendReceipt receipt = producer.send(msg);
        emit("sent", "key", name, "t", now(), "msg_id", receipt.getMessageId().toString());
    }

    static Map<String, FilterExpression> all(String topic) {
        return Collections.singletonMap(topic, new FilterExpression("*", FilterExpressionType.TAG));
    }

    // --- workloads -----------------------------------------------------------------------

    /**
     * SimpleConsumer: "ack" is acked at once; "late" is left unacked once and acked when it
     * comes back; "extend" has its invisible duration changed to extend_ms at its first
     * receive and is acked when it comes back; "never" is never acked, so after the group's
     * max delivery attempts it goes to %DLQ%group (read afterwards by RocketMQDriver). One
     * thread receives in a loop until all that happened, then for quiet_ms more (RocketMQ
     * moves a spent message to the DLQ when a receive meets it again).
     */
    static void simple(String endpoint) throws Exception {
        String topic = arg("topic");
        Duration invisible = Duration.ofMillis(intArg("invisible_ms"));
        Duration extend = Duration.ofMillis(intArg("extend_ms"));
        int maxAttempts = intArg("max_attempts");
        long deadline = intArg("deadline_ms");
        long quiet = intArg("quiet_ms");
        Set<String> acked = ConcurrentHashMap.newKeySet();
        AtomicInteger neverSeen = new AtomicInteger();
        try (Producer producer = producer(endpoint, topic);
             SimpleConsumer consumer = PROVIDER.newSimpleConsumerBuilder()
                 .setClientConfiguration(configuration(endpoint))
                 .setConsumerGroup(arg("consumer_group"))
                 .setAwaitDuration(Duration.ofMillis(intArg("await_ms")))
                 .setSubscriptionExpressions(all(topic))
                 .build()) {
            send(producer, message(topic, "warmup", null), "warmup");
            boolean warm = false;
            while (!warm && now() < deadline) {
                for (MessageView m : consumer.receive(16, invisible)) {
                    warm |= "warmup".equals(keyOf(m));
                    consumer.ack(m);
                }
            }
            if (!warm) {
                throw new IllegalStateException("the warm-up message never came");
            }
            emit("ready", "t", now());
            for (String name : new String[] {"ack", "late", "extend", "never"}) {
                send(producer, message(topic, name, null), name);
            }
            long doneAt = -1;
            while (now() < deadline && (doneAt < 0 || now() < doneAt + quiet)) {
                for (MessageView m : consumer.receive(16, invisible)) {
                    String key = keyOf(m);
                    emitView("receive", m);
                    boolean ack = "ack".equals(key)
                        || ("late".equals(key) || "extend".equals(key)) && m.getDeliveryAttempt() > 1;
                    if (ack) {
                        consumer.ack(m);
                        acked.add(key);
                        emit("ack", "key", key, "t", now());
                    } else if ("extend".equals(key)) {
                        consumer.changeInvisibleDuration(m, extend);
                        emit("changed", "key", key, "t", now(), "ms", extend.toMillis());
                    } else if ("never".equals(key)) {
                        neverSeen.set(m.getDeliveryAttempt());
                    }
                }
                if (doneAt < 0 && acked.size() == 3 && neverSeen.get() >= maxAttempts) {
                    doneAt = now();
                }
            }
        }
    }

    /**
     * FIFO message groups: groups (comma-separated) of per_group messages each ("g1-0",
     * "g1-1", ...), sent round robin, with message_group set, to a topic of one queue; a FIFO
     * consumer group's PushConsumer consumes them, each taking work_ms. "g1-1" always fails,
     * "g2-1" fails once. Each consume records the groups running at that moment. With
     * preload=true every message is sent before the consumer starts, so that its first receive
     * takes them all in one batch.
     */
    static void fifo(String endpoint) throws Exception {
        String topic = arg("topic");
        String[] groups = arg("groups").split(",");
        int perGroup = intArg("per_group");
        int workMs = intArg("work_ms");
        long deadline = intArg("deadline_ms");
        boolean preload = Boolean.parseBoolean(arg("preload"));
        Map<String, AtomicInteger> running = new ConcurrentHashMap<>();
        Set<String> consumed = ConcurrentHashMap.newKeySet();
        AtomicInteger failedAttempts = new AtomicInteger();
        int maxAttempts = intArg("max_attempts");
        try (Producer producer = producer(endpoint, topic)) {
            send(producer, message(topic, "warmup", "warmup"), "warmup");
            if (preload) {
                sendAll(producer, topic, groups, perGroup);
            }
            try (PushConsumer consumer = PROVIDER.newPushConsumerBuilder()
                     .setClientConfiguration(configuration(endpoint))
                     .setConsumerGroup(arg("consumer_group"))
                     .setSubscriptionExpressions(all(topic))
                     .setConsumptionThreadCount(intArg("threads"))
                     .setEnableFifoConsumeAccelerator(Boolean.parseBoolean(arg("accelerator")))
                     .setMessageListener(m -> {
                         String key = keyOf(m);
                         if ("warmup".equals(key)) {
                             consumed.add(key);
                             return ConsumeResult.SUCCESS;
                         }
                         String group = m.getMessageGroup().orElse("");
                         int inGroup = running.computeIfAbsent(group, g -> new AtomicInteger()).incrementAndGet();
                         boolean fail = "g1-1".equals(key) || "g2-1".equals(key) && m.getDeliveryAttempt() == 1;
                         emitView("consume", m, "fail", fail, "in_group", inGroup);
                         try {
                             Thread.sleep(workMs);
                         } catch (InterruptedException e) {
                             Thread.currentThread().interrupt();
                         }
                         running.get(group).decrementAndGet();
                         if (fail) {
                             if ("g1-1".equals(key)) {
                                 failedAttempts.set(m.getDeliveryAttempt());
                             }
                             return ConsumeResult.FAILURE;
                         }
                         consumed.add(key);
                         return ConsumeResult.SUCCESS;
                     })
                     .build()) {
                if (!await(() -> consumed.contains("warmup"), deadline)) {
                    throw new IllegalStateException("the warm-up message never came");
                }
                emit("ready", "t", now());
                if (!preload) {
                    sendAll(producer, topic, groups, perGroup);
                }
                int expected = groups.length * perGroup;  // all but g1-1, plus the warm-up
                await(() -> consumed.size() >= expected && failedAttempts.get() >= maxAttempts, deadline);
                Thread.sleep(intArg("quiet_ms"));
            }
        }
    }

    static void sendAll(Producer producer, String topic, String[] groups, int perGroup) throws Exception {
        for (int i = 0; i < perGroup; i++) {
            for (String g : groups) {
                String name = g + "-" + i;
                send(producer, message(topic, name, g), name);
            }
        }
    }

    /** A timer message (the workloads' message) due at {@code dueEpochMs}; sent, its receipt
     * recorded with the due time, and returned. */
    static SendReceipt sendTimer(Producer producer, String topic, String name, long dueEpochMs)
        throws Exception {
        Message msg = PROVIDER.newMessageBuilder()
            .setTopic(topic)
            .setBody(name.getBytes(StandardCharsets.UTF_8))
            .setKeys(name)
            .setTag("T")
            .addProperty("p", name)
            .setDeliveryTimestamp(dueEpochMs)
            .build();
        SENT_AT.put(name, now());
        SendReceipt receipt = producer.send(msg);
        emit("sent", "key", name, "t", now(), "msg_id", receipt.getMessageId().toString(),
            "due_ms", dueEpochMs, "handle", receipt.getRecallHandle() != null);
        return receipt;
    }

    /** Recall {@code name} and record what the call returned or raised, with how long before
     * its due time the call began (ms; negative once past it). */
    static void recallOne(Producer producer, String topic, String name, SendReceipt receipt,
        long dueEpochMs) {
        long before = dueEpochMs - System.currentTimeMillis();
        try {
            RecallReceipt r = producer.recallMessage(topic, receipt.getRecallHandle());
            emit("recall", "key", name, "t", now(), "before_due_ms", before, "ok", true,
                "msg_id", r.getMessageId().toString());
        } catch (Exception e) {
            emit("recall", "key", name, "t", now(), "before_due_ms", before, "ok", false,
                "error", e.getClass().getSimpleName(), "message", e.getMessage());
        }
    }

    /**
     * Recall of timer messages: after a warm-up timer, "kept", "recalled-1" and "recalled-2"
     * are sent due in due_ms and "late" due in late_due_ms; the two "recalled" ones are
     * recalled at once, and "late" once a SimpleConsumer has received it. Every message
     * received is acked; the receive loop goes on until "kept" and "late" came, and then
     * until quiet_ms after the last due time, so that a recalled message that arrived anyway
     * would be seen.
     */
    static void recall(String endpoint) throws Exception {
        String topic = arg("topic");
        Duration invisible = Duration.ofMillis(intArg("invisible_ms"));
        long deadline = intArg("deadline_ms");
        try (Producer producer = producer(endpoint, topic);
             SimpleConsumer consumer = PROVIDER.newSimpleConsumerBuilder()
                 .setClientConfiguration(configuration(endpoint))
                 .setConsumerGroup(arg("consumer_group"))
                 .setAwaitDuration(Duration.ofMillis(intArg("await_ms")))
                 .setSubscriptionExpressions(all(topic))
                 .build()) {
            // A topic of message type DELAY takes timer messages only: the warm-up is one.
            sendTimer(producer, topic, "warmup", System.currentTimeMillis() + 200);
            boolean warm = false;
            while (!warm && now() < deadline) {
                for (MessageView m : consumer.receive(16, invisible)) {
                    warm |= "warmup".equals(keyOf(m));
                    consumer.ack(m);
                }
            }
            if (!warm) {
                throw new IllegalStateException("the warm-up message never came");
            }
            emit("ready", "t", now());
            long due = System.currentTimeMillis() + intArg("due_ms");
            long lateDue = System.currentTimeMillis() + intArg("late_due_ms");
            Map<String, SendReceipt> receipts = new HashMap<>();
            for (String name : new String[] {"kept", "recalled-1", "recalled-2"}) {
                receipts.put(name, sendTimer(producer, topic, name, due));
            }
            receipts.put("late", sendTimer(producer, topic, "late", lateDue));
            for (String name : new String[] {"recalled-1", "recalled-2"}) {
                recallOne(producer, topic, name, receipts.get(name), due);
            }
            Set<String> got = ConcurrentHashMap.newKeySet();
            long quietUntil = due + intArg("quiet_ms");
            while (now() < deadline
                && !(got.contains("kept") && got.contains("late")
                     && System.currentTimeMillis() >= quietUntil)) {
                for (MessageView m : consumer.receive(16, invisible)) {
                    String key = keyOf(m);
                    emitView("receive", m);
                    consumer.ack(m);
                    if ("late".equals(key) && got.add(key)) {
                        recallOne(producer, topic, key, receipts.get(key), lateDue);
                    } else {
                        got.add(key);
                    }
                }
            }
        }
    }

    public static void main(String[] argv) throws Exception {
        if (argv.length < 2) {
            System.err.println("usage: RocketMQV5Driver WORKLOAD PROXY_ENDPOINT key=value...");
            System.exit(2);
        }
        args = new HashMap<>();
        for (int i = 2; i < argv.length; i++) {
            String[] kv = argv[i].split("=", 2);
            args.put(kv[0], kv.length > 1 ? kv[1] : "");
        }
        try {
            emit("start", "workload", argv[0], "epoch_ms", START);
            switch (argv[0]) {
                case "simple": simple(argv[1]); break;
                case "fifo": fifo(argv[1]); break;
                case "recall": recall(argv[1]); break;
                default:
                    System.err.println("unknown workload " + argv[0]);
                    System.exit(2);
            }
            emit("done", "t", now());
        } catch (Throwable e) {
            // The client's threads would keep the JVM alive: end it, with the cause on stderr.
            e.printStackTrace();
            System.exit(1);
        }
        System.exit(0);
    }
}
