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
//! size is not bounded: the result streams on as it is scanned (what the scanner itself holds
//! is bounded, see `ERROR_BYTES_MAX` and `ID_BYTES_MAX`), and what its caller holds of it is
//! bounded by the stream's credit window, so a result may be larger than a message the
//! gateway holds whole (`limits::MESSAGE_BYTES_MAX`).

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

/// Position in the RFC 8259 §6 number grammar (shared with the list rewriter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Num {
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

/// What one more byte does to a number in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NumStep {
    /// The byte belongs to the number, which is now at this position.
    Next(Num),
    /// The number ended before the byte, which is read as what follows a value.
    End,
    /// The number cannot end here and the byte cannot continue it.
    Malformed,
}

impl Num {
    /// The next position after byte `b`, per the RFC 8259 §6 grammar.
    #[inline(always)]
    pub(super) fn step(self, b: u8) -> NumStep {
        match (self, b) {
            (Num::Minus, b'0') => NumStep::Next(Num::Zero),
            (Num::Minus | Num::Int, b'0'..=b'9') => NumStep::Next(Num::Int),
            (Num::Zero | Num::Int, b'.') => NumStep::Next(Num::Dot),
            (Num::Dot | Num::Frac, b'0'..=b'9') => NumStep::Next(Num::Frac),
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => NumStep::Next(Num::Exp),
            (Num::Exp, b'+' | b'-') => NumStep::Next(Num::ExpSign),
            (Num::Exp | Num::ExpSign | Num::ExpInt, b'0'..=b'9') => NumStep::Next(Num::ExpInt),
            (Num::Zero | Num::Int | Num::Frac | Num::ExpInt, _) => NumStep::End,
            (Num::Minus | Num::Dot | Num::Exp | Num::ExpSign, _) => NumStep::Malformed,
        }
    }
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
    out: &'a mut ScanEvents,
}

/// Events of one `feed`, kept inline: a piece completes a few at most (result slices
/// around the structure it holds, and `Done`), so the usual case allocates nothing.
pub const SCAN_EVENTS_INLINE: usize = 4;

/// Where [`ResultScanner`] pushes its events.
pub type ScanEvents = smallvec::SmallVec<[ScanEvent; SCAN_EVENTS_INLINE]>;

/// An incremental scanner for one JSON-RPC response document; see the module docs.
#[derive(Debug)]
pub struct ResultScanner {
    state: State,
    /// Arrays and objects open. Invariant: depth `> 0` between `Doc` and `End`, 0 in them.
    nest: Nesting,
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
            nest: Nesting::default(),
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
    pub fn feed(&mut self, piece: Bytes, out: &mut ScanEvents) -> Result<(), ScanError> {
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
    pub fn finish(&mut self, out: &mut ScanEvents) -> Result<(), ScanError> {
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

    fn scan(&mut self, piece: &Bytes, out: &mut ScanEvents) -> Result<(), ScanError> {
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
        // Outer match on the state alone: it compiles to one jump table, where a match on
        // `(state, byte)` with guards became a chain of compares on this hot path.
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
                    return Err(ScanError::NotJson("expected ':'"));
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
                    _ => return Err(ScanError::NotJson("expected ',' or a closing bracket")),
                }
            }
            State::Name | State::NameOrClose => match b {
                b'"' => self.begin_name(),
                b'}' if self.state == State::NameOrClose => self.close(cx, at)?,
                _ => return Err(ScanError::NotJson("expected a member name")),
            },
            State::Doc => {
                if b != b'{' {
                    return Err(ScanError::NotJson("the document must be an object"));
                }
                self.push(false)?;
                self.state = State::NameOrClose;
            }
            State::End => return Err(ScanError::Trailing),
            State::Str(_)
            | State::Escape(_)
            | State::Unicode { .. }
            | State::Number(_)
            | State::Literal(_) => unreachable!("on_structure stops at the first byte of a token"),
        }
        Ok(())
    }

    /// The first byte of a value at `at`.
    fn begin_value(&mut self, cx: &mut Cx<'_>, at: usize, b: u8) -> Result<(), ScanError> {
        if self.nest.depth() == 1 {
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
        assert!(self.nest.depth() >= 1);
        self.state = State::CommaOrClose;
        if self.nest.depth() > 1 {
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
        out: &mut ScanEvents,
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
                    Some(b'u') => match bytes.get(at + 2..).and_then(<[u8]>::first_chunk::<4>) {
                        // The whole `\uXXXX` is in this piece: decoded here, not digit by digit.
                        Some(hex) => {
                            let code = hex4(hex)
                                .ok_or(ScanError::NotJson("invalid \\u escape in a string"))?;
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
                Some(_) => return Err(ScanError::NotJson("raw control character in a string")),
            }
        }
    }

    /// The byte after a backslash (RFC 8259 §7).
    fn on_escape(&mut self, at: usize, b: u8, text: Text) -> Result<usize, ScanError> {
        if b == b'u' {
            self.state = State::Unicode {
                text,
                left: 4,
                code: 0,
            };
            return Ok(at + 1);
        }
        let decoded = escaped_byte(b).ok_or(ScanError::NotJson("invalid escape in a string"))?;
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
        let Some(digit) = hex_digit(b) else {
            return Err(ScanError::NotJson("invalid \\u escape in a string"));
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

    /// A `\uXXXX` escape decoded to `code`: the string goes on.
    fn unicode_decoded(&mut self, text: Text, code: u16) {
        if text == Text::Member {
            // The names acted on are ASCII; anything else (surrogates included) is none of them.
            match u8::try_from(code) {
                Ok(ascii) if ascii.is_ascii() => self.name_push(&[ascii]),
                _ => self.name_other = true,
            }
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
    ) -> Result<usize, ScanError> {
        let bytes: &[u8] = cx.piece;
        while let Some(&b) = bytes.get(at) {
            num = match num.step(b) {
                NumStep::Next(next) => next,
                NumStep::End => {
                    self.end_value(cx, at)?;
                    return self.on_structure(cx, at);
                }
                NumStep::Malformed => return Err(ScanError::NotJson("malformed number")),
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
    ) -> Result<usize, ScanError> {
        match literal_run(cx.piece, at, rest) {
            LiteralRun::Done(at) => {
                self.end_value(cx, at)?;
                self.on_structure(cx, at)
            }
            LiteralRun::More(rest) => {
                self.state = State::Literal(rest);
                Ok(cx.piece.len())
            }
            LiteralRun::Mismatch => Err(ScanError::NotJson("expected true, false or null")),
        }
    }

    /// Opens a container.
    fn push(&mut self, array: bool) -> Result<(), ScanError> {
        if self.nest.push(array) {
            Ok(())
        } else {
            Err(ScanError::TooDeep)
        }
    }

    /// Closes the innermost container with the bracket at `at`.
    fn close(&mut self, cx: &mut Cx<'_>, at: usize) -> Result<(), ScanError> {
        if self.nest.pop() > 0 {
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
        self.nest.top_is_array()
    }

    /// A name begins: top-level names are decoded, nested ones only skipped.
    fn begin_name(&mut self) {
        if self.nest.depth() == 1 {
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

/// The byte a short escape stands for (RFC 8259 §7): `b` is the byte after the backslash,
/// e.g. `n` gives a newline. `None` for `u` (a `\uXXXX` escape, decoded digit by digit) and
/// for any byte that starts no escape.
#[inline(always)]
pub(super) fn escaped_byte(b: u8) -> Option<u8> {
    match b {
        b'"' | b'\\' | b'/' => Some(b),
        b'b' => Some(0x08),
        b'f' => Some(0x0c),
        b'n' => Some(b'\n'),
        b'r' => Some(b'\r'),
        b't' => Some(b'\t'),
        _ => None,
    }
}

/// The code unit the four hex digits of a `\uXXXX` escape spell; `None` when one is no hex
/// digit.
#[inline(always)]
pub(super) fn hex4(hex: &[u8; 4]) -> Option<u16> {
    hex.iter()
        .try_fold(0u16, |code, &b| Some(code << 4 | u16::from(hex_digit(b)?)))
}

/// The open arrays and objects of a scan, a bit per level (shared by the scanners here).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Nesting {
    /// Containers open. Invariant: `depth <= SCAN_DEPTH_MAX`.
    depth: usize,
    /// Bit `d` set: the container at depth `d + 1` is an array. Invariant: no bit at or above
    /// `depth` is set.
    arrays: u128,
}

impl Nesting {
    /// Containers open now.
    #[inline]
    pub(super) fn depth(&self) -> usize {
        self.depth
    }

    /// Opens a container; false (and nothing changes) when that would nest deeper than
    /// [`SCAN_DEPTH_MAX`].
    pub(super) fn push(&mut self, array: bool) -> bool {
        if self.depth >= SCAN_DEPTH_MAX {
            return false;
        }
        assert!(self.arrays >> self.depth == 0);
        self.arrays |= u128::from(array) << self.depth;
        self.depth += 1;
        true
    }

    /// Closes the innermost container; returns how many stay open.
    pub(super) fn pop(&mut self) -> usize {
        assert!(self.depth >= 1);
        self.depth -= 1;
        self.arrays &= !(1u128 << self.depth);
        self.depth
    }

    /// True if the innermost open container is an array.
    #[inline]
    pub(super) fn top_is_array(&self) -> bool {
        assert!(self.depth >= 1);
        self.arrays >> (self.depth - 1) & 1 == 1
    }
}

/// Where the bytes of `true`, `false` or `null` after its first got in one piece.
pub(super) enum LiteralRun {
    /// The literal ended just before this offset.
    Done(usize),
    /// The piece ended inside it; this much is still to come. Invariant: not empty.
    More(&'static [u8]),
    /// A byte that is not the literal's.
    Mismatch,
}

/// Matches `bytes[at..]` against `rest`, the bytes of a literal still to come (not empty).
pub(super) fn literal_run(bytes: &[u8], mut at: usize, mut rest: &'static [u8]) -> LiteralRun {
    while let Some(&b) = bytes.get(at) {
        let Some((&want, tail)) = rest.split_first() else {
            unreachable!("a literal state always has bytes to come");
        };
        if want != b {
            return LiteralRun::Mismatch;
        }
        at += 1;
        rest = tail;
        if rest.is_empty() {
            return LiteralRun::Done(at);
        }
    }
    LiteralRun::More(rest)
}

/// The value of one hex digit of a `\uXXXX` escape; `None` for any other byte.
#[inline(always)]
pub(super) fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Bytes a string scan checks per step of [`plain_run`]: two 16-byte SSE2 registers on
/// x86-64, so one step is a handful of vector instructions.
const PLAIN_LANES: usize = 32;

/// Bytes per word when [`first_stop`] locates a stop inside a window.
const WORD_BYTES: usize = 8;

/// Words [`plain_run`] checks one at a time before it goes window by window: short strings
/// end within them.
const SHORT_WORDS: usize = 2;

const _: () = assert!(PLAIN_LANES.is_multiple_of(WORD_BYTES));

/// True for a byte that ends a run of plain string bytes: `"`, `\\` or a control byte.
#[inline(always)]
fn is_stop(b: u8) -> bool {
    // Non-short-circuit `|` keeps this branch-free, so the lane loops below vectorize.
    (b == b'"') | (b == b'\\') | (b < 0x20)
}

/// True when a window holds a stop byte. A fixed-size, branch-free fold: the compiler turns
/// it into vector compares, ORs and one mask test (no `unsafe`, no intrinsics).
#[inline(always)]
fn any_stop(lanes: &[u8; PLAIN_LANES]) -> bool {
    let mut flags = [0u8; PLAIN_LANES];
    for (flag, &b) in flags.iter_mut().zip(lanes) {
        *flag = u8::from(is_stop(b));
    }
    flags.iter().fold(0, |any, &flag| any | flag) != 0
}

/// The offset of the first stop byte in a window, [`PLAIN_LANES`] when there is none. The
/// flags are computed as vector compares, then read back a word at a time.
#[inline(always)]
fn first_stop(lanes: &[u8; PLAIN_LANES]) -> usize {
    let mut flags = [0u8; PLAIN_LANES];
    for (flag, &b) in flags.iter_mut().zip(lanes) {
        *flag = u8::from(is_stop(b)).wrapping_neg();
    }
    let mut at = 0;
    for word in flags.chunks_exact(WORD_BYTES) {
        let mut w = [0u8; WORD_BYTES];
        w.copy_from_slice(word);
        let w = u64::from_le_bytes(w);
        if w != 0 {
            return at + (w.trailing_zeros() / 8) as usize;
        }
        at += WORD_BYTES;
    }
    PLAIN_LANES
}

/// The offset of the first stop byte in one word, if any.
///
/// SWAR: for each class, `(w - 0x01..01 * n) & !w & 0x80..80` flags the lowest matching byte
/// exactly (higher flags may be false positives from the borrow, but never lower ones), so
/// the lowest flag over the three classes is the first stop byte.
#[inline(always)]
fn word_stop(word: &[u8; WORD_BYTES]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; WORD_BYTES]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; WORD_BYTES]);
    const QUOTES: u64 = u64::from_ne_bytes([b'"'; WORD_BYTES]);
    const BACKSLASHES: u64 = u64::from_ne_bytes([b'\\'; WORD_BYTES]);
    let w = u64::from_le_bytes(*word);
    let quote = w ^ QUOTES;
    let backslash = w ^ BACKSLASHES;
    let stops = (quote.wrapping_sub(ONES) & !quote)
        | (backslash.wrapping_sub(ONES) & !backslash)
        | (w.wrapping_sub(ONES * 0x20) & !w);
    let stops = stops & HIGHS;
    (stops != 0).then(|| (stops.trailing_zeros() / 8) as usize)
}

/// Returns the length of the leading run of `bytes` with no `"`, no `\\` and no control byte
/// (below 0x20): the bytes a string scan can skip without looking at them one by one.
///
/// [`PLAIN_LANES`] bytes at a time while that many remain. A shorter tail is checked with
/// the last full window of `bytes`, which overlaps bytes already known to be plain, so its
/// first stop is at or after the tail's start; only a slice shorter than one window goes
/// byte by byte.
pub(super) fn plain_run(bytes: &[u8]) -> usize {
    // Most strings in a JSON-RPC envelope are short names and values, so the first words
    // are looked at on their own before a whole window is.
    let mut at = 0;
    for _ in 0..SHORT_WORDS {
        let Some(word) = bytes.get(at..).and_then(<[u8]>::first_chunk::<WORD_BYTES>) else {
            break;
        };
        if let Some(stop) = word_stop(word) {
            return at + stop;
        }
        at += WORD_BYTES;
    }
    while let Some(lanes) = bytes
        .get(at..)
        .and_then(|rest| rest.first_chunk::<PLAIN_LANES>())
    {
        if any_stop(lanes) {
            return at + first_stop(lanes);
        }
        at += PLAIN_LANES;
    }
    if at == bytes.len() {
        return at;
    }
    if let Some(last) = bytes.last_chunk::<PLAIN_LANES>() {
        // Fewer than PLAIN_LANES bytes are left after `at`, so the window starts before it,
        // and the bytes before `at` were all plain.
        let start = bytes.len() - PLAIN_LANES;
        assert!(start < at);
        let stop = start + first_stop(last);
        debug_assert!(stop >= at);
        return stop;
    }
    while let Some(&b) = bytes.get(at) {
        if is_stop(b) {
            break;
        }
        at += 1;
    }
    at
}

#[cfg(test)]
#[path = "scan_tests.rs"]
pub(super) mod tests;
