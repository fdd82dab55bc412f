//! Fuzzes the streaming JSON-RPC response scanner against serde_json and against the
//! envelope parser. Oracles: the scanner's answer is the same fed whole, cut in two at a
//! point the input chooses, and in small pieces; it accepts only what serde_json reads as a
//! JSON object and refuses as not JSON only what serde_json refuses too; and on bodies that
//! serde_json and the scanner both accept, the `result`, `id` and `error` it hands on are the
//! raw member values serde_json finds, and the ones `parse_envelope` finds when that accepts
//! the body as well (so a response is read the same whichever path its size sends it down).
//!
//! Known and tolerated (fuzz/README.md, finding 3): a body that breaks both the `id` or
//! `error` size bound and the JSON syntax may be refused for either, depending on where the
//! pieces end, since the bounds are checked at the end of each piece.
//!
//! Input: one byte picks the piece size, two the cut point; the rest is the body.
#![no_main]

use std::fmt;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use mcpyard::jsonrpc::{ResultScanner, ScanError, ScanEvent, ScanEvents, parse_envelope};
use mcpyard_fuzz::{Input, cut};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

/// The parts of a scanned body the oracles compare.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    result: Option<Vec<u8>>,
    id: Option<Vec<u8>>,
    error: Option<Vec<u8>>,
}

/// Scans `pieces`, checking the event rules on the way: results are non-empty slices of
/// the piece just fed, one `Done` comes last, and a failure sticks.
fn scan(pieces: &[Bytes]) -> Result<Outcome, ScanError> {
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
                    assert!(!bytes.is_empty(), "empty result slice");
                    let (start, base) = (bytes.as_ptr() as usize, piece.as_ptr() as usize);
                    assert!(start >= base && start + bytes.len() <= base + piece.len());
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
        if let Err(e) = fed {
            assert_eq!(scanner.finish(&mut out), Err(e), "error does not stick");
            return Err(e);
        }
    }
    scanner.finish(&mut out)?;
    assert!(scanner.is_done() && out.is_empty());
    let (id, error, had_result) = done.expect("finish succeeded without done");
    if !had_result {
        assert!(result.is_empty());
    }
    Ok(Outcome {
        result: had_result.then_some(result),
        id: id.map(|b| b.to_vec()),
        error: error.map(|b| b.to_vec()),
    })
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

/// True when two scans of the same body answered alike (see finding 3 above).
fn alike(a: &Result<Outcome, ScanError>, b: &Result<Outcome, ScanError>) -> bool {
    let bound = |r: &Result<Outcome, ScanError>| {
        matches!(r, Err(ScanError::IdTooLarge | ScanError::ErrorTooLarge))
    };
    a == b || (a.is_err() && b.is_err() && (bound(a) || bound(b)))
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let piece = usize::from(input.byte() % 16).max(1);
    let selector = input.u16();
    let body = Bytes::copy_from_slice(input.rest());

    let at = cut(selector, body.len());
    let whole = scan(std::slice::from_ref(&body));
    let halves = scan(&[body.slice(..at), body.slice(at..)]);
    assert!(
        alike(&whole, &halves),
        "whole and cut in two differ: {whole:?} {halves:?}"
    );
    let small: Vec<Bytes> = (0..body.len())
        .step_by(piece)
        .map(|from| body.slice(from..(from + piece).min(body.len())))
        .collect();
    let small = scan(&small);
    assert!(
        alike(&whole, &small),
        "whole and in pieces of {piece} differ: {whole:?} {small:?}"
    );

    // IgnoredAny: serde_json checks the syntax but not what `\u` escapes spell, like the
    // scanner.
    let syntax = serde_json::from_slice::<IgnoredAny>(&body).is_ok();
    let object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let json_object = syntax && object;
    match &whole {
        Ok(_) => assert!(json_object, "the scanner accepted what serde_json refuses"),
        Err(ScanError::NotJson(_) | ScanError::Truncated | ScanError::Trailing) => {
            assert!(
                !json_object,
                "the scanner refused what serde_json reads: {whole:?}"
            )
        }
        // Valid JSON that is not one unambiguous response.
        Err(_) => {}
    }
    let Ok(got) = whole else {
        return;
    };
    let Ok(text) = std::str::from_utf8(&body) else {
        return;
    };
    let Ok(Members(members)) = serde_json::from_str::<Members<'_>>(text) else {
        return;
    };
    let only = |name: &str| {
        let mut found = members.iter().filter(|(key, _)| key == name);
        let first = found.next().map(|(_, raw)| raw.get().as_bytes().to_vec());
        assert!(
            found.next().is_none(),
            "the scanner accepted a duplicate `{name}`"
        );
        first
    };
    let want = Outcome {
        result: only("result"),
        id: only("id").filter(|raw| raw != b"null"),
        error: only("error"),
    };
    assert_eq!(
        got, want,
        "the scanner and serde_json read different members"
    );
    if let Ok(envelope) = parse_envelope(&body) {
        let raw = |v: Option<mcpyard::jsonrpc::Raw<'_>>| v.map(|v| v.get().as_bytes().to_vec());
        let from_envelope = Outcome {
            result: raw(envelope.result),
            id: envelope.id.map(|id| id.raw.as_bytes().to_vec()),
            error: raw(envelope.error),
        };
        assert_eq!(
            got, from_envelope,
            "the scanner and the envelope parser differ"
        );
    }
});
