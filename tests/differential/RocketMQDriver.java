import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;

import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.consumer.PullStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.protocol.heartbeat.MessageModel;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * The RocketMQ side of the differential suite: runs one named workload against a name server
 * and broker with the 4.x-style remoting client and prints what it observed, one JSON object a
 * line on stdout ({"ev": ..., ...}). The Python side (tests/differential/workloads.py) runs the
 * same script against the bridge and produces the same records, so the two can be compared.
 *
 * Usage: RocketMQDriver WORKLOAD NAMESRV key=value...
 * Times: "t" is ms since the workload started; "since_sent" ms since the message's send
 * began (sent events give "t", when the send returned).
 */
public final class RocketMQDriver {
    private static final long START = System.currentTimeMillis();
    /** Send timeout, ms: RocketMQ's 3 s default is too short for a new topic's first send on a
     * loaded 2-core machine. */
    private static final int SEND_TIMEOUT_MS = 15_000;

    private RocketMQDriver() {
    }

    // --- output -----------------------------------------------------------------------------
    /** Print one event (DriverOutput's JSON line): emit("consume", "key", k, "t", 12, ...). */
    static void emit(String ev, Object... kv) {
        DriverOutput.emit(ev, kv);
    }

    static long now() {
        return System.currentTimeMillis() - START;
    }

    // --- arguments and waiting -----------------------------------------------------------
    private static Map<String, String> args;

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

    /** Poll until the condition holds or the deadline (ms since start) passes. */
    static boolean await(BooleanSupplier condition, long deadline) throws InterruptedException {
        while (now() < deadline) {
            if (condition.getAsBoolean()) {
                return true;
            }
            Thread.sleep(50);
        }
        return condition.getAsBoolean();
    }

    static Map<String, Object> describe(MessageExt m, Map<String, Long> sentAt) {
        Map<String, Object> d = new HashMap<>();
        long t = now();
        d.put("key", m.getKeys());
        d.put("body", new String(m.getBody(), StandardCharsets.UTF_8));
        d.put("topic", m.getTopic());
        d.put("tags", m.getTags());
        d.put("reconsume", m.getReconsumeTimes());
        d.put("msg_id", m.getMsgId());
        d.put("props", new HashMap<>(m.getProperties()));
        d.put("t", t);
        Long sent = m.getKeys() == null ? null : sentAt.get(m.getKeys());
        d.put("since_sent", sent == null ? null : t - sent);
        d.put("store_minus_born", m.getStoreTimestamp() - m.getBornTimestamp());
        return d;
    }

    static void emitMessage(String ev, MessageExt m, Map<String, Long> sentAt, Object... extra) {
        Map<String, Object> d = describe(m, sentAt);
        List<Object> kv = new ArrayList<>();
        for (Map.Entry<String, Object> e : d.entrySet()) {
            kv.add(e.getKey());
            kv.add(e.getValue());
        }
        for (Object o : extra) {
            kv.add(o);
        }
        emit(ev, kv.toArray());
    }

    static DefaultMQPushConsumer pushConsumer(String group, String namesrv) {
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(group);
        c.setNamesrvAddr(namesrv);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setInstanceName(group + "-" + ProcessHandle.current().pid());
        // Learn new routes (retry and DLQ topics) within a second rather than 30 s.
        c.setPollNameServerInterval(1000);
        return c;
    }

    /** Keys of the warm-up messages each consumer received ("warmup" or "warmup@instance"). */
    static final Set<String> WARM = ConcurrentHashMap.newKeySet();

    /** True (and recorded) for the warm-up message: listeners skip it. */
    static boolean warmup(MessageExt m, String instance) {
        if (!"warmup".equals(m.getKeys())) {
            return false;
        }
        WARM.add(instance == null ? "warmup" : "warmup@" + instance);
        return true;
    }

    /** Wait until every listed consumer received the warm-up message. */
    static void awaitWarm(String... names) throws InterruptedException {
        if (!await(() -> WARM.containsAll(List.of(names)), now() + 120_000)) {
            throw new IllegalStateException("consumers not ready within 120 s: " + WARM);
        }
        emit("ready", "t", now());
    }

    /** Every message of a topic from offset 0 (system and DLQ topics), read with a pull consumer. */
    static List<MessageExt> readAll(DefaultMQPullConsumer puller, String topic) {
        List<MessageExt> out = new ArrayList<>();
        Set<MessageQueue> queues;
        try {
            queues = puller.fetchSubscribeMessageQueues(topic);
        } catch (Exception e) {
            return out;  // the topic does not exist yet
        }
        for (MessageQueue mq : queues) {
            long offset = 0;
            while (true) {
                PullResult r;
                try {
                    r = puller.pull(mq, "*", offset, 64, 3000);
                } catch (Exception e) {
                    break;
                }
                if (r.getPullStatus() != PullStatus.FOUND) {
                    break;
                }
                out.addAll(r.getMsgFoundList());
                offset = r.getNextBeginOffset();
            }
        }
        return out;
    }

    static DefaultMQPullConsumer puller(String namesrv) throws Exception {
        DefaultMQPullConsumer p = new DefaultMQPullConsumer("differential_reader_" + ProcessHandle.current().pid());
        p.setNamesrvAddr(namesrv);
        p.setInstanceName("reader-" + ProcessHandle.current().pid());
        p.start();
        return p;
    }

    // --- workloads -----------------------------------------------------------------------
    // Each workload first sends a "warmup" message (which creates the topic) and waits until
    // its consumers received it, so that the timings below do not include route discovery.

    static DefaultMQProducer producer(String group, String namesrv) throws Exception {
        DefaultMQProducer p = new DefaultMQProducer(group);
        p.setNamesrvAddr(namesrv);
        p.setSendMsgTimeout(SEND_TIMEOUT_MS);
        p.setInstanceName(group + "-" + ProcessHandle.current().pid());
        p.start();
        return p;
    }

    /** A concurrent listener that records each message and answers with fails(msg). */
    static MessageListenerConcurrently recording(Map<String, Long> sentAt, String instance,
        java.util.function.Predicate<MessageExt> fails) {
        return (msgs, ctx) -> {
            MessageExt m = msgs.get(0);
            if (warmup(m, instance)) {
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            }
            boolean fail = fails.test(m);
            emitMessage("consume", m, sentAt, "fail", fail, "instance", instance);
            return fail ? ConsumeConcurrentlyStatus.RECONSUME_LATER : ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        };
    }

    /**
     * Seed 003: COUNT transactional messages whose local transaction answers UNKNOWN; the check
     * answers by index % 3: 0 UNKNOWN (for ever), 1 COMMIT, 2 ROLLBACK. Observes the sends, each
     * check, what a push consumer of the topic receives, and the messages parked in
     * TRANS_CHECK_MAX_TIME_TOPIC.
     */
    static void transaction(String namesrv) throws Exception {
        String topic = arg("topic");
        int count = intArg("count");
        long deadline = intArg("deadline_ms");
        long quiet = intArg("quiet_ms");
        Map<String, Long> sentAt = new ConcurrentHashMap<>();
        Map<String, Integer> localTrans = new ConcurrentHashMap<>();
        AtomicInteger transactionIndex = new AtomicInteger();
        AtomicInteger consumed = new AtomicInteger();

        TransactionMQProducer producer = new TransactionMQProducer(arg("producer_group"));
        producer.setNamesrvAddr(namesrv);
        producer.setSendMsgTimeout(SEND_TIMEOUT_MS);
        producer.setInstanceName("tx-" + ProcessHandle.current().pid());
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                int status = transactionIndex.getAndIncrement() % 3;
                localTrans.put(msg.getKeys(), status);
                emit("execute", "key", msg.getKeys(), "t", now());
                return LocalTransactionState.UNKNOW;
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                Integer status = localTrans.get(msg.getKeys());
                LocalTransactionState answer = LocalTransactionState.COMMIT_MESSAGE;
                if (status != null) {
                    answer = status == 0 ? LocalTransactionState.UNKNOW
                        : status == 1 ? LocalTransactionState.COMMIT_MESSAGE
                        : LocalTransactionState.ROLLBACK_MESSAGE;
                }
                emitMessage("check", msg, sentAt, "answer", answer.name());
                return answer;
            }
        });
        producer.start();
        sendRouted(producer, message(topic, "warmup"));
        DefaultMQPushConsumer consumer = pushConsumer(arg("consumer_group"), namesrv);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener(recording(sentAt, null, m -> {
            consumed.incrementAndGet();
            return false;
        }));
        consumer.start();
        awaitWarm("warmup");

        String[] tags = {"TagA", "TagB", "TagC", "TagD", "TagE"};
        for (int i = 0; i < count; i++) {
            Message msg = new Message(topic, tags[i % tags.length], "KEY" + i,
                ("Hello RocketMQ " + i).getBytes(StandardCharsets.UTF_8));
            sentAt.put("KEY" + i, now());
            TransactionSendResult r = producer.sendMessageInTransaction(msg, null);
            emit("sent", "key", "KEY" + i, "status", r.getSendStatus().name(),
                "local", r.getLocalTransactionState().name(), "msg_id", r.getMsgId(),
                "transaction_id", r.getTransactionId(), "t", now());
            Thread.sleep(10);
        }
        int unknown = (count + 2) / 3;
        int committed = (count + 1) / 3;
        DefaultMQPullConsumer puller = puller(namesrv);
        Map<String, Long> parkedSeen = new ConcurrentHashMap<>();
        BooleanSupplier allParked = () -> {
            List<MessageExt> parked = parkedOf(puller, topic);
            for (MessageExt m : parked) {
                parkedSeen.putIfAbsent(m.getKeys(), now());
            }
            return parked.size() >= unknown;
        };
        await(() -> allParked.getAsBoolean() && consumed.get() >= committed, deadline);
        await(() -> false, now() + quiet);
        for (MessageExt m : parkedOf(puller, topic)) {
            Long seen = parkedSeen.get(m.getKeys());
            emitMessage("parked", m, sentAt, "parked_since_sent",
                seen == null ? null : seen - sentAt.getOrDefault(m.getKeys(), 0L));
        }
        puller.shutdown();
        producer.shutdown();
        consumer.shutdown();
    }

    static List<MessageExt> parkedOf(DefaultMQPullConsumer puller, String topic) {
        List<MessageExt> out = new ArrayList<>();
        for (MessageExt m : readAll(puller, "TRANS_CHECK_MAX_TIME_TOPIC")) {
            if (topic.equals(m.getProperty("REAL_TOPIC"))) {
                out.add(m);
            }
        }
        return out;
    }

    /**
     * Delay levels and timers, by name: "levelN" (delay level N), "delaymsN" (timer, N ms),
     * "delaysecN" (timer, N s), "atN" / "atmN" (timer due N ms after / before now), and
     * "levelN+delaymsM" (both: the level wins); anything else is sent plainly.
     */
    static void delay(String namesrv) throws Exception {
        String topic = arg("topic");
        long deadline = intArg("deadline_ms");
        long quiet = intArg("quiet_ms");
        Map<String, Long> sentAt = new ConcurrentHashMap<>();
        AtomicInteger consumed = new AtomicInteger();
        DefaultMQProducer producer = producer(arg("producer_group"), namesrv);
        send(producer, sentAt, message(topic, "warmup"));
        DefaultMQPushConsumer consumer = pushConsumer(arg("consumer_group"), namesrv);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener(recording(sentAt, null, m -> {
            consumed.incrementAndGet();
            return false;
        }));
        consumer.start();
        awaitWarm("warmup");
        String[] names = arg("messages").split(",");
        for (String name : names) {
            Message msg = message(topic, name);
            long wall = System.currentTimeMillis();
            if (name.startsWith("level")) {
                msg.setDelayTimeLevel(Integer.parseInt(name.substring(5).split("\\+")[0]));
            }
            if (name.contains("delayms")) {
                msg.setDelayTimeMs(Long.parseLong(name.replaceAll(".*delayms", "")));
            } else if (name.startsWith("delaysec")) {
                msg.setDelayTimeSec(Long.parseLong(name.substring(8)));
            } else if (name.startsWith("atm")) {
                msg.setDeliverTimeMs(wall - Long.parseLong(name.substring(3)));
            } else if (name.startsWith("at")) {
                msg.setDeliverTimeMs(wall + Long.parseLong(name.substring(2)));
            }
            send(producer, sentAt, msg);
        }
        await(() -> consumed.get() >= names.length, deadline);
        Thread.sleep(quiet);
        producer.shutdown();
        consumer.shutdown();
    }

    static Message message(String topic, String name) {
        Message msg = new Message(topic, "T", name, name.getBytes(StandardCharsets.UTF_8));
        msg.putUserProperty("p", name);
        return msg;
    }

    /**
     * producer.send, tried again while the name server has no route for the topic yet (a new
     * broker's registration or the auto-created topic not seen yet): nothing was sent then.
     */
    static SendResult sendRouted(DefaultMQProducer producer, Message msg) throws Exception {
        long deadline = System.currentTimeMillis() + 30_000;
        while (true) {
            try {
                return producer.send(msg);
            } catch (org.apache.rocketmq.client.exception.MQClientException e) {
                String text = String.valueOf(e.getMessage());
                if (!text.contains("No route info") || System.currentTimeMillis() > deadline) {
                    throw e;
                }
                Thread.sleep(200);
            }
        }
    }

    static void send(DefaultMQProducer producer, Map<String, Long> sentAt, Message msg) throws Exception {
        sentAt.put(msg.getKeys(), now());
        SendResult r = sendRouted(producer, msg);
        emit("sent", "key", msg.getKeys(), "status", r.getSendStatus().name(), "msg_id", r.getMsgId(),
            "queue_id", r.getMessageQueue().getQueueId(), "t", now());
    }

    /**
     * The retry ladder: "ok" succeeds, "once" fails once, "always" always fails; the consumer's
     * maxReconsumeTimes is max_reconsume. Observes every attempt, then the dead-letter queue.
     */
    static void retry(String namesrv) throws Exception {
        String topic = arg("topic");
        String group = arg("consumer_group");
        long deadline = intArg("deadline_ms");
        long quiet = intArg("quiet_ms");
        Map<String, Long> sentAt = new ConcurrentHashMap<>();
        DefaultMQProducer producer = producer(arg("producer_group"), namesrv);
        send(producer, sentAt, message(topic, "warmup"));
        DefaultMQPushConsumer consumer = pushConsumer(group, namesrv);
        consumer.setMaxReconsumeTimes(intArg("max_reconsume"));
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener(recording(sentAt, null,
            m -> "always".equals(m.getKeys()) || "once".equals(m.getKeys()) && m.getReconsumeTimes() == 0));
        consumer.start();
        awaitWarm("warmup");
        for (String name : new String[] {"ok", "once", "always"}) {
            send(producer, sentAt, message(topic, name));
        }
        DefaultMQPullConsumer puller = puller(namesrv);
        String dlq = "%DLQ%" + group;
        await(() -> !readAll(puller, dlq).isEmpty(), deadline);
        Thread.sleep(quiet);
        for (MessageExt m : readAll(puller, dlq)) {
            emitMessage("dlq", m, sentAt, "dlq_topic", dlq);
        }
        puller.shutdown();
        producer.shutdown();
        consumer.shutdown();
    }

    /**
     * Orderly consumption of one queue: "m2" fails twice then succeeds, "m4" always fails (with
     * maxReconsumeTimes max_reconsume it ends in the DLQ); the rest succeed. Observes the
     * sequence of attempts and the DLQ.
     */
    static void orderly(String namesrv) throws Exception {
        String topic = arg("topic");
        String group = arg("consumer_group");
        int count = intArg("count");
        long deadline = intArg("deadline_ms");
        long quiet = intArg("quiet_ms");
        Map<String, Long> sentAt = new ConcurrentHashMap<>();
        Map<String, AtomicInteger> attempts = new ConcurrentHashMap<>();
        DefaultMQProducer producer = producer(arg("producer_group"), namesrv);
        producer.send(message(topic, "warmup"), (mqs, m, a) -> mqs.get(0), null);
        DefaultMQPushConsumer consumer = pushConsumer(group, namesrv);
        consumer.setMaxReconsumeTimes(intArg("max_reconsume"));
        consumer.setSuspendCurrentQueueTimeMillis(intArg("suspend_ms"));
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
            MessageExt m = msgs.get(0);
            if (warmup(m, null)) {
                return ConsumeOrderlyStatus.SUCCESS;
            }
            int n = attempts.computeIfAbsent(m.getKeys(), k -> new AtomicInteger()).incrementAndGet();
            boolean fail = "m4".equals(m.getKeys()) || "m2".equals(m.getKeys()) && n <= 2;
            emitMessage("consume", m, sentAt, "fail", fail);
            return fail ? ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT : ConsumeOrderlyStatus.SUCCESS;
        });
        consumer.start();
        awaitWarm("warmup");
        for (int i = 0; i < count; i++) {
            Message msg = message(topic, "m" + i);
            sentAt.put(msg.getKeys(), now());
            SendResult r = producer.send(msg, (mqs, m, a) -> mqs.get(0), null);
            emit("sent", "key", msg.getKeys(), "queue_id", r.getMessageQueue().getQueueId(), "t", now());
        }
        DefaultMQPullConsumer puller = puller(namesrv);
        String dlq = "%DLQ%" + group;
        String last = "m" + (count - 1);
        await(() -> attempts.containsKey(last) && !readAll(puller, dlq).isEmpty(), deadline);
        Thread.sleep(quiet);
        for (MessageExt m : readAll(puller, dlq)) {
            emitMessage("dlq", m, sentAt, "dlq_topic", dlq);
        }
        puller.shutdown();
        producer.shutdown();
        consumer.shutdown();
    }

    /** Two BROADCASTING instances of one group; "bad" always fails, the others succeed. */
    static void broadcasting(String namesrv) throws Exception {
        String topic = arg("topic");
        String group = arg("consumer_group");
        long deadline = intArg("deadline_ms");
        long quiet = intArg("quiet_ms");
        Map<String, Long> sentAt = new ConcurrentHashMap<>();
        AtomicInteger consumed = new AtomicInteger();
        DefaultMQProducer producer = producer(arg("producer_group"), namesrv);
        send(producer, sentAt, message(topic, "warmup"));
        List<DefaultMQPushConsumer> consumers = new ArrayList<>();
        for (String instance : new String[] {"a", "b"}) {
            DefaultMQPushConsumer c = pushConsumer(group, namesrv);
            c.setMessageModel(MessageModel.BROADCASTING);
            c.setInstanceName(instance + "-" + ProcessHandle.current().pid());
            c.subscribe(topic, "*");
            c.registerMessageListener(recording(sentAt, instance, m -> {
                consumed.incrementAndGet();
                return "bad".equals(m.getKeys());
            }));
            c.start();
            consumers.add(c);
        }
        awaitWarm("warmup@a", "warmup@b");
        for (String name : new String[] {"ok1", "bad", "ok2"}) {
            send(producer, sentAt, message(topic, name));
        }
        await(() -> consumed.get() >= 6, deadline);
        Thread.sleep(quiet);
        producer.shutdown();
        for (DefaultMQPushConsumer c : consumers) {
            c.shutdown();
        }
    }


    // --- benchmarks (python -m bench rocketmq) --------------------------------------------
    // Each prints one "result" event with its figures; lateness is measured on the broker's
    // clock: the delivered copy's store time minus the due time written into its body.

    static long pct(long[] sorted, double q) {
        return sorted.length == 0 ? -1 : sorted[Math.min(sorted.length - 1, (int) (q * sorted.length))];
    }

    static long[] sortedCopy(java.util.Collection<Long> values) {
        long[] out = values.stream().mapToLong(Long::longValue).toArray();
        java.util.Arrays.sort(out);
        return out;
    }

    /** The latest store time (epoch ms) of a message a lateness consumer received. */
    static final java.util.concurrent.atomic.AtomicLong LAST_STORE = new java.util.concurrent.atomic.AtomicLong();

    /** A push consumer that records store time minus the due time in each body, per key. */
    static DefaultMQPushConsumer latenessConsumer(String namesrv, String topic,
        java.util.Queue<Long> lateness, AtomicInteger count) throws Exception {
        DefaultMQPushConsumer c = pushConsumer(arg("consumer_group"), namesrv);
        c.setConsumeMessageBatchMaxSize(32);
        c.setPullBatchSize(64);
        c.subscribe(topic, "*");
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                if (warmup(m, null)) {
                    continue;
                }
                long due = Long.parseLong(new String(m.getBody(), StandardCharsets.UTF_8));
                lateness.add(m.getStoreTimestamp() - due);
                LAST_STORE.accumulateAndGet(m.getStoreTimestamp(), Math::max);
                count.incrementAndGet();
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        return c;
    }

    /** Messages whose asynchronous send failed, sent again synchronously by resendFailed(). */
    static final java.util.Queue<Message> FAILED_SENDS = new java.util.concurrent.ConcurrentLinkedQueue<>();

    /** Send again what failed (a busy broker refuses some of a burst); returns how many of
     * them failed again. */
    static int resendFailed(DefaultMQProducer producer, AtomicInteger acked) {
        int lost = 0;
        for (Message msg = FAILED_SENDS.poll(); msg != null; msg = FAILED_SENDS.poll()) {
            try {
                producer.send(msg);
                acked.incrementAndGet();
            } catch (Exception e) {
                lost++;
            }
        }
        return lost;
    }

    static void sendAsync(DefaultMQProducer producer, Message msg, AtomicInteger acked, AtomicInteger failed)
        throws Exception {
        while (true) {
            try {
                producer.send(msg, new org.apache.rocketmq.client.producer.SendCallback() {
                    @Override
                    public void onSuccess(SendResult r) {
                        acked.incrementAndGet();
                    }

                    @Override
                    public void onException(Throwable e) {
                        FAILED_SENDS.add(msg);
                        failed.incrementAndGet();
                    }
                });
                return;
            } catch (org.apache.rocketmq.client.exception.MQClientException e) {
                Thread.sleep(5);  // too many requests in flight: wait for room
            }
        }
    }

    /** COUNT timers due at the same second, due_in_ms after the start. */
    static void benchBurst(String namesrv) throws Exception {
        String topic = arg("topic");
        int count = intArg("count");
        java.util.Queue<Long> lateness = new java.util.concurrent.ConcurrentLinkedQueue<>();
        AtomicInteger delivered = new AtomicInteger();
        DefaultMQProducer producer = producer(arg("producer_group"), namesrv);
        producer.setRetryTimesWhenSendAsyncFailed(5);
        send(producer, new ConcurrentHashMap<>(), message(topic, "warmup"));
        DefaultMQPushConsumer consumer = latenessConsumer(namesrv, topic, lateness, delivered);
        awaitWarm("warmup");
        long due = System.currentTimeMillis() + intArg("due_in_ms");
        AtomicInteger acked = new AtomicInteger();
        AtomicInteger failed = new AtomicInteger();
        long started = System.currentTimeMillis();
        for (int i = 0; i < count; i++) {
            Message msg = new Message(topic, Long.toString(due).getBytes(StandardCharsets.UTF_8));
            msg.setDeliverTimeMs(due);
            sendAsync(producer, msg, acked, failed);
        }
        await(() -> acked.get() + failed.get() >= count, now() + 600_000);
        // Not sent again: a send that timed out may have been stored all the same, and a second
        // copy would be delivered too. Both counts are reported.
        FAILED_SENDS.clear();
        int lost = failed.get();
        long sentBy = System.currentTimeMillis();
        await(() -> delivered.get() >= acked.get(), now() + intArg("deadline_ms"));
        await(() -> false, now() + 3000);  // stored despite a failed send: delivered too
        long[] late = sortedCopy(lateness);
        long within = java.util.Arrays.stream(late).filter(v -> v <= 1000).count();
        emit("result", "sent", acked.get(), "send_failed", failed.get(), "lost", lost, "delivered", late.length,
            "send_s", (sentBy - started) / 1000.0, "sent_before_due_ms", due - sentBy,
            "p50_ms", pct(late, 0.5), "p99_ms", pct(late, 0.99),
            "all_in_ms", late.length == 0 ? -1 : late[late.length - 1],
            "early", java.util.Arrays.stream(late).filter(v -> v < 0).count(), "within_1s", within);
        producer.shutdown();
        consumer.shutdown();
    }

    /** Timers at a steady rate, each due delay_ms after its send. */
    static void benchSteady(String namesrv) throws Exception {
        String topic = arg("topic");
        int rate = intArg("rate");
        int seconds = intArg("seconds");
        int delayMs = intArg("delay_ms");
        java.util.Queue<Long> lateness = new java.util.concurrent.ConcurrentLinkedQueue<>();
        AtomicInteger delivered = new AtomicInteger();
        DefaultMQProducer producer = producer(arg("producer_group"), namesrv);
        send(producer, new ConcurrentHashMap<>(), message(topic, "warmup"));
        DefaultMQPushConsumer consumer = latenessConsumer(namesrv, topic, lateness, delivered);
        awaitWarm("warmup");
        int count = rate * seconds;
        AtomicInteger acked = new AtomicInteger();
        AtomicInteger failed = new AtomicInteger();
        long started = System.nanoTime();
        for (int i = 0; i < count; i++) {
            long at = started + (long) i * 1_000_000_000L / rate;
            while (System.nanoTime() < at) {
                Thread.onSpinWait();
            }
            long due = System.currentTimeMillis() + delayMs;
            Message msg = new Message(topic, Long.toString(due).getBytes(StandardCharsets.UTF_8));
            msg.setDeliverTimeMs(due);
            sendAsync(producer, msg, acked, failed);
        }
        await(() -> delivered.get() >= count - failed.get(), now() + delayMs + 60_000);
        long[] late = sortedCopy(lateness);
        emit("result", "sent", acked.get(), "delivered", late.length, "p50_ms", pct(late, 0.5),
            "p99_ms", pct(late, 0.99), "max_ms", late.length == 0 ? -1 : late[late.length - 1],
            "early", java.util.Arrays.stream(late).filter(v -> v < 0).count());
        producer.shutdown();
        consumer.shutdown();
    }

    /** COUNT messages at delay level 1: delivered per second, from the first send to the last delivery. */
    static void benchLevels(String namesrv) throws Exception {
        String topic = arg("topic");
        int count = intArg("count");
        java.util.Queue<Long> lateness = new java.util.concurrent.ConcurrentLinkedQueue<>();
        AtomicInteger delivered = new AtomicInteger();
        DefaultMQProducer producer = producer(arg("producer_group"), namesrv);
        send(producer, new ConcurrentHashMap<>(), message(topic, "warmup"));
        DefaultMQPushConsumer consumer = latenessConsumer(namesrv, topic, lateness, delivered);
        awaitWarm("warmup");
        AtomicInteger acked = new AtomicInteger();
        AtomicInteger failed = new AtomicInteger();
        long started = System.currentTimeMillis();
        for (int i = 0; i < count; i++) {
            // The body is the earliest delivery time: send time + the level's delay.
            Message msg = new Message(topic, Long.toString(System.currentTimeMillis() + 1000)
                .getBytes(StandardCharsets.UTF_8));
            msg.setDelayTimeLevel(1);
            sendAsync(producer, msg, acked, failed);
        }
        long sentBy = System.currentTimeMillis();
        await(() -> delivered.get() >= count - failed.get(), now() + 600_000);
        long[] late = sortedCopy(lateness);
        emit("result", "sent", acked.get(), "delivered", late.length,
            "seconds", (LAST_STORE.get() - started) / 1000.0, "send_s", (sentBy - started) / 1000.0,
            "p50_late_ms", pct(late, 0.5), "p99_late_ms", pct(late, 0.99));
        producer.shutdown();
        consumer.shutdown();
    }

    /** Transactional sends (every local transaction commits): per second with THREADS threads
     * for SECONDS, then commit-to-visible latency at RATE per second for COUNT messages. */
    static void benchTransactions(String namesrv) throws Exception {
        String topic = arg("topic");
        int threads = intArg("threads");
        int seconds = intArg("seconds");
        int rate = intArg("rate");
        int count = intArg("count");
        TransactionMQProducer producer = new TransactionMQProducer(arg("producer_group"));
        producer.setNamesrvAddr(namesrv);
        producer.setSendMsgTimeout(SEND_TIMEOUT_MS);
        producer.setInstanceName("bench-tx-" + ProcessHandle.current().pid());
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return LocalTransactionState.COMMIT_MESSAGE;
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                return LocalTransactionState.COMMIT_MESSAGE;
            }
        });
        producer.start();
        sendRouted(producer, message(topic, "warmup"));
        Map<String, Long> ended = new ConcurrentHashMap<>();
        Map<String, Long> seen = new ConcurrentHashMap<>();
        DefaultMQPushConsumer consumer = pushConsumer(arg("consumer_group"), namesrv);
        consumer.subscribe(topic, "lat");
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            long t = System.nanoTime();
            for (MessageExt m : msgs) {
                seen.putIfAbsent(m.getKeys(), t);
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        Message warm = message(topic, "warm");
        warm.setTags("lat");
        producer.sendMessageInTransaction(warm, null);
        await(() -> seen.containsKey("warm"), now() + 120_000);
        AtomicInteger sent = new AtomicInteger();
        long deadline = System.nanoTime() + seconds * 1_000_000_000L;
        List<Thread> workers = new ArrayList<>();
        long started = System.nanoTime();
        for (int t = 0; t < threads; t++) {
            Thread w = new Thread(() -> {
                byte[] body = new byte[100];
                while (System.nanoTime() < deadline) {
                    try {
                        producer.sendMessageInTransaction(new Message(topic, "x", body), null);
                        sent.incrementAndGet();
                    } catch (Exception e) {
                        // counted as not sent
                    }
                }
            });
            w.start();
            workers.add(w);
        }
        for (Thread w : workers) {
            w.join();
        }
        double perSecond = sent.get() / ((System.nanoTime() - started) / 1e9);
        for (int i = 0; i < count; i++) {
            Message msg = new Message(topic, "lat", "lat" + i, ("lat" + i).getBytes(StandardCharsets.UTF_8));
            producer.sendMessageInTransaction(msg, null);
            ended.put("lat" + i, System.nanoTime());
            Thread.sleep(1000 / rate);
        }
        await(() -> seen.keySet().containsAll(ended.keySet()), now() + 30_000);
        List<Long> latencies = new ArrayList<>();
        for (Map.Entry<String, Long> e : ended.entrySet()) {
            Long s = seen.get(e.getKey());
            if (s != null) {
                latencies.add((s - e.getValue()) / 1_000_000L);
            }
        }
        long[] lat = sortedCopy(latencies);
        emit("result", "per_second", perSecond, "threads", threads, "visible", lat.length,
            "p50_ms", pct(lat, 0.5), "p99_ms", pct(lat, 0.99));
        producer.shutdown();
        consumer.shutdown();
    }

    /** COUNT messages (100 bytes, 4 queues) consumed by a new group, one in ten failing once:
     * messages handed to the listener per second, from the first until every message was
     * consumed or sent back. */
    static void benchConsume(String namesrv) throws Exception {
        String topic = arg("topic");
        int count = intArg("count");
        DefaultMQProducer producer = producer(arg("producer_group"), namesrv);
        AtomicInteger acked = new AtomicInteger();
        AtomicInteger failed = new AtomicInteger();
        byte[] body = new byte[100];
        for (int i = 0; i < count; i++) {
            sendAsync(producer, new Message(topic, "TagA", "k" + i, body), acked, failed);
        }
        await(() -> acked.get() + failed.get() >= count, now() + 600_000);
        int lost = resendFailed(producer, acked);
        int stored = acked.get();
        AtomicInteger done = new AtomicInteger();
        AtomicInteger sentBack = new AtomicInteger();
        long[] first = {0};
        DefaultMQPushConsumer consumer = pushConsumer(arg("consumer_group"), namesrv);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            synchronized (first) {
                if (first[0] == 0) {
                    first[0] = System.nanoTime();
                }
            }
            MessageExt m = msgs.get(0);
            if (m.getReconsumeTimes() == 0 && m.getQueueOffset() % 10 == 0) {
                sentBack.incrementAndGet();
                done.incrementAndGet();  // the consume service sends it back before it returns
                return ConsumeConcurrentlyStatus.RECONSUME_LATER;
            }
            if (m.getReconsumeTimes() == 0) {
                done.incrementAndGet();
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        await(() -> done.get() >= stored, now() + 600_000);
        double seconds = (System.nanoTime() - first[0]) / 1e9;
        emit("result", "messages", stored, "seconds", seconds, "per_second", stored / seconds,
            "sent_back", sentBack.get());
        producer.shutdown();
        consumer.shutdown();
    }

    /** "k=v&k=v" with URL-encoded keys and values, in order. */
    static Map<String, String> query(String text) {
        Map<String, String> out = new java.util.LinkedHashMap<>();
        for (String pair : text.split("&")) {
            if (pair.isEmpty()) {
                continue;
            }
            String[] kv = pair.split("=", 2);
            out.put(URLDecoder.decode(kv[0], StandardCharsets.UTF_8),
                URLDecoder.decode(kv.length > 1 ? kv[1] : "", StandardCharsets.UTF_8));
        }
        return out;
    }

    /** Try a call up to 10 times, 1 s apart, while it throws (a loaded machine times calls out). */
    static <T> T tried(java.util.concurrent.Callable<T> call) throws Exception {
        for (int attempt = 1; ; attempt++) {
            try {
                return call.call();
            } catch (Exception e) {
                if (attempt == 10) {
                    throw e;
                }
                Thread.sleep(1000);
            }
        }
    }

    /**
     * SQL92 property filters: sends the messages m0, m1, ... ("key", "keys", "tags" and user
     * properties, URL-encoded), then for each expression e0, e1, ...: whether the broker takes
     * it (the CHECK_CLIENT_CONFIG request a push consumer sends when it starts: the broker
     * compiles the expression and answers SUBSCRIPTION_PARSE_FAILED if it cannot), and which
     * messages the broker's filter selects (pulled from every queue with the selector).
     */
    static void sql(String namesrv) throws Exception {
        String topic = arg("topic");
        DefaultMQProducer producer = producer(arg("producer_group"), namesrv);
        for (int i = 0; args.containsKey("m" + i); i++) {
            Map<String, String> fields = query(arg("m" + i));
            String key = fields.remove("key");
            Message msg = new Message(topic, key.getBytes(StandardCharsets.UTF_8));
            msg.setKeys(java.util.Arrays.asList(fields.remove("keys").split(" ")));
            String tags = fields.remove("tags");
            if (tags != null) {
                msg.setTags(tags);
            }
            for (Map.Entry<String, String> e : fields.entrySet()) {
                msg.putUserProperty(e.getKey(), e.getValue());
            }
            tried(() -> sendRouted(producer, msg));  // a repeated send only repeats a key
            emit("sent", "key", key, "t", now());
        }
        producer.shutdown();
        DefaultMQPullConsumer puller = puller(namesrv);
        Set<MessageQueue> queues = tried(() -> puller.fetchSubscribeMessageQueues(topic));
        org.apache.rocketmq.client.impl.factory.MQClientInstance client =
            puller.getDefaultMQPullConsumerImpl().getRebalanceImpl().getmQClientFactory();
        for (int i = 0; args.containsKey("e" + i); i++) {
            String expression = URLDecoder.decode(arg("e" + i), StandardCharsets.UTF_8);
            String group = arg("consumer_group") + "_" + i;
            org.apache.rocketmq.remoting.protocol.heartbeat.SubscriptionData sub =
                org.apache.rocketmq.remoting.protocol.filter.FilterAPI.build(topic, expression, "SQL92");
            String refused = tried(() -> {
                try {
                    client.getMQClientAPIImpl().checkClientInBroker(
                        arg("broker_addr"), group, client.getClientId(), sub, 10_000);
                    return null;
                } catch (MQClientException e) {
                    if (e.getResponseCode() == 23) {  // ResponseCode.SUBSCRIPTION_PARSE_FAILED
                        return String.valueOf(e.getErrorMessage());
                    }
                    throw e;
                }
            });
            if (refused != null) {
                emit("invalid", "index", i, "expression", expression, "error", refused);
                continue;
            }
            List<String> keys = new ArrayList<>();
            for (MessageQueue mq : queues) {
                long offset = 0;
                long end = tried(() -> puller.maxOffset(mq));
                while (offset < end) {
                    long from = offset;
                    PullResult r = tried(() -> puller.pull(mq, MessageSelector.bySql(expression), from, 32, 10_000));
                    if (r.getPullStatus() == PullStatus.FOUND) {
                        for (MessageExt m : r.getMsgFoundList()) {
                            keys.add(new String(m.getBody(), StandardCharsets.UTF_8));
                        }
                    } else if (r.getPullStatus() != PullStatus.NO_MATCHED_MSG) {
                        break;
                    }
                    offset = r.getNextBeginOffset();
                }
            }
            emit("selected", "index", i, "expression", expression, "keys", String.join(",", keys));
        }
        puller.shutdown();
    }

    /** Change broker settings at run time ("name:value;name:value"), as mqadmin updateBrokerConfig does. */
    static void brokerConfig(String namesrv, String settings) throws Exception {
        if (settings == null || settings.isEmpty()) {
            return;
        }
        java.util.Properties props = new java.util.Properties();
        for (String pair : settings.split(";")) {
            String[] kv = pair.split(":", 2);
            props.setProperty(kv[0], kv[1]);
        }
        DefaultMQAdminExt admin = new DefaultMQAdminExt();
        admin.setNamesrvAddr(namesrv);
        admin.setInstanceName("admin-" + ProcessHandle.current().pid());
        admin.start();
        try {
            admin.updateBrokerConfig(arg("broker_addr"), props);
        } finally {
            admin.shutdown();
        }
        emit("broker_config", "settings", settings, "t", now());
    }

    /**
     * What RocketMQ 5's gRPC clients cannot do for themselves (RocketMQV5Driver): with
     * action=setup, create the topic (queues, message_type NORMAL or FIFO, as the proxy checks
     * a message's type against its topic's) and the consumer group (retry_max_times, fifo:
     * consumeMessageOrderly, and an exponential retry policy of backoff_ms, fixed); with
     * action=dlq, read %DLQ%consumer_group ("dlq" events).
     */
    static void v5admin(String namesrv) throws Exception {
        String group = arg("consumer_group");
        if ("dlq".equals(arg("action"))) {
            DefaultMQPullConsumer puller = puller(namesrv);
            try {
                for (MessageExt m : readAll(puller, "%DLQ%" + group)) {
                    emitMessage("dlq", m, new HashMap<>(), "dlq_topic", "%DLQ%" + group);
                }
            } finally {
                puller.shutdown();
            }
            return;
        }
        DefaultMQAdminExt admin = new DefaultMQAdminExt();
        admin.setNamesrvAddr(namesrv);
        admin.setInstanceName("admin-" + ProcessHandle.current().pid());
        admin.start();
        try {
            int queues = intArg("queues");
            org.apache.rocketmq.common.TopicConfig topic =
                new org.apache.rocketmq.common.TopicConfig(arg("topic"), queues, queues, 6);
            // "+" adds an attribute, as mqadmin updateTopic -a +message.type=FIFO does.
            topic.setAttributes(Map.of("+message.type", arg("message_type")));
            admin.createAndUpdateTopicConfig(arg("broker_addr"), topic);
            org.apache.rocketmq.remoting.protocol.subscription.SubscriptionGroupConfig sub =
                new org.apache.rocketmq.remoting.protocol.subscription.SubscriptionGroupConfig();
            sub.setGroupName(group);
            sub.setRetryMaxTimes(intArg("retry_max_times"));
            sub.setConsumeMessageOrderly(Boolean.parseBoolean(arg("fifo")));
            org.apache.rocketmq.remoting.protocol.subscription.GroupRetryPolicy policy =
                new org.apache.rocketmq.remoting.protocol.subscription.GroupRetryPolicy();
            policy.setType(org.apache.rocketmq.remoting.protocol.subscription.GroupRetryPolicyType.EXPONENTIAL);
            long backoff = intArg("backoff_ms");
            policy.setExponentialRetryPolicy(
                new org.apache.rocketmq.remoting.protocol.subscription.ExponentialRetryPolicy(backoff, backoff, 1));
            sub.setGroupRetryPolicy(policy);
            admin.createAndUpdateSubscriptionGroupConfig(arg("broker_addr"), sub);
            // The proxy finds the topic through the name server: wait for its route.
            boolean routed = await(() -> {
                try {
                    return !admin.examineTopicRouteInfo(arg("topic")).getQueueDatas().isEmpty();
                } catch (Exception e) {
                    return false;
                }
            }, now() + 60_000);
            if (!routed) {
                throw new IllegalStateException("no route for " + arg("topic") + " after 60 s");
            }
        } finally {
            admin.shutdown();
        }
        emit("created", "topic", arg("topic"), "group", group, "t", now());
    }

    public static void main(String[] argv) throws Exception {
        if (argv.length < 2) {
            System.err.println("usage: RocketMQDriver WORKLOAD NAMESRV key=value...");
            System.exit(2);
        }
        args = new HashMap<>();
        for (int i = 2; i < argv.length; i++) {
            String[] kv = argv[i].split("=", 2);
            args.put(kv[0], kv.length > 1 ? kv[1] : "");
        }
        try {
            run(argv);
        } catch (Throwable e) {
            // The clients' threads would keep the JVM alive: end it, with the cause on stderr.
            e.printStackTrace();
            System.exit(1);
        }
        System.exit(0);
    }

    static void run(String[] argv) throws Exception {
        String namesrv = argv[1];
        emit("start", "workload", argv[0], "epoch_ms", START);
        brokerConfig(namesrv, args.get("broker_config"));
        switch (argv[0]) {
            case "transaction": transaction(namesrv); break;
            case "delay": delay(namesrv); break;
            case "retry": retry(namesrv); break;
            case "orderly": orderly(namesrv); break;
            case "broadcasting": broadcasting(namesrv); break;
            case "sql": sql(namesrv); break;
            case "v5admin": v5admin(namesrv); break;
            case "bench-burst": benchBurst(namesrv); break;
            case "bench-steady": benchSteady(namesrv); break;
            case "bench-levels": benchLevels(namesrv); break;
            case "bench-transactions": benchTransactions(namesrv); break;
            case "bench-consume": benchConsume(namesrv); break;
            default:
                System.err.println("unknown workload " + argv[0]);
                System.exit(2);
        }
        brokerConfig(namesrv, args.get("restore_broker_config"));
        emit("done", "t", now());
    }
}
