// What a RocketMQ 5.5.0 broker reads from a request: its header decoded into the class the
// broker's processor decodes it into, and its body read by the broker's own body class
// (fastjson2, with each field's name and alternateNames). The differential test of the
// remoting port's guard (tests/interop/test_remoting_bodies.py) feeds it the requests it
// feeds the guard and compares what each read.
//
// One JSON object a line on stdin: {"kind": "header" | "send" | "body", "class": the class
// to read into, "fields": the ext fields, "body": base64}. One line a request on stdout:
// {"ok": true, "value": what was read, written back as JSON} or {"ok": false, "error": ...}.
import com.alibaba.fastjson2.JSON;
import com.alibaba.fastjson2.JSONObject;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.HashMap;
import java.util.Map;
import org.apache.rocketmq.remoting.CommandCustomHeader;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;
import org.apache.rocketmq.remoting.protocol.header.SendMessageRequestHeader;

public final class BrokerReading {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            JSONObject out = new JSONObject();
            try {
                out.put("value", read(JSON.parseObject(line)));
                out.put("ok", true);
            } catch (Throwable e) {
                out.put("ok", false);
                out.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
            }
            System.out.println(out.toJSONString());
            System.out.flush();
        }
    }

    private static Object read(JSONObject request) throws Exception {
        String kind = request.getString("kind");
        RemotingCommand cmd = RemotingCommand.createRequestCommand(request.getIntValue("code"), null);
        HashMap<String, String> fields = new HashMap<>();
        JSONObject given = request.getJSONObject("fields");
        if (given != null) {
            for (Map.Entry<String, Object> e : given.entrySet()) {
                fields.put(e.getKey(), String.valueOf(e.getValue()));
            }
        }
        cmd.setExtFields(fields);
        String body = request.getString("body");
        byte[] bytes = body == null ? new byte[0] : Base64.getDecoder().decode(body);
        cmd.setBody(bytes);
        if ("send".equals(kind)) {  // SEND_MESSAGE (V1 names) or V2/batch (short names)
            return JSON.toJSON(SendMessageRequestHeader.parseRequestHeader(cmd));
        }
        Class<?> type = Class.forName(request.getString("class"));
        if ("header".equals(kind)) {
            @SuppressWarnings("unchecked")
            Class<? extends CommandCustomHeader> header = (Class<? extends CommandCustomHeader>) type;
            return JSON.toJSON(cmd.decodeCommandCustomHeader(header));
        }
        // A body: RemotingSerializable.decode(bytes, class), as the broker's processors call it.
        Method decode = Class.forName("org.apache.rocketmq.remoting.protocol.RemotingSerializable")
            .getMethod("decode", byte[].class, Class.class);
        Object value = decode.invoke(null, bytes, type);
        return value == null ? null : JSON.toJSON(value);
    }
}
