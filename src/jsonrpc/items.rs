//! Streaming rewrite of MCP list results: the items of an upstream `tools/list`,
//! `prompts/list`, `resources/list` or `resources/templates/list` result are renamed with a
//! route prefix, filtered by the route's allow-list and handed on as zero-copy slices of the
//! pieces they arrived in; a `resources/read` result passes through with its URIs prefixed.
//!
//! Why this exists: the proxy binding merges the lists of several upstream servers (routes)
//! into one, following each upstream's `nextCursor` pages, and a list may hold 100,000 items.
//! Parsing it into a tree would cost memory in proportion to the list and copy every byte.
//! An [`ItemRewriter`] is sans-IO, like its sibling [`super::ResultScanner`]: it takes the raw
//! `result` value of one upstream answer piece by piece, split anywhere (one byte at a time is
//! fine), and never holds more than one item.
//!
//! Flow (list merge, [`ItemMode::Items`]): for each route and page, the `result` slices (from
//! [`super::ScanEvent::Result`]) → [`ItemRewriter::feed`] → complete, renamed, admitted items
//! appended to a shared [`ItemSink`] as `,`-separated parts → [`ItemRewriter::finish`] gives
//! the page's raw `nextCursor`. The caller writes `{"tools":[`, the sink's parts as they come,
//! and `]` plus its own cursor. Flow (`resources/read`, [`ItemMode::Document`]): every byte of
//! the result goes to the sink as it arrives, with the prefix inserted into each
//! `contents[i].uri`.
//!
//! An item is one element of the `array` member of the result object; counting the result
//! object as depth 1 and the array as depth 2, an item's own members, the key among them, are
//! at depth 3. The prefix goes right after the opening quote of the key's string value,
//! before its raw bytes, so `"se\u0061rch"` becomes `"github__se\u0061rch"` and decodes to
//! `github__search`. Same-named members deeper in the item (inside `inputSchema`, say) are
//! not touched.
//!
//! Items mode holds each item (as slices plus the prefix) until it closes, so an upstream
//! whose answer breaks mid-item never leaves half an item in the merged list; items completed
//! before an error do stay in the sink, and the caller decides what a failed page means.
//! Document mode holds nothing: after an error the parts already in the sink are not a
//! complete document and must not be sent as one.
//!
//! What is checked is what [`super::ResultScanner`] checks (RFC 8259 syntax, nesting up to
//! [`SCAN_DEPTH_MAX`], nothing but whitespace after the object), plus: the `array` member, if
//! present, is an array and appears once; in Items mode `nextCursor` appears once and is a
//! string or `null`. An item that is not an object, lacks the key, has it twice, has a
//! non-string, non-UTF-8 (lone surrogate) or over-long value for it, is refused by the
//! allow-list or outgrows [`LIST_ITEM_BYTES_MAX`] is dropped and counted, not an error.

use std::fmt;

use bytes::{Bytes, BytesMut};

use super::scan::{
    LiteralRun, Nesting, Num, NumStep, SCAN_DEPTH_MAX, escaped_byte, hex_digit, hex4, literal_run,
    plain_run,
};
use crate::limits::{LIST_CURSOR_BYTES_MAX, LIST_ITEM_BYTES_MAX, LIST_KEY_BYTES_MAX};
use crate::stream::pieces;

/// Longest decoded member name compared against the rules' `array` and `key` and against
/// `nextCursor`; a longer name is none of them and is skipped without being kept.
const NAME_BYTES_MAX: usize = 32;

/// The top-level member whose string value continues the list on its next page.
const CURSOR: &[u8] = b"nextCursor";

/// What separates two items in the sink.
const COMMA: Bytes = Bytes::from_static(b",");

/// Depth of the list's items: the result object is 1, the array 2.
const ITEM_DEPTH: usize = 2;

/// Depth of an item's members, the key among them.
const FIELD_DEPTH: usize = 3;

const _: () = assert!(NAME_BYTES_MAX >= "resourceTemplates".len());
const _: () = assert!(NAME_BYTES_MAX >= CURSOR.len());
const _: () = assert!(FIELD_DEPTH < SCAN_DEPTH_MAX);

/// What to rewrite: which array of the result holds the items, which member of an item gets
/// the prefix, and the prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemRules {
    /// The top-level member holding the items: `tools`, `prompts`, `resources`,
    /// `resourceTemplates` or `contents`. ASCII, 1 to 32 bytes.
    pub array: &'static [u8],
    /// The member of each item whose string value gets the prefix: `name`, `uri` or
    /// `uriTemplate`. ASCII, 1 to 32 bytes.
    pub key: &'static [u8],
    /// Bytes inserted right after the opening quote of the key's string value, e.g.
    /// `github__`. Printable ASCII without `"` or `\`, so the string stays valid JSON with the
    /// same escapes; may be empty.
    pub prefix: Bytes,
}

impl ItemRules {
    /// `tools/list`: each `tools[i].name` gets `prefix`.
    pub fn tools(prefix: Bytes) -> Self {
        ItemRules {
            array: b"tools",
            key: b"name",
            prefix,
        }
    }

    /// `prompts/list`: each `prompts[i].name` gets `prefix`.
    pub fn prompts(prefix: Bytes) -> Self {
        ItemRules {
            array: b"prompts",
            key: b"name",
            prefix,
        }
    }

    /// `resources/list`: each `resources[i].uri` gets `prefix`.
    pub fn resources(prefix: Bytes) -> Self {
        ItemRules {
            array: b"resources",
            key: b"uri",
            prefix,
        }
    }

    /// `resources/templates/list`: each `resourceTemplates[i].uriTemplate` gets `prefix`.
    pub fn resource_templates(prefix: Bytes) -> Self {
        ItemRules {
            array: b"resourceTemplates",
            key: b"uriTemplate",
            prefix,
        }
    }

    /// `resources/read` (with [`ItemMode::Document`]): each `contents[i].uri` gets `prefix`.
    pub fn contents(prefix: Bytes) -> Self {
        ItemRules {
            array: b"contents",
            key: b"uri",
            prefix,
        }
    }
}

/// What an [`ItemRewriter`] hands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemMode {
    /// List merge: only items go to the sink, each complete, renamed and admitted, preceded
    /// by `,` unless it is the first item in the sink. Every other top-level member is
    /// validated and skipped, except `nextCursor`, whose raw lexeme [`ItemRewriter::finish`]
    /// returns.
    Items,
    /// Whole document: every byte goes to the sink as it arrives, with the prefix inserted
    /// into each item's string key (every occurrence, should an item repeat it). Nothing is
    /// held back, filtered or counted, and `nextCursor` is an ordinary member.
    Document,
}

/// Where rewritten output goes; one sink can take the items of several rewriters (routes
/// and pages merged into one list).
#[derive(Debug, Default)]
pub struct ItemSink {
    /// The output so far, in order. Parts are slices of the pieces fed, the prefix, or `,`.
    /// The caller may take them at any time (items already handed on count in `items`).
    pub parts: Vec<Bytes>,
    /// Items written to `parts` (Items mode), across every rewriter that used this sink.
    pub items: u64,
    /// Items dropped (Items mode): not objects, no single string key, refused by the
    /// allow-list, or too large.
    pub dropped: u64,
}

impl ItemSink {
    /// Returns an empty sink.
    pub fn new() -> Self {
        ItemSink::default()
    }
}

/// Why a result is not one acceptable list (or `resources/read`) document. Once returned,
/// every later `feed` or `finish` returns the same error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemError {
    /// The bytes are not JSON; the text says what was expected where the scan stopped.
    NotJson(&'static str),
    /// The result ended before the top-level object closed.
    Truncated,
    /// Non-whitespace after the top-level object.
    Trailing,
    /// Arrays and objects nest deeper than [`SCAN_DEPTH_MAX`].
    TooDeep,
    /// A member the rewriter acts on (named here) appears twice, so its meaning is ambiguous.
    Duplicate(&'static str),
    /// The member that should hold the items is not an array.
    NotAnArray,
    /// The `nextCursor` lexeme is longer than [`LIST_CURSOR_BYTES_MAX`].
    CursorTooLarge,
    /// The `nextCursor` value is not a string or `null` (MCP: cursors are opaque strings).
    BadCursor,
}

impl fmt::Display for ItemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ItemError::NotJson(expected) => write!(f, "list result is not JSON: {expected}"),
            ItemError::Truncated => f.write_str("list result ended inside the JSON document"),
            ItemError::Trailing => f.write_str("list result has bytes after the JSON document"),
            ItemError::TooDeep => f.write_str("list result JSON nests too deep"),
            ItemError::Duplicate(name) => {
                write!(f, "list result has a duplicate `{name}` member")
            }
            ItemError::NotAnArray => f.write_str("list result items are not an array"),
            ItemError::CursorTooLarge => f.write_str("list result cursor exceeds the size limit"),
            ItemError::BadCursor => f.write_str("list result cursor is not a string or null"),
        }
    }
}

impl std::error::Error for ItemError {}

/// Where the scan is, between two bytes (as in [`super::ResultScanner`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before the top-level `{`.
    Doc,
    /// Just after `{`: a name or `}`.
    NameOrClose,
    /// After `,` in an object: a name.
    Name,
    /// After a name: `:`.
    Colon,
    /// Just after `[`: a value or `]`.
    ValueOrClose,
    /// After `:` or after `,` in an array: a value.
    Value,
    /// After a value inside a container: `,` or the container's closing bracket.
    CommaOrClose,
    /// Inside a string.
    Str(Text),
    /// After a backslash inside a string.
    Escape(Text),
    /// Inside `\uXXXX`: `left` hex digits to go, `code` the digits so far.
    Unicode { text: Text, left: u8, code: u16 },
    /// Inside a number.
    Number(Num),
    /// Inside `true`, `false` or `null`. Invariant: the rest is never empty.
    Literal(&'static [u8]),
    /// After the top-level `}`: whitespace only.
    End,
}

impl State {
    /// Between tokens: the states [`ItemRewriter::on_structure`] handles.
    fn is_structural(self) -> bool {
        matches!(
            self,
            State::Doc
                | State::NameOrClose
                | State::Name
                | State::Colon
                | State::ValueOrClose
                | State::Value
                | State::CommaOrClose
                | State::End
        )
    }
}

/// What a string is, which decides what is decoded and what happens at its closing quote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Text {
    /// A value that is not an item's key: skipped.
    Value,
    /// A name nobody acts on: skipped.
    Name,
    /// A name of the top-level object: decoded into `name` to pick the [`Member`].
    Member,
    /// A name of an open item: decoded into `name` to find the key.
    Field,
    /// The key's value in an open item (Items mode): decoded into `key` for the allow-list.
    Key,
}

/// The top-level member whose value is being scanned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Member {
    /// The rules' `array`: its elements are the items.
    Array,
    /// `nextCursor` (Items mode): kept raw.
    Cursor,
    /// Anything else: validated; passed on in Document mode, skipped in Items mode.
    Other,
}

/// The list item being scanned: a value at [`ITEM_DEPTH`] inside the `array` member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Item {
    /// Not inside an item, or inside one that passes unchanged (Document mode, not an object).
    None,
    /// Inside an object item: its members are matched against the key. Items mode holds it.
    Open,
    /// Items mode: the item was dropped (and counted); the rest of it is skipped.
    Dropped,
}

/// Per-`feed` context: the piece, the start of its bytes not yet dealt with, the caller's
/// allow-list and sink.
struct Cx<'a> {
    piece: &'a Bytes,
    /// Offset in `piece` where the bytes not yet emitted, held or kept begin. Invariant:
    /// `Some` exactly while [`ItemRewriter::marking`].
    mark: Option<usize>,
    admit: &'a mut dyn FnMut(&str) -> bool,
    out: &'a mut ItemSink,
}

/// An incremental rewriter for one list (or `resources/read`) result; see the module docs.
#[derive(Debug)]
pub struct ItemRewriter {
    rules: ItemRules,
    mode: ItemMode,
    state: State,
    /// Arrays and objects open. Invariant: depth `> 0` between `Doc` and `End`, 0 in them.
    nest: Nesting,
    /// The member named last at depth 1; reset to `Other` when its value ends.
    member: Member,
    /// The `nextCursor` value has begun and not yet ended.
    capturing: bool,
    /// The decoded member or field name read so far. Invariant: `name_len <= NAME_BYTES_MAX`.
    name: [u8; NAME_BYTES_MAX],
    name_len: usize,
    /// The name outgrew `name` or decoded to non-ASCII, so it is none the rewriter acts on.
    name_other: bool,
    seen_array: bool,
    seen_cursor: bool,
    /// Bytes of a `nextCursor` value that began in an earlier piece.
    /// Invariant: `cursor_held.len() <= LIST_CURSOR_BYTES_MAX`.
    cursor_held: BytesMut,
    /// The raw `nextCursor` string lexeme, once its value has ended (`None` for `null`).
    cursor: Option<Bytes>,
    item: Item,
    /// The open item has had its key member.
    key_seen: bool,
    /// The open item's last name was the key, whose value comes next.
    at_key: bool,
    /// The key value decoded so far (Items mode). Invariant: `key.len() <= LIST_KEY_BYTES_MAX`.
    key: Vec<u8>,
    /// The key value outgrew `key` or is not valid UTF-16 (a lone surrogate escape).
    key_bad: bool,
    /// A high surrogate escape waiting for its low half.
    key_high: Option<u16>,
    /// The open item's bytes so far (Items mode): slices and the prefix, small ones joined
    /// ([`pieces::keep`]).
    held: Vec<Bytes>,
    /// Invariant: `held_len` is the sum of `held`'s lengths and `<= LIST_ITEM_BYTES_MAX`.
    held_len: usize,
    failed: Option<ItemError>,
}

impl ItemRewriter {
    /// Returns a rewriter waiting for the first byte of a result.
    ///
    /// The rules come from the gateway's own tables and validated configuration; names that
    /// do not fit [`ItemRules`]'s documented shape are a bug and fail an assertion.
    pub fn new(rules: ItemRules, mode: ItemMode) -> Self {
        for name in [rules.array, rules.key] {
            assert!(!name.is_empty());
            assert!(name.len() <= NAME_BYTES_MAX);
            assert!(name.is_ascii());
        }
        assert!(rules.prefix.iter().all(|&b| is_prefix_byte(b)));
        ItemRewriter {
            rules,
            mode,
            state: State::Doc,
            nest: Nesting::default(),
            member: Member::Other,
            capturing: false,
            name: [0; NAME_BYTES_MAX],
            name_len: 0,
            name_other: false,
            seen_array: false,
            seen_cursor: false,
            cursor_held: BytesMut::new(),
            cursor: None,
            item: Item::None,
            key_seen: false,
            at_key: false,
            key: Vec::new(),
            key_bad: false,
            key_high: None,
            held: Vec::new(),
            held_len: 0,
            failed: None,
        }
    }

    /// Rewrites one piece of the result, appending what it completes to `out`.
    ///
    /// `admit` gets the decoded key value of each item (escapes resolved, prefix not
    /// included) as soon as that value closes, and returns false to drop the item; it is
    /// called only in Items mode. Returns an error when the bytes so far cannot start an
    /// acceptable document; what was appended before the error stays in `out` (see the
    /// module docs). Empty pieces are fine.
    pub fn feed(
        &mut self,
        piece: Bytes,
        admit: &mut dyn FnMut(&str) -> bool,
        out: &mut ItemSink,
    ) -> Result<(), ItemError> {
        if let Some(failed) = self.failed {
            return Err(failed);
        }
        let scanned = self.scan(&piece, admit, out);
        if let Err(e) = scanned {
            self.fail(e);
        }
        scanned
    }

    /// Ends the result: returns the raw `nextCursor` string lexeme (quotes and escapes as
    /// they arrived, e.g. `"abc"`; `None` when absent, `null`, or in Document mode) when the
    /// document was complete, and [`ItemError::Truncated`] otherwise, in which case an item
    /// still held is discarded. Calling it again gives the same answer.
    pub fn finish(&mut self) -> Result<Option<Bytes>, ItemError> {
        if let Some(failed) = self.failed {
            return Err(failed);
        }
        if self.state == State::End {
            return Ok(self.cursor.clone());
        }
        self.fail(ItemError::Truncated);
        Err(ItemError::Truncated)
    }

    /// Returns true once the top-level object has closed.
    pub fn is_done(&self) -> bool {
        self.state == State::End
    }

    /// Returns the bytes held between pieces: the open item's parts (the prefix included),
    /// its decoded key, and a `nextCursor` lexeme that spans pieces. Bounded by one item.
    pub fn held_bytes(&self) -> usize {
        self.held_len + self.key.len() + self.cursor_held.len()
    }

    /// Records the error every later call returns, and lets go of what was held.
    fn fail(&mut self, e: ItemError) {
        self.failed = Some(e);
        self.held.clear();
        self.held_len = 0;
        self.key.clear();
        self.cursor_held.clear();
        self.cursor = None;
    }

    /// True while bytes of the current piece must be accounted for at its end: all of them
    /// in Document mode, those of an open item (Items mode) or of the cursor value.
    fn marking(&self) -> bool {
        self.mode == ItemMode::Document || self.capturing || self.item == Item::Open
    }

    /// Runs the state machine over one piece, then accounts for the piece's bytes still
    /// marked (emitted, held or kept) before the piece goes back to the caller.
    fn scan(
        &mut self,
        piece: &Bytes,
        admit: &mut dyn FnMut(&str) -> bool,
        out: &mut ItemSink,
    ) -> Result<(), ItemError> {
        let bytes: &[u8] = piece;
        let mut cx = Cx {
            piece,
            mark: self.marking().then_some(0),
            admit,
            out,
        };
        let mut at = 0;
        // Every handler consumes at least one byte, so this runs at most `bytes.len()` times;
        // handlers consume whole runs, so it runs about once per token (see scan.rs).
        while let Some(&b) = bytes.get(at) {
            let next = match self.state {
                State::Str(text) => self.on_string(&mut cx, at, text)?,
                State::Escape(text) => self.on_escape(at, b, text)?,
                State::Unicode { text, left, code } => self.on_unicode(at, b, text, left, code)?,
                State::Number(num) => self.on_number(&mut cx, at, num)?,
                State::Literal(rest) => self.on_literal(&mut cx, at, rest)?,
                _ => self.on_structure(&mut cx, at)?,
            };
            debug_assert!(next > at);
            at = next;
        }
        assert_eq!(cx.mark.is_some(), self.marking());
        if let Some(from) = cx.mark {
            self.flush(&mut cx, from)?;
        }
        Ok(())
    }

    /// The piece ended with `piece[from..]` not yet accounted for.
    fn flush(&mut self, cx: &mut Cx<'_>, from: usize) -> Result<(), ItemError> {
        let to = cx.piece.len();
        if self.mode == ItemMode::Document {
            emit(cx, from, to);
        } else if self.capturing {
            self.keep_cursor(cx.piece, from, to, false)?;
        } else {
            let part = cx.piece.slice(from..to);
            self.hold(cx, part);
        }
        Ok(())
    }

    /// Whitespace and punctuation between tokens, up to and including the first byte of a
    /// string, number or literal (or the end of the piece). Returns the offset after the last
    /// byte consumed; consumes at least one byte when `at` is inside the piece.
    fn on_structure(&mut self, cx: &mut Cx<'_>, mut at: usize) -> Result<usize, ItemError> {
        let bytes: &[u8] = cx.piece;
        while let Some(&b) = bytes.get(at) {
            if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                self.on_punctuation(cx, at, b)?;
            }
            at += 1;
            if !self.state.is_structural() {
                break;
            }
        }
        Ok(at)
    }

    /// One non-whitespace byte between tokens, or the first byte of a value.
    fn on_punctuation(&mut self, cx: &mut Cx<'_>, at: usize, b: u8) -> Result<(), ItemError> {
        match self.state {
            State::Value | State::ValueOrClose => {
                if b == b']' && self.state == State::ValueOrClose {
                    self.close(cx, at)?;
                } else {
                    self.begin_value(cx, at, b)?;
                }
            }
            State::Colon => {
                if b != b':' {
                    return Err(ItemError::NotJson("expected ':'"));
                }
                self.state = State::Value;
            }
            State::CommaOrClose => {
                let array = self.top_is_array();
                match b {
                    b',' if array => self.state = State::Value,
                    b',' => self.state = State::Name,
                    b']' if array => self.close(cx, at)?,
                    b'}' if !array => self.close(cx, at)?,
                    _ => return Err(ItemError::NotJson("expected ',' or a closing bracket")),
                }
            }
            State::Name | State::NameOrClose => match b {
                b'"' => self.begin_name(),
                b'}' if self.state == State::NameOrClose => self.close(cx, at)?,
                _ => return Err(ItemError::NotJson("expected a member name")),
            },
            State::Doc => {
                if b != b'{' {
                    return Err(ItemError::NotJson("the document must be an object"));
                }
                self.push(false)?;
                self.state = State::NameOrClose;
            }
            State::End => return Err(ItemError::Trailing),
            State::Str(_)
            | State::Escape(_)
            | State::Unicode { .. }
            | State::Number(_)
            | State::Literal(_) => unreachable!("on_structure stops at the first byte of a token"),
        }
        Ok(())
    }

    /// The first byte of a value at `at`.
    fn begin_value(&mut self, cx: &mut Cx<'_>, at: usize, b: u8) -> Result<(), ItemError> {
        let mut text = Text::Value;
        match self.nest.depth() {
            1 => self.begin_member_value(cx, at, b)?,
            ITEM_DEPTH if self.member == Member::Array => self.begin_item(cx, at, b),
            FIELD_DEPTH if self.at_key => text = self.begin_key(cx, at, b),
            _ => {}
        }
        self.state = match b {
            b'{' => {
                self.push(false)?;
                State::NameOrClose
            }
            b'[' => {
                self.push(true)?;
                State::ValueOrClose
            }
            b'"' => State::Str(text),
            b'-' => State::Number(Num::Minus),
            b'0' => State::Number(Num::Zero),
            b'1'..=b'9' => State::Number(Num::Int),
            b't' => State::Literal(b"rue"),
            b'f' => State::Literal(b"alse"),
            b'n' => State::Literal(b"ull"),
            _ => return Err(ItemError::NotJson("expected a value")),
        };
        Ok(())
    }

    /// A value of the top-level object begins at `at`: check the members acted on, and start
    /// keeping the cursor.
    fn begin_member_value(&mut self, cx: &mut Cx<'_>, at: usize, b: u8) -> Result<(), ItemError> {
        match self.member {
            Member::Array if b != b'[' => Err(ItemError::NotAnArray),
            Member::Cursor if b != b'"' && b != b'n' => Err(ItemError::BadCursor),
            Member::Cursor => {
                assert!(!self.capturing);
                assert!(cx.mark.is_none());
                self.capturing = true;
                cx.mark = Some(at);
                Ok(())
            }
            Member::Array | Member::Other => Ok(()),
        }
    }

    /// An item begins at `at`. Only an object can carry the key; in Items mode anything else
    /// is dropped at once, in Document mode it passes unchanged.
    fn begin_item(&mut self, cx: &mut Cx<'_>, at: usize, b: u8) {
        assert_eq!(self.item, Item::None);
        self.key_seen = false;
        self.at_key = false;
        match (b, self.mode) {
            (b'{', ItemMode::Items) => {
                assert!(cx.mark.is_none());
                assert!(self.held.is_empty());
                assert_eq!(self.held_len, 0);
                self.item = Item::Open;
                cx.mark = Some(at);
            }
            (b'{', ItemMode::Document) => self.item = Item::Open,
            (_, ItemMode::Items) => {
                self.item = Item::Dropped;
                cx.out.dropped += 1;
            }
            (_, ItemMode::Document) => {}
        }
    }

    /// The value of an open item's key begins at `at`: a string gets the prefix (and, in
    /// Items mode, is decoded); anything else drops the item in Items mode. Returns what the
    /// string, if it is one, is.
    fn begin_key(&mut self, cx: &mut Cx<'_>, at: usize, b: u8) -> Text {
        self.at_key = false;
        if self.item != Item::Open {
            return Text::Value;
        }
        if b != b'"' {
            if self.mode == ItemMode::Items {
                self.drop_item(cx);
            }
            return Text::Value;
        }
        self.insert_prefix(cx, at + 1);
        if self.mode == ItemMode::Document || self.item != Item::Open {
            return Text::Value;
        }
        assert!(self.key.is_empty());
        self.key_bad = false;
        self.key_high = None;
        Text::Key
    }

    /// Puts the prefix before `piece[at]`, the first byte of the key's string content.
    fn insert_prefix(&mut self, cx: &mut Cx<'_>, at: usize) {
        if self.rules.prefix.is_empty() {
            return;
        }
        let Some(from) = cx.mark else {
            unreachable!("an open item is marked in both modes");
        };
        let prefix = self.rules.prefix.clone();
        if self.mode == ItemMode::Document {
            emit(cx, from, at);
            cx.out.parts.push(prefix);
        } else {
            let head = cx.piece.slice(from..at);
            if !self.hold(cx, head) || !self.hold(cx, prefix) {
                return;
            }
        }
        cx.mark = Some(at);
    }

    /// A value ended just before `end`; what follows is `,` or a closing bracket.
    #[inline(always)]
    fn end_value(&mut self, cx: &mut Cx<'_>, end: usize) -> Result<(), ItemError> {
        assert!(self.nest.depth() >= 1);
        self.state = State::CommaOrClose;
        // Most values are inside items, where nothing happens at their end: that test is
        // inlined into every caller, the rest is not.
        if self.nest.depth() > ITEM_DEPTH {
            return Ok(());
        }
        self.end_outer_value(cx, end)
    }

    /// A top-level member's value or an item ended just before `end`.
    fn end_outer_value(&mut self, cx: &mut Cx<'_>, end: usize) -> Result<(), ItemError> {
        match self.nest.depth() {
            1 => self.end_member(cx, end),
            ITEM_DEPTH if self.member == Member::Array => {
                self.end_item(cx, end);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A top-level member's value ended just before `end`.
    fn end_member(&mut self, cx: &mut Cx<'_>, end: usize) -> Result<(), ItemError> {
        if self.capturing {
            self.capturing = false;
            let Some(from) = cx.mark.take() else {
                unreachable!("the cursor value is marked while it is captured");
            };
            self.keep_cursor(cx.piece, from, end, true)?;
        }
        self.member = Member::Other;
        Ok(())
    }

    /// An item ended just before `end`. In Items mode an open item is complete: it goes to
    /// the sink if it had its key and fits, and is dropped otherwise.
    fn end_item(&mut self, cx: &mut Cx<'_>, end: usize) {
        if self.item == Item::Open && self.mode == ItemMode::Items {
            let Some(from) = cx.mark else {
                unreachable!("an open item is marked in Items mode");
            };
            let tail = cx.piece.slice(from..end);
            if !self.key_seen {
                self.drop_item(cx);
            } else if self.hold(cx, tail) {
                self.emit_item(cx);
            }
        }
        self.item = Item::None;
    }

    /// Adds `part` to the open item (Items mode), or drops the item when that would take it
    /// past [`LIST_ITEM_BYTES_MAX`]. Returns true when the item is still open.
    fn hold(&mut self, cx: &mut Cx<'_>, part: Bytes) -> bool {
        assert_eq!(self.mode, ItemMode::Items);
        assert_eq!(self.item, Item::Open);
        if self.held_len + part.len() > LIST_ITEM_BYTES_MAX {
            self.drop_item(cx);
            return false;
        }
        self.held_len += part.len();
        let kept = self.held.len();
        if let Some(part) = pieces::keep(kept, self.held.last_mut(), part) {
            self.held.push(part);
        }
        assert!(self.held_len <= LIST_ITEM_BYTES_MAX);
        true
    }

    /// Hands the held, complete item to the sink.
    fn emit_item(&mut self, cx: &mut Cx<'_>) {
        assert_eq!(self.item, Item::Open);
        assert!(self.key_seen);
        cx.mark = None;
        if cx.out.items > 0 {
            cx.out.parts.push(COMMA);
        }
        cx.out.parts.append(&mut self.held);
        self.held_len = 0;
        cx.out.items += 1;
        self.item = Item::None;
    }

    /// Drops the open item (Items mode): what was held goes, the rest is skipped.
    fn drop_item(&mut self, cx: &mut Cx<'_>) {
        assert_eq!(self.mode, ItemMode::Items);
        assert_eq!(self.item, Item::Open);
        self.held.clear();
        self.held_len = 0;
        self.key.clear();
        cx.mark = None;
        cx.out.dropped += 1;
        self.item = Item::Dropped;
    }

    /// Keeps `piece[from..to]` of the cursor value; `last` when the value ends at `to`.
    fn keep_cursor(
        &mut self,
        piece: &Bytes,
        from: usize,
        to: usize,
        last: bool,
    ) -> Result<(), ItemError> {
        assert!(from <= to);
        assert!(to <= piece.len());
        if self.cursor_held.len() + (to - from) > LIST_CURSOR_BYTES_MAX {
            return Err(ItemError::CursorTooLarge);
        }
        let part = piece.slice(from..to);
        if !last {
            self.cursor_held.extend_from_slice(&part);
            assert!(self.cursor_held.len() <= LIST_CURSOR_BYTES_MAX);
            return Ok(());
        }
        // A cursor that arrived in one piece is sliced, not copied.
        let raw = if self.cursor_held.is_empty() {
            part
        } else {
            self.cursor_held.extend_from_slice(&part);
            std::mem::take(&mut self.cursor_held).freeze()
        };
        // The value was checked to start like a string or `null`.
        self.cursor = (raw.first() != Some(&b'n')).then_some(raw);
        Ok(())
    }

    /// Inside a string at `at`: skips plain bytes in bulk (decoding them when the string is
    /// a name or key acted on), decodes short escapes in place, and at the closing quote goes
    /// on to the punctuation after the string. A `\u` escape cut by the end of the piece goes
    /// back to the dispatcher a byte at a time.
    fn on_string(
        &mut self,
        cx: &mut Cx<'_>,
        mut at: usize,
        text: Text,
    ) -> Result<usize, ItemError> {
        let bytes: &[u8] = cx.piece;
        // Each turn consumes at least two bytes or returns, so the loop is bounded by the piece.
        loop {
            let rest = bytes.get(at..).unwrap_or_default();
            let run = plain_run(rest);
            if !matches!(text, Text::Value | Text::Name) {
                self.decoded(text, rest.get(..run).unwrap_or_default());
            }
            at += run;
            match bytes.get(at) {
                None => return Ok(at),
                Some(b'"') => {
                    self.string_closed(cx, at, text)?;
                    return self.on_structure(cx, at + 1);
                }
                Some(b'\\') => match bytes.get(at + 1) {
                    Some(b'u') => match bytes.get(at + 2..).and_then(<[u8]>::first_chunk::<4>) {
                        // The whole `\uXXXX` is in this piece: decoded here, not digit by digit.
                        Some(hex) => {
                            let code = hex4(hex)
                                .ok_or(ItemError::NotJson("invalid \\u escape in a string"))?;
                            self.unicode_decoded(text, code);
                            at += 6;
                        }
                        None => {
                            self.state = State::Escape(text);
                            return Ok(at + 1);
                        }
                    },
                    Some(&escaped) => at = self.on_escape(at + 1, escaped, text)?,
                    None => {
                        self.state = State::Escape(text);
                        return Ok(at + 1);
                    }
                },
                Some(_) => return Err(ItemError::NotJson("raw control character in a string")),
            }
        }
    }

    /// The closing quote of a string at `at`.
    fn string_closed(&mut self, cx: &mut Cx<'_>, at: usize, text: Text) -> Result<(), ItemError> {
        match text {
            Text::Value => self.end_value(cx, at + 1)?,
            Text::Name => self.state = State::Colon,
            Text::Member => {
                self.member_named()?;
                self.state = State::Colon;
            }
            Text::Field => {
                self.field_named(cx);
                self.state = State::Colon;
            }
            Text::Key => {
                self.key_closed(cx);
                self.end_value(cx, at + 1)?;
            }
        }
        Ok(())
    }

    /// The byte after a backslash (RFC 8259 §7).
    fn on_escape(&mut self, at: usize, b: u8, text: Text) -> Result<usize, ItemError> {
        if b == b'u' {
            self.state = State::Unicode {
                text,
                left: 4,
                code: 0,
            };
            return Ok(at + 1);
        }
        let decoded = escaped_byte(b).ok_or(ItemError::NotJson("invalid escape in a string"))?;
        self.decoded(text, &[decoded]);
        self.state = State::Str(text);
        Ok(at + 1)
    }

    /// One hex digit of `\uXXXX`.
    fn on_unicode(
        &mut self,
        at: usize,
        b: u8,
        text: Text,
        left: u8,
        code: u16,
    ) -> Result<usize, ItemError> {
        assert!((1..=4).contains(&left));
        let Some(digit) = hex_digit(b) else {
            return Err(ItemError::NotJson("invalid \\u escape in a string"));
        };
        let code = (code << 4) | u16::from(digit);
        if left > 1 {
            self.state = State::Unicode {
                text,
                left: left - 1,
                code,
            };
            return Ok(at + 1);
        }
        self.unicode_decoded(text, code);
        Ok(at + 1)
    }

    /// Decoded bytes (plain or from a short escape) of a string acted on.
    fn decoded(&mut self, text: Text, decoded: &[u8]) {
        match text {
            Text::Member | Text::Field => self.name_push(decoded),
            Text::Key => self.key_push(decoded),
            Text::Value | Text::Name => {}
        }
    }

    /// A `\uXXXX` escape decoded to `code`: the string goes on.
    fn unicode_decoded(&mut self, text: Text, code: u16) {
        match text {
            // The names acted on are ASCII; anything else (surrogates included) is none of them.
            Text::Member | Text::Field => match u8::try_from(code) {
                Ok(ascii) if ascii.is_ascii() => self.name_push(&[ascii]),
                _ => self.name_other = true,
            },
            Text::Key => self.key_unicode(code),
            Text::Value | Text::Name => {}
        }
        self.state = State::Str(text);
    }

    /// The bytes of a number from `at`; the first byte that cannot continue it ends the number
    /// and is then read as the punctuation after a value.
    fn on_number(
        &mut self,
        cx: &mut Cx<'_>,
        mut at: usize,
        mut num: Num,
    ) -> Result<usize, ItemError> {
        let bytes: &[u8] = cx.piece;
        while let Some(&b) = bytes.get(at) {
            num = match num.step(b) {
                NumStep::Next(next) => next,
                NumStep::End => {
                    self.end_value(cx, at)?;
                    return self.on_structure(cx, at);
                }
                NumStep::Malformed => return Err(ItemError::NotJson("malformed number")),
            };
            at += 1;
        }
        self.state = State::Number(num);
        Ok(at)
    }

    /// The bytes of `true`, `false` or `null` after the first, from `at`; `rest` is what is
    /// still to come.
    fn on_literal(
        &mut self,
        cx: &mut Cx<'_>,
        at: usize,
        rest: &'static [u8],
    ) -> Result<usize, ItemError> {
        match literal_run(cx.piece, at, rest) {
            LiteralRun::Done(at) => {
                self.end_value(cx, at)?;
                self.on_structure(cx, at)
            }
            LiteralRun::More(rest) => {
                self.state = State::Literal(rest);
                Ok(cx.piece.len())
            }
            LiteralRun::Mismatch => Err(ItemError::NotJson("expected true, false or null")),
        }
    }

    /// Opens a container.
    fn push(&mut self, array: bool) -> Result<(), ItemError> {
        if self.nest.push(array) {
            Ok(())
        } else {
            Err(ItemError::TooDeep)
        }
    }

    /// Closes the innermost container with the bracket at `at`.
    fn close(&mut self, cx: &mut Cx<'_>, at: usize) -> Result<(), ItemError> {
        if self.nest.pop() > 0 {
            return self.end_value(cx, at + 1);
        }
        assert!(!self.capturing);
        assert_eq!(self.item, Item::None);
        self.state = State::End;
        Ok(())
    }

    #[inline]
    fn top_is_array(&self) -> bool {
        self.nest.top_is_array()
    }

    /// A name begins: top-level names and the names of an open item are decoded, others
    /// only skipped.
    fn begin_name(&mut self) {
        let text = match self.nest.depth() {
            1 => Text::Member,
            FIELD_DEPTH if self.item == Item::Open => Text::Field,
            _ => Text::Name,
        };
        self.name_len = 0;
        self.name_other = false;
        self.state = State::Str(text);
    }

    fn name_push(&mut self, decoded: &[u8]) {
        let end = self.name_len + decoded.len();
        match self.name.get_mut(self.name_len..end) {
            Some(dst) => {
                dst.copy_from_slice(decoded);
                self.name_len = end;
            }
            None => self.name_other = true,
        }
        assert!(self.name_len <= NAME_BYTES_MAX);
    }

    /// The decoded name, or `None` when it is none the rewriter acts on.
    fn decoded_name(&self) -> Option<&[u8]> {
        if self.name_other {
            return None;
        }
        self.name.get(..self.name_len)
    }

    /// A top-level name closed: decide which member its value is, refusing ambiguity.
    fn member_named(&mut self) -> Result<(), ItemError> {
        self.member = match self.decoded_name() {
            Some(name) if name == self.rules.array => Member::Array,
            Some(CURSOR) if self.mode == ItemMode::Items => Member::Cursor,
            _ => Member::Other,
        };
        match self.member {
            Member::Array if self.seen_array => {
                // `new` checked that the array name is ASCII.
                let name = std::str::from_utf8(self.rules.array).unwrap_or("array");
                return Err(ItemError::Duplicate(name));
            }
            Member::Array => self.seen_array = true,
            Member::Cursor if self.seen_cursor => return Err(ItemError::Duplicate("nextCursor")),
            Member::Cursor => self.seen_cursor = true,
            Member::Other => {}
        }
        Ok(())
    }

    /// A name of the open item closed: note the key. A second key makes the item ambiguous,
    /// so Items mode drops it; Document mode prefixes every occurrence.
    fn field_named(&mut self, cx: &mut Cx<'_>) {
        if self.item == Item::Dropped {
            // Dropped while this name was read (a piece ended inside it with the item past
            // its limit): nothing of the item matters any more.
            return;
        }
        assert_eq!(self.item, Item::Open);
        if self.decoded_name() != Some(self.rules.key) {
            return;
        }
        if self.key_seen && self.mode == ItemMode::Items {
            self.drop_item(cx);
            return;
        }
        self.key_seen = true;
        self.at_key = true;
    }

    /// Appends decoded bytes to the key, marking it bad when it outgrows
    /// [`LIST_KEY_BYTES_MAX`] or follows a high surrogate that had no low half.
    fn key_push(&mut self, decoded: &[u8]) {
        if decoded.is_empty() || self.key_bad {
            return;
        }
        if self.key_high.is_some() || self.key.len() + decoded.len() > LIST_KEY_BYTES_MAX {
            self.key_bad = true;
            return;
        }
        self.key.extend_from_slice(decoded);
        assert!(self.key.len() <= LIST_KEY_BYTES_MAX);
    }

    /// A `\uXXXX` escape in the key: UTF-16 code units become UTF-8, pairing surrogates
    /// (RFC 8259 §7); a lone surrogate makes the key bad.
    fn key_unicode(&mut self, code: u16) {
        let scalar = match (self.key_high.take(), code) {
            (Some(high), 0xDC00..=0xDFFF) => {
                0x10000 + ((u32::from(high) - 0xD800) << 10) + (u32::from(code) - 0xDC00)
            }
            (None, 0xD800..=0xDBFF) => {
                self.key_high = Some(code);
                return;
            }
            (Some(_), _) | (None, 0xDC00..=0xDFFF) => {
                self.key_bad = true;
                return;
            }
            (None, _) => u32::from(code),
        };
        match char::from_u32(scalar) {
            Some(c) => self.key_push(c.encode_utf8(&mut [0; 4]).as_bytes()),
            None => self.key_bad = true,
        }
    }

    /// The key's value string closed (Items mode): ask the allow-list, unless the item was
    /// dropped meanwhile or the key cannot be matched (too long, not UTF-8).
    fn key_closed(&mut self, cx: &mut Cx<'_>) {
        assert_eq!(self.mode, ItemMode::Items);
        if self.item != Item::Open {
            self.key.clear();
            return;
        }
        let admitted = !self.key_bad
            && self.key_high.is_none()
            && std::str::from_utf8(&self.key).is_ok_and(|key| (cx.admit)(key));
        self.key.clear();
        if !admitted {
            self.drop_item(cx);
        }
    }
}

/// Document mode: passes `piece[from..to]` on.
fn emit(cx: &mut Cx<'_>, from: usize, to: usize) {
    if from < to {
        cx.out.parts.push(cx.piece.slice(from..to));
    }
}

/// True for a byte a prefix may hold: printable ASCII that needs no escape in a JSON string.
fn is_prefix_byte(b: u8) -> bool {
    (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\'
}

#[cfg(test)]
#[path = "items_tests.rs"]
mod tests;
