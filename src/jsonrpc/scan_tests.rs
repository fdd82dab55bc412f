//! Tables of valid and malformed documents, each fed whole, split in two at every byte
//! boundary and one byte per piece; a seeded round trip of random documents; a seeded
//! differential against `serde_json` on mutated documents. The seed comes from
//! `MCPYARD_SEED` when set and is printed in every assertion message. The splitting and
//! random-JSON helpers are shared with the list rewriter's tests (`items_tests.rs`).

use super::*;
use crate::testing::Rng;

/// The parts of a scanned document a test compares.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    result: Option<Vec<u8>>,
    id: Option<Vec<u8>>,
    error: Option<Vec<u8>>,
}

/// Feeds `pieces` then finishes, checking the event stream's own rules on the way: Result
/// slices are non-empty, point into the piece they came from, and precede the one Done.
fn scan_pieces(pieces: &[Bytes]) -> Result<Outcome, ScanError> {
    let mut scanner = ResultScanner::new();
    let mut out = ScanEvents::new();
    let mut result = Vec::new();
    let mut done = None;
    for piece in pieces {
        out.clear();
        let fed = scanner.feed(piece.clone(), &mut out);
        for event in out.drain(..) {
            match event {
                ScanEvent::Result(bytes) => {
                    assert!(done.is_none(), "result after done");
                    assert!(!bytes.is_empty());
                    let start = bytes.as_ptr() as usize;
                    let base = piece.as_ptr() as usize;
                    assert!(start >= base, "result slice is not from this piece");
                    assert!(start + bytes.len() <= base + piece.len());
                    result.extend_from_slice(&bytes);
                }
                ScanEvent::Done {
                    id,
                    error,
                    had_result,
                } => {
                    assert!(done.is_none(), "second done");
                    done = Some((id, error, had_result));
                }
            }
        }
        fed?;
    }
    scanner.finish(&mut out)?;
    assert!(out.is_empty());
    assert!(scanner.is_done());
    // finish is idempotent and a done scanner still accepts whitespace.
    assert_eq!(scanner.finish(&mut out), Ok(()));
    assert_eq!(scanner.feed(Bytes::from_static(b" \n"), &mut out), Ok(()));
    assert!(out.is_empty());
    let Some((id, error, had_result)) = done else {
        panic!("finish succeeded without done");
    };
    if !had_result {
        assert!(result.is_empty());
    }
    Ok(Outcome {
        result: had_result.then_some(result),
        id: id.map(|b| b.to_vec()),
        error: error.map(|b| b.to_vec()),
    })
}

pub(in crate::jsonrpc) fn whole(doc: &[u8]) -> Vec<Bytes> {
    vec![Bytes::copy_from_slice(doc)]
}

pub(in crate::jsonrpc) fn split_at(doc: &[u8], cut: usize) -> Vec<Bytes> {
    let all = Bytes::copy_from_slice(doc);
    vec![all.slice(..cut), all.slice(cut..)]
}

pub(in crate::jsonrpc) fn bytewise(doc: &[u8]) -> Vec<Bytes> {
    let all = Bytes::copy_from_slice(doc);
    (0..all.len()).map(|i| all.slice(i..i + 1)).collect()
}

/// Every way the tables feed a document: whole, two pieces at every cut, one byte each.
pub(in crate::jsonrpc) fn all_splits(doc: &[u8]) -> Vec<Vec<Bytes>> {
    let mut splits = vec![whole(doc), bytewise(doc)];
    splits.extend((0..=doc.len()).map(|cut| split_at(doc, cut)));
    splits
}

fn expect(result: Option<&str>, id: Option<&str>, error: Option<&str>) -> Outcome {
    Outcome {
        result: result.map(|s| s.as_bytes().to_vec()),
        id: id.map(|s| s.as_bytes().to_vec()),
        error: error.map(|s| s.as_bytes().to_vec()),
    }
}

/// (document, raw result, raw id, raw error)
type Valid = (
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
    Option<&'static str>,
);

const VALID: &[Valid] = &[
    (
        r#"{"jsonrpc":"2.0","id":7,"result":{"a":1}}"#,
        Some(r#"{"a":1}"#),
        Some("7"),
        None,
    ),
    (
        r#"{"result":[1,2,3],"id":"abc","jsonrpc":"2.0"}"#,
        Some("[1,2,3]"),
        Some(r#""abc""#),
        None,
    ),
    (
        r#"{"id":-1.5e+3,"result":"x","jsonrpc":"2.0"}"#,
        Some(r#""x""#),
        Some("-1.5e+3"),
        None,
    ),
    (
        " \n\t{ \"jsonrpc\" : \"2.0\" ,\r\n \"id\" : 7 , \"result\" : { \"a\" : [ 1 , 2 ] } \n} \n ",
        Some("{ \"a\" : [ 1 , 2 ] }"),
        Some("7"),
        None,
    ),
    (
        r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"x","data":[1,{"y":null}]}}"#,
        None,
        Some("7"),
        Some(r#"{"code":-32602,"message":"x","data":[1,{"y":null}]}"#),
    ),
    (
        r#"{"error" : {"code":-32700,"message":"Parse error"} ,"jsonrpc":"2.0","id":null}"#,
        None,
        None,
        Some(r#"{"code":-32700,"message":"Parse error"}"#),
    ),
    (
        r#"{"id":1,"result":{"s":"{}[]\",:\\","t":["]","}",":",","],"u":"\u00e9\ud83d\ude00"}}"#,
        Some(r#"{"s":"{}[]\",:\\","t":["]","}",":",","],"u":"\u00e9\ud83d\ude00"}"#),
        Some("1"),
        None,
    ),
    (r#"{"id":1,"result":{}}"#, Some("{}"), Some("1"), None),
    (r#"{"id":1,"result":[]}"#, Some("[]"), Some("1"), None),
    (r#"{"id":1,"result":{ } }"#, Some("{ }"), Some("1"), None),
    (
        r#"{"id":1,"result":[ [ ] , { } ]}"#,
        Some("[ [ ] , { } ]"),
        Some("1"),
        None,
    ),
    (r#"{"id":1,"result":null}"#, Some("null"), Some("1"), None),
    (r#"{"result":true,"id":1}"#, Some("true"), Some("1"), None),
    (r#"{"result":false}"#, Some("false"), None, None),
    (r#"{"id":1,"result":123}"#, Some("123"), Some("1"), None),
    (r#"{"result":  42  ,"id":0}"#, Some("42"), Some("0"), None),
    (r#"{"result":-0,"id":-0}"#, Some("-0"), Some("-0"), None),
    (
        r#"{"result":12.5E-7,"id":1E5}"#,
        Some("12.5E-7"),
        Some("1E5"),
        None,
    ),
    (r#"{"result":0.0e0}"#, Some("0.0e0"), None, None),
    (
        r#"{"id":"ü","result":"héllo 😀 世界"}"#,
        Some(r#""héllo 😀 世界""#),
        Some(r#""ü""#),
        None,
    ),
    (
        r#"{"res\u0075lt":[1],"\u0069d":2}"#,
        Some("[1]"),
        Some("2"),
        None,
    ),
    (
        r#"{"\u0072esult":1,"i\u0064":3}"#,
        Some("1"),
        Some("3"),
        None,
    ),
    (
        r#"{"re\/sult":1,"i\nd":2,"result":3}"#,
        Some("3"),
        None,
        None,
    ),
    (
        r#"{"meta":{"result":[1,{"id":9}],"error":{}},"id":4,"result":"ok","x":[[[]]]}"#,
        Some(r#""ok""#),
        Some("4"),
        None,
    ),
    (
        r#"{"resultresultresultresult":5,"id":1,"result":2}"#,
        Some("2"),
        Some("1"),
        None,
    ),
    (
        r#"{"id":"a\"b","result":0}"#,
        Some("0"),
        Some(r#""a\"b""#),
        None,
    ),
    (
        r#"{"id":"\u0041","result":0}"#,
        Some("0"),
        Some(r#""\u0041""#),
        None,
    ),
    (r#"{"jsonrpc":"2.0","id":1}"#, None, Some("1"), None),
    (r#"{}"#, None, None, None),
    (" { } ", None, None, None),
    (
        r#"{"result":"abcdefghijklmnop\\qrstuvw\"xyz0123456789\b\f\n\r\t\/"}"#,
        Some(r#""abcdefghijklmnop\\qrstuvw\"xyz0123456789\b\f\n\r\t\/""#),
        None,
        None,
    ),
    (
        r#"{"result":["a",1,true,false,null,{"k":[{"k":-1.0}]}],"jsonrpc":"2.0","id":"z"}"#,
        Some(r#"["a",1,true,false,null,{"k":[{"k":-1.0}]}]"#),
        Some(r#""z""#),
        None,
    ),
    (
        r#"{"error":"not an object","id":5}"#,
        None,
        Some("5"),
        Some(r#""not an object""#),
    ),
];

#[test]
fn valid_documents_every_split() {
    for &(doc, result, id, error) in VALID {
        let want = expect(result, id, error);
        for pieces in all_splits(doc.as_bytes()) {
            let got = scan_pieces(&pieces);
            assert_eq!(got.as_ref(), Ok(&want), "{doc} in {} pieces", pieces.len());
        }
    }
}

#[test]
fn valid_documents_agree_with_serde_json() {
    for &(doc, ..) in VALID {
        let parsed: Result<serde::de::IgnoredAny, _> = serde_json::from_str(doc);
        assert!(parsed.is_ok(), "{doc}");
    }
}

const MALFORMED: &[(&str, ScanError)] = &[
    ("", ScanError::Truncated),
    ("  \n", ScanError::Truncated),
    ("[]", ScanError::NotJson("the document must be an object")),
    (
        r#""x""#,
        ScanError::NotJson("the document must be an object"),
    ),
    (
        "\u{feff}{}",
        ScanError::NotJson("the document must be an object"),
    ),
    ("}", ScanError::NotJson("the document must be an object")),
    (r#"{"id":1,"result":{}"#, ScanError::Truncated),
    (r#"{"id":1,"result":"abc}"#, ScanError::Truncated),
    (r#"{"id":1,"result":"abc\"#, ScanError::Truncated),
    (r#"{"id":1,"result":12"#, ScanError::Truncated),
    (r#"{"id":1,"result":tr"#, ScanError::Truncated),
    (
        r#"{"result":[1,2}"#,
        ScanError::NotJson("expected ',' or a closing bracket"),
    ),
    (
        r#"{"result":{"a":1]}"#,
        ScanError::NotJson("expected ',' or a closing bracket"),
    ),
    (
        r#"{"result":1]"#,
        ScanError::NotJson("expected ',' or a closing bracket"),
    ),
    (
        r#"{"result":1,}"#,
        ScanError::NotJson("expected a member name"),
    ),
    (r#"{"result":[1,]}"#, ScanError::NotJson("expected a value")),
    (r#"{"result":[,1]}"#, ScanError::NotJson("expected a value")),
    (
        r#"{"result":[1 2]}"#,
        ScanError::NotJson("expected ',' or a closing bracket"),
    ),
    (
        r#"{"result":tru}"#,
        ScanError::NotJson("expected true, false or null"),
    ),
    (
        r#"{"result":nul}"#,
        ScanError::NotJson("expected true, false or null"),
    ),
    (r#"{"result":True}"#, ScanError::NotJson("expected a value")),
    (
        r#"{"result":truex}"#,
        ScanError::NotJson("expected ',' or a closing bracket"),
    ),
    (
        r#"{"result":01}"#,
        ScanError::NotJson("expected ',' or a closing bracket"),
    ),
    (r#"{"result":-}"#, ScanError::NotJson("malformed number")),
    (r#"{"result":1.}"#, ScanError::NotJson("malformed number")),
    (r#"{"result":1e}"#, ScanError::NotJson("malformed number")),
    (r#"{"result":1e+}"#, ScanError::NotJson("malformed number")),
    (r#"{"result":.5}"#, ScanError::NotJson("expected a value")),
    (r#"{"result":+1}"#, ScanError::NotJson("expected a value")),
    (
        r#"{"result":1.5.2}"#,
        ScanError::NotJson("expected ',' or a closing bracket"),
    ),
    (
        r#"{"result":"a\x"}"#,
        ScanError::NotJson("invalid escape in a string"),
    ),
    (
        r#"{"result":"\u12g4"}"#,
        ScanError::NotJson("invalid \\u escape in a string"),
    ),
    (
        r#"{"res\qult":1}"#,
        ScanError::NotJson("invalid escape in a string"),
    ),
    (
        "{\"result\":\"a\nb\"}",
        ScanError::NotJson("raw control character in a string"),
    ),
    (
        "{\"result\":\"a\tb\"}",
        ScanError::NotJson("raw control character in a string"),
    ),
    (r#"{"result":1}x"#, ScanError::Trailing),
    (r#"{"result":1}{}"#, ScanError::Trailing),
    ("{\"result\":1}\0", ScanError::Trailing),
    (r#"{"id":1}}"#, ScanError::Trailing),
    (r#"{"result":1,"result":2}"#, ScanError::Duplicate("result")),
    (
        r#"{"result":1,"res\u0075lt":2}"#,
        ScanError::Duplicate("result"),
    ),
    (r#"{"id":1,"id":null}"#, ScanError::Duplicate("id")),
    (r#"{"error":{},"error":{}}"#, ScanError::Duplicate("error")),
    (r#"{"result":1,"error":{}}"#, ScanError::ResultAndError),
    (r#"{"error":{},"result":1}"#, ScanError::ResultAndError),
    (r#"{"id":{}}"#, ScanError::BadId),
    (r#"{"id":[1]}"#, ScanError::BadId),
    (r#"{"id":true}"#, ScanError::BadId),
    (r#"{"result" 1}"#, ScanError::NotJson("expected ':'")),
    (r#"{"result"::1}"#, ScanError::NotJson("expected a value")),
    (
        r#"{result:1}"#,
        ScanError::NotJson("expected a member name"),
    ),
    (
        r#"{"a":1 "b":2}"#,
        ScanError::NotJson("expected ',' or a closing bracket"),
    ),
    (r#"{,}"#, ScanError::NotJson("expected a member name")),
    (r#"{"a"}"#, ScanError::NotJson("expected ':'")),
    (r#"{"a":{"b"}}"#, ScanError::NotJson("expected ':'")),
    (
        r#"{"a":{1:2}}"#,
        ScanError::NotJson("expected a member name"),
    ),
];

#[test]
fn malformed_documents_fail_at_every_split() {
    for &(doc, want) in MALFORMED {
        for pieces in all_splits(doc.as_bytes()) {
            let got = scan_pieces(&pieces);
            assert_eq!(got, Err(want), "{doc:?} in {} pieces", pieces.len());
        }
        let parsed: Result<serde_json::Value, _> = serde_json::from_str(doc);
        let duplicate_or_semantic = matches!(
            want,
            ScanError::Duplicate(_) | ScanError::ResultAndError | ScanError::BadId
        );
        let json_object = parsed.is_ok_and(|v| v.is_object());
        assert_eq!(json_object, duplicate_or_semantic, "{doc:?} vs serde_json");
    }
}

#[test]
fn error_stays_after_failure() {
    let mut scanner = ResultScanner::new();
    let mut out = ScanEvents::new();
    let bad = scanner.feed(Bytes::from_static(b"{\"result\":x"), &mut out);
    assert_eq!(bad, Err(ScanError::NotJson("expected a value")));
    let again = scanner.feed(Bytes::from_static(b"1}"), &mut out);
    assert_eq!(again, bad);
    assert_eq!(scanner.finish(&mut out), bad);
    assert!(out.is_empty());
}

#[test]
fn done_comes_at_the_closing_brace_and_only_once() {
    let mut scanner = ResultScanner::new();
    let mut out = ScanEvents::new();
    let fed = scanner.feed(Bytes::from_static(b"{\"id\":1,\"result\":2} "), &mut out);
    assert_eq!(fed, Ok(()));
    assert_eq!(
        out.to_vec(),
        vec![
            ScanEvent::Result(Bytes::from_static(b"2")),
            ScanEvent::Done {
                id: Some(Bytes::from_static(b"1")),
                error: None,
                had_result: true
            }
        ]
    );
    out.clear();
    assert_eq!(scanner.finish(&mut out), Ok(()));
    assert!(out.is_empty());
    let trailing = scanner.feed(Bytes::from_static(b" 3"), &mut out);
    assert_eq!(trailing, Err(ScanError::Trailing));
}

#[test]
fn empty_pieces_are_harmless() {
    let doc = br#"{"id":1,"result":"abc"}"#;
    let all = Bytes::from_static(doc);
    let mut pieces = Vec::new();
    for i in 0..doc.len() {
        pieces.push(Bytes::new());
        pieces.push(all.slice(i..i + 1));
        pieces.push(all.slice(i + 1..i + 1));
    }
    let got = scan_pieces(&pieces);
    assert_eq!(got, Ok(expect(Some("\"abc\""), Some("1"), None)));
}

#[test]
fn one_piece_yields_one_slice_of_it() {
    let all = Bytes::from_static(b"{\"id\":1, \"result\" : [1, \"x\"] , \"jsonrpc\":\"2.0\"}");
    let mut scanner = ResultScanner::new();
    let mut out = ScanEvents::new();
    assert_eq!(scanner.feed(all.clone(), &mut out), Ok(()));
    let Some(ScanEvent::Result(slice)) = out.first() else {
        panic!("no result event: {out:?}");
    };
    assert_eq!(&slice[..], b"[1, \"x\"]");
    assert_eq!(slice.as_ptr() as usize - all.as_ptr() as usize, 20);
    assert_eq!(out.len(), 2);
}

/// `{"result":` + `[` × n + `]` × n + `}`
fn nested_result(n: usize) -> Vec<u8> {
    let mut doc = b"{\"result\":".to_vec();
    doc.extend(std::iter::repeat_n(b'[', n));
    doc.extend(std::iter::repeat_n(b']', n));
    doc.push(b'}');
    doc
}

#[test]
fn nesting_up_to_the_limit_is_accepted() {
    let n = SCAN_DEPTH_MAX - 1;
    let doc = nested_result(n);
    let raw = doc.get(10..10 + 2 * n).unwrap_or_default().to_vec();
    for pieces in [whole(&doc), bytewise(&doc), split_at(&doc, 10 + n)] {
        let got = scan_pieces(&pieces);
        assert_eq!(got.map(|o| o.result), Ok(Some(raw.clone())));
    }
}

#[test]
fn nesting_past_the_limit_is_too_deep() {
    let doc = nested_result(SCAN_DEPTH_MAX);
    assert_eq!(scan_pieces(&whole(&doc)), Err(ScanError::TooDeep));
    let mut skipped = b"{\"other\":{\"a\":".to_vec();
    skipped.extend(std::iter::repeat_n(b'[', SCAN_DEPTH_MAX));
    assert_eq!(scan_pieces(&bytewise(&skipped)), Err(ScanError::TooDeep));
}

#[test]
fn depth_bomb_fails_without_recursion() {
    let mut doc = b"{\"result\":".to_vec();
    doc.extend(std::iter::repeat_n(b'[', 1 << 20));
    assert_eq!(scan_pieces(&whole(&doc)), Err(ScanError::TooDeep));
    let mut objects = b"{\"x\":".to_vec();
    for _ in 0..100_000 {
        objects.extend_from_slice(b"{\"a\":");
    }
    assert_eq!(scan_pieces(&whole(&objects)), Err(ScanError::TooDeep));
}

#[test]
fn id_and_error_are_bounded() {
    let mut fits = b"{\"id\":\"".to_vec();
    fits.extend(std::iter::repeat_n(b'a', ID_BYTES_MAX - 2));
    fits.extend_from_slice(b"\"}");
    let raw = fits.get(6..6 + ID_BYTES_MAX).unwrap_or_default().to_vec();
    for pieces in [whole(&fits), split_at(&fits, 300), bytewise(&fits)] {
        assert_eq!(scan_pieces(&pieces).map(|o| o.id), Ok(Some(raw.clone())));
    }
    let mut long = b"{\"id\":\"".to_vec();
    long.extend(std::iter::repeat_n(b'a', ID_BYTES_MAX - 1));
    long.extend_from_slice(b"\"}");
    for pieces in [whole(&long), split_at(&long, 300), bytewise(&long)] {
        assert_eq!(scan_pieces(&pieces), Err(ScanError::IdTooLarge));
    }

    let mut error = b"{\"error\":{\"data\":\"".to_vec();
    error.extend(std::iter::repeat_n(b'e', ERROR_BYTES_MAX - 11));
    error.extend_from_slice(b"\"}}");
    let raw = error.get(9..error.len() - 1).unwrap_or_default().to_vec();
    assert_eq!(raw.len(), ERROR_BYTES_MAX);
    for pieces in [whole(&error), split_at(&error, 5000)] {
        assert_eq!(scan_pieces(&pieces).map(|o| o.error), Ok(Some(raw.clone())));
    }
    let mut large = b"{\"error\":{\"data\":\"".to_vec();
    large.extend(std::iter::repeat_n(b'e', ERROR_BYTES_MAX));
    large.extend_from_slice(b"\"}}");
    for pieces in [whole(&large), split_at(&large, 5000)] {
        assert_eq!(scan_pieces(&pieces), Err(ScanError::ErrorTooLarge));
    }
}

#[test]
fn plain_run_stops_at_the_first_special_byte() {
    for len in 0..40 {
        let plain = vec![b'x'; len];
        assert_eq!(plain_run(&plain), len);
        for stop in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
            for at in 0..len {
                let mut bytes = plain.clone();
                if let Some(b) = bytes.get_mut(at) {
                    *b = stop;
                }
                // A later stop (or a high byte) must not hide the first one.
                bytes.push(b'"');
                assert_eq!(plain_run(&bytes), at, "stop {stop:#x} at {at} of {len}");
            }
        }
    }
    let high = "é😀\u{7f} ~".repeat(5);
    assert_eq!(plain_run(high.as_bytes()), high.len());
}

/// The first stop byte by the definition, one byte at a time.
fn plain_run_reference(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .unwrap_or(bytes.len())
}

#[test]
fn plain_run_finds_every_stop_in_windows_and_tails() {
    // Lengths around one, two and three lane windows, so stops land in a full window, in
    // the overlapping last window and in the byte-by-byte path of a short slice.
    for len in 0..3 * 32 + 5 {
        let plain: Vec<u8> = (0..len).map(|i| b"ab~\x7f\xc3\xa9 Z"[i % 8]).collect();
        assert_eq!(plain_run(&plain), len, "plain of {len}");
        for at in 0..len {
            for stop in [b'"', b'\\', 0x00, 0x09, 0x1f] {
                let mut bytes = plain.clone();
                if let Some(b) = bytes.get_mut(at) {
                    *b = stop;
                }
                assert_eq!(plain_run(&bytes), at, "stop {stop:#x} at {at} of {len}");
                // A second stop after the first must not move the answer.
                if let Some(b) = bytes.get_mut(len - 1) {
                    *b = b'"';
                }
                assert_eq!(plain_run(&bytes), at, "two stops, first at {at} of {len}");
            }
        }
    }
    // Every byte value, at every lane of a window and of a tail.
    for value in 0..=255u8 {
        for len in [1, 31, 32, 33, 64, 70] {
            for at in 0..len {
                let mut bytes = vec![b'x'; len];
                if let Some(b) = bytes.get_mut(at) {
                    *b = value;
                }
                assert_eq!(
                    plain_run(&bytes),
                    plain_run_reference(&bytes),
                    "byte {value:#x} at {at} of {len}"
                );
            }
        }
    }
}

#[test]
fn display_names_the_problem() {
    let text = ScanError::Duplicate("result").to_string();
    assert_eq!(text, "response has a duplicate `result` member");
    let text = ScanError::NotJson("expected ':'").to_string();
    assert_eq!(text, "response is not JSON: expected ':'");
}

// ---- Seeded random documents ----

/// Random documents per run of each seeded test.
const ROUNDS: usize = 400;
/// Deepest random value (containers inside the result).
const RANDOM_DEPTH_MAX: u32 = 6;

pub(in crate::jsonrpc) fn ws(rng: &mut Rng, out: &mut String) {
    if rng.chance(25) {
        for _ in 0..rng.below(3) + 1 {
            out.push(rng.pick(&[' ', '\n', '\t', '\r']));
        }
    }
}

pub(in crate::jsonrpc) fn random_string(rng: &mut Rng, out: &mut String) {
    const PIECES: &[&str] = &[
        "a",
        "Z",
        "0",
        " ",
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "é",
        "😀",
        "世",
        "\\\"",
        "\\\\",
        "\\/",
        "\\n",
        "\\t",
        "\\b",
        "\\f",
        "\\r",
        "\\u0041",
        "\\u00e9",
        "\\ud83d\\ude00",
        "\\u005C",
        "\\u0022",
        "plain text that runs past a word",
    ];
    out.push('"');
    for _ in 0..rng.below(12) {
        out.push_str(rng.pick(PIECES));
    }
    out.push('"');
}

pub(in crate::jsonrpc) fn random_number(rng: &mut Rng, out: &mut String) {
    if rng.chance(30) {
        out.push('-');
    }
    if rng.chance(20) {
        out.push('0');
    } else {
        out.push(char::from(b'1' + rng.below(9) as u8));
        for _ in 0..rng.below(6) {
            out.push(char::from(b'0' + rng.below(10) as u8));
        }
    }
    if rng.chance(30) {
        out.push('.');
        for _ in 0..rng.below(4) + 1 {
            out.push(char::from(b'0' + rng.below(10) as u8));
        }
    }
    if rng.chance(20) {
        out.push(rng.pick(&['e', 'E']));
        if rng.chance(50) {
            out.push(rng.pick(&['+', '-']));
        }
        out.push(char::from(b'0' + rng.below(10) as u8));
    }
}

/// Appends a random JSON value (no surrounding whitespace) of nesting at most `depth`.
pub(in crate::jsonrpc) fn random_value(rng: &mut Rng, depth: u32, out: &mut String) {
    let kinds = if depth == 0 { 5 } else { 7 };
    match rng.below(kinds) {
        0 => out.push_str(rng.pick(&["null", "true", "false"])),
        1 | 2 => random_number(rng, out),
        3 | 4 => random_string(rng, out),
        5 => {
            out.push('[');
            for i in 0..rng.below(5) {
                if i > 0 {
                    out.push(',');
                }
                ws(rng, out);
                random_value(rng, depth - 1, out);
                ws(rng, out);
            }
            out.push(']');
        }
        _ => {
            out.push('{');
            for i in 0..rng.below(5) {
                if i > 0 {
                    out.push(',');
                }
                ws(rng, out);
                // Nested names may be "result", "id" or "error": they must not count.
                let name = rng.pick(&["\"result\"", "\"id\"", "\"error\"", "\"k\\n\""]);
                out.push_str(name);
                ws(rng, out);
                out.push(':');
                ws(rng, out);
                random_value(rng, depth - 1, out);
                ws(rng, out);
            }
            out.push('}');
        }
    }
}

/// A random response document in random member order and the outcome it should scan to.
fn random_document(rng: &mut Rng) -> (String, Outcome) {
    let mut members: Vec<(String, String)> = Vec::new();
    let mut want = Outcome {
        result: None,
        id: None,
        error: None,
    };
    members.push(("\"jsonrpc\"".into(), "\"2.0\"".into()));
    if rng.chance(90) {
        let mut id = String::new();
        match rng.below(3) {
            0 => random_number(rng, &mut id),
            1 => random_string(rng, &mut id),
            _ => id.push_str("null"),
        }
        if id != "null" {
            want.id = Some(id.clone().into_bytes());
        }
        members.push(("\"id\"".into(), id));
    }
    let mut value = String::new();
    random_value(rng, RANDOM_DEPTH_MAX, &mut value);
    match rng.below(10) {
        0 => {}
        1 | 2 => {
            want.error = Some(value.clone().into_bytes());
            members.push(("\"error\"".into(), value));
        }
        _ => {
            want.result = Some(value.clone().into_bytes());
            let name = rng.pick(&["\"result\"", "\"res\\u0075lt\""]);
            members.push((name.into(), value));
        }
    }
    for _ in 0..rng.below(3) {
        let mut other = String::new();
        random_value(rng, 3, &mut other);
        let name = rng.pick(&["\"meta\"", "\"resul\"", "\"results\"", "\"\"", "\"ids\""]);
        members.push((name.into(), other));
    }
    // Fisher-Yates: member order is free.
    for i in (1..members.len()).rev() {
        members.swap(i, rng.index(i + 1));
    }
    let mut doc = String::new();
    ws(rng, &mut doc);
    doc.push('{');
    for (i, (name, value)) in members.iter().enumerate() {
        if i > 0 {
            doc.push(',');
        }
        ws(rng, &mut doc);
        doc.push_str(name);
        ws(rng, &mut doc);
        doc.push(':');
        ws(rng, &mut doc);
        doc.push_str(value);
        ws(rng, &mut doc);
    }
    doc.push('}');
    ws(rng, &mut doc);
    (doc, want)
}

/// Splits `doc` at random cuts: sometimes byte by byte, usually into a few pieces.
pub(in crate::jsonrpc) fn random_pieces(rng: &mut Rng, doc: &[u8]) -> Vec<Bytes> {
    let all = Bytes::copy_from_slice(doc);
    if rng.chance(10) {
        return bytewise(doc);
    }
    let mut cuts: Vec<usize> = (0..rng.below(8))
        .map(|_| rng.index(doc.len() + 1))
        .collect();
    cuts.push(0);
    cuts.push(doc.len());
    cuts.sort_unstable();
    cuts.windows(2)
        .filter_map(|w| match *w {
            [a, b] => Some(all.slice(a..b)),
            _ => None,
        })
        .collect()
}

#[test]
fn random_documents_round_trip() {
    let (mut rng, seed) = Rng::seeded(0x5CA7_0B0D_1E55);
    for round in 0..ROUNDS {
        let (doc, want) = random_document(&mut rng);
        let valid: Result<serde::de::IgnoredAny, _> = serde_json::from_str(&doc);
        assert!(
            valid.is_ok(),
            "seed {seed} round {round}: generator wrote {doc}"
        );
        let pieces = random_pieces(&mut rng, doc.as_bytes());
        let got = scan_pieces(&pieces);
        assert_eq!(got, Ok(want), "seed {seed} round {round}: {doc}");
    }
}

/// Bytes a mutation inserts or writes: the ones JSON structure turns on.
const MUTATIONS: &[u8] = b"{}[]\",:\\ \n0123456789-+.eEtrufalsn/xu";

/// Applies one to three ASCII edits at ASCII positions, so the text stays UTF-8.
pub(in crate::jsonrpc) fn mutate(rng: &mut Rng, doc: &str) -> Vec<u8> {
    let mut bytes = doc.as_bytes().to_vec();
    for _ in 0..rng.below(3) + 1 {
        let ascii: Vec<usize> = (0..bytes.len())
            .filter(|&i| bytes.get(i).is_some_and(|b| b.is_ascii()))
            .collect();
        if ascii.is_empty() {
            break;
        }
        let at = rng.pick(&ascii);
        let with = rng.pick(MUTATIONS);
        match rng.below(3) {
            0 => {
                bytes.remove(at);
            }
            1 => bytes.insert(at, with),
            _ => {
                if let Some(b) = bytes.get_mut(at) {
                    *b = with;
                }
            }
        }
    }
    bytes
}

#[test]
fn mutated_documents_agree_with_serde_json() {
    let (_, seed) = Rng::seeded(0x5CA7_0B0D_1E55);
    let mut rng = Rng((seed ^ 0xD1FF).max(1));
    let mut refused = 0;
    for round in 0..ROUNDS * 4 {
        let (doc, _) = random_document(&mut rng);
        let bytes = mutate(&mut rng, &doc);
        let text = String::from_utf8_lossy(&bytes);
        // IgnoredAny: serde_json checks syntax but not what \u escapes spell, like us.
        let syntax: Result<serde::de::IgnoredAny, _> = serde_json::from_slice(&bytes);
        let object = bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
        let json_object = syntax.is_ok() && object;
        let got = scan_pieces(&random_pieces(&mut rng, &bytes));
        match got {
            Ok(_) => assert!(json_object, "seed {seed} round {round}: accepted {text}"),
            Err(ScanError::NotJson(_) | ScanError::Truncated | ScanError::Trailing) => {
                refused += 1;
                assert!(!json_object, "seed {seed} round {round}: refused {text}");
            }
            // Semantic refusals: valid JSON that is not one unambiguous response.
            Err(_) => {}
        }
    }
    // The mutations must actually reach the refusal paths.
    assert!(refused > ROUNDS, "seed {seed}: only {refused} refused");
}

/// Every escape the string fast paths decode in place, and malformed ones they must refuse.
const ESCAPES: &[&str] = &[
    "\\\"",
    "\\\\",
    "\\/",
    "\\b",
    "\\f",
    "\\n",
    "\\r",
    "\\t",
    "\\u0041",
    "\\u00e9",
    "\\uD83D\\uDE00",
    "\\u005C",
    "\\u0022",
    // An escaped backslash, then an escaped quote.
    "\\\\\\\"",
];
const BAD_ESCAPES: &[&str] = &["\\x", "\\u12G4", "\\u00\"", "\\U0041", "\u{1}"];

/// A string value of 70 plain bytes (two lane windows and a tail) with `escape` at `at`.
fn text_with(escape: &str, at: usize) -> String {
    let plain = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ-_.é!?";
    let (head, tail) = plain.split_at(plain.floor_char_boundary(at));
    format!("\"{head}{escape}{tail}\"")
}

#[test]
fn escapes_at_every_position_and_split() {
    for escape in ESCAPES {
        for at in 0..=70 {
            let text = text_with(escape, at);
            // As the result value, and as the name of a top-level member the scanner decodes.
            for doc in [
                format!(r#"{{"id":1,"result":{{"t":{text}}}}}"#),
                format!(r#"{{"id":1,{text}:[{text}],"result":{text}}}"#),
            ] {
                assert!(
                    serde_json::from_str::<serde_json::Value>(&doc).is_ok(),
                    "{doc}"
                );
                let result = doc
                    .rsplit_once("\"result\":")
                    .map(|(_, r)| r.strip_suffix('}').unwrap_or(r))
                    .unwrap_or_default();
                let want = Ok(expect(Some(result), Some("1"), None));
                for pieces in all_splits(doc.as_bytes()) {
                    assert_eq!(
                        scan_pieces(&pieces),
                        want,
                        "{doc} in {} pieces",
                        pieces.len()
                    );
                }
            }
        }
    }
}

#[test]
fn bad_escapes_fail_at_every_position_and_split() {
    for escape in BAD_ESCAPES {
        for at in [0, 1, 7, 8, 31, 32, 33, 63, 64, 69] {
            let doc = format!(r#"{{"id":1,"result":{}}}"#, text_with(escape, at));
            assert!(
                serde_json::from_str::<serde_json::Value>(&doc).is_err(),
                "{doc}"
            );
            let first = scan_pieces(&whole(doc.as_bytes()));
            assert!(
                matches!(first, Err(ScanError::NotJson(_))),
                "{doc}: {first:?}"
            );
            for pieces in all_splits(doc.as_bytes()) {
                assert_eq!(
                    scan_pieces(&pieces),
                    first,
                    "{doc} in {} pieces",
                    pieces.len()
                );
            }
        }
    }
}

#[test]
fn member_names_with_escapes_are_decoded_before_matching() {
    for name in ["\"res\\u0075lt\"", "\"\\u0072esult\"", "\"resul\\u0074\""] {
        let doc = format!(r#"{{"id":1,{name}:[1]}}"#);
        for pieces in all_splits(doc.as_bytes()) {
            assert_eq!(
                scan_pieces(&pieces),
                Ok(expect(Some("[1]"), Some("1"), None)),
                "{doc}"
            );
        }
    }
    // An escape that decodes to something else is not the member.
    let doc = r#"{"id":1,"res\u0076lt":[1]}"#;
    assert_eq!(
        scan_pieces(&whole(doc.as_bytes())),
        Ok(expect(None, Some("1"), None))
    );
}
