//! Tables of lists, `resources/read` documents and malformed results, each fed whole, split
//! in two at every byte boundary and one byte per piece; the bounds (key, item, cursor,
//! depth) at their edges; a 100,000-item list fed piece by piece in bounded memory; a seeded
//! merge of random lists checked against `serde_json`, and a seeded differential on mutated
//! lists. The seed comes from `MCPYARD_SEED` when set and is printed in every assertion
//! message.

use super::*;
use crate::jsonrpc::scan::tests::{
    all_splits, bytewise, mutate, random_pieces, random_string, random_value, split_at, whole, ws,
};
use crate::limits::PIECE_JOIN_BYTES;
use crate::testing::Rng;
use serde_json::Value;

/// What rewriting one result produced.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// The sink's parts, joined.
    out: String,
    items: u64,
    dropped: u64,
    /// The raw cursor lexeme `finish` returned.
    cursor: Option<String>,
}

/// The rules of the list tables: `tools[i].name` with the prefix `gh__`.
fn tools() -> ItemRules {
    ItemRules::tools(Bytes::from_static(b"gh__"))
}

/// The rules of the document tables: `contents[i].uri` with the prefix `gh+`.
fn contents() -> ItemRules {
    ItemRules::contents(Bytes::from_static(b"gh+"))
}

/// The allow-list of the tables: everything but `denied`.
fn admit_most(key: &str) -> bool {
    key != "denied"
}

fn joined(parts: &[Bytes]) -> String {
    let bytes: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    String::from_utf8(bytes).expect("test documents are UTF-8")
}

/// Address ranges of the pieces fed so far, adjacent pieces merged into one range (the
/// tables cut one buffer, so there is usually one range however many pieces there are).
#[derive(Default)]
struct Spans(Vec<(usize, usize)>);

impl Spans {
    fn add(&mut self, piece: &Bytes) {
        let base = piece.as_ptr() as usize;
        match self.0.last_mut() {
            Some(last) if last.1 == base => last.1 = base + piece.len(),
            _ => self.0.push((base, base + piece.len())),
        }
    }

    /// True when `part` points into the pieces: it was sliced, not copied.
    fn holds(&self, part: &Bytes) -> bool {
        let start = part.as_ptr() as usize;
        let end = start + part.len();
        self.0.iter().any(|&(from, to)| from <= start && end <= to)
    }
}

/// Feeds `pieces` to `rewriter`, checking the rewriter's own rules after each: every new part
/// is non-empty and is `,`, the prefix itself, a slice of a piece fed so far, or, when some
/// pieces fed are small, small parts of an item joined (`stream::pieces`: shorter than two
/// of the smallest kept whole); and what is held stays within one item.
fn feed_all(
    rewriter: &mut ItemRewriter,
    rules: &ItemRules,
    pieces: &[Bytes],
    admit: &mut dyn FnMut(&str) -> bool,
    sink: &mut ItemSink,
) -> Result<(), ItemError> {
    let mut spans = Spans::default();
    let small_pieces = pieces.iter().any(|p| p.len() < PIECE_JOIN_BYTES);
    for piece in pieces {
        let before = sink.parts.len();
        let fed = rewriter.feed(piece.clone(), admit, sink);
        spans.add(piece);
        for part in sink.parts.get(before..).unwrap_or_default() {
            assert!(!part.is_empty(), "empty part");
            let prefix = part.as_ptr() == rules.prefix.as_ptr() && part.len() == rules.prefix.len();
            let zero_copy = &part[..] == b"," || prefix || spans.holds(part);
            let joined = small_pieces && part.len() < 2 * PIECE_JOIN_BYTES;
            assert!(zero_copy || joined, "part {part:?} was copied");
        }
        let held_max = LIST_ITEM_BYTES_MAX + LIST_KEY_BYTES_MAX + LIST_CURSOR_BYTES_MAX;
        assert!(rewriter.held_bytes() <= held_max);
        fed?;
    }
    Ok(())
}

/// Rewrites `pieces` with a fresh rewriter into a fresh sink, then finishes, and checks that
/// `finish` is idempotent and a done rewriter still takes whitespace.
fn run(
    rules: &ItemRules,
    mode: ItemMode,
    pieces: &[Bytes],
    admit: &mut dyn FnMut(&str) -> bool,
) -> Result<Outcome, ItemError> {
    let mut rewriter = ItemRewriter::new(rules.clone(), mode);
    let mut sink = ItemSink::new();
    feed_all(&mut rewriter, rules, pieces, admit, &mut sink)?;
    let cursor = rewriter.finish()?;
    assert!(rewriter.is_done());
    assert_eq!(rewriter.held_bytes(), 0);
    assert_eq!(rewriter.finish(), Ok(cursor.clone()));
    let before = sink.parts.len();
    let space = Bytes::from_static(b" \n");
    assert_eq!(rewriter.feed(space, admit, &mut sink), Ok(()));
    if mode == ItemMode::Items {
        assert_eq!(sink.parts.len(), before);
    } else {
        sink.parts.truncate(before);
    }
    if mode == ItemMode::Document {
        assert_eq!(cursor, None);
        assert_eq!((sink.items, sink.dropped), (0, 0));
    }
    Ok(Outcome {
        out: joined(&sink.parts),
        items: sink.items,
        dropped: sink.dropped,
        cursor: cursor.map(|c| String::from_utf8_lossy(&c).into_owned()),
    })
}

fn listed(out: &str, items: u64, dropped: u64, cursor: Option<&str>) -> Outcome {
    Outcome {
        out: out.to_owned(),
        items,
        dropped,
        cursor: cursor.map(str::to_owned),
    }
}

/// (result, merged output, items, dropped, raw cursor) with [`tools`] and [`admit_most`].
type Listed = (&'static str, &'static str, u64, u64, Option<&'static str>);

const LISTS: &[Listed] = &[
    (
        r#"{"tools":[{"name":"search","inputSchema":{"type":"object","properties":{"name":{"type":"string","name":"q"}}}}],"nextCursor":"abc"}"#,
        r#"{"name":"gh__search","inputSchema":{"type":"object","properties":{"name":{"type":"string","name":"q"}}}}"#,
        1,
        0,
        Some(r#""abc""#),
    ),
    (r#"{"tools":[]}"#, "", 0, 0, None),
    (r#"{}"#, "", 0, 0, None),
    (" \n{ } \r\n", "", 0, 0, None),
    (r#"{"_meta":{"x":1},"nextCursor":null}"#, "", 0, 0, None),
    (
        r#"{"_meta":{"tools":[{"name":"x"}]},"tools":[{"name":"a"},{"name":"b"}],"other":[{"name":"c"}]}"#,
        r#"{"name":"gh__a"},{"name":"gh__b"}"#,
        2,
        0,
        None,
    ),
    (
        r#"{"tools":[{"name":"se\u0061rch"}]}"#,
        r#"{"name":"gh__se\u0061rch"}"#,
        1,
        0,
        None,
    ),
    (
        r#"{"tools":[{"\u006eame":"a"},{"nam\u0065":"b"}]}"#,
        r#"{"\u006eame":"gh__a"},{"nam\u0065":"gh__b"}"#,
        2,
        0,
        None,
    ),
    (
        r#"{"t\u006fols":[{"name":"a"}]}"#,
        r#"{"name":"gh__a"}"#,
        1,
        0,
        None,
    ),
    (
        r#"{"tools":[{"name":"denied","x":1},{"name":"ok"},{"name":"deni\u0065d"}]}"#,
        r#"{"name":"gh__ok"}"#,
        1,
        2,
        None,
    ),
    (
        r#"{"tools":[1,"s",null,[{"name":"x"}],{"name":"ok"},true,-2.5e3,{}]}"#,
        r#"{"name":"gh__ok"}"#,
        1,
        7,
        None,
    ),
    (
        r#"{"tools":[{"title":"x"},{"name":"ok"},{"Name":"y","names":"z","nam":"w"}]}"#,
        r#"{"name":"gh__ok"}"#,
        1,
        2,
        None,
    ),
    (
        r#"{"tools":[{"name":"a","name":"b"},{"name":"ok"},{"name":"a","n\u0061me":1}]}"#,
        r#"{"name":"gh__ok"}"#,
        1,
        2,
        None,
    ),
    (
        r#"{"tools":[{"name":1},{"name":null},{"name":{"x":"y"}},{"name":["a"]},{"name":true}]}"#,
        "",
        0,
        5,
        None,
    ),
    (
        " { \"tools\" : [ { \"name\" : \"a\" , \"d\" : [ 1 , 2 ] } ,\n{\"name\":\"b\"} ] , \"nextCursor\" : \"c\" } ",
        r#"{ "name" : "gh__a" , "d" : [ 1 , 2 ] },{"name":"gh__b"}"#,
        2,
        0,
        Some(r#""c""#),
    ),
    (
        r#"{"nextCursor":"a\"b\u0041\\","tools":[{"name":"x"}]}"#,
        r#"{"name":"gh__x"}"#,
        1,
        0,
        Some(r#""a\"b\u0041\\""#),
    ),
    (
        r#"{"tools":[{"name":"\ud800"},{"name":"\udc00x"},{"name":"\ud800\u0041"},{"name":"\ud83d\ude00"}]}"#,
        r#"{"name":"gh__\ud83d\ude00"}"#,
        1,
        3,
        None,
    ),
    (
        r#"{"tools":[{"inputSchema":{"name":"deep","properties":{"name":{}}},"name":"t","annotations":{"title":"n"}}]}"#,
        r#"{"inputSchema":{"name":"deep","properties":{"name":{}}},"name":"gh__t","annotations":{"title":"n"}}"#,
        1,
        0,
        None,
    ),
    (
        r#"{"tools":[{"name":""},{"name":"a\"b"},{"name":"é 😀"}]}"#,
        r#"{"name":"gh__"},{"name":"gh__a\"b"},{"name":"gh__é 😀"}"#,
        3,
        0,
        None,
    ),
    (
        r#"{"a":[[{"name":"x"}]],"tools":[{"name":"x","n":[{"name":"y"}]}],"b":{"tools":[]}}"#,
        r#"{"name":"gh__x","n":[{"name":"y"}]}"#,
        1,
        0,
        None,
    ),
    (
        r#"{"tools":[{"a":"}]{[,:\"","name":"b","c":["]","}"]}]}"#,
        r#"{"a":"}]{[,:\"","name":"gh__b","c":["]","}"]}"#,
        1,
        0,
        None,
    ),
];

#[test]
fn lists_rewrite_the_same_at_every_split() {
    for &(doc, out, items, dropped, cursor) in LISTS {
        let want = listed(out, items, dropped, cursor);
        for pieces in all_splits(doc.as_bytes()) {
            let got = run(&tools(), ItemMode::Items, &pieces, &mut admit_most);
            assert_eq!(got.as_ref(), Ok(&want), "{doc} in {} pieces", pieces.len());
        }
    }
}

#[test]
fn list_tables_agree_with_serde_json() {
    for &(doc, out, items, ..) in LISTS {
        // IgnoredAny: one table entry holds a lone surrogate, which a Value refuses.
        let parsed: Result<serde::de::IgnoredAny, _> = serde_json::from_str(doc);
        assert!(parsed.is_ok(), "{doc}");
        let merged: Vec<Value> = serde_json::from_str(&format!("[{out}]")).expect("merged list");
        assert_eq!(merged.len() as u64, items, "{doc}");
        for item in merged {
            let name = item.get("name").and_then(Value::as_str).unwrap_or_default();
            assert!(name.starts_with("gh__"), "{doc}: {item}");
        }
    }
}

/// (result, output) with [`contents`] in Document mode.
const DOCUMENTS: &[(&str, &str)] = &[
    (
        r#"{"contents":[{"uri":"file:///a","text":"x"},{"uri":"b","blob":"AAEC"}],"_meta":{}}"#,
        r#"{"contents":[{"uri":"gh+file:///a","text":"x"},{"uri":"gh+b","blob":"AAEC"}],"_meta":{}}"#,
    ),
    (r#"{"contents":[]}"#, r#"{"contents":[]}"#),
    (" {} \n", " {} \n"),
    (
        r#"{"contents":[1,{"uri":5},{"uri":"a","uri":"b"},{"x":{"uri":"deep"}},["uri"],{"text":"t"}]}"#,
        r#"{"contents":[1,{"uri":5},{"uri":"gh+a","uri":"gh+b"},{"x":{"uri":"deep"}},["uri"],{"text":"t"}]}"#,
    ),
    (
        " {\"_meta\" : {\"contents\":[{\"uri\":\"x\"}]} , \"contents\" : [ { \"ur\\u0069\" : \"y\\u0041\" } ] , \"nextCursor\" : 5 }\r\n",
        " {\"_meta\" : {\"contents\":[{\"uri\":\"x\"}]} , \"contents\" : [ { \"ur\\u0069\" : \"gh+y\\u0041\" } ] , \"nextCursor\" : 5 }\r\n",
    ),
    (
        r#"{"other":[{"uri":"x"}],"contents":[{"mimeType":"text/plain","uri":"","text":"\"uri\""}]}"#,
        r#"{"other":[{"uri":"x"}],"contents":[{"mimeType":"text/plain","uri":"gh+","text":"\"uri\""}]}"#,
    ),
];

#[test]
fn documents_pass_through_with_uris_prefixed_at_every_split() {
    for &(doc, out) in DOCUMENTS {
        let want = listed(out, 0, 0, None);
        for pieces in all_splits(doc.as_bytes()) {
            let mut never = |key: &str| -> bool { panic!("admit called in Document mode: {key}") };
            let got = run(&contents(), ItemMode::Document, &pieces, &mut never);
            assert_eq!(got.as_ref(), Ok(&want), "{doc} in {} pieces", pieces.len());
        }
        // Without a prefix the document is passed byte for byte.
        let bare = ItemRules::contents(Bytes::new());
        let got = run(
            &bare,
            ItemMode::Document,
            &bytewise(doc.as_bytes()),
            &mut admit_most,
        );
        assert_eq!(got.map(|o| o.out), Ok(doc.to_owned()));
    }
}

#[test]
fn document_mode_holds_nothing_back() {
    let doc = Bytes::from_static(
        br#"{"contents":[{"uri":"file:///a","text":"x"},{"uri":"b","blob":"..."}],"_meta":{}}"#,
    );
    let mut rewriter = ItemRewriter::new(contents(), ItemMode::Document);
    let mut sink = ItemSink::new();
    // Cut inside the first uri: everything up to the cut is out at once.
    let cut = 25;
    let first = rewriter.feed(doc.slice(..cut), &mut admit_most, &mut sink);
    assert_eq!(first, Ok(()));
    assert_eq!(joined(&sink.parts), r#"{"contents":[{"uri":"gh+file"#);
    assert_eq!(rewriter.held_bytes(), 0);
    let rest = rewriter.feed(doc.slice(cut..), &mut admit_most, &mut sink);
    assert_eq!(rest, Ok(()));
    assert_eq!(rewriter.finish(), Ok(None));
    assert_eq!(
        joined(&sink.parts),
        r#"{"contents":[{"uri":"gh+file:///a","text":"x"},{"uri":"gh+b","blob":"..."}],"_meta":{}}"#
    );
    // Slices of the input with the prefix between them: head, prefix, middle, prefix, tail.
    assert_eq!(sink.parts.len(), 6);
}

/// Results both modes refuse the same way (with [`tools`] in Items mode, and with the same
/// array and key in Document mode).
const MALFORMED: &[(&str, ItemError)] = &[
    ("", ItemError::Truncated),
    ("  \n", ItemError::Truncated),
    ("[]", ItemError::NotJson("the document must be an object")),
    (
        r#""x""#,
        ItemError::NotJson("the document must be an object"),
    ),
    (r#"{"tools":{}}"#, ItemError::NotAnArray),
    (r#"{"tools":null}"#, ItemError::NotAnArray),
    (r#"{"tools":"[]"}"#, ItemError::NotAnArray),
    (r#"{"tools":[],"tools":[]}"#, ItemError::Duplicate("tools")),
    (
        r#"{"tools":[],"tool\u0073":[1]}"#,
        ItemError::Duplicate("tools"),
    ),
    (r#"{"tools":[{"name":"a"}"#, ItemError::Truncated),
    (r#"{"tools":[{"name":"a"#, ItemError::Truncated),
    (r#"{"tools":[{"name":"a"}]"#, ItemError::Truncated),
    (r#"{"tools":[{"name":"a"}]}x"#, ItemError::Trailing),
    (r#"{"tools":[]}{}"#, ItemError::Trailing),
    (
        r#"{"tools":[{"name":"a",}]}"#,
        ItemError::NotJson("expected a member name"),
    ),
    (
        r#"{"tools":[{"name":"a"},]}"#,
        ItemError::NotJson("expected a value"),
    ),
    (
        r#"{"tools":[{"name":"a"}}"#,
        ItemError::NotJson("expected ',' or a closing bracket"),
    ),
    (
        r#"{"tools":[{"name":"a\x"}]}"#,
        ItemError::NotJson("invalid escape in a string"),
    ),
    (
        r#"{"tools":[{"name":"\u12g4"}]}"#,
        ItemError::NotJson("invalid \\u escape in a string"),
    ),
    (
        r#"{"tools":[{"n\qame":"a"}]}"#,
        ItemError::NotJson("invalid escape in a string"),
    ),
    (
        "{\"tools\":[{\"name\":\"a\nb\"}]}",
        ItemError::NotJson("raw control character in a string"),
    ),
    (
        r#"{"tools":[{"name":nul}]}"#,
        ItemError::NotJson("expected true, false or null"),
    ),
    (
        r#"{"tools":[{"name":01}]}"#,
        ItemError::NotJson("expected ',' or a closing bracket"),
    ),
    (
        r#"{"tools":[{"name":-}]}"#,
        ItemError::NotJson("malformed number"),
    ),
    (
        r#"{"tools":[{"name" "a"}]}"#,
        ItemError::NotJson("expected ':'"),
    ),
    (
        r#"{"tools":[{name:"a"}]}"#,
        ItemError::NotJson("expected a member name"),
    ),
    (
        r#"{"tools":[1 2]}"#,
        ItemError::NotJson("expected ',' or a closing bracket"),
    ),
    (r#"{"x":[1,]}"#, ItemError::NotJson("expected a value")),
    (
        r#"{"tools":[],}"#,
        ItemError::NotJson("expected a member name"),
    ),
];

/// Results only Items mode refuses: Document mode passes `nextCursor` as any other member.
const MALFORMED_LISTS: &[(&str, ItemError)] = &[
    (
        r#"{"nextCursor":"a","nextCursor":"b"}"#,
        ItemError::Duplicate("nextCursor"),
    ),
    (
        r#"{"nextCursor":null,"nextCurs\u006fr":null}"#,
        ItemError::Duplicate("nextCursor"),
    ),
    (r#"{"nextCursor":1}"#, ItemError::BadCursor),
    (r#"{"nextCursor":{}}"#, ItemError::BadCursor),
    (r#"{"nextCursor":["a"]}"#, ItemError::BadCursor),
    (r#"{"nextCursor":true}"#, ItemError::BadCursor),
    (r#"{"nextCursor":"abc"#, ItemError::Truncated),
    (
        r#"{"nextCursor":nul}"#,
        ItemError::NotJson("expected true, false or null"),
    ),
];

#[test]
fn malformed_results_fail_at_every_split() {
    let in_both = MALFORMED.iter().map(|&(doc, e)| (doc, e, true));
    let in_lists = MALFORMED_LISTS.iter().map(|&(doc, e)| (doc, e, false));
    let document_rules = ItemRules {
        array: b"tools",
        key: b"name",
        prefix: Bytes::from_static(b"gh__"),
    };
    for (doc, want, document_too) in in_both.chain(in_lists) {
        for pieces in all_splits(doc.as_bytes()) {
            let got = run(&tools(), ItemMode::Items, &pieces, &mut admit_most);
            assert_eq!(got, Err(want), "{doc:?} in {} pieces", pieces.len());
            let got = run(
                &document_rules,
                ItemMode::Document,
                &pieces,
                &mut admit_most,
            );
            if document_too {
                assert_eq!(got, Err(want), "{doc:?} in {} pieces", pieces.len());
            } else if !matches!(want, ItemError::NotJson(_) | ItemError::Truncated) {
                assert!(got.is_ok(), "{doc:?}: {got:?} in Document mode");
            }
        }
        let parsed: Result<Value, _> = serde_json::from_str(doc);
        let semantic = matches!(
            want,
            ItemError::Duplicate(_) | ItemError::NotAnArray | ItemError::BadCursor
        );
        assert_eq!(parsed.is_ok_and(|v| v.is_object()), semantic, "{doc:?}");
    }
}

#[test]
fn admit_gets_the_decoded_key_and_the_prefix_goes_before_the_raw_bytes() {
    let doc = r#"{"tools":[{"name":"se\u0061rch"},{"name":"caf\u00e9 \ud83d\ude00 \"q\" \\ \/ é"},{"name":"plain"}]}"#;
    let want = listed(
        r#"{"name":"gh__se\u0061rch"},{"name":"gh__caf\u00e9 \ud83d\ude00 \"q\" \\ \/ é"}"#,
        2,
        1,
        None,
    );
    for pieces in all_splits(doc.as_bytes()) {
        let mut seen = Vec::new();
        let got = run(&tools(), ItemMode::Items, &pieces, &mut |key: &str| {
            seen.push(key.to_owned());
            key != "plain"
        });
        assert_eq!(got.as_ref(), Ok(&want), "{} pieces", pieces.len());
        assert_eq!(seen, ["search", "café 😀 \"q\" \\ / é", "plain"]);
    }
}

#[test]
fn refused_item_is_let_go_as_soon_as_its_key_closes() {
    let head = Bytes::from_static(br#"{"tools":[{"name":"denied","description":"a long"#);
    let tail = Bytes::from_static(br#" text"},{"name":"ok"}]}"#);
    for (name, admitted) in [("denied", false), ("ok", true)] {
        let mut rewriter = ItemRewriter::new(tools(), ItemMode::Items);
        let mut sink = ItemSink::new();
        let mut calls = 0;
        let mut admit = |key: &str| {
            calls += 1;
            key != name
        };
        assert_eq!(rewriter.feed(head.clone(), &mut admit, &mut sink), Ok(()));
        // Once asked, a refused item holds nothing and counts as dropped at once.
        assert_eq!(rewriter.held_bytes() == 0, !admitted);
        assert_eq!(sink.dropped, u64::from(!admitted));
        assert_eq!(rewriter.feed(tail.clone(), &mut admit, &mut sink), Ok(()));
        assert_eq!(rewriter.finish(), Ok(None));
        assert_eq!(calls, 2);
        assert_eq!((sink.items, sink.dropped), (1, 1));
    }
}

/// `{"tools":[{"name":"<key>"},{"name":"after"}]}`
fn list_with_key(key: &str) -> String {
    format!(r#"{{"tools":[{{"name":"{key}"}},{{"name":"after"}}]}}"#)
}

#[test]
fn keys_past_the_limit_drop_their_item() {
    let fits = "k".repeat(LIST_KEY_BYTES_MAX);
    let long = "k".repeat(LIST_KEY_BYTES_MAX + 1);
    // Decoded bytes count, not raw ones: six raw bytes per `\u0061`, one decoded.
    let escaped = "\\u0061".repeat(LIST_KEY_BYTES_MAX);
    let escaped_long = format!("{escaped}\\u0061");
    // A two-byte character that does not fit whole is refused, not cut.
    let multibyte = format!("{}é", "k".repeat(LIST_KEY_BYTES_MAX - 1));
    for (key, kept) in [
        (&fits, true),
        (&long, false),
        (&escaped, true),
        (&escaped_long, false),
        (&multibyte, false),
    ] {
        let doc = list_with_key(key);
        for pieces in [
            whole(doc.as_bytes()),
            split_at(doc.as_bytes(), 5000),
            bytewise(doc.as_bytes()),
        ] {
            let got = run(&tools(), ItemMode::Items, &pieces, &mut |_: &str| true);
            let got = got.map(|o| (o.items, o.dropped));
            let want = if kept { (2, 0) } else { (1, 1) };
            assert_eq!(got, Ok(want), "key of {} bytes", key.len());
        }
    }
}

/// An item of `len` input bytes: `{"name":"big","d":"xxx…"}`.
fn item_of(len: usize) -> String {
    let frame = r#"{"name":"big","d":""}"#.len();
    format!(r#"{{"name":"big","d":"{}"}}"#, "x".repeat(len - frame))
}

#[test]
fn items_past_the_limit_are_dropped_and_later_items_come_through() {
    // The limit counts the item as it goes out, prefix included.
    let prefix = tools().prefix.len();
    let fits = item_of(LIST_ITEM_BYTES_MAX - prefix);
    let over = item_of(LIST_ITEM_BYTES_MAX - prefix + 1);
    let doc = format!(r#"{{"tools":[{fits},{over},{{"name":"after"}}],"nextCursor":"n"}}"#);
    let all = Bytes::from(doc.clone().into_bytes());
    for piece_bytes in [all.len(), 100_000, 4096, 1000] {
        let pieces: Vec<Bytes> = (0..all.len())
            .step_by(piece_bytes)
            .map(|at| all.slice(at..(at + piece_bytes).min(all.len())))
            .collect();
        let mut rewriter = ItemRewriter::new(tools(), ItemMode::Items);
        let mut sink = ItemSink::new();
        let mut item_bytes_out = Vec::new();
        for piece in pieces {
            let fed = rewriter.feed(piece, &mut |_: &str| true, &mut sink);
            assert_eq!(fed, Ok(()));
            assert!(rewriter.held_bytes() <= LIST_ITEM_BYTES_MAX);
            item_bytes_out.extend(sink.parts.drain(..).map(|p| p.len()));
        }
        assert_eq!(rewriter.finish(), Ok(Some(Bytes::from_static(b"\"n\""))));
        assert_eq!(
            (sink.items, sink.dropped),
            (2, 1),
            "pieces of {piece_bytes}"
        );
        let total: usize = item_bytes_out.iter().sum();
        let after = r#"{"name":"gh__after"}"#.len();
        assert_eq!(total, LIST_ITEM_BYTES_MAX + 1 + after);
    }
}

/// An item that outgrows the limit while a piece ends inside one of its member names (the
/// name runs on past the limit by more than a piece) is
/// dropped there; the name's closing quote then comes inside a dropped item, and the items
/// after it come through (before, that quote aborted the process on an assert).
#[test]
fn an_item_outgrowing_the_limit_inside_a_member_name_is_dropped() {
    let name = "a".repeat(LIST_ITEM_BYTES_MAX + 150_000);
    let doc = format!(r#"{{"tools":[{{"{name}":0,"name":"x"}},{{"name":"after"}}]}}"#);
    let all = Bytes::from(doc.into_bytes());
    for piece_bytes in [32 * 1024, 32 * 1024 + 7, 100_000, 4093] {
        let mut rewriter = ItemRewriter::new(tools(), ItemMode::Items);
        let mut sink = ItemSink::new();
        for at in (0..all.len()).step_by(piece_bytes) {
            let piece = all.slice(at..(at + piece_bytes).min(all.len()));
            assert_eq!(rewriter.feed(piece, &mut |_: &str| true, &mut sink), Ok(()));
            assert!(rewriter.held_bytes() <= LIST_ITEM_BYTES_MAX);
        }
        assert_eq!(rewriter.finish(), Ok(None), "pieces of {piece_bytes}");
        assert_eq!(
            (sink.items, sink.dropped),
            (1, 1),
            "pieces of {piece_bytes}"
        );
        let out: Vec<u8> = sink.parts.iter().flat_map(|p| p.to_vec()).collect();
        assert_eq!(out, br#"{"name":"gh__after"}"#, "pieces of {piece_bytes}");
    }
}

#[test]
fn a_hundred_thousand_items_stream_in_bounded_memory() {
    const ITEMS: usize = 100_000;
    let mut doc = String::from(r#"{"_meta":{"page":1},"tools":["#);
    let mut want = String::new();
    let mut kept = 0u64;
    for i in 0..ITEMS {
        if i > 0 {
            doc.push(',');
        }
        let item = format!(
            r#"{{"name":"tool{i}","description":"tool number {i}","inputSchema":{{"type":"object","properties":{{"name":{{"type":"string"}}}}}}}}"#
        );
        if i % 10 != 7 {
            if kept > 0 {
                want.push(',');
            }
            want.push_str(&item.replacen("\"tool", "\"gh__tool", 1));
            kept += 1;
        }
        doc.push_str(&item);
    }
    doc.push_str(r#"],"nextCursor":"page-2"}"#);
    let longest = r#"{"name":"tool99999","description":"tool number 99999","inputSchema":{"type":"object","properties":{"name":{"type":"string"}}}}"#.len();
    let all = Bytes::from(doc.into_bytes());
    let mut rng = Rng(0x1735);
    let mut sink = ItemSink::new();
    let mut rewriter = ItemRewriter::new(tools(), ItemMode::Items);
    let mut out = Vec::with_capacity(want.len());
    let mut at = 0;
    let mut admit = |key: &str| !key.ends_with('7');
    while at < all.len() {
        // Pieces from one byte to a few socket reads.
        let len = [1, 7, 100, 1500, 32 * 1024][rng.index(5)];
        let piece = all.slice(at..(at + len).min(all.len()));
        at += piece.len();
        assert_eq!(rewriter.feed(piece, &mut admit, &mut sink), Ok(()));
        // Never more than the item being read (prefix included) and its key.
        assert!(rewriter.held_bytes() <= longest + 4 + "tool99999".len());
        out.extend(sink.parts.drain(..).flat_map(|p| p.to_vec()));
    }
    assert_eq!(
        rewriter.finish(),
        Ok(Some(Bytes::from_static(b"\"page-2\"")))
    );
    assert_eq!(sink.items, kept);
    assert_eq!(sink.dropped, ITEMS as u64 - kept);
    assert!(out == want.as_bytes(), "merged list differs");
}

#[test]
fn cursor_is_bounded() {
    let cursor = |len: usize| format!(r#"{{"tools":[],"nextCursor":"{}"}}"#, "c".repeat(len - 2));
    let fits = cursor(LIST_CURSOR_BYTES_MAX);
    let raw = format!("\"{}\"", "c".repeat(LIST_CURSOR_BYTES_MAX - 2));
    let long = cursor(LIST_CURSOR_BYTES_MAX + 1);
    for cut in [0, 30, 1000, fits.len()] {
        let got = run(
            &tools(),
            ItemMode::Items,
            &split_at(fits.as_bytes(), cut),
            &mut admit_most,
        );
        assert_eq!(got.map(|o| o.cursor), Ok(Some(raw.clone())), "cut at {cut}");
        let got = run(
            &tools(),
            ItemMode::Items,
            &split_at(long.as_bytes(), cut),
            &mut admit_most,
        );
        assert_eq!(got, Err(ItemError::CursorTooLarge), "cut at {cut}");
    }
    let got = run(
        &tools(),
        ItemMode::Items,
        &bytewise(long.as_bytes()),
        &mut admit_most,
    );
    assert_eq!(got, Err(ItemError::CursorTooLarge));
}

#[test]
fn one_sink_merges_routes_and_pages() {
    let pages: [(&str, &[u8]); 5] = [
        (r#"{"tools":[{"name":"denied"}],"nextCursor":"2"}"#, b"a__"),
        (r#"{"tools":[]}"#, b"a__"),
        (
            r#"{"tools":[{"name":"x"},{"name":"y"}],"nextCursor":"3"}"#,
            b"a__",
        ),
        (r#"{"tools":[{"name":"x"},7,{"name":"z"}]}"#, b"b__"),
        (r#"{"tools":[{"name":"w"}]}"#, b""),
    ];
    let mut sink = ItemSink::new();
    let mut cursors = Vec::new();
    for (doc, prefix) in pages {
        let rules = ItemRules::tools(Bytes::from_static(prefix));
        let mut rewriter = ItemRewriter::new(rules.clone(), ItemMode::Items);
        let pieces = split_at(doc.as_bytes(), doc.len() / 2);
        let fed = feed_all(&mut rewriter, &rules, &pieces, &mut admit_most, &mut sink);
        assert_eq!(fed, Ok(()));
        cursors.push(rewriter.finish());
    }
    assert_eq!(
        joined(&sink.parts),
        r#"{"name":"a__x"},{"name":"a__y"},{"name":"b__x"},{"name":"b__z"},{"name":"w"}"#
    );
    assert_eq!((sink.items, sink.dropped), (5, 2));
    let two = Bytes::from_static(b"\"2\"");
    let three = Bytes::from_static(b"\"3\"");
    assert_eq!(
        cursors,
        [Ok(Some(two)), Ok(None), Ok(Some(three)), Ok(None), Ok(None)]
    );
}

#[test]
fn error_stays_after_failure_and_lets_go_of_the_item() {
    let mut rewriter = ItemRewriter::new(tools(), ItemMode::Items);
    let mut sink = ItemSink::new();
    let head = Bytes::from_static(br#"{"tools":[{"name":"a"},{"name":"b","x":"#);
    assert_eq!(rewriter.feed(head, &mut admit_most, &mut sink), Ok(()));
    assert!(rewriter.held_bytes() > 0);
    let bad = rewriter.feed(Bytes::from_static(b"?}]}"), &mut admit_most, &mut sink);
    assert_eq!(bad, Err(ItemError::NotJson("expected a value")));
    assert_eq!(rewriter.held_bytes(), 0);
    let again = rewriter.feed(Bytes::from_static(b"1}]}"), &mut admit_most, &mut sink);
    assert_eq!(again, bad);
    assert_eq!(
        rewriter.finish(),
        Err(ItemError::NotJson("expected a value"))
    );
    // The item completed before the error went out; the broken one never did.
    assert_eq!(joined(&sink.parts), r#"{"name":"gh__a"}"#);
}

#[test]
fn a_result_cut_anywhere_leaves_only_whole_items() {
    let items = [
        r#"{"name":"a","s":{"name":"n"}}"#,
        r#"{"name":"b"}"#,
        r#"{"x":1,"name":"c"}"#,
    ];
    let doc = format!(r#"{{"tools":[{}],"nextCursor":"z"}}"#, items.join(","));
    let ends: Vec<usize> = items
        .iter()
        .filter_map(|item| doc.find(item).map(|at| at + item.len()))
        .collect();
    assert_eq!(ends.len(), 3);
    let all = Bytes::from(doc.clone().into_bytes());
    for cut in 0..doc.len() {
        let mut rewriter = ItemRewriter::new(tools(), ItemMode::Items);
        let mut sink = ItemSink::new();
        let fed = rewriter.feed(all.slice(..cut), &mut admit_most, &mut sink);
        assert_eq!(fed, Ok(()));
        assert_eq!(rewriter.finish(), Err(ItemError::Truncated), "cut at {cut}");
        assert_eq!(rewriter.held_bytes(), 0);
        let closed = ends.iter().filter(|&&end| end <= cut).count();
        assert_eq!(sink.items, closed as u64, "cut at {cut}");
        let merged: Result<Vec<Value>, _> =
            serde_json::from_str(&format!("[{}]", joined(&sink.parts)));
        assert_eq!(merged.map(|m| m.len()).ok(), Some(closed), "cut at {cut}");
    }
}

#[test]
fn empty_pieces_are_harmless() {
    let doc = br#"{"tools":[{"name":"a"}],"nextCursor":"c"}"#;
    let all = Bytes::from_static(doc);
    let mut pieces = Vec::new();
    for i in 0..doc.len() {
        pieces.push(Bytes::new());
        pieces.push(all.slice(i..i + 1));
        pieces.push(all.slice(i + 1..i + 1));
    }
    let got = run(&tools(), ItemMode::Items, &pieces, &mut admit_most);
    assert_eq!(got, Ok(listed(r#"{"name":"gh__a"}"#, 1, 0, Some("\"c\""))));
}

#[test]
fn an_item_in_one_piece_goes_out_as_slices_of_it() {
    let all = Bytes::from_static(br#"{"tools":[{"name":"a","d":1},{"name":"b"}]}"#);
    let mut rewriter = ItemRewriter::new(tools(), ItemMode::Items);
    let mut sink = ItemSink::new();
    assert_eq!(
        rewriter.feed(all.clone(), &mut admit_most, &mut sink),
        Ok(())
    );
    let offsets: Vec<(usize, usize)> = sink
        .parts
        .iter()
        .map(|p| {
            (
                (p.as_ptr() as usize).wrapping_sub(all.as_ptr() as usize),
                p.len(),
            )
        })
        .collect();
    // Head to the opening quote, the prefix, the rest; then `,` and the second item.
    assert_eq!(offsets.first(), Some(&(10, 9)));
    assert_eq!(offsets.get(2), Some(&(19, 9)));
    assert_eq!(offsets.get(4), Some(&(29, 9)));
    assert_eq!(offsets.get(6), Some(&(38, 3)));
    assert_eq!(sink.parts.get(1), Some(&tools().prefix));
    assert_eq!(sink.parts.get(3).map(|p| &p[..]), Some(&b","[..]));
    assert_eq!(sink.parts.get(5), Some(&tools().prefix));
    assert_eq!(sink.parts.len(), 7);
    // Without a prefix an item is one slice.
    let mut bare = ItemRewriter::new(ItemRules::tools(Bytes::new()), ItemMode::Items);
    let mut sink = ItemSink::new();
    assert_eq!(bare.feed(all.clone(), &mut admit_most, &mut sink), Ok(()));
    assert_eq!(joined(&sink.parts), r#"{"name":"a","d":1},{"name":"b"}"#);
    assert_eq!(sink.parts.len(), 3);
}

#[test]
fn nesting_inside_items_is_capped() {
    // The result object, the array and the item take three levels.
    let nested = |n: usize| {
        format!(
            r#"{{"tools":[{{"name":"a","x":{}{}}}]}}"#,
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    let deepest = nested(SCAN_DEPTH_MAX - 3);
    for mode in [ItemMode::Items, ItemMode::Document] {
        let got = run(&tools(), mode, &whole(deepest.as_bytes()), &mut admit_most);
        assert!(got.is_ok(), "{mode:?}: {got:?}");
        let deeper = nested(SCAN_DEPTH_MAX - 2);
        let got = run(&tools(), mode, &whole(deeper.as_bytes()), &mut admit_most);
        assert_eq!(got, Err(ItemError::TooDeep));
    }
}

#[test]
fn display_names_the_problem() {
    let text = ItemError::Duplicate("tools").to_string();
    assert_eq!(text, "list result has a duplicate `tools` member");
    let text = ItemError::NotJson("expected ':'").to_string();
    assert_eq!(text, "list result is not JSON: expected ':'");
    assert_eq!(
        ItemError::CursorTooLarge.to_string(),
        "list result cursor exceeds the size limit"
    );
}

// ---- Seeded random lists ----

/// Random lists per run of each seeded test.
const ROUNDS: usize = 300;

/// Pieces of a random key, raw and decoded.
const KEY_PIECES: &[(&str, &str)] = &[
    ("a", "a"),
    ("Z", "Z"),
    ("0", "0"),
    ("_", "_"),
    (" ", " "),
    ("é", "é"),
    ("世", "世"),
    ("😀", "😀"),
    ("\\u0061", "a"),
    ("\\u00e9", "é"),
    ("\\ud83d\\ude00", "😀"),
    ("\\\"", "\""),
    ("\\\\", "\\"),
    ("\\/", "/"),
    ("\\n", "\n"),
    ("\\t", "\t"),
    ("file:///x/", "file:///x/"),
    (
        "plain text that runs past a word",
        "plain text that runs past a word",
    ),
];

/// A random key string lexeme.
fn random_key(rng: &mut Rng) -> String {
    let mut raw = String::from("\"");
    for _ in 0..rng.below(6) {
        raw.push_str(rng.pick(KEY_PIECES).0);
    }
    raw.push('"');
    raw
}

/// How a random item is made, which decides whether Items mode keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// An object with one string key: kept when admitted.
    Keyed,
    /// Not an object.
    NotObject,
    /// An object without the key.
    Keyless,
    /// An object with the key twice.
    TwoKeys,
    /// An object whose key is not a string.
    NotString,
}

/// A random value for a member of an item: sometimes an object holding a same-named key.
fn random_field_value(rng: &mut Rng, key: &str, out: &mut String) {
    if rng.chance(20) {
        let mut inner = String::new();
        random_value(rng, 2, &mut inner);
        out.push_str(&format!(
            r#"{{"{key}":"nested","properties":{{"{key}":{inner}}}}}"#
        ));
    } else {
        random_value(rng, 3, out);
    }
}

/// `key` with its first character written as a `\uXXXX` escape.
fn escape_first(key: &str) -> String {
    let mut chars = key.chars();
    let first = chars.next().map_or(0, u32::from);
    format!("\\u{first:04x}{}", chars.as_str())
}

/// A random item of `shape` for the key `key`.
fn random_item(rng: &mut Rng, key: &str, shape: Shape) -> String {
    if shape == Shape::NotObject {
        let mut out = String::new();
        match rng.below(4) {
            0 => out.push_str(rng.pick(&["null", "true", "false", "12", "-0.5e3"])),
            1 => random_string(rng, &mut out),
            2 => out.push_str(&format!(r#"[{{"{key}":"a"}}]"#)),
            _ => random_value(rng, 2, &mut out),
        }
        // random_value may write an object; those are keyless, so still not kept.
        return out;
    }
    let mut fields: Vec<String> = Vec::new();
    for _ in 0..rng.below(4) {
        let name = rng.pick(&[
            "description",
            "inputSchema",
            "title",
            "_meta",
            "Name",
            "uris",
        ]);
        let mut field = format!("\"{name}\":");
        random_field_value(rng, key, &mut field);
        fields.push(field);
    }
    let keys = match shape {
        Shape::Keyless => 0,
        Shape::TwoKeys => 2,
        _ => 1,
    };
    for _ in 0..keys {
        // The key's own name may be written with an escape.
        let name = if rng.chance(20) {
            escape_first(key)
        } else {
            key.to_owned()
        };
        let value = if shape == Shape::NotString {
            rng.pick(&["1", "null", "{}", "[\"a\"]", "true"]).to_owned()
        } else {
            random_key(rng)
        };
        let at = rng.index(fields.len() + 1);
        fields.insert(at, format!("\"{name}\":{value}"));
    }
    let mut out = String::from("{");
    for (i, field) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        ws(rng, &mut out);
        out.push_str(field);
        ws(rng, &mut out);
    }
    out.push('}');
    out
}

/// A random list result for `rules`: its text, its items, and its raw cursor lexeme.
fn random_list(rng: &mut Rng, rules: &ItemRules) -> (String, Vec<(String, Shape)>, Option<String>) {
    let array = std::str::from_utf8(rules.array).unwrap_or_default();
    let key = std::str::from_utf8(rules.key).unwrap_or_default();
    let shapes = [
        Shape::Keyed,
        Shape::NotObject,
        Shape::Keyless,
        Shape::TwoKeys,
        Shape::NotString,
    ];
    let mut items = Vec::new();
    for _ in 0..rng.below(12) {
        let shape = if rng.chance(70) {
            Shape::Keyed
        } else {
            rng.pick(&shapes)
        };
        items.push((random_item(rng, key, shape), shape));
    }
    let mut members: Vec<String> = Vec::new();
    if !items.is_empty() || rng.chance(70) {
        let mut list = format!("\"{array}\":[");
        for (i, (item, _)) in items.iter().enumerate() {
            if i > 0 {
                list.push(',');
            }
            ws(rng, &mut list);
            list.push_str(item);
            ws(rng, &mut list);
        }
        list.push(']');
        members.push(list);
    }
    let mut cursor = None;
    if rng.chance(60) {
        let mut raw = String::new();
        if rng.chance(20) {
            raw.push_str("null");
        } else {
            random_string(rng, &mut raw);
            cursor = Some(raw.clone());
        }
        members.push(format!("\"nextCursor\" : {raw}"));
    }
    for _ in 0..rng.below(3) {
        let name = rng.pick(&["_meta", "other", "nextcursor", "", "toolsx"]);
        let mut value = String::new();
        random_value(rng, 3, &mut value);
        members.push(format!("\"{name}\":{value}"));
    }
    for i in (1..members.len()).rev() {
        members.swap(i, rng.index(i + 1));
    }
    let mut doc = String::new();
    ws(rng, &mut doc);
    doc.push('{');
    doc.push_str(&members.join(","));
    doc.push('}');
    ws(rng, &mut doc);
    (doc, items, cursor)
}

/// A random allow-list that depends only on the decoded key.
fn random_admit(rng: &mut Rng) -> impl FnMut(&str) -> bool + use<> {
    let modulus = rng.below(4) + 1;
    move |key: &str| modulus == 1 || key.bytes().map(u64::from).sum::<u64>() % modulus != 0
}

/// The item as Items mode should write it, if it is kept: the key's decoded value prefixed.
fn expected_item(
    item: &str,
    shape: Shape,
    key: &str,
    prefix: &str,
    admit: &mut dyn FnMut(&str) -> bool,
) -> Option<Value> {
    if shape != Shape::Keyed {
        return None;
    }
    let mut value: Value = serde_json::from_str(item).expect("random item is JSON");
    let object = value.as_object_mut()?;
    let name = object.get(key)?.as_str()?.to_owned();
    if !admit(&name) {
        return None;
    }
    object.insert(key.to_owned(), Value::String(format!("{prefix}{name}")));
    Some(value)
}

/// The document as Document mode should write it: every object item's string key prefixed.
fn expected_document(doc: &str, rules: &ItemRules) -> Value {
    let array = std::str::from_utf8(rules.array).unwrap_or_default();
    let key = std::str::from_utf8(rules.key).unwrap_or_default();
    let prefix = std::str::from_utf8(&rules.prefix).unwrap_or_default();
    let mut value: Value = serde_json::from_str(doc).expect("random list is JSON");
    let items = value.get_mut(array).and_then(Value::as_array_mut);
    for item in items.into_iter().flatten() {
        if let Some(Value::String(name)) = item.get_mut(key) {
            name.insert_str(0, prefix);
        }
    }
    value
}

const PREFIXES: &[&str] = &["", "gh__", "a", "route-1__", "x+"];

#[test]
fn random_lists_merge_as_serde_json_reads_them() {
    let (mut rng, seed) = Rng::seeded(0x17E4_5EED);
    let kinds = [
        ItemRules::tools as fn(Bytes) -> ItemRules,
        ItemRules::prompts,
        ItemRules::resources,
        ItemRules::resource_templates,
    ];
    for round in 0..ROUNDS {
        let mut sink = ItemSink::new();
        let mut want = Vec::new();
        let mut dropped = 0;
        let kind = rng.pick(&kinds);
        for page in 0..rng.below(3) + 1 {
            let rules = kind(Bytes::from_static(rng.pick(PREFIXES).as_bytes()));
            let (doc, items, cursor) = random_list(&mut rng, &rules);
            let context = format!("seed {seed} round {round} page {page}: {doc}");
            let mut admit = random_admit(&mut rng);
            let key = std::str::from_utf8(rules.key).unwrap_or_default();
            let prefix = std::str::from_utf8(&rules.prefix).unwrap_or_default();
            for (item, shape) in &items {
                match expected_item(item, *shape, key, prefix, &mut admit) {
                    Some(value) => want.push(value),
                    None => dropped += 1,
                }
            }
            let pieces = random_pieces(&mut rng, doc.as_bytes());
            let mut rewriter = ItemRewriter::new(rules.clone(), ItemMode::Items);
            let fed = feed_all(&mut rewriter, &rules, &pieces, &mut admit, &mut sink);
            assert_eq!(fed, Ok(()), "{context}");
            let got = rewriter.finish().map(|c| c.map(|c| c.to_vec()));
            assert_eq!(got, Ok(cursor.map(String::into_bytes)), "{context}");
            check_document(&mut rng, &doc, &rules, &context);
        }
        let merged: Value = serde_json::from_str(&format!("[{}]", joined(&sink.parts)))
            .unwrap_or_else(|e| panic!("seed {seed} round {round}: merged list: {e}"));
        assert_eq!(merged, Value::Array(want), "seed {seed} round {round}");
        assert_eq!(sink.dropped, dropped, "seed {seed} round {round}");
    }
}

/// Document mode over the same random list: it reads as the input with every object item's
/// string key prefixed, and with no prefix it is the input byte for byte.
fn check_document(rng: &mut Rng, doc: &str, rules: &ItemRules, context: &str) {
    let pieces = random_pieces(rng, doc.as_bytes());
    let got = run(rules, ItemMode::Document, &pieces, &mut |_: &str| true);
    let out = got
        .unwrap_or_else(|e| panic!("{context}: Document mode: {e}"))
        .out;
    if rules.prefix.is_empty() {
        assert_eq!(out, doc, "{context}");
    }
    let read: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{context}: {e}"));
    assert_eq!(read, expected_document(doc, rules), "{context}");
}

#[test]
fn mutated_lists_agree_with_serde_json() {
    let (_, seed) = Rng::seeded(0x17E4_5EED);
    let mut rng = Rng((seed ^ 0x1D1F).max(1));
    let mut refused = 0;
    for round in 0..ROUNDS * 4 {
        let rules = ItemRules::tools(Bytes::from_static(b"gh__"));
        let (doc, ..) = random_list(&mut rng, &rules);
        let bytes = mutate(&mut rng, &doc);
        let text = String::from_utf8_lossy(&bytes);
        let syntax: Result<serde::de::IgnoredAny, _> = serde_json::from_slice(&bytes);
        let object = bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
        let json_object = syntax.is_ok() && object;
        for mode in [ItemMode::Items, ItemMode::Document] {
            let pieces = random_pieces(&mut rng, &bytes);
            match run(&rules, mode, &pieces, &mut |_: &str| true) {
                Ok(_) => assert!(json_object, "seed {seed} round {round}: accepted {text}"),
                Err(ItemError::NotJson(_) | ItemError::Truncated | ItemError::Trailing) => {
                    refused += 1;
                    assert!(!json_object, "seed {seed} round {round}: refused {text}");
                }
                // Valid JSON that is not one unambiguous list.
                Err(_) => {}
            }
        }
    }
    assert!(refused > ROUNDS, "seed {seed}: only {refused} refused");
}
