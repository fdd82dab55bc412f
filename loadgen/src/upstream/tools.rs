//! The fixture's tool catalogue: `echo`, `big`, then generated tools up to `--tools`,
//! rendered once at start as the tools/list result pages, and the set of names tools/call
//! accepts.
//!
//! `route.rs` asks this for a page (no cursor, or the cursor a page announced) and whether a
//! name is a tool; nothing here runs per request except a slice clone, a cursor parse and a
//! hash lookup. With the defaults (`--tools 2`, no `--page-size`) the one page is
//! byte-identical to the fixture's tools/list before the catalogue existed, so perf results
//! taken then stay comparable.
//!
//! Pagination follows MCP 2025-11-25 "Utilities / Pagination": a page that is not the last
//! carries `nextCursor`, an opaque string the client sends back as `params.cursor`; the
//! last page has none. A cursor this list did not issue is refused (-32602, `route.rs`).
//! Cursors are `offset-<n>`, the decimal position (from 0) of the page's first tool.
//!
//! The catalogue has a revision, 0 at start. `POST /control/tools_changed` renders the next
//! one ([`Tools::revised`]): the same tools, in the same order, with `echo`'s description
//! naming the revision, so the list's content really changes (a cache that compares lists
//! sees a difference) while every name and cursor stays valid.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::ops::Range;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use crate::limits::{FIXTURE_PAGE_SIZE_MAX, FIXTURE_TOOL_BYTES_MAX, FIXTURE_TOOLS_MAX};

/// `echo`, exactly as the fixture listed it before `--tools` existed.
const ECHO_TOOL: &str = r#"{"name":"echo","description":"Returns the fixture's payload","inputSchema":{"type":"object","properties":{"text":{"type":"string"}}}}"#;

/// `echo` of revision N > 0: its description, then the revision, then the rest.
const ECHO_REVISED: [&str; 2] = [
    r#"{"name":"echo","description":"Returns the fixture's payload (revision "#,
    r#")","inputSchema":{"type":"object","properties":{"text":{"type":"string"}}}}"#,
];

/// `big`, exactly as the fixture listed it before `--tools` existed.
const BIG_TOOL: &str = r#"{"name":"big","description":"Returns the fixture's payload","inputSchema":{"type":"object","properties":{}}}"#;

/// The fixed tools that open every list, in order, as (name, rendered object).
const FIXED_TOOLS: [(&str, &str); 2] = [("echo", ECHO_TOOL), ("big", BIG_TOOL)];

/// What precedes the offset in a cursor.
const CURSOR_PREFIX: &str = "offset-";

/// Generated tools cycle through these shapes, so a list has the variety of a real one:
/// (what the description says the tool does, its `inputSchema`). Each schema has two or
/// three typed properties and a `required` list.
const SHAPES: [(&str, &str); 3] = [
    (
        "Searches collection",
        r#"{"type":"object","properties":{"query":{"type":"string","description":"Words to look for"},"limit":{"type":"integer","minimum":1,"maximum":100},"exact":{"type":"boolean"}},"required":["query"]}"#,
    ),
    (
        "Fetches one record by key from shelf",
        r#"{"type":"object","properties":{"key":{"type":"string","description":"The record's key"},"version":{"type":"integer","minimum":0}},"required":["key","version"]}"#,
    ),
    (
        "Lists the entries below folder",
        r#"{"type":"object","properties":{"path":{"type":"string","description":"A slash-separated path"},"depth":{"type":"number","minimum":0},"recursive":{"type":"boolean"}},"required":["path"]}"#,
    ),
];

/// The rendered catalogue.
#[derive(Debug)]
pub struct Tools {
    /// Tools in the list. Invariant: `1 <= count <= FIXTURE_TOOLS_MAX`.
    count: usize,
    /// Tools per page; `count` when the list is not paginated. Invariant:
    /// `1 <= page_size <= count`.
    page_size: usize,
    /// Each page's tools/list result object, in order: slices of one buffer, so a reply
    /// clones a reference, never bytes. Invariant: `pages.len() == count.div_ceil(page_size)`.
    pages: Vec<Bytes>,
    /// The names of the generated tools (list position 3 on); empty when `count <= 2`.
    /// Shared by every revision: names never change.
    generated: Arc<HashSet<Box<str>>>,
    /// The catalogue's revision: 0 at start, one more per `tools_changed`.
    revision: u64,
}

impl Tools {
    /// Renders `count` tools in pages of `page_size` (0: one page with every tool).
    ///
    /// The arguments come from `args.rs`, which checked them against the limits; out of
    /// range here is a bug, so it is asserted.
    pub fn new(count: usize, page_size: usize) -> Tools {
        assert!(count >= 1);
        assert!(count <= FIXTURE_TOOLS_MAX);
        assert!(page_size <= FIXTURE_PAGE_SIZE_MAX);
        let page_size = if page_size == 0 {
            count
        } else {
            page_size.min(count)
        };
        let pages = render_pages(count, page_size, 0);
        assert_eq!(pages.len(), count.div_ceil(page_size));
        let generated = (FIXED_TOOLS.len() + 1..=count)
            .map(|position| tool_name(position).into_boxed_str())
            .collect::<HashSet<_>>();
        assert_eq!(generated.len(), count.saturating_sub(FIXED_TOOLS.len()));
        Tools {
            count,
            page_size,
            pages,
            generated: Arc::new(generated),
            revision: 0,
        }
    }

    /// Renders the next revision: the same tools and pages, `echo`'s description naming
    /// the new revision number.
    pub fn revised(&self) -> Tools {
        let revision = self.revision.wrapping_add(1);
        let pages = render_pages(self.count, self.page_size, revision);
        assert_eq!(pages.len(), self.pages.len());
        Tools {
            count: self.count,
            page_size: self.page_size,
            pages,
            generated: Arc::clone(&self.generated),
            revision,
        }
    }

    /// Returns the catalogue's revision (0 at start).
    #[cfg(test)]
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Returns the first page: the tools/list result for a request without a cursor.
    pub fn first_page(&self) -> &Bytes {
        // `new` asserted at least one tool, hence at least one page.
        let first = self.pages.first();
        first.unwrap_or_else(|| unreachable!("a tool list has at least one page"))
    }

    /// Returns the page `cursor` names, or `None` when it is not a cursor this list issued
    /// (wrong prefix, not the canonical decimal, not a page start, or past the end).
    pub fn page(&self, cursor: &str) -> Option<&Bytes> {
        let digits = cursor.strip_prefix(CURSOR_PREFIX)?;
        // Only the exact lexeme a page announced: digits without sign or leading zero, so
        // each page has one cursor ("offset-0" is never announced: page 0 has none).
        if digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let offset: usize = digits.parse().ok()?;
        if !offset.is_multiple_of(self.page_size) {
            return None;
        }
        self.pages.get(offset / self.page_size)
    }

    /// Returns true if `name` is one of the listed tools.
    ///
    /// Called on every tools/call: two string compares for the fixed tools, and one hash
    /// lookup (no allocation) only for other names when the list has generated tools.
    pub fn contains(&self, name: &str) -> bool {
        match name {
            "echo" => true,
            "big" => self.count >= 2,
            _ => !self.generated.is_empty() && self.generated.contains(name),
        }
    }

    /// Returns every page in order.
    #[cfg(test)]
    pub fn pages(&self) -> &[Bytes] {
        &self.pages
    }
}

/// The name of the generated tool at list `position` (from 1; `echo` and `big` hold 1 and
/// 2): `tool_` and the position zero-padded to five digits, so names sort in list order up
/// to 99,999 and are unique at any length.
pub fn tool_name(position: usize) -> String {
    format!("tool_{position:05}")
}

/// Renders every page of `revision` into one buffer and returns each page as a slice of it.
fn render_pages(count: usize, page_size: usize, revision: u64) -> Vec<Bytes> {
    assert!(page_size >= 1);
    let fixed_bytes: usize = FIXED_TOOLS.iter().map(|(_, tool)| tool.len() + 1).sum();
    // Generated tools are about 330 B: reserving 384 a tool renders without regrowing (and
    // copying) a buffer of tens of MB, at the cost of about 50 B a tool left unused.
    let mut out = BytesMut::with_capacity(fixed_bytes + count * (FIXTURE_TOOL_BYTES_MAX * 3 / 4));
    let mut spans: Vec<Range<usize>> = Vec::with_capacity(count.div_ceil(page_size));
    // `step_by` ends the loop after `count.div_ceil(page_size)` pages.
    for first in (0..count).step_by(page_size) {
        let end = count.min(first + page_size);
        let start = out.len();
        out.put_slice(br#"{"tools":["#);
        for index in first..end {
            if index > first {
                out.put_u8(b',');
            }
            put_tool(index, revision, &mut out);
        }
        out.put_u8(b']');
        if end < count {
            // Writing to a `BytesMut` cannot fail: it grows.
            let _ = write!(out, r#","nextCursor":"{CURSOR_PREFIX}{end}""#);
        }
        out.put_u8(b'}');
        spans.push(start..out.len());
    }
    let all = out.freeze();
    spans.into_iter().map(|span| all.slice(span)).collect()
}

/// Appends the tool at list `index` (from 0) as revision `revision` lists it.
fn put_tool(index: usize, revision: u64, out: &mut BytesMut) {
    if index == 0 && revision > 0 {
        let [before, after] = ECHO_REVISED;
        out.put_slice(before.as_bytes());
        // Writing to a `BytesMut` cannot fail: it grows.
        let _ = write!(out, "{revision}");
        out.put_slice(after.as_bytes());
        return;
    }
    if let Some((_, tool)) = FIXED_TOOLS.get(index) {
        out.put_slice(tool.as_bytes());
        return;
    }
    let position = index + 1;
    let (does, schema) = SHAPES[position % SHAPES.len()];
    let start = out.len();
    // Writing to a `BytesMut` cannot fail: it grows.
    let _ = write!(
        out,
        r#"{{"name":"{name}","description":"{does} {position} of the generated catalogue and returns the fixture's payload.","inputSchema":{schema}}}"#,
        name = tool_name(position),
    );
    assert!(out.len() - start <= FIXTURE_TOOL_BYTES_MAX);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn json(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(bytes));
        })
    }

    /// The `tools` array of a page.
    fn tools_of(page: &[u8]) -> Vec<Value> {
        json(page)["tools"].as_array().cloned().unwrap_or_default()
    }

    #[test]
    fn the_default_list_is_the_two_fixed_tools_byte_for_byte() {
        // What tools/list answered before `--tools` existed; perf results compare to it.
        let before = br#"{"tools":[{"name":"echo","description":"Returns the fixture's payload","inputSchema":{"type":"object","properties":{"text":{"type":"string"}}}},{"name":"big","description":"Returns the fixture's payload","inputSchema":{"type":"object","properties":{}}}]}"#;
        let tools = Tools::new(2, 0);
        assert_eq!(tools.pages().len(), 1);
        assert_eq!(tools.first_page().as_ref(), before.as_slice());
        assert!(tools.contains("echo"));
        assert!(tools.contains("big"));
        assert!(!tools.contains("tool_00003"));
    }

    #[test]
    fn a_generated_list_has_n_unique_tools_with_schemas() {
        for count in [1, 3, 1000] {
            let tools = Tools::new(count, 0);
            let list = tools_of(tools.first_page());
            assert_eq!(list.len(), count);
            let names: HashSet<&str> = list.iter().filter_map(|t| t["name"].as_str()).collect();
            assert_eq!(names.len(), count, "names are unique");
            for tool in &list {
                let name = tool["name"].as_str().unwrap_or_default();
                assert!(tools.contains(name), "{name}");
                assert!(tool["description"].is_string(), "{tool}");
                assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
            }
        }
        let list = tools_of(Tools::new(4, 0).first_page());
        let names: Vec<&str> = list.iter().filter_map(|t| t["name"].as_str()).collect();
        assert_eq!(names, ["echo", "big", "tool_00003", "tool_00004"]);
    }

    #[test]
    fn generated_tools_are_realistic_and_about_300_bytes() {
        let tools = Tools::new(3 + 2 * SHAPES.len(), 0);
        for tool in tools_of(tools.first_page()).iter().skip(FIXED_TOOLS.len()) {
            let bytes = tool.to_string().len();
            assert!(
                (250..=FIXTURE_TOOL_BYTES_MAX).contains(&bytes),
                "{bytes}: {tool}"
            );
            let properties = tool["inputSchema"]["properties"].as_object();
            let properties = properties.unwrap_or_else(|| panic!("{tool}"));
            assert!((2..=3).contains(&properties.len()), "{tool}");
            assert!(properties.values().all(|p| p["type"].is_string()), "{tool}");
            let required = tool["inputSchema"]["required"].as_array();
            let required = required.unwrap_or_else(|| panic!("{tool}"));
            assert!(!required.is_empty(), "{tool}");
            for name in required.iter().filter_map(Value::as_str) {
                assert!(properties.contains_key(name), "{name} in {tool}");
            }
        }
    }

    #[test]
    fn pages_concatenate_to_the_whole_list() {
        for (count, page_size) in [(1, 1), (2, 1), (5, 2), (6, 2), (7, 3), (10, 10), (4, 99)] {
            let whole = tools_of(Tools::new(count, 0).first_page());
            let tools = Tools::new(count, page_size);
            let pages = tools.pages();
            assert_eq!(pages.len(), count.div_ceil(page_size.min(count)));
            let mut joined = Vec::new();
            let mut page = tools.first_page().clone();
            // Follows nextCursor as a client would; each step moves one page forward.
            for index in 0..pages.len() {
                assert_eq!(Some(&page), pages.get(index), "{count}/{page_size}");
                let v = json(&page);
                joined.extend(tools_of(&page));
                let Some(cursor) = v["nextCursor"].as_str() else {
                    assert_eq!(index + 1, pages.len(), "only the last page has no cursor");
                    break;
                };
                page = tools
                    .page(cursor)
                    .cloned()
                    .unwrap_or_else(|| panic!("{cursor}"));
            }
            assert_eq!(joined, whole, "{count}/{page_size}");
            let last = pages.last().map(|p| json(p)).unwrap_or_default();
            assert!(last.get("nextCursor").is_none(), "{last}");
        }
    }

    #[test]
    fn a_page_announces_the_offset_of_the_next() {
        let tools = Tools::new(5, 2);
        let first = String::from_utf8_lossy(tools.first_page()).into_owned();
        assert!(first.starts_with(r#"{"tools":[{"name":"echo","#), "{first}");
        assert!(first.ends_with(r#"}],"nextCursor":"offset-2"}"#), "{first}");
    }

    #[test]
    fn only_issued_cursors_name_a_page() {
        let tools = Tools::new(6, 2);
        assert_eq!(tools.page("offset-2"), tools.pages().get(1));
        assert_eq!(tools.page("offset-4"), tools.pages().get(2));
        for bad in [
            "",
            "offset-",
            "offset-0",
            "offset-02",
            "offset-+2",
            "offset--2",
            "offset-3",
            "offset-6",
            "offset-99999999999999999999999",
            "2",
            "page-2",
            " offset-2",
        ] {
            assert_eq!(tools.page(bad), None, "{bad:?}");
        }
        // Unpaginated: no cursor was ever issued.
        assert_eq!(Tools::new(6, 0).page("offset-2"), None);
    }

    #[test]
    fn only_listed_names_are_tools() {
        let one = Tools::new(1, 0);
        assert!(one.contains("echo"));
        assert!(!one.contains("big"));
        let five = Tools::new(5, 0);
        for name in ["echo", "big", "tool_00003", "tool_00005"] {
            assert!(five.contains(name), "{name}");
        }
        for name in [
            "",
            "Echo",
            "tool_00006",
            "tool_00002",
            "tool_3",
            "tool_000003",
        ] {
            assert!(!five.contains(name), "{name}");
        }
    }

    #[test]
    fn a_revision_changes_echo_alone_and_keeps_names_and_cursors() {
        let first = Tools::new(7, 3);
        assert_eq!(first.revision(), 0);
        let second = first.revised();
        let third = second.revised();
        assert_eq!((second.revision(), third.revision()), (1, 2));
        for (tools, revision) in [(&second, 1), (&third, 2)] {
            assert_eq!(tools.pages().len(), first.pages().len());
            let mut page = tools.first_page().clone();
            let echo = tools_of(&page)[0].clone();
            let before = tools_of(first.first_page())[0].clone();
            assert_eq!(echo["name"], "echo");
            assert_eq!(echo["inputSchema"], before["inputSchema"]);
            assert_eq!(
                echo["description"],
                format!("Returns the fixture's payload (revision {revision})")
            );
            // Every other tool, page and cursor is as in revision 0.
            assert_eq!(tools_of(&page)[1..], tools_of(first.first_page())[1..]);
            assert_eq!(tools.pages()[1..], first.pages()[1..]);
            let cursor = json(&page)["nextCursor"].as_str().map(str::to_owned);
            page = cursor
                .and_then(|c| tools.page(&c).cloned())
                .unwrap_or_else(|| panic!("the first page's cursor"));
            assert_eq!(Some(&page), first.pages().get(1));
            assert!(tools.contains("tool_00007") && !tools.contains("tool_00008"));
        }
        assert_ne!(second.first_page(), third.first_page());
    }

    #[test]
    fn names_widen_past_five_digits() {
        assert_eq!(tool_name(3), "tool_00003");
        assert_eq!(tool_name(99_999), "tool_99999");
        assert_eq!(tool_name(FIXTURE_TOOLS_MAX), "tool_200000");
    }
}
