//! Fuzzes the streaming list-item rewriter (both modes) and the list cache's merge against
//! serde_json. Oracles: the rewriter's answer is the same fed whole, cut in two at a point the
//! input chooses, and in small pieces; it accepts only JSON objects and refuses as not JSON
//! only what serde_json refuses; in Items mode the items it writes are exactly the input's
//! items that are objects with one string key the allow-list admits, in order, each as
//! serde_json reads it with the route prefix put in front of the key, and the counts and the
//! cursor agree; in Document mode the output reads as the input with every object item's
//! string key prefixed, byte for byte the input when the prefix is empty; and the cache's
//! merge of those items from several routes, as stored and then served to a session that
//! may not see some routes, reads as one list holding exactly the visible routes' items.
//! The cache's reader must also take arbitrary stored bytes without panicking.
//!
//! Input: one byte picks the list kind, the prefix and the allow-list, one the piece size
//! (low four bits) and the routes a session may not see (high four bits), two the cut
//! point; the rest is the `result` value.
#![no_main]

use std::fmt;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use mcpyard::fuzzing::{encode_list, served_list};

/// The toolkit labels of the four routes whose fragments the cache merges.
const ROUTES: [&str; 4] = ["r0", "r1", "r2", "r3"];
use mcpyard::jsonrpc::{ItemError, ItemMode, ItemRewriter, ItemRules, ItemSink};
use mcpyard::limits::LIST_KEY_BYTES_MAX;
use mcpyard_fuzz::{Input, cut};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

const PREFIXES: [&[u8]; 4] = [b"", b"gh__", b"a+", b"route-1__"];

/// What rewriting one result produced.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    out: Vec<u8>,
    items: u64,
    dropped: u64,
    cursor: Result<Option<Vec<u8>>, ItemError>,
}

fn admit_with(modulus: u64) -> impl FnMut(&str) -> bool {
    move |key: &str| modulus == 1 || key.bytes().map(u64::from).sum::<u64>() % modulus != 0
}

fn run(rules: &ItemRules, mode: ItemMode, modulus: u64, pieces: &[Bytes]) -> Outcome {
    let mut rewriter = ItemRewriter::new(rules.clone(), mode);
    let mut sink = ItemSink::new();
    let mut admit = admit_with(modulus);
    let mut cursor = Ok(None);
    for piece in pieces {
        if let Err(e) = rewriter.feed(piece.clone(), &mut admit, &mut sink) {
            cursor = Err(e);
            break;
        }
    }
    if cursor.is_ok() {
        cursor = rewriter.finish().map(|c| c.map(|c| c.to_vec()));
    }
    if let Err(e) = cursor {
        assert_eq!(rewriter.finish(), Err(e), "error does not stick");
        assert_eq!(rewriter.held_bytes(), 0, "a failed rewriter holds bytes");
    }
    let out: Vec<u8> = sink.parts.iter().flat_map(|p| p.iter().copied()).collect();
    Outcome {
        out,
        items: sink.items,
        dropped: sink.dropped,
        cursor,
    }
}

/// A JSON object's members in order, duplicates kept, each value raw.
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

/// The items Items mode must write for `doc`, and how many it must drop; `None` when
/// serde_json cannot read the document in full (it then has nothing to say).
fn expected_items(
    doc: &str,
    rules: &ItemRules,
    modulus: u64,
) -> Option<(Vec<Value>, u64, Option<Vec<u8>>)> {
    let Members(members) = serde_json::from_str(doc).ok()?;
    // The whole document must be readable as values, lone surrogates and all.
    serde_json::from_str::<Value>(doc).ok()?;
    let array = std::str::from_utf8(rules.array).ok()?;
    let key = std::str::from_utf8(rules.key).ok()?;
    let prefix = std::str::from_utf8(&rules.prefix).ok()?;
    let cursor = members
        .iter()
        .find(|(name, _)| name == "nextCursor")
        .map(|(_, raw)| raw.get().as_bytes().to_vec())
        .filter(|raw| raw != b"null");
    let Some((_, items)) = members.iter().find(|(name, _)| name == array) else {
        return Some((Vec::new(), 0, cursor));
    };
    let items: Vec<&RawValue> = serde_json::from_str(items.get()).ok()?;
    let mut admit = admit_with(modulus);
    let (mut kept, mut dropped) = (Vec::new(), 0);
    for item in items {
        let keep = serde_json::from_str::<Members<'_>>(item.get())
            .ok()
            .and_then(|Members(fields)| {
                let mut named = fields.iter().filter(|(name, _)| name == key);
                let (_, value) = named.next()?;
                if named.next().is_some() {
                    return None;
                }
                let name: String = serde_json::from_str(value.get()).ok()?;
                (name.len() <= LIST_KEY_BYTES_MAX && admit(&name)).then_some(name)
            });
        match keep {
            Some(name) => {
                let mut value: Value = serde_json::from_str(item.get()).ok()?;
                let object = value.as_object_mut()?;
                object.insert(key.to_owned(), Value::String(format!("{prefix}{name}")));
                kept.push(value);
            }
            None => dropped += 1,
        }
    }
    Some((kept, dropped, cursor))
}

/// `doc` as Document mode must write it: every object item's string key prefixed.
fn expected_document(doc: &str, rules: &ItemRules) -> Option<Value> {
    let array = std::str::from_utf8(rules.array).ok()?;
    let key = std::str::from_utf8(rules.key).ok()?;
    let prefix = std::str::from_utf8(&rules.prefix).ok()?;
    let mut value: Value = serde_json::from_str(doc).ok()?;
    let items = value.get_mut(array).and_then(Value::as_array_mut);
    for item in items.into_iter().flatten() {
        if let Some(Value::String(name)) = item.get_mut(key) {
            name.insert_str(0, prefix);
        }
    }
    Some(value)
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let control = input.byte();
    let kinds = [
        ItemRules::tools as fn(Bytes) -> ItemRules,
        ItemRules::prompts,
        ItemRules::resources,
        ItemRules::resource_templates,
    ];
    let kind = kinds[usize::from(control & 3)];
    let prefix = PREFIXES[usize::from((control >> 2) & 3)];
    let modulus = u64::from((control >> 4) & 3) + 1;
    let pieces_byte = input.byte();
    let piece = usize::from(pieces_byte % 16).max(1);
    let hidden = u64::from(pieces_byte >> 4);
    let selector = input.u16();
    let doc = Bytes::copy_from_slice(input.rest());
    let rules = kind(Bytes::from_static(prefix));
    let at = cut(selector, doc.len());
    let splits = [
        vec![doc.clone()],
        vec![doc.slice(..at), doc.slice(at..)],
        (0..doc.len())
            .step_by(piece)
            .map(|from| doc.slice(from..(from + piece).min(doc.len())))
            .collect::<Vec<_>>(),
    ];

    let syntax = serde_json::from_slice::<IgnoredAny>(&doc).is_ok();
    let object = doc.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let json_object = syntax && object;
    let mut results = Vec::new();
    for mode in [ItemMode::Items, ItemMode::Document] {
        let whole = run(&rules, mode, modulus, &splits[0]);
        for pieces in &splits[1..] {
            let other = run(&rules, mode, modulus, pieces);
            if mode == ItemMode::Document && whole.cursor.is_err() {
                // After an error Document mode's output is not a document; only the
                // error itself must agree.
                assert_eq!(
                    whole.cursor, other.cursor,
                    "{mode:?}: errors differ by split"
                );
            } else {
                assert_eq!(whole, other, "{mode:?}: whole and pieces differ");
            }
        }
        match &whole.cursor {
            Ok(_) => assert!(json_object, "{mode:?}: accepted what serde_json refuses"),
            Err(ItemError::NotJson(_) | ItemError::Truncated | ItemError::Trailing) => {
                assert!(!json_object, "{mode:?}: refused what serde_json reads")
            }
            Err(_) => {}
        }
        results.push(whole);
    }
    let [items, document] = &results[..] else {
        return;
    };
    // Whatever the store holds, reading it must not panic.
    let _ = served_list(&doc, &ROUTES, hidden);
    let Ok(text) = std::str::from_utf8(&doc) else {
        return;
    };

    if let Ok(cursor) = &items.cursor
        && let Some((want, dropped, want_cursor)) = expected_items(text, &rules, modulus)
    {
        let listed = format!("[{}]", String::from_utf8_lossy(&items.out));
        let got: Vec<Value> = serde_json::from_str(&listed).expect("the items are JSON");
        assert_eq!(
            got, want,
            "Items mode wrote other items than serde_json reads"
        );
        assert_eq!(items.items, want.len() as u64, "item count");
        assert_eq!(items.dropped, dropped, "dropped count");
        assert_eq!(cursor, &want_cursor, "cursor");

        // The cache merges several routes' items, empty and missing ones among them, and
        // serves a session only the routes it may see.
        let array = std::str::from_utf8(rules.array).expect("ASCII");
        let fragment = Bytes::from(items.out.clone());
        let fragments = [
            Some(fragment.clone()),
            None,
            Some(Bytes::new()),
            Some(fragment),
        ];
        let stored = encode_list(array, &ROUTES, &fragments);
        for hide in [0, hidden] {
            let served =
                served_list(&stored, &ROUTES, hide).expect("the cache reads what it stored");
            let served: Value = serde_json::from_slice(&served).expect("the list is JSON");
            let visible: Vec<Value> = [0, 3]
                .into_iter()
                .filter(|route| hide & (1 << route) == 0)
                .flat_map(|_| want.iter().cloned())
                .collect();
            assert_eq!(
                served,
                serde_json::json!({ array: visible }),
                "hidden {hide:#b}"
            );
        }
    }

    if document.cursor.is_ok() {
        assert_eq!(document.cursor, Ok(None), "Document mode has no cursor");
        if rules.prefix.is_empty() {
            assert_eq!(
                document.out, doc,
                "Document mode without a prefix changed bytes"
            );
        }
        if let Some(want) = expected_document(text, &rules) {
            let got: Value =
                serde_json::from_slice(&document.out).expect("Document mode output is JSON");
            assert_eq!(got, want, "Document mode wrote another document");
        }
    }
});
