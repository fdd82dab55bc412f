//! Fuzzes the proxy's renaming both ways with a round-trip oracle: an upstream item name
//! (from the input, written plainly or all in `\u` escapes) goes through the list rewriter,
//! which must show the agent exactly `<prefix><name>`; the agent sends that name back in a
//! `tools/call` or `resources/read` (echoing the lexeme verbatim, or re-escaped); the server
//! must locate it in the params; and the proxy's prefix strip (the `Splice` of the params,
//! fed cut at a point the input chooses and in small pieces) must hand the upstream params
//! whose name is the original name again, every other byte unchanged.
//!
//! A name longer than the list rewriter's key bound must be dropped instead.
//!
//! Input: one byte of flags (bit 0 resources rather than tools, bit 1 upstream escapes every
//! character, bit 2 the agent re-escapes the name, bits 3-4 the toolkit, bits 5-7 the piece
//! size), two bytes of cut point; the rest is the name (lossy UTF-8).
#![no_main]

use std::fmt;
use std::fmt::Write;

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use mcpyard::fuzzing::{Splice, lexeme, request_target};
use mcpyard::jsonrpc::{ItemMode, ItemRewriter, ItemRules, ItemSink, escape_str};
use mcpyard::limits::LIST_KEY_BYTES_MAX;
use mcpyard_fuzz::{Input, split};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

const TOOLKITS: [&str; 4] = ["gh", "a", "route-1", ""];

/// A JSON object's members in order, each value raw.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(MembersVisitor)
    }
}

struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Members<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::new();
        while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
            members.push(entry);
        }
        Ok(Members(members))
    }
}

/// `name` as a JSON string with every character written as `\u` escapes (UTF-16).
fn all_escaped(name: &str) -> String {
    let mut out = String::from("\"");
    for unit in name.encode_utf16() {
        let _ = write!(out, "\\u{unit:04X}");
    }
    out.push('"');
    out
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let flags = input.byte();
    let uri = flags & 1 == 1;
    let upstream_escapes_all = flags & 2 == 2;
    let agent_reescapes = flags & 4 == 4;
    let toolkit = TOOLKITS[usize::from((flags >> 3) & 3)];
    let piece = usize::from(flags >> 5) + 1;
    let selector = input.u16();
    let name = String::from_utf8_lossy(input.rest()).into_owned();
    if name.is_empty() {
        return;
    }
    let (rules, key, prefix) = if uri {
        let prefix = if toolkit.is_empty() {
            String::new()
        } else {
            format!("{toolkit}+")
        };
        (
            ItemRules::resources(Bytes::from(prefix.clone())),
            "uri",
            prefix,
        )
    } else {
        let prefix = if toolkit.is_empty() {
            String::new()
        } else {
            format!("{toolkit}__")
        };
        (
            ItemRules::tools(Bytes::from(prefix.clone())),
            "name",
            prefix,
        )
    };
    let array = std::str::from_utf8(rules.array).expect("ASCII");

    // Upstream → agent: the list rewriter puts the prefix in front of the name.
    let upstream = if upstream_escapes_all {
        all_escaped(&name)
    } else {
        let mut out = BytesMut::new();
        escape_str(&name, &mut out);
        String::from_utf8(out.to_vec()).expect("escape_str writes UTF-8")
    };
    let doc = format!(r#"{{"{array}":[{{"{key}":{upstream},"description":"d"}}]}}"#);
    let mut rewriter = ItemRewriter::new(rules.clone(), ItemMode::Items);
    let mut sink = ItemSink::new();
    rewriter
        .feed(Bytes::from(doc.clone()), &mut |_: &str| true, &mut sink)
        .expect("the list is valid");
    assert_eq!(rewriter.finish(), Ok(None));
    if name.len() > LIST_KEY_BYTES_MAX {
        // A name over the bound never reaches the agent.
        assert_eq!((sink.items, sink.dropped), (0, 1), "a long name was kept");
        return;
    }
    assert_eq!(
        (sink.items, sink.dropped),
        (1, 0),
        "the item was dropped: {doc}"
    );
    let item: Vec<u8> = sink.parts.iter().flat_map(|p| p.iter().copied()).collect();
    let item = String::from_utf8(item).expect("the item is UTF-8");
    let shown = format!("{prefix}{name}");
    let read: Value = serde_json::from_str(&item).expect("the item is JSON");
    assert_eq!(
        read[key],
        Value::String(shown.clone()),
        "the agent sees {item}"
    );

    // Agent → server: the name comes back in the params, as the agent writes it.
    let agent_lexeme = if agent_reescapes {
        serde_json::to_string(&shown).expect("a string serializes")
    } else {
        let Members(members) = serde_json::from_str(&item).expect("the item is an object");
        let (_, raw) = members
            .into_iter()
            .find(|(k, _)| k == key)
            .expect("the key");
        raw.get().to_owned()
    };
    let params = format!(r#"{{"{key}":{agent_lexeme},"arguments":{{"{key}":{agent_lexeme}}}}}"#);
    let raw: &RawValue = serde_json::from_str(&params).expect("the params are JSON");
    let target = request_target(raw, uri)
        .expect("the target is a string")
        .expect("the target is there");
    assert_eq!(target.name, shown, "the server read another name");
    assert_eq!(
        &params[target.start..target.end],
        agent_lexeme,
        "the lexeme is elsewhere"
    );

    // Server → upstream: the proxy strips the prefix off in the params as they stream.
    if prefix.is_empty() {
        return;
    }
    let upstream_name = target
        .name
        .strip_prefix(&prefix)
        .expect("the prefix is there");
    assert_eq!(upstream_name, name);
    let with = lexeme(upstream_name);
    let params_bytes = params.as_bytes();
    for parts in [
        split(params_bytes, selector).to_vec(),
        params_bytes.chunks(piece).collect(),
    ] {
        let mut splice = Splice::new(target.start, target.end, with.clone());
        let want_len = splice.out_len(params_bytes.len());
        let mut out = Vec::new();
        for part in parts {
            for piece in splice.feed(Bytes::copy_from_slice(part)) {
                out.extend_from_slice(&piece);
            }
        }
        assert_eq!(out.len(), want_len, "out_len is wrong");
        assert_eq!(
            out[..target.start],
            params_bytes[..target.start],
            "bytes before changed"
        );
        assert_eq!(
            out[target.start + with.len()..],
            params_bytes[target.end..],
            "bytes after changed"
        );
        let sent: Value = serde_json::from_slice(&out).expect("the upstream params are JSON");
        assert_eq!(
            sent[key],
            Value::String(name.clone()),
            "the upstream gets another name"
        );
        assert_eq!(
            sent["arguments"][key],
            Value::String(shown.clone()),
            "arguments changed"
        );
    }
});
