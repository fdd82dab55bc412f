//! Micro-benchmarks of the hot codecs: HTTP request decode and response encode, chunked
//! framing, SSE encode/decode, the JSON-RPC envelope peek (serde_json borrowed, beside a
//! simd-json DOM parse of a copy for comparison), the streaming result scanner, credit-window
//! arithmetic, session ids.
//!
//! Run: `cargo bench --bench codecs` (add `-- --quick` for a short run).

use bytes::{Bytes, BytesMut};
use criterion::{Criterion, Throughput, criterion_group};
use mcpyard::binding::server::session_id;
use mcpyard::http::{
    self, BodyFraming, RequestDecoder, RequestEvent, ResponseDecoder, ResponseEvent,
};
use mcpyard::jsonrpc;
use mcpyard::limits::SLOT_BYTES;
use mcpyard::sse;
use mcpyard::stream::Window;
use std::hint::black_box;

const CALL: &[u8] = br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello from the benchmark"},"_meta":{"progressToken":"t-1"}}}"#;

fn request_bytes() -> Vec<u8> {
    let mut r = format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:7114\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\nmcp-protocol-version: 2025-11-25\r\nmcp-session-id: 0001lg7geCVz7B-TdmYjLEbYSQ\r\ncontent-length: {}\r\n\r\n",
        CALL.len()
    )
    .into_bytes();
    r.extend_from_slice(CALL);
    r
}

/// A 1 KiB `tools/call` result as the upstream fixture answers it: one read holding the head
/// and the whole Content-Length body (which has no newline).
fn response_bytes_1k() -> Vec<u8> {
    let mut body =
        String::from(r#"{"jsonrpc":"2.0","id":42,"result":{"content":[{"type":"text","text":""#);
    while body.len() < 1024 + 64 {
        body.push_str("0123456789abcdef");
    }
    body.push_str(r#""}],"isError":false}}"#);
    let mut r = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: 0001lg7geCVz7B-TdmYjLEbYSQ\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body.as_bytes());
    r
}

/// Decodes one whole request and asks for the fields the server binding reads per request.
fn decode_request_and_look_up(raw: &[u8]) -> usize {
    let mut buf = BytesMut::from(raw);
    let mut d = RequestDecoder::new(1 << 20);
    let mut found = 0;
    while let Ok(Some(ev)) = d.decode(&mut buf) {
        match ev {
            RequestEvent::Head(head) => {
                for name in [
                    "host",
                    "origin",
                    "accept",
                    "mcp-protocol-version",
                    "mcp-session-id",
                ] {
                    found += usize::from(head.headers.get(black_box(name)).is_some());
                }
                found += usize::from(head.keep_alive());
            }
            RequestEvent::Data(data) => found += data.len(),
            RequestEvent::End => break,
        }
    }
    found
}

/// Decodes one whole response: head, body, end.
fn decode_response(raw: &[u8]) -> usize {
    let mut buf = BytesMut::from(raw);
    let mut d = ResponseDecoder::new(usize::MAX);
    let mut found = 0;
    while let Ok(Some(ev)) = d.decode(&mut buf, false) {
        match ev {
            ResponseEvent::Head(head) => {
                found += usize::from(head.headers.get(black_box("content-type")).is_some());
                found += usize::from(head.keep_alive());
            }
            ResponseEvent::Data(data) => found += data.len(),
            ResponseEvent::End => break,
        }
    }
    found
}

fn http_codecs(c: &mut Criterion) {
    let raw = request_bytes();
    let mut g = c.benchmark_group("http");
    g.throughput(Throughput::Bytes(raw.len() as u64));
    g.bench_function("decode_post_request", |b| {
        b.iter(|| {
            let mut buf = BytesMut::from(&raw[..]);
            let mut d = RequestDecoder::new(1 << 20);
            let mut events = 0;
            while let Ok(Some(ev)) = d.decode(&mut buf) {
                events += 1;
                if matches!(ev, RequestEvent::End) {
                    break;
                }
            }
            black_box(events)
        })
    });
    g.bench_function("decode_request_and_look_up", |b| {
        b.iter(|| black_box(decode_request_and_look_up(black_box(&raw))))
    });
    let response = response_bytes_1k();
    g.throughput(Throughput::Bytes(response.len() as u64));
    g.bench_function("decode_response_1k", |b| {
        b.iter(|| black_box(decode_response(black_box(&response))))
    });
    g.bench_function("encode_response_head", |b| {
        let mut out = BytesMut::with_capacity(256);
        b.iter(|| {
            out.clear();
            http::encode_response_head(
                200,
                &[
                    ("content-type", b"application/json"),
                    ("mcp-session-id", b"0001lg7geCVz7B-TdmYjLEbYSQ"),
                ],
                BodyFraming::Length(black_box(123)),
                &mut out,
            )
            .unwrap_or_default();
            black_box(out.len())
        })
    });
    let chunk = vec![b'x'; 32 * 1024];
    g.throughput(Throughput::Bytes(chunk.len() as u64));
    g.bench_function("encode_chunk_32k", |b| {
        let mut out = BytesMut::with_capacity(40 * 1024);
        b.iter(|| {
            out.clear();
            http::encode_chunk(black_box(&chunk), &mut out);
            black_box(out.len())
        })
    });
    g.finish();
}

fn sse_codecs(c: &mut Criterion) {
    let mut g = c.benchmark_group("sse");
    g.throughput(Throughput::Bytes(CALL.len() as u64));
    g.bench_function("encode_event", |b| {
        let mut out = BytesMut::with_capacity(512);
        b.iter(|| {
            out.clear();
            let ev = sse::Event {
                id: Some("3.17"),
                event: None,
                data: Some(black_box(CALL)),
                retry_ms: None,
            };
            let _ = sse::encode_event(&ev, &mut out);
            black_box(out.len())
        })
    });
    let mut stream = BytesMut::new();
    for i in 0..16 {
        let id = format!("1.{i}");
        let ev = sse::Event {
            id: Some(&id),
            event: None,
            data: Some(CALL),
            retry_ms: None,
        };
        let _ = sse::encode_event(&ev, &mut stream);
    }
    let stream = stream.freeze();
    g.throughput(Throughput::Bytes(stream.len() as u64));
    g.bench_function("decode_16_events", |b| {
        b.iter(|| {
            let mut buf = BytesMut::from(&stream[..]);
            let mut d = sse::Decoder::new();
            let mut n = 0;
            while let Ok(Some(_)) = d.decode(&mut buf) {
                n += 1;
            }
            black_box(n)
        })
    });
    g.finish();
}

fn envelope(c: &mut Criterion) {
    let mut g = c.benchmark_group("jsonrpc");
    g.throughput(Throughput::Bytes(CALL.len() as u64));
    g.bench_function("envelope_peek_serde_json_borrowed", |b| {
        b.iter(|| {
            let env = jsonrpc::parse_envelope(black_box(CALL));
            black_box(env.map(|e| e.params.map(|p| p.get().len())).ok())
        })
    });
    g.bench_function("simd_json_dom_of_a_copy", |b| {
        b.iter(|| {
            let mut copy = black_box(CALL).to_vec();
            let v = simd_json::to_borrowed_value(&mut copy)
                .map(|v| matches!(v, simd_json::BorrowedValue::Object(_)));
            black_box(v.ok())
        })
    });
    g.bench_function("write_result_envelope_1k", |b| {
        let result = vec![b' '; 1024];
        let mut out = BytesMut::with_capacity(1200);
        b.iter(|| {
            out.clear();
            jsonrpc::write_result("42", black_box(&result), &mut out);
            black_box(out.len())
        })
    });
    g.finish();
}

/// A response of about 1 MiB whose result is one `text` content item: prose with a `\n`
/// escape every line, the shape of a large tool result.
fn text_response_1mib() -> Bytes {
    let line = "the quick brown fox jumps over the lazy dog, \\\"quoted\\\" and 0123456789\\n";
    let mut doc =
        String::from(r#"{"jsonrpc":"2.0","id":42,"result":{"content":[{"type":"text","text":""#);
    while doc.len() < (1 << 20) - 64 {
        doc.push_str(line);
    }
    doc.push_str(r#""}],"isError":false}}"#);
    Bytes::from(doc)
}

/// A response of about 1 MiB whose result is dense structure: many small objects.
fn dense_response_1mib() -> Bytes {
    let mut doc = String::from(r#"{"jsonrpc":"2.0","id":42,"result":{"rows":["#);
    let mut i = 0u32;
    while doc.len() < (1 << 20) - 64 {
        doc.push_str(&format!(r#"{{"n":{i},"ok":true,"v":-1.5e3,"s":"row"}},"#));
        i += 1;
    }
    doc.push_str("null]}}");
    Bytes::from(doc)
}

/// Feeds `doc` in slot-sized pieces (as socket reads arrive) and counts result bytes.
fn scan_in_slots(doc: &Bytes, events: &mut jsonrpc::ScanEvents) -> usize {
    let mut scanner = jsonrpc::ResultScanner::new();
    let mut result_bytes = 0;
    for start in (0..doc.len()).step_by(SLOT_BYTES) {
        let end = (start + SLOT_BYTES).min(doc.len());
        events.clear();
        if scanner.feed(doc.slice(start..end), events).is_err() {
            return 0;
        }
        for event in events.iter() {
            if let jsonrpc::ScanEvent::Result(bytes) = event {
                result_bytes += bytes.len();
            }
        }
    }
    if scanner.finish(events).is_err() {
        return 0;
    }
    result_bytes
}

fn scan_result(c: &mut Criterion) {
    let mut g = c.benchmark_group("jsonrpc");
    for (name, doc) in [
        ("scan_result_1mib", text_response_1mib()),
        ("scan_result_1mib_dense", dense_response_1mib()),
    ] {
        let mut events = jsonrpc::ScanEvents::new();
        assert!(scan_in_slots(&doc, &mut events) > doc.len() - 128);
        g.throughput(Throughput::Bytes(doc.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| black_box(scan_in_slots(black_box(&doc), &mut events)))
        });
    }
    g.finish();
}

fn window_and_ids(c: &mut Criterion) {
    c.bench_function("window_send_ack_cycle", |b| {
        let mut w = Window::new(32 * 1024);
        b.iter(|| {
            w.on_sent(black_box(1024));
            w.on_ack(black_box(1024));
            black_box(w.credit())
        })
    });
    c.bench_function("session_id_mint", |b| {
        b.iter(|| black_box(session_id::mint(0, 1).ok()))
    });
    let id = session_id::mint(0, 1).unwrap_or_default();
    c.bench_function("session_id_owner", |b| {
        b.iter(|| black_box(session_id::owner(black_box(id.as_bytes()))))
    });
}

criterion_group!(
    benches,
    http_codecs,
    sse_codecs,
    envelope,
    scan_result,
    window_and_ids
);

/// Env var that switches the binary from criterion to a fixed-count loop, for callgrind:
/// `CODECS_LOOP=decode_response_1k:10000 valgrind --tool=callgrind target/release/deps/codecs-*`.
/// Run it with two counts and divide the difference in Ir by the difference in counts.
const LOOP_ENV: &str = "CODECS_LOOP";

/// Runs one HTTP codec operation `count` times, without criterion's own work around it.
fn run_loop(name: &str, count: u64) -> Result<usize, String> {
    let request = request_bytes();
    let response = response_bytes_1k();
    let chunk = vec![b'x'; 32 * 1024];
    let mut out = BytesMut::with_capacity(40 * 1024);
    let mut total = 0usize;
    for _ in 0..count {
        total += match name {
            "decode_request_and_look_up" => decode_request_and_look_up(black_box(&request)),
            "decode_response_1k" => decode_response(black_box(&response)),
            "encode_chunk_32k" => {
                out.clear();
                http::encode_chunk(black_box(&chunk), &mut out);
                out.len()
            }
            "encode_response_head" => {
                out.clear();
                http::encode_response_head(
                    200,
                    &[
                        ("content-type", b"application/json"),
                        ("mcp-session-id", b"0001lg7geCVz7B-TdmYjLEbYSQ"),
                    ],
                    BodyFraming::Length(black_box(123)),
                    &mut out,
                )
                .unwrap_or_default();
                out.len()
            }
            _ => return Err(format!("{LOOP_ENV}: unknown operation {name}")),
        };
    }
    Ok(black_box(total))
}

fn main() {
    if let Ok(spec) = std::env::var(LOOP_ENV) {
        let (name, count) = spec.split_once(':').unwrap_or((spec.as_str(), "1"));
        let count: u64 = count.parse().unwrap_or(1);
        match run_loop(name, count) {
            Ok(total) => println!("{name} x{count}: {total}"),
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(2);
            }
        }
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
