// TritongenClient: a single-file Java 17 client for tritongen, JDK only (java.net.http.HttpClient).
// Copy this one file into a project, or run it directly:
//
//   java TritongenClient.java triton-generate --url http://127.0.0.1:8000 --prompt "Hello"
//   java TritongenClient.java triton-stream   --url http://127.0.0.1:8000 --prompt "Hello"
//   java TritongenClient.java openai-chat     --url http://127.0.0.1:9000 --prompt "Hello" [--stream]
//
// triton-generate: POST /v2/models/llm_bls/generate, one JSON answer (the non-decoupled front).
// triton-stream:   POST /v2/models/llm/generate_stream, prints each server-sent text as it arrives.
// openai-chat:     POST /v1/chat/completions of the OpenAI-compatible server (SSE with --stream).
// Options: --model NAME (Triton model, or the OpenAI model; default llm_bls / llm / first listed),
// --prompt TEXT (Triton: "The capital of France is", continued as raw text; OpenAI chat: "What is the
// capital of France?"), --max-tokens N (32), --temperature T (0 = greedy), --api-key KEY (OpenAI only).
// Exit status: 0 on success, 1 on an HTTP or server error (the message goes to stderr), 2 on bad usage.

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

public final class TritongenClient {
    // HTTP/1.1: the JDK's default (HTTP_2) sends "Upgrade: h2c" on every plain-http request, which
    // uvicorn answers with "Unsupported upgrade request" warnings and Triton ignores anyway.
    private final HttpClient http = HttpClient.newBuilder()
            .version(HttpClient.Version.HTTP_1_1)
            .connectTimeout(Duration.ofSeconds(10))
            .build();
    private final String baseUrl;
    private final String apiKey;

    public TritongenClient(String baseUrl, String apiKey) {
        this.baseUrl = baseUrl.endsWith("/") ? baseUrl.substring(0, baseUrl.length() - 1) : baseUrl;
        this.apiKey = apiKey;
    }

    /** Triton HTTP generate (non-streaming): the whole text_output of one response. */
    public String tritonGenerate(String model, String prompt, int maxTokens, double temperature)
            throws IOException, InterruptedException {
        Map<String, Object> body = tritonBody(prompt, maxTokens, temperature, false);
        HttpResponse<String> resp = http.send(post("/v2/models/" + model + "/generate", body),
                HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8));
        Map<String, Object> json = asMap(Json.parse(resp.body()));
        if (resp.statusCode() != 200 || json.containsKey("error")) {
            throw new IOException("HTTP " + resp.statusCode() + ": " + json.get("error"));
        }
        return String.valueOf(json.get("text_output"));
    }

    /** Triton HTTP generate_stream: calls onText with each new piece of text as it arrives. */
    public void tritonStream(String model, String prompt, int maxTokens, double temperature,
                             java.util.function.Consumer<String> onText) throws IOException, InterruptedException {
        Map<String, Object> body = tritonBody(prompt, maxTokens, temperature, true);
        for (Map<String, Object> event : events(post("/v2/models/" + model + "/generate_stream", body))) {
            if (event.containsKey("error")) {
                throw new IOException("server error: " + event.get("error"));
            }
            Object text = event.get("text_output");
            if (text != null) {
                onText.accept(text.toString());
            }
        }
    }

    /** OpenAI chat completion; with stream, calls onText per delta; returns the whole answer. */
    public String openaiChat(String model, String prompt, int maxTokens, double temperature, boolean stream,
                             java.util.function.Consumer<String> onText) throws IOException, InterruptedException {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("model", model != null ? model : firstModel());
        body.put("messages", List.of(Map.of("role", "user", "content", prompt)));
        body.put("max_tokens", maxTokens);
        body.put("temperature", temperature);
        body.put("stream", stream);
        if (!stream) {
            HttpResponse<String> resp = http.send(post("/v1/chat/completions", body),
                    HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8));
            Map<String, Object> json = asMap(Json.parse(resp.body()));
            if (resp.statusCode() != 200) {
                throw new IOException("HTTP " + resp.statusCode() + ": " + json.get("error"));
            }
            Map<String, Object> choice = asMap(((List<?>) json.get("choices")).get(0));
            String text = String.valueOf(asMap(choice.get("message")).get("content"));
            onText.accept(text);
            return text;
        }
        StringBuilder all = new StringBuilder();
        for (Map<String, Object> event : events(post("/v1/chat/completions", body))) {
            if (event.containsKey("error")) {
                throw new IOException("server error: " + event.get("error"));
            }
            List<?> choices = (List<?>) event.get("choices");
            if (choices == null || choices.isEmpty()) {
                continue;
            }
            Object content = asMap(asMap(choices.get(0)).get("delta")).get("content");
            if (content != null && !content.toString().isEmpty()) {
                all.append(content);
                onText.accept(content.toString());
            }
        }
        return all.toString();
    }

    private String firstModel() throws IOException, InterruptedException {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(baseUrl + "/v1/models")).GET();
        if (apiKey != null) {
            b.header("Authorization", "Bearer " + apiKey);
        }
        HttpResponse<String> resp = http.send(b.build(), HttpResponse.BodyHandlers.ofString());
        if (resp.statusCode() != 200) {
            throw new IOException("HTTP " + resp.statusCode() + " from /v1/models: " + resp.body());
        }
        List<?> data = (List<?>) asMap(Json.parse(resp.body())).get("data");
        return String.valueOf(asMap(data.get(0)).get("id"));
    }

    private static Map<String, Object> tritonBody(String prompt, int maxTokens, double temperature, boolean stream) {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("text_input", prompt);
        body.put("max_tokens", maxTokens);
        body.put("temperature", temperature);
        body.put("stream", stream);
        body.put("exclude_input_in_output", true);
        return body;
    }

    private HttpRequest post(String path, Map<String, Object> body) {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(baseUrl + path))
                .timeout(Duration.ofMinutes(10))
                .header("Content-Type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(Json.write(body), StandardCharsets.UTF_8));
        if (apiKey != null) {
            b.header("Authorization", "Bearer " + apiKey);
        }
        return b.build();
    }

    /** Server-sent events of a POST, parsed as they arrive (each "data:" line is one JSON object). */
    private Iterable<Map<String, Object>> events(HttpRequest request) throws IOException, InterruptedException {
        HttpResponse<java.io.InputStream> resp = http.send(request, HttpResponse.BodyHandlers.ofInputStream());
        BufferedReader reader = new BufferedReader(new InputStreamReader(resp.body(), StandardCharsets.UTF_8));
        if (resp.statusCode() != 200) {
            StringBuilder sb = new StringBuilder();
            for (String line; (line = reader.readLine()) != null; ) {
                sb.append(line);
            }
            throw new IOException("HTTP " + resp.statusCode() + ": " + sb);
        }
        return () -> new java.util.Iterator<>() {
            private Map<String, Object> next = advance();

            private Map<String, Object> advance() {
                try {
                    for (String line; (line = reader.readLine()) != null; ) {
                        if (!line.startsWith("data:")) {
                            continue;  // blank separators, comments, event names
                        }
                        String data = line.substring(5).trim();
                        if (data.equals("[DONE]")) {
                            break;
                        }
                        return asMap(Json.parse(data));
                    }
                    reader.close();
                    return null;
                } catch (IOException e) {
                    throw new java.io.UncheckedIOException(e);
                }
            }

            public boolean hasNext() {
                return next != null;
            }

            public Map<String, Object> next() {
                Map<String, Object> current = next;
                next = advance();
                return current;
            }
        };
    }

    @SuppressWarnings("unchecked")
    private static Map<String, Object> asMap(Object o) throws IOException {
        if (!(o instanceof Map)) {
            throw new IOException("expected a JSON object, got: " + o);
        }
        return (Map<String, Object>) o;
    }

    /** Just enough JSON: write maps/lists/strings/numbers/booleans, parse into the same. */
    static final class Json {
        private final String s;
        private int i;

        private Json(String s) {
            this.s = s;
        }

        static Object parse(String text) throws IOException {
            Json p = new Json(text);
            Object v = p.value();
            p.ws();
            if (p.i != text.length()) {
                throw new IOException("trailing characters in JSON at " + p.i);
            }
            return v;
        }

        static String write(Object v) {
            if (v == null) {
                return "null";
            } else if (v instanceof String str) {
                StringBuilder sb = new StringBuilder("\"");
                for (char c : str.toCharArray()) {
                    switch (c) {
                        case '"' -> sb.append("\\\"");
                        case '\\' -> sb.append("\\\\");
                        case '\n' -> sb.append("\\n");
                        case '\r' -> sb.append("\\r");
                        case '\t' -> sb.append("\\t");
                        default -> {
                            if (c < 0x20) {
                                sb.append(String.format("\\u%04x", (int) c));
                            } else {
                                sb.append(c);
                            }
                        }
                    }
                }
                return sb.append('"').toString();
            } else if (v instanceof Map<?, ?> m) {
                List<String> parts = new ArrayList<>();
                m.forEach((k, val) -> parts.add(write(k.toString()) + ":" + write(val)));
                return "{" + String.join(",", parts) + "}";
            } else if (v instanceof List<?> l) {
                List<String> parts = new ArrayList<>();
                l.forEach(val -> parts.add(write(val)));
                return "[" + String.join(",", parts) + "]";
            }
            return v.toString();  // numbers and booleans
        }

        private void ws() {
            while (i < s.length() && Character.isWhitespace(s.charAt(i))) {
                i++;
            }
        }

        private Object value() throws IOException {
            ws();
            if (i >= s.length()) {
                throw new IOException("unexpected end of JSON");
            }
            char c = s.charAt(i);
            if (c == '{') {
                Map<String, Object> m = new HashMap<>();
                i++;
                ws();
                if (s.charAt(i) == '}') {
                    i++;
                    return m;
                }
                while (true) {
                    ws();
                    String key = string();
                    ws();
                    expect(':');
                    m.put(key, value());
                    ws();
                    if (s.charAt(i) == ',') {
                        i++;
                    } else {
                        expect('}');
                        return m;
                    }
                }
            } else if (c == '[') {
                List<Object> l = new ArrayList<>();
                i++;
                ws();
                if (s.charAt(i) == ']') {
                    i++;
                    return l;
                }
                while (true) {
                    l.add(value());
                    ws();
                    if (s.charAt(i) == ',') {
                        i++;
                    } else {
                        expect(']');
                        return l;
                    }
                }
            } else if (c == '"') {
                return string();
            } else if (s.startsWith("true", i)) {
                i += 4;
                return Boolean.TRUE;
            } else if (s.startsWith("false", i)) {
                i += 5;
                return Boolean.FALSE;
            } else if (s.startsWith("null", i)) {
                i += 4;
                return null;
            }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) {
                i++;
            }
            if (start == i) {
                throw new IOException("bad JSON at " + i);
            }
            return Double.parseDouble(s.substring(start, i));
        }

        private String string() throws IOException {
            expect('"');
            StringBuilder sb = new StringBuilder();
            while (true) {
                char c = s.charAt(i++);
                if (c == '"') {
                    return sb.toString();
                }
                if (c != '\\') {
                    sb.append(c);
                    continue;
                }
                char e = s.charAt(i++);
                switch (e) {
                    case 'n' -> sb.append('\n');
                    case 't' -> sb.append('\t');
                    case 'r' -> sb.append('\r');
                    case 'b' -> sb.append('\b');
                    case 'f' -> sb.append('\f');
                    case 'u' -> {
                        sb.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        i += 4;
                    }
                    default -> sb.append(e);  // \" \\ \/
                }
            }
        }

        private void expect(char c) throws IOException {
            if (i >= s.length() || s.charAt(i) != c) {
                throw new IOException("expected '" + c + "' in JSON at " + i);
            }
            i++;
        }
    }

    public static void main(String[] args) {
        if (args.length < 1) {
            System.err.println("usage: TritongenClient triton-generate|triton-stream|openai-chat [--url U] "
                    + "[--model M] [--prompt P] [--max-tokens N] [--temperature T] [--stream] [--api-key K]");
            System.exit(2);
        }
        Map<String, String> opts = new HashMap<>();
        for (int k = 1; k < args.length; k++) {
            if (args[k].equals("--stream")) {
                opts.put("stream", "true");
            } else if (args[k].startsWith("--") && k + 1 < args.length) {
                opts.put(args[k].substring(2), args[++k]);
            } else {
                System.err.println("unexpected argument: " + args[k]);
                System.exit(2);
            }
        }
        String command = args[0];
        boolean openai = command.equals("openai-chat");
        String url = opts.getOrDefault("url", openai ? "http://127.0.0.1:9000" : "http://127.0.0.1:8000");
        // The Triton models continue the raw text (no chat template), so their default prompt is one
        // an instruct model continues; the OpenAI chat route applies the template to a question.
        String prompt = opts.getOrDefault("prompt", openai ? "What is the capital of France?" : "The capital of France is");
        int maxTokens = Integer.parseInt(opts.getOrDefault("max-tokens", "32"));
        double temperature = Double.parseDouble(opts.getOrDefault("temperature", "0"));
        TritongenClient client = new TritongenClient(url, opts.get("api-key"));
        try {
            switch (command) {
                case "triton-generate" -> System.out.println(
                        client.tritonGenerate(opts.getOrDefault("model", "llm_bls"), prompt, maxTokens, temperature));
                case "triton-stream" -> {
                    client.tritonStream(opts.getOrDefault("model", "llm"), prompt, maxTokens, temperature,
                            text -> { System.out.print(text); System.out.flush(); });
                    System.out.println();
                }
                case "openai-chat" -> {
                    boolean stream = opts.containsKey("stream");
                    client.openaiChat(opts.get("model"), prompt, maxTokens, temperature, stream,
                            text -> { System.out.print(text); System.out.flush(); });
                    System.out.println();
                }
                default -> {
                    System.err.println("unknown command: " + command);
                    System.exit(2);
                }
            }
        } catch (IOException | InterruptedException | RuntimeException e) {
            System.err.println("error: " + e.getMessage());
            System.exit(1);
        }
    }
}
