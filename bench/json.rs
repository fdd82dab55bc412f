//! Per-request JSON work of a `tools/call` through the gateway, at the sizes the perf harness
//! uses: the streaming result scanner over the fixture's ~1 KiB answer (and a structure-rich
//! and an escape-heavy answer), the request envelope peek, and the param lookups the server
//! binding makes on every call. Also the proxy's list merge: a 1,000-tool `tools/list`
//! result renamed and filtered by the streaming item rewriter, beside a plain scan of the
//! same answer.
//!
//! Run: `cargo bench --bench json` (add `-- --quick` for a short run).
//!
//! Instruction counts: `target/release/deps/json-HASH --ir CASE N` runs case `CASE` N times
//! inside [`ir_loop`] and exits, so
//! `valgrind --tool=callgrind --toggle-collect='json::ir_loop' BIN --ir CASE N` counts only
//! that work; divide the total Ir by N. `--ir list` prints the case names.

use bytes::Bytes;
use criterion::{Criterion, Throughput};
use mcpyard::jsonrpc;
use mcpyard::limits::SLOT_BYTES;
use std::collections::HashSet;
use std::hint::black_box;

/// The loadgen fixture's text payload pattern (`mcpyard-loadgen upstream --result-bytes N`).
const FILL: &[u8] = b"mcpyard-loadgen-";

/// The upstream answer the fixture gives a `tools/call`: one text item of `n` bytes.
fn fixture_answer(n: usize) -> Bytes {
    let mut doc =
        br#"{"jsonrpc":"2.0","id":42,"result":{"content":[{"type":"text","text":""#.to_vec();
    doc.extend(FILL.iter().copied().cycle().take(n));
    doc.extend_from_slice(br#""}],"isError":false}}"#);
    Bytes::from(doc)
}

/// A `tools/list`-like answer: many short strings and small objects.
fn structured_answer() -> Bytes {
    let mut doc = String::from(r#"{"jsonrpc":"2.0","id":42,"result":{"tools":["#);
    for i in 0..8 {
        if i > 0 {
            doc.push(',');
        }
        doc.push_str(&format!(
            r#"{{"name":"tool{i}","description":"Returns the fixture's payload","inputSchema":{{"type":"object","properties":{{"text":{{"type":"string"}},"n":{{"type":"integer","minimum":0}}}},"required":["text"]}},"annotations":{{"readOnlyHint":true,"idempotentHint":false}}}}"#
        ));
    }
    doc.push_str("]}}");
    Bytes::from(doc)
}

/// A ~1 KiB text answer with escapes (`\n`, `\"`, `\\`, `\u00e9`) every few dozen bytes.
fn escaped_answer() -> Bytes {
    let line = r#"line with \"quotes\", a back\\slash, caf\u00e9 and a newline\n"#;
    let mut doc =
        String::from(r#"{"jsonrpc":"2.0","id":42,"result":{"content":[{"type":"text","text":""#);
    while doc.len() < 1024 {
        doc.push_str(line);
    }
    doc.push_str(r#""}],"isError":false}}"#);
    Bytes::from(doc)
}

/// Tools in the list-merge cases.
const LIST_TOOLS: usize = 1000;

/// The route prefix the list-merge cases insert.
const LIST_PREFIX: &[u8] = b"github__";

/// A `tools/list` result of `n` tools like a real server's (~330 bytes each: title,
/// description, an input schema with two typed properties, annotations), with a cursor.
fn tools_list(n: usize) -> Bytes {
    let mut doc = String::from(r#"{"tools":["#);
    for i in 0..n {
        if i > 0 {
            doc.push(',');
        }
        doc.push_str(&format!(
            r#"{{"name":"search_issues_{i}","title":"Search issues {i}","description":"Searches issues and pull requests in a repository and returns the matching ones","inputSchema":{{"type":"object","properties":{{"query":{{"type":"string","description":"Search terms"}},"limit":{{"type":"integer","minimum":1,"maximum":100}}}},"required":["query"]}},"annotations":{{"readOnlyHint":true}}}}"#
        ));
    }
    doc.push_str(r#"],"nextCursor":"page-2"}"#);
    Bytes::from(doc)
}

/// The route's allow-list in the list-merge cases: every other tool.
fn list_allow(n: usize) -> HashSet<String> {
    (0..n)
        .step_by(2)
        .map(|i| format!("search_issues_{i}"))
        .collect()
}

/// What the proxy does with one upstream page: rewrites the result in Items mode, fed in
/// slot-sized pieces as socket reads deliver it. Returns the items written.
fn rewrite_list(doc: &Bytes, allow: &HashSet<String>, sink: &mut jsonrpc::ItemSink) -> u64 {
    sink.parts.clear();
    sink.items = 0;
    sink.dropped = 0;
    let rules = jsonrpc::ItemRules::tools(Bytes::from_static(LIST_PREFIX));
    let mut rewriter = jsonrpc::ItemRewriter::new(rules, jsonrpc::ItemMode::Items);
    let mut admit = |name: &str| allow.contains(name);
    let mut at = 0;
    while at < doc.len() {
        let piece = doc.slice(at..doc.len().min(at + SLOT_BYTES));
        at += piece.len();
        if rewriter.feed(piece, &mut admit, sink).is_err() {
            return 0;
        }
    }
    match rewriter.finish() {
        Ok(_) => sink.items,
        Err(_) => 0,
    }
}

/// The same list as an upstream answer, for the plain-scan baseline.
fn tools_list_answer(n: usize) -> Bytes {
    let mut doc = br#"{"jsonrpc":"2.0","id":42,"result":"#.to_vec();
    doc.extend_from_slice(&tools_list(n));
    doc.push(b'}');
    Bytes::from(doc)
}

/// The agent's `tools/call` as the loadgen sends it (`--params-bytes 16`).
const CALL: &[u8] = br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"echo","arguments":{"text":"mcpyard-loadgen-"},"_meta":{"progressToken":42}}}"#;

/// Scans `doc` as one piece (a small answer arrives in one read) and returns the result bytes.
fn scan_one(doc: &Bytes, events: &mut jsonrpc::ScanEvents) -> usize {
    let mut scanner = jsonrpc::ResultScanner::new();
    events.clear();
    if scanner.feed(doc.clone(), events).is_err() || scanner.finish(events).is_err() {
        return 0;
    }
    events
        .iter()
        .map(|e| match e {
            jsonrpc::ScanEvent::Result(b) => b.len(),
            jsonrpc::ScanEvent::Done { .. } => 0,
        })
        .sum()
}

/// What the server binding does with a `tools/call` body: envelope, tool name, progress token.
fn peek_call(body: &[u8]) -> usize {
    let Ok(env) = jsonrpc::parse_envelope(body) else {
        return 0;
    };
    let Some(params) = env.params else { return 0 };
    let name = jsonrpc::param_str(params, "name").ok().flatten();
    let token = jsonrpc::progress_token(params);
    name.map_or(0, |n| n.len()) + token.map_or(0, |t| t.get().len())
}

/// The instruction-count cases, by name.
const CASES: &[&str] = &[
    "scan_fixture_1k",
    "scan_structured",
    "scan_escaped_1k",
    "envelope_call",
    "param_name",
    "progress_token",
    "peek_call",
    "list_tools_1000",
    "scan_tools_1000",
];

/// Runs case `case` `n` times; the only frame callgrind collects in `--ir` mode.
#[inline(never)]
fn ir_loop(case: &str, n: u64) -> usize {
    let fixture = fixture_answer(1024);
    let structured = structured_answer();
    let escaped = escaped_answer();
    let params = jsonrpc::parse_envelope(CALL)
        .ok()
        .and_then(|e| e.params)
        .map(|p| p.get().to_owned())
        .unwrap_or_default();
    let params = jsonrpc::Raw::parse(&params).unwrap_or_else(|| {
        panic!("the CALL constant has object params");
    });
    let mut events = jsonrpc::ScanEvents::new();
    // Built only for its own case, so the other cases' counts do not include building it.
    let listing = case == "list_tools_1000";
    let list = match case {
        "list_tools_1000" => tools_list(LIST_TOOLS),
        "scan_tools_1000" => tools_list_answer(LIST_TOOLS),
        _ => Bytes::new(),
    };
    let allow = if listing {
        list_allow(LIST_TOOLS)
    } else {
        HashSet::new()
    };
    let mut sink = jsonrpc::ItemSink::new();
    let mut sum = 0;
    for _ in 0..n {
        sum += match case {
            "scan_fixture_1k" => scan_one(black_box(&fixture), &mut events),
            "scan_structured" => scan_one(black_box(&structured), &mut events),
            "scan_escaped_1k" => scan_one(black_box(&escaped), &mut events),
            "envelope_call" => {
                jsonrpc::parse_envelope(black_box(CALL)).map_or(0, |e| e.kind as usize)
            }
            "param_name" => jsonrpc::param_str(black_box(params), "name")
                .ok()
                .flatten()
                .map_or(0, |n| n.len()),
            "progress_token" => {
                jsonrpc::progress_token(black_box(params)).map_or(0, |t| t.get().len())
            }
            "peek_call" => peek_call(black_box(CALL)),
            "list_tools_1000" => rewrite_list(black_box(&list), &allow, &mut sink) as usize,
            "scan_tools_1000" => scan_one(black_box(&list), &mut events),
            other => panic!("unknown case {other}; one of {CASES:?}"),
        };
    }
    sum
}

fn scanner(c: &mut Criterion) {
    let mut g = c.benchmark_group("json_scan");
    for (name, doc) in [
        ("fixture_1k", fixture_answer(1024)),
        ("structured", structured_answer()),
        ("escaped_1k", escaped_answer()),
    ] {
        let mut events = jsonrpc::ScanEvents::new();
        assert!(scan_one(&doc, &mut events) > 0, "{name} must scan");
        g.throughput(Throughput::Bytes(doc.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| black_box(scan_one(black_box(&doc), &mut events)))
        });
    }
    g.finish();
}

fn list_merge(c: &mut Criterion) {
    let mut g = c.benchmark_group("json_list");
    let list = tools_list(LIST_TOOLS);
    let allow = list_allow(LIST_TOOLS);
    let mut sink = jsonrpc::ItemSink::new();
    assert_eq!(
        rewrite_list(&list, &allow, &mut sink),
        LIST_TOOLS as u64 / 2
    );
    g.throughput(Throughput::Bytes(list.len() as u64));
    g.bench_function("rewrite_tools_1000", |b| {
        b.iter(|| black_box(rewrite_list(black_box(&list), &allow, &mut sink)))
    });
    // Baseline: the result scanner over the same answer in one piece, which only finds
    // where the result is.
    let answer = tools_list_answer(LIST_TOOLS);
    let mut events = jsonrpc::ScanEvents::new();
    assert!(scan_one(&answer, &mut events) > 0);
    g.throughput(Throughput::Bytes(answer.len() as u64));
    g.bench_function("scan_tools_1000", |b| {
        b.iter(|| black_box(scan_one(black_box(&answer), &mut events)))
    });
    g.finish();
}

fn request_side(c: &mut Criterion) {
    let mut g = c.benchmark_group("json_request");
    assert!(peek_call(CALL) > 0);
    g.bench_function("envelope_call", |b| {
        b.iter(|| black_box(jsonrpc::parse_envelope(black_box(CALL)).is_ok()))
    });
    g.bench_function("peek_call", |b| {
        b.iter(|| black_box(peek_call(black_box(CALL))))
    });
    g.finish();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--ir") {
        let case = args.get(at + 1).map_or("list", String::as_str);
        if case == "list" {
            println!("{}", CASES.join("\n"));
            return;
        }
        let n = args
            .get(at + 2)
            .and_then(|n| n.parse().ok())
            .unwrap_or(1000);
        println!("{case} x{n}: {}", ir_loop(case, n));
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    scanner(&mut c);
    list_merge(&mut c);
    request_side(&mut c);
    c.final_summary();
}
