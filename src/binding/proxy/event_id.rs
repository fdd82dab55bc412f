//! Aggregate event ids: one resumable position for a session whose events come from
//! several routes, each numbering its events its own way.
//!
//! Every route of a proxy with more than one route has a short event prefix (from the
//! config: the CRC32C of its toolkit name, URL-safe base64, cut to the shortest length at
//! which all routes differ). The aggregate id lists each route's last event id as
//! `<prefix>=<id>` pairs sorted by prefix and joined by `;`, e.g. `2=200;S=101`. When the
//! agent resumes with it, [`decode`] splits it back so each route resumes from its own id.
//!
//! Route ids are opaque upstream bytes, so the three bytes that structure the aggregate
//! (`%`, `;`, `=`) and control bytes are percent-escaped inside them; decoding undoes it.
//! A decoded id goes into the `Last-Event-ID` header of a request to the route, so one
//! that decodes to a control byte other than HTAB (`%0D%0A`, `%00`: no upstream id can
//! hold one, since SSE lines end at CR and LF and an id with NUL is ignored) is malformed
//! and dropped.

use crate::limits::AGGREGATE_EVENT_ID_BYTES_MAX;
use std::fmt::Write;
use std::rc::Rc;

/// The routes' event prefixes in aggregate order.
#[derive(Debug)]
pub struct Prefixes {
    /// (prefix, route index), sorted by prefix. Invariant: prefixes are unique.
    sorted: Vec<(Rc<str>, usize)>,
}

impl Prefixes {
    /// `prefixes[i]` is route i's prefix; `None` entries take no part (a proxy with one
    /// route has none at all, and then ids pass through unchanged).
    pub fn new(prefixes: &[Option<&str>]) -> Prefixes {
        let mut sorted: Vec<(Rc<str>, usize)> = prefixes
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.map(|p| (Rc::from(p), i)))
            .collect();
        sorted.sort();
        for pair in sorted.windows(2) {
            if let [a, b] = pair {
                assert!(a.0 != b.0, "event prefixes are unique (config validation)");
            }
        }
        Prefixes { sorted }
    }

    /// True if this proxy aggregates (it has route prefixes).
    pub fn aggregating(&self) -> bool {
        !self.sorted.is_empty()
    }

    /// The aggregate of the routes' last ids (`ids[i]` is route i's); `None` while no route
    /// has an id. The agent sends it back in a header, so it is at most
    /// [`AGGREGATE_EVENT_ID_BYTES_MAX`]: each route's pair gets an equal share of that, and a
    /// pair longer than its share is left out (that route resumes from where it is, as
    /// for an id too long to hand on at all).
    pub fn encode(&self, ids: &[Option<Rc<str>>]) -> Option<String> {
        let share = AGGREGATE_EVENT_ID_BYTES_MAX / self.sorted.len().max(1);
        let mut out = String::new();
        for (prefix, route) in &self.sorted {
            let Some(Some(id)) = ids.get(*route) else {
                continue;
            };
            let before = out.len();
            if !out.is_empty() {
                out.push(';');
            }
            out.push_str(prefix);
            out.push('=');
            escape_into(id, &mut out);
            if out.len() - before > share {
                out.truncate(before);
            }
        }
        assert!(out.len() <= AGGREGATE_EVENT_ID_BYTES_MAX);
        (!out.is_empty()).then_some(out)
    }

    /// Splits an aggregate into (route index, that route's id) pairs. Pairs with an
    /// unknown prefix, without `=`, with an empty id, a broken escape or an id that decodes
    /// to a control byte are skipped; a prefix given twice keeps its last id.
    pub fn decode(&self, aggregate: &str) -> Vec<(usize, Rc<str>)> {
        let mut out: Vec<(usize, Rc<str>)> = Vec::new();
        for pair in aggregate.split(';') {
            let Some((prefix, id)) = pair.split_once('=') else {
                continue;
            };
            let Ok(at) = self.sorted.binary_search_by(|(p, _)| (**p).cmp(prefix)) else {
                continue;
            };
            let Some((_, route)) = self.sorted.get(at) else {
                continue;
            };
            let Some(id) = unescape(id).filter(|id| usable(id)) else {
                continue;
            };
            out.retain(|(r, _)| r != route);
            out.push((*route, Rc::from(id.as_str())));
        }
        out
    }
}

/// True for a decoded route id that may be sent upstream: it becomes the route's
/// `Last-Event-ID`, so it must read back unchanged there (not empty, no control byte but
/// HTAB, no SP or HTAB at either end).
fn usable(id: &str) -> bool {
    crate::http::field_value_round_trips(id.as_bytes())
}

/// True for a byte that must be escaped inside a route's id.
fn reserved(b: u8) -> bool {
    matches!(b, b'%' | b';' | b'=') || b < 0x20 || b == 0x7f
}

/// Appends `id` with its reserved bytes as `%XX`.
fn escape_into(id: &str, out: &mut String) {
    let mut plain_from = 0;
    for (at, b) in id.bytes().enumerate() {
        if reserved(b) {
            out.push_str(id.get(plain_from..at).unwrap_or_default());
            let _ = write!(out, "%{b:02X}");
            plain_from = at + 1;
        }
    }
    out.push_str(id.get(plain_from..).unwrap_or_default());
}

/// Undoes [`escape_into`]; `None` for a `%` not followed by two hex digits or a result
/// that is not UTF-8.
fn unescape(text: &str) -> Option<String> {
    if !text.contains('%') {
        return Some(text.to_owned());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while let Some(&b) = bytes.get(at) {
        if b == b'%' {
            // Exactly two hex digits (`from_str_radix` alone would also take `+9`).
            let hex = bytes.get(at + 1..at + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            out.push(b);
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[Option<&str>]) -> Vec<Option<Rc<str>>> {
        list.iter().map(|i| i.map(Rc::from)).collect()
    }

    #[test]
    fn pairs_are_sorted_by_prefix_and_name_each_routes_last_id() {
        // Route 0 is bluesky (`S`), route 1 quartz (`2`): `2` sorts first.
        let p = Prefixes::new(&[Some("S"), Some("2")]);
        assert!(p.aggregating());
        assert_eq!(p.encode(&ids(&[None, None])), None);
        assert_eq!(
            p.encode(&ids(&[Some("101"), None])).as_deref(),
            Some("S=101")
        );
        assert_eq!(
            p.encode(&ids(&[Some("101"), Some("200")])).as_deref(),
            Some("2=200;S=101")
        );
    }

    #[test]
    fn aggregates_split_back_and_skip_what_they_do_not_know() {
        let p = Prefixes::new(&[Some("S"), Some("2")]);
        let got = |text: &str| -> Vec<(usize, String)> {
            p.decode(text)
                .into_iter()
                .map(|(r, id)| (r, id.to_string()))
                .collect()
        };
        assert_eq!(got("2=200;S=100"), [(1, "200".into()), (0, "100".into())]);
        assert_eq!(
            got("X=7;S=100"),
            [(0, "100".into())],
            "unknown prefix ignored"
        );
        assert_eq!(got("S=100;garbage;=5;2="), [(0, "100".into())]);
        assert_eq!(got("S=1;S=2"), [(0, "2".into())], "the last one wins");
        assert_eq!(got(""), []);
        assert_eq!(got("S=%zz;2=%4"), [], "broken escapes");
        assert_eq!(got("S=%+9;2=%-1"), [], "signs are not hex digits");
    }

    #[test]
    fn ids_that_decode_to_control_bytes_are_dropped() {
        // W and S stand for two routes; the hostile part is dropped, the other kept.
        let p = Prefixes::new(&[Some("W"), Some("S")]);
        let got = |text: &str| -> Vec<(usize, String)> {
            p.decode(text)
                .into_iter()
                .map(|(r, id)| (r, id.to_string()))
                .collect()
        };
        assert_eq!(got("W=x%0D%0AX-Injected%3A%201;S=y"), [(1, "y".into())]);
        for hostile in ["%00", "a%0Db", "a%0A", "%7F", "%1B[31m", "%0B"] {
            assert_eq!(
                got(&format!("W={hostile};S=7")),
                [(1, "7".into())],
                "{hostile}"
            );
        }
        // Bytes above 0x7f are not control bytes: an escaped UTF-8 id still decodes.
        assert_eq!(got("W=%C3%BC"), [(0, "\u{fc}".into())]);
        // HTAB is a valid header value byte: a route's id with a tab comes back whole.
        assert_eq!(got("W=tab%09here"), [(0, "tab\there".into())]);
    }

    #[test]
    fn reserved_bytes_in_route_ids_survive_a_round_trip() {
        let p = Prefixes::new(&[Some("a"), Some("b"), Some("c")]);
        let nasty = ["x;y=z%w", "%3B", "tab\there", "ünï=cödé;", "plain/17"];
        for id in nasty {
            let encoded = p.encode(&ids(&[Some(id), Some("1"), None])).unwrap();
            let pairs: Vec<&str> = encoded.split(';').collect();
            assert_eq!(pairs.len(), 2, "no stray separators in {encoded}");
            assert!(!encoded.contains('\t'));
            let back = p.decode(&encoded);
            assert_eq!(back, [(0, Rc::from(id)), (1, Rc::from("1"))], "{encoded}");
        }
    }

    #[test]
    fn the_aggregate_stays_within_its_bound() {
        // 64 routes, each with the longest id an exit may hand on, all of it escaped.
        let prefixes: Vec<String> = (0..64).map(|i| format!("p{i:02}")).collect();
        let names: Vec<Option<&str>> = prefixes.iter().map(|p| Some(p.as_str())).collect();
        let p = Prefixes::new(&names);
        let long = ";".repeat(crate::limits::EXIT_EVENT_ID_BYTES_MAX);
        let mut list: Vec<Option<&str>> = vec![Some(long.as_str()); 64];
        list[5] = Some("short");
        let encoded = p.encode(&ids(&list)).unwrap();
        assert!(encoded.len() <= AGGREGATE_EVENT_ID_BYTES_MAX);
        // The long ones are left out; the short one is kept, and decodes back.
        assert_eq!(encoded, "p05=short");
        assert_eq!(p.decode(&encoded), [(5, Rc::from("short"))]);
        // With two routes the share is wide: the longest id passes whole.
        let two = Prefixes::new(&[Some("a"), Some("b")]);
        let plain = "x".repeat(crate::limits::EXIT_EVENT_ID_BYTES_MAX);
        let encoded = two.encode(&ids(&[Some(&plain), Some(&plain)])).unwrap();
        assert_eq!(two.decode(&encoded).len(), 2);
    }

    #[test]
    fn a_single_route_does_not_aggregate() {
        let p = Prefixes::new(&[None]);
        assert!(!p.aggregating());
        assert_eq!(p.encode(&ids(&[Some("5")])), None);
        assert!(p.decode("S=5").is_empty());
    }
}
