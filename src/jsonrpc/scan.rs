//! Streaming scan of one upstream JSON-RPC response body: the `result` value is handed on as
//! zero-copy slices of the pieces it arrived in, while the small members (`id`, `error`) are
//! kept raw and bounded.
//!
//! Why this exists: [`super::parse_envelope`] needs the whole body in one buffer, which for a
//! multi-MiB tool result means holding all of it before the first byte can go downstream. A
//! [`ResultScanner`] is sans-IO and takes the body of an upstream `application/json` answer
//! piece by piece, split anywhere (one byte at a time is fine). Each [`ScanEvent::Result`] is
//! `piece.slice(..)` of a piece it was fed, so the result can be forwarded (for instance inside
//! [`super::write_result_prefix`] / [`super::write_result_suffix`]) as it arrives, never
//! copied and never buffered here. [`ScanEvent::Done`] ends the document with the raw `id` and
//! `error`.
//!
//! Flow: upstream body pieces → [`ResultScanner::feed`] → `Result` slices downstream as they
//! come → `Done` (match the id, or relay the error) → [`ResultScanner::finish`] at body end.
//!
//! The scanner is a byte-level state machine with an explicit container stack (a bit per level
//! in a `u128`), so nesting costs no recursion and is capped at [`SCAN_DEPTH_MAX`]. What it
//! checks (RFC 8259): the document is one object followed only by whitespace; brackets
//! balance and match; names are strings followed by `:`; values are separated by `,` with no
//! trailing comma; strings hold no raw control bytes and only the escapes `\" \\ \/ \b \f \n
//! \r \t \uXXXX`; numbers follow the §6 grammar; `true`, `false`, `null` are spelled out.
//! What it does not check: that strings are UTF-8, that `\u` surrogates pair up, that names
//! other than `result`, `id` and `error` are unique, and what `jsonrpc` says. The total body
//! size is not bounded here; the caller caps it (`limits::MESSAGE_BYTES_MAX`).

use std::fmt;

use bytes::{Bytes, BytesMut};

use crate::limits::MESSAGE_BYTES_MAX;

/// Deepest nesting of arrays and objects, the top-level object included (`serde_json` stops
/// at the same depth, so the two agree on what is too deep).
pub const SCAN_DEPTH_MAX: usize = 128;

/// Largest raw `error` member value kept; a larger one is refused ([`ScanError::ErrorTooLarge`])
/// rather than buffered, since only `result` is streamed.
pub const ERROR_BYTES_MAX: usize = 64 * 1024;

/// Largest raw `id` lexeme kept; ids the gateway writes are far shorter, so a longer one
/// cannot match a request and is refused ([`ScanError::IdTooLarge`]).
pub const ID_BYTES_MAX: usize = 1024;

/// Longest decoded member name compared against `result`, `id` and `error`; a longer name is
/// none of them and is skipped without being kept.
const NAME_BYTES_MAX: usize = 16;

const _: () = assert!(SCAN_DEPTH_MAX <= u128::BITS as usize);
const _: () = assert!(SCAN_DEPTH_MAX >= 2);
const _: () = assert!(NAME_BYTES_MAX >= "jsonrpc".len());
const _: () = assert!(ID_BYTES_MAX <= ERROR_BYTES_MAX);
const _: () = assert!(ERROR_BYTES_MAX <= MESSAGE_BYTES_MAX);

/// What the scanner found in the pieces fed so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanEvent {
    /// The next bytes of the raw `result` value, in order: from its first byte to its last,
    /// whitespace inside the value included, whitespace around it not. Never empty.
    Result(Bytes),
    /// The top-level object closed; emitted once. `id` is the raw lexeme of a string or number
    /// `id` (`None` when absent or `null`), `error` the raw `error` value when there was one,
    /// and `had_result` whether a `result` member was seen. Bytes after the object may still
    /// make a later `feed` fail with [`ScanError::Trailing`].
    Done {
        /// The raw id lexeme, e.g. `7` or `"a\"b"`.
        id: Option<Bytes>,
        /// The raw `error` value, at most [`ERROR_BYTES_MAX`] bytes.
        error: Option<Bytes>,
        /// A `result` member was present (its bytes went out as [`ScanEvent::Result`]).
        had_result: bool,
    },
}

/// Why a body is not one acceptable JSON-RPC response document. Once returned, every later
/// `feed` or `finish` returns the same error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanError {
    /// The bytes are not JSON; the text says what was expected where the scan stopped.
    NotJson(&'static str),
    /// The body ended before the top-level object closed.
    Truncated,
    /// Non-whitespace after the top-level object.
    Trailing,
    /// Arrays and objects nest deeper than [`SCAN_DEPTH_MAX`].
    TooDeep,
    /// The `id` lexeme is longer than [`ID_BYTES_MAX`].
    IdTooLarge,
    /// The `error` value is longer than [`ERROR_BYTES_MAX`].
    ErrorTooLarge,
    /// The `id` is an object, an array or a boolean (JSON-RPC 2.0 §5: string, number or null).
    BadId,
    /// A member the scanner acts on (named here) appears twice, so its meaning is ambiguous.
    Duplicate(&'static str),
    /// Both `result` and `error` are present (JSON-RPC 2.0 §5: exactly one of them).
    ResultAndError,
}

impl fmt::Display for ScanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScanError::NotJson(expected) => write!(f, "response is not JSON: {expected}"),
            ScanError::Truncated => f.write_str("response body ended inside the JSON document"),
            ScanError::Trailing => f.write_str("response has bytes after the JSON document"),
            ScanError::TooDeep => f.write_str("response JSON nests too deep"),
            ScanError::IdTooLarge => f.write_str("response id exceeds the size limit"),
            ScanError::ErrorTooLarge => f.write_str("response error exceeds the size limit"),
            ScanError::BadId => f.write_str("response id is not a string, number or null"),
            ScanError::Duplicate(name) => write!(f, "response has a duplicate `{name}` member"),
            ScanError::ResultAndError => f.write_str("response has both result and error"),
        }
    }
}

impl std::error::Error for ScanError {}

/// Where the scan is, between two bytes.
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
    /// Between tokens: the states [`ResultScanner::on_structure`] handles.
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

/// What a string is, which decides what happens at its closing quote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Text {
    /// A value.
    Value,
    /// A name inside a nested object: skipped.
    Name,
    /// A name of the top-level object: decoded into `name` to pick the [`Member`].
    Member,
}

/// Position in the RFC 8259 §6 number grammar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Num {
    /// After `-`: a digit must follow.
    Minus,
    /// A leading `0`: no more integer digits.
    Zero,
    /// Integer digits.
    Int,
    /// After `.`: a digit must follow.
    Dot,
    /// Fraction digits.
    Frac,
    /// After `e`/`E`: a sign or digit must follow.
    Exp,
    /// After the exponent sign: a digit must follow.
    ExpSign,
    /// Exponent digits.
    ExpInt,
}

/// The top-level member whose value is being scanned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Member {
    Result,
    Id,
    Error,
    /// `jsonrpc` or anything unknown: validated, not kept.
    Other,
}

/// Per-`feed` context: the piece and where the current member value started in it.
struct Cx<'a> {
    piece: &'a Bytes,
    /// Offset in `piece` where the kept member value's bytes (not yet handed on) begin.
    /// Invariant: `Some` exactly while `ResultScanner::capturing`.
    mark: Option<usize>,
    out: &'a mut Vec<ScanEvent>,
}

/// An incremental scanner for one JSON-RPC response document; see the module docs.
#[derive(Debug)]
pub struct ResultScanner {
    state: State,
    /// Arrays and objects open. Invariant: `0 < depth <= SCAN_DEPTH_MAX` between `Doc` and
    /// `End`, 0 in them.
    depth: usize,
    /// Bit `d` set: the container at depth `d + 1` is an array. Invariant: no bit at or above
    /// `depth` is set.
    arrays: u128,
    /// The member named last at depth 1; reset to `Other` when its value ends.
    member: Member,
    /// The value of a kept member (`member != Other`) has begun and not yet ended.
    capturing: bool,
    /// The decoded top-level member name read so far. Invariant: `name_len <= NAME_BYTES_MAX`.
    name: [u8; NAME_BYTES_MAX],
    name_len: usize,
    /// The name outgrew `name` or decoded to non-ASCII, so it is none of the kept members.
    name_other: bool,
    /// Bytes of an `id` or `error` value that began in an earlier piece.
    held: BytesMut,
    seen_id: bool,
    seen_error: bool,
    had_result: bool,
    id: Option<Bytes>,
    error: Option<Bytes>,
    failed: Option<ScanError>,
}

impl Default for ResultScanner {
    fn default() -> Self {
        Self::new()
    }
}

impl ResultScanner {
    /// Returns a scanner waiting for the first byte of a document.
    pub fn new() -> Self {
        ResultScanner {
            state: State::Doc,
            depth: 0,
            arrays: 0,
            member: Member::Other,
            capturing: false,
            name: [0; NAME_BYTES_MAX],
            name_len: 0,
            name_other: false,
            held: BytesMut::new(),
            seen_id: false,
            seen_error: false,
            had_result: false,
            id: None,
            error: None,
            failed: None,
        }
    }

    /// Scans one piece of the body, pushing the events it completes onto `out` (which the
    /// caller owns and may reuse; nothing is cleared).
    ///
    /// Returns an error when the bytes so far cannot start an acceptable document; events
    /// pushed before the error stay in `out`. Empty pieces are fine.
    pub fn feed(&mut self, piece: Bytes, out: &mut Vec<ScanEvent>) -> Result<(), ScanError> {
        if let Some(failed) = self.failed {
            return Err(failed);
        }
        let scanned = self.scan(&piece, out);
        if let Err(e) = scanned {
            self.failed = Some(e);
        }
        scanned
    }

    /// Ends the body: returns `Ok` when the document was complete (so [`ScanEvent::Done`] has
    /// already been pushed by `feed`; nothing more is pushed) and [`ScanError::Truncated`]
    /// otherwise. Calling it again gives the same answer.
    pub fn finish(&mut self, out: &mut Vec<ScanEvent>) -> Result<(), ScanError> {
        // Done is pushed at the closing brace; `out` is taken so the signature can grow a
        // late event without breaking callers.
        let _ = out;
        if let Some(failed) = self.failed {
            return Err(failed);
        }
        if self.state == State::End {
            return Ok(());
        }
        self.failed = Some(ScanError::Truncated);
        Err(ScanError::Truncated)
    }

    /// Returns true once the top-level object has closed (and `Done` was pushed).
    pub fn is_done(&self) -> bool {
        self.state == State::End
    }

    fn scan(&mut self, piece: &Bytes, out: &mut Vec<ScanEvent>) -> Result<(), ScanError> {
        let bytes: &[u8] = piece;
        let mut cx = Cx {
            piece,
            mark: if self.capturing { Some(0) } else { None },
            out,
        };
        let mut at = 0;
        // Every handler consumes at least one byte, so this runs at most `bytes.len()` times.
        // Handlers consume a whole run of bytes and chain into the handler for what follows
        // (a string's closing quote goes straight on to the punctuation after it), so this
        // dispatch, a poorly predicted jump, runs about once per token rather than per byte.
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
        if let Some(from) = cx.mark {
            self.keep(cx.piece, from, bytes.len(), false, cx.out)?;
        }
        Ok(())
    }

    /// Whitespace and punctuation between tokens, up to and including the first byte of a
    /// string, number or literal (or the end of the piece). Returns the offset after the last
    /// byte consumed; consumes at least one byte when `at` is inside the piece.
    fn on_structure(&mut self, cx: &mut Cx<'_>, mut at: usize) -> Result<usize, ScanError> {
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
    fn on_punctuation(&mut self, cx: &mut Cx<'_>, at: usize, b: u8) -> Result<(), ScanError> {
        match (self.state, b) {
            (State::Doc, b'{') => {
                self.push(false)?;
                self.state = State::NameOrClose;
            }
            (State::Doc, _) => return Err(ScanError::NotJson("the document must be an object")),
            (State::NameOrClose | State::Name, b'"') => self.begin_name(),
            (State::NameOrClose, b'}') => self.close(cx, at)?,
            (State::NameOrClose | State::Name, _) => {
                return Err(ScanError::NotJson("expected a member name"));
            }
            (State::Colon, b':') => self.state = State::Value,
            (State::Colon, _) => return Err(ScanError::NotJson("expected ':'")),
            (State::ValueOrClose, b']') => self.close(cx, at)?,
            (State::ValueOrClose | State::Value, _) => self.begin_value(cx, at, b)?,
            (State::CommaOrClose, b',') => {
                self.state = if self.top_is_array() {
                    State::Value
                } else {
                    State::Name
                };
            }
            (State::CommaOrClose, b']') if self.top_is_array() => self.close(cx, at)?,
            (State::CommaOrClose, b'}') if !self.top_is_array() => self.close(cx, at)?,
            (State::CommaOrClose, _) => {
                return Err(ScanError::NotJson("expected ',' or a closing bracket"));
            }
            (State::End, _) => return Err(ScanError::Trailing),
            (
                State::Str(_)
                | State::Escape(_)
                | State::Unicode { .. }
                | State::Number(_)
                | State::Literal(_),
                _,
            ) => unreachable!("on_structure stops at the first byte of a token"),
        }
        Ok(())
    }

    /// The first byte of a value at `at`.
    fn begin_value(&mut self, cx: &mut Cx<'_>, at: usize, b: u8) -> Result<(), ScanError> {
        if self.depth == 1 {
            self.begin_member_value(cx, at, b)?;
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
            b'"' => State::Str(Text::Value),
            b'-' => State::Number(Num::Minus),
            b'0' => State::Number(Num::Zero),
            b'1'..=b'9' => State::Number(Num::Int),
            b't' => State::Literal(b"rue"),
            b'f' => State::Literal(b"alse"),
            b'n' => State::Literal(b"ull"),
            _ => return Err(ScanError::NotJson("expected a value")),
        };
        Ok(())
    }

    /// A value of the top-level object begins at `at`: start keeping it if it is one of ours.
    fn begin_member_value(&mut self, cx: &mut Cx<'_>, at: usize, b: u8) -> Result<(), ScanError> {
        assert!(!self.capturing);
        assert!(cx.mark.is_none());
        if self.member == Member::Id && matches!(b, b'{' | b'[' | b't' | b'f') {
            return Err(ScanError::BadId);
        }
        if self.member != Member::Other {
            self.capturing = true;
            cx.mark = Some(at);
        }
        Ok(())
    }

    /// A value ended just before `end`; what follows is `,` or a closing bracket.
    fn end_value(&mut self, cx: &mut Cx<'_>, end: usize) -> Result<(), ScanError> {
        assert!(self.depth >= 1);
        self.state = State::CommaOrClose;
        if self.depth > 1 {
            return Ok(());
        }
        let kept = cx.mark.take();
        assert_eq!(kept.is_some(), self.capturing);
        self.capturing = false;
        if let Some(from) = kept {
            self.keep(cx.piece, from, end, true, cx.out)?;
        }
        self.member = Member::Other;
        Ok(())
    }

    /// Hands on or holds `piece[from..to]` of the current member's value; `last` when the
    /// value ends at `to`.
    fn keep(
        &mut self,
        piece: &Bytes,
        from: usize,
        to: usize,
        last: bool,
        out: &mut Vec<ScanEvent>,
    ) -> Result<(), ScanError> {
        assert!(from <= to);
        assert!(to <= piece.len());
        let (limit, too_large) = match self.member {
            Member::Result => {
                if from < to {
                    out.push(ScanEvent::Result(piece.slice(from..to)));
                }
                return Ok(());
            }
            Member::Id => (ID_BYTES_MAX, ScanError::IdTooLarge),
            Member::Error => (ERROR_BYTES_MAX, ScanError::ErrorTooLarge),
            Member::Other => unreachable!("only kept members are captured"),
        };
        if self.held.len() + (to - from) > limit {
            return Err(too_large);
        }
        if !last {
            self.held.extend_from_slice(&piece[from..to]);
            return Ok(());
        }
        // A value that arrived in one piece is sliced, not copied.
        let raw = if self.held.is_empty() {
            piece.slice(from..to)
        } else {
            self.held.extend_from_slice(&piece[from..to]);
            std::mem::take(&mut self.held).freeze()
        };
        if self.member == Member::Id {
            // The id value was checked to start like a string, number or `null`.
            self.id = if raw.first() == Some(&b'n') {
                None
            } else {
                Some(raw)
            };
        } else {
            self.error = Some(raw);
        }
        Ok(())
    }

    /// Inside a string at `at`: skips plain bytes in bulk, decodes short escapes in place, and
    /// at the closing quote goes on to the punctuation after the string. A `\u` escape, or an
    /// escape cut by the end of the piece, goes back to the dispatcher a byte at a time.
    fn on_string(
        &mut self,
        cx: &mut Cx<'_>,
        mut at: usize,
        text: Text,
    ) -> Result<usize, ScanError> {
        let bytes: &[u8] = cx.piece;
        // Each turn consumes at least two bytes or returns, so the loop is bounded by the piece.
        loop {
            let rest = bytes.get(at..).unwrap_or_default();
            let run = plain_run(rest);
            if text == Text::Member {
                self.name_push(rest.get(..run).unwrap_or_default());
            }
            at += run;
            match bytes.get(at) {
                None => return Ok(at),
                Some(b'"') => {
                    match text {
                        Text::Value => self.end_value(cx, at + 1)?,
                        Text::Name => self.state = State::Colon,
                        Text::Member => {
                            self.member_named()?;
                            self.state = State::Colon;
                        }
                    }
                    return self.on_structure(cx, at + 1);
                }
                Some(b'\\') => match bytes.get(at + 1) {
                    Some(&escaped) if escaped != b'u' => {
                        at = self.on_escape(at + 1, escaped, text)?
                    }
                    _ => {
                        self.state = State::Escape(text);
                        return Ok(at + 1);
                    }
                },
                Some(_) => return Err(ScanError::NotJson("raw control character in a string")),
            }
        }
    }

    /// The byte after a backslash (RFC 8259 §7).
    fn on_escape(&mut self, at: usize, b: u8, text: Text) -> Result<usize, ScanError> {
        let decoded = match b {
            b'"' | b'\\' | b'/' => b,
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                self.state = State::Unicode {
                    text,
                    left: 4,
                    code: 0,
                };
                return Ok(at + 1);
            }
            _ => return Err(ScanError::NotJson("invalid escape in a string")),
        };
        if text == Text::Member {
            self.name_push(&[decoded]);
        }
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
    ) -> Result<usize, ScanError> {
        assert!((1..=4).contains(&left));
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return Err(ScanError::NotJson("invalid \\u escape in a string")),
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
        if text == Text::Member {
            // The names acted on are ASCII; anything else (surrogates included) is none of them.
            match u8::try_from(code) {
                Ok(ascii) if ascii.is_ascii() => self.name_push(&[ascii]),
                _ => self.name_other = true,
            }
        }
        self.state = State::Str(text);
        Ok(at + 1)
    }

    /// The bytes of a number from `at`; the first byte that cannot continue it ends the number
    /// and is then read as the punctuation after a value.
    fn on_number(
        &mut self,
        cx: &mut Cx<'_>,
        mut at: usize,
        mut num: Num,
    ) -> Result<usize, ScanError> {
        let bytes: &[u8] = cx.piece;
        while let Some(&b) = bytes.get(at) {
            num = match (num, b) {
                (Num::Minus, b'0') => Num::Zero,
                (Num::Minus | Num::Int, b'0'..=b'9') => Num::Int,
                (Num::Zero | Num::Int, b'.') => Num::Dot,
                (Num::Dot | Num::Frac, b'0'..=b'9') => Num::Frac,
                (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::Exp,
                (Num::Exp, b'+' | b'-') => Num::ExpSign,
                (Num::Exp | Num::ExpSign | Num::ExpInt, b'0'..=b'9') => Num::ExpInt,
                (Num::Zero | Num::Int | Num::Frac | Num::ExpInt, _) => {
                    self.end_value(cx, at)?;
                    return self.on_structure(cx, at);
                }
                (Num::Minus | Num::Dot | Num::Exp | Num::ExpSign, _) => {
                    return Err(ScanError::NotJson("malformed number"));
                }
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
        mut at: usize,
        mut rest: &'static [u8],
    ) -> Result<usize, ScanError> {
        let bytes: &[u8] = cx.piece;
        while let Some(&b) = bytes.get(at) {
            let Some((&want, tail)) = rest.split_first() else {
                unreachable!("a literal state always has bytes to come");
            };
            if want != b {
                return Err(ScanError::NotJson("expected true, false or null"));
            }
            at += 1;
            rest = tail;
            if rest.is_empty() {
                self.end_value(cx, at)?;
                return self.on_structure(cx, at);
            }
        }
        self.state = State::Literal(rest);
        Ok(at)
    }

    /// Opens a container.
    fn push(&mut self, array: bool) -> Result<(), ScanError> {
        if self.depth >= SCAN_DEPTH_MAX {
            return Err(ScanError::TooDeep);
        }
        assert!(self.arrays >> self.depth == 0);
        self.arrays |= u128::from(array) << self.depth;
        self.depth += 1;
        Ok(())
    }

    /// Closes the innermost container with the bracket at `at`.
    fn close(&mut self, cx: &mut Cx<'_>, at: usize) -> Result<(), ScanError> {
        assert!(self.depth >= 1);
        self.depth -= 1;
        self.arrays &= !(1u128 << self.depth);
        if self.depth > 0 {
            return self.end_value(cx, at + 1);
        }
        assert!(!self.capturing);
        self.state = State::End;
        cx.out.push(ScanEvent::Done {
            id: self.id.take(),
            error: self.error.take(),
            had_result: self.had_result,
        });
        Ok(())
    }

    #[inline]
    fn top_is_array(&self) -> bool {
        assert!(self.depth >= 1);
        self.arrays >> (self.depth - 1) & 1 == 1
    }

    /// A name begins: top-level names are decoded, nested ones only skipped.
    fn begin_name(&mut self) {
        if self.depth == 1 {
            self.name_len = 0;
            self.name_other = false;
            self.state = State::Str(Text::Member);
        } else {
            self.state = State::Str(Text::Name);
        }
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

    /// A top-level name closed: decide which member its value is, refusing ambiguity.
    fn member_named(&mut self) -> Result<(), ScanError> {
        let name = self.name.get(..self.name_len).unwrap_or_default();
        self.member = match name {
            _ if self.name_other => Member::Other,
            b"result" => Member::Result,
            b"id" => Member::Id,
            b"error" => Member::Error,
            _ => Member::Other,
        };
        match self.member {
            Member::Result if self.had_result => return Err(ScanError::Duplicate("result")),
            Member::Result if self.seen_error => return Err(ScanError::ResultAndError),
            Member::Result => self.had_result = true,
            Member::Error if self.seen_error => return Err(ScanError::Duplicate("error")),
            Member::Error if self.had_result => return Err(ScanError::ResultAndError),
            Member::Error => self.seen_error = true,
            Member::Id if self.seen_id => return Err(ScanError::Duplicate("id")),
            Member::Id => self.seen_id = true,
            Member::Other => {}
        }
        Ok(())
    }
}

/// Returns the length of the leading run of `bytes` with no `"`, no `\` and no control byte
/// (below 0x20): the bytes a string scan can skip without looking at them one by one.
///
/// Eight bytes at a time (SWAR): for each class, `(w - 0x01..01 * n) & !w & 0x80..80` flags
/// the lowest matching byte exactly (higher flags may be false positives from the borrow, but
/// never lower ones), so the lowest flag over the three classes is the first stop byte.
fn plain_run(bytes: &[u8]) -> usize {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const QUOTES: u64 = u64::from_ne_bytes([b'"'; 8]);
    const BACKSLASHES: u64 = u64::from_ne_bytes([b'\\'; 8]);
    const WORD_BYTES: usize = 8;
    let mut at = 0;
    while let Some(word) = bytes
        .get(at..)
        .and_then(|rest| rest.first_chunk::<WORD_BYTES>())
    {
        let w = u64::from_le_bytes(*word);
        let quote = w ^ QUOTES;
        let backslash = w ^ BACKSLASHES;
        let stops = (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (w.wrapping_sub(ONES * 0x20) & !w);
        let stops = stops & HIGHS;
        if stops != 0 {
            return at + (stops.trailing_zeros() / 8) as usize;
        }
        at += WORD_BYTES;
    }
    while let Some(&b) = bytes.get(at) {
        if b == b'"' || b == b'\\' || b < 0x20 {
            break;
        }
        at += 1;
    }
    at
}

#[cfg(test)]
mod tests {
    //! Tables of valid and malformed documents, each fed whole, split in two at every byte
    //! boundary and one byte per piece; a seeded round trip of random documents; a seeded
    //! differential against `serde_json` on mutated documents. The seed comes from
    //! `MCPYARD_SEED` when set and is printed in every assertion message.

    use super::*;

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
        let mut out = Vec::new();
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

    fn whole(doc: &[u8]) -> Vec<Bytes> {
        vec![Bytes::copy_from_slice(doc)]
    }

    fn split_at(doc: &[u8], cut: usize) -> Vec<Bytes> {
        let all = Bytes::copy_from_slice(doc);
        vec![all.slice(..cut), all.slice(cut..)]
    }

    fn bytewise(doc: &[u8]) -> Vec<Bytes> {
        let all = Bytes::copy_from_slice(doc);
        (0..all.len()).map(|i| all.slice(i..i + 1)).collect()
    }

    /// Every way the tables feed a document: whole, two pieces at every cut, one byte each.
    fn all_splits(doc: &[u8]) -> Vec<Vec<Bytes>> {
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
        let mut out = Vec::new();
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
        let mut out = Vec::new();
        let fed = scanner.feed(Bytes::from_static(b"{\"id\":1,\"result\":2} "), &mut out);
        assert_eq!(fed, Ok(()));
        assert_eq!(
            out,
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
        let mut out = Vec::new();
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

    /// xorshift64*: tiny, deterministic, good enough to pick test inputs.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        fn index(&mut self, n: usize) -> usize {
            self.below(n as u64) as usize
        }

        fn chance(&mut self, percent: u64) -> bool {
            self.below(100) < percent
        }

        fn pick<T: Copy>(&mut self, items: &[T]) -> T {
            let at = self.index(items.len());
            *items.get(at).unwrap_or_else(|| panic!("empty pick"))
        }
    }

    fn seed() -> u64 {
        let seed = std::env::var("MCPYARD_SEED")
            .ok()
            .and_then(|s| s.parse::<u64>().ok());
        // xorshift must not start at zero.
        seed.unwrap_or(0x5CA7_0B0D_1E55).max(1)
    }

    fn ws(rng: &mut Rng, out: &mut String) {
        if rng.chance(25) {
            for _ in 0..rng.below(3) + 1 {
                out.push(rng.pick(&[' ', '\n', '\t', '\r']));
            }
        }
    }

    fn random_string(rng: &mut Rng, out: &mut String) {
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

    fn random_number(rng: &mut Rng, out: &mut String) {
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
    fn random_value(rng: &mut Rng, depth: u32, out: &mut String) {
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
    fn random_pieces(rng: &mut Rng, doc: &[u8]) -> Vec<Bytes> {
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
        let seed = seed();
        let mut rng = Rng(seed);
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
    fn mutate(rng: &mut Rng, doc: &str) -> Vec<u8> {
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
        let seed = seed();
        let mut rng = Rng(seed ^ 0xD1FF);
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
}
