import java.util.Map;
import java.util.TreeMap;

/**
 * The output of the differential suite's drivers (RocketMQDriver and RocketMQV5Driver, compiled
 * each with its own copy of this file since their class paths differ): one JSON object a line
 * on stdout, {"ev": ..., ...}, which tests/differential/rocketmq_side.py parses.
 */
final class DriverOutput {
    private static final Object OUT = new Object();

    private DriverOutput() {
    }

    /** Print one event: emit("consume", "key", k, "t", 12, ...). Lines of threads never mix. */
    static void emit(String ev, Object... kv) {
        StringBuilder b = new StringBuilder("{\"ev\":").append(quote(ev));
        for (int i = 0; i + 1 < kv.length; i += 2) {
            b.append(',').append(quote(String.valueOf(kv[i]))).append(':').append(value(kv[i + 1]));
        }
        b.append('}');
        synchronized (OUT) {
            System.out.println(b);
            System.out.flush();
        }
    }

    private static String quote(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
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

    /** A JSON value: numbers and booleans as they are, maps as objects (keys sorted), anything
     * else as its string. */
    private static String value(Object v) {
        if (v == null) {
            return "null";
        }
        if (v instanceof Number || v instanceof Boolean) {
            return v.toString();
        }
        if (v instanceof Map) {
            StringBuilder b = new StringBuilder("{");
            boolean first = true;
            for (Map.Entry<?, ?> e : new TreeMap<>((Map<?, ?>) v).entrySet()) {
                b.append(first ? "" : ",").append(quote(String.valueOf(e.getKey()))).append(':')
                    .append(value(e.getValue()));
                first = false;
            }
            return b.append('}').toString();
        }
        return quote(v.toString());
    }
}
