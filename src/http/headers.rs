//! Zero-copy header fields of a decoded head.
//!
//! The decoders split the whole head off the read buffer as one frozen `Bytes` and keep only
//! byte ranges into it, so a head costs one small `Vec` of ranges and no copies of names or
//! values. Lookups are linear: a head holds at most `HEADERS_PER_MESSAGE_MAX` fields. The
//! `Vec`s of ended heads are kept per worker for the next heads (`FIELD_LISTS_KEPT`), so in
//! steady state a head allocates nothing. (Ranges kept inline in the head instead widened
//! every head event the decoders move, and cost more in moves than the allocation.)

use crate::runtime::kept::{self, Kept};
use std::cell::RefCell;
use std::fmt;

use bytes::Bytes;

use super::error::HttpError;

/// Byte ranges of one field line inside the head. Invariant: `start <= end <= head.len()`
/// for both ranges; `Headers::new` checks this and `slice` never panics regardless.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Field {
    pub(super) name_start: u32,
    pub(super) name_end: u32,
    pub(super) value_start: u32,
    pub(super) value_end: u32,
}

impl Field {
    /// Locates `name` and `value`, both borrowed from `base`, as ranges into `base`.
    ///
    /// Returns `None` if either slice does not lie inside `base` (which would be a bug in the
    /// parser, never a property of the input).
    pub(super) fn locate(base: &[u8], name: &[u8], value: &[u8]) -> Option<Field> {
        let (name_start, name_end) = offsets(base, name)?;
        let (value_start, value_end) = offsets(base, value)?;
        Some(Field {
            name_start,
            name_end,
            value_start,
            value_end,
        })
    }
}

/// Emptied field lists a worker keeps for its next heads.
const FIELD_LISTS_KEPT: usize = 256;

/// A list with room for more fields than this is not kept (the kept lists hold at most
/// `FIELD_LISTS_KEPT` x this many fields' room, 256 KiB).
const FIELD_LIST_KEPT_FIELDS: usize = crate::limits::HEADERS_PER_MESSAGE_MAX;

thread_local! {
    static FIELD_LISTS: Kept<Vec<Field>> = const { RefCell::new(Vec::new()) };
}

/// An empty field list with room for `count` fields, a kept one when there is one.
fn field_list(count: usize) -> Vec<Field> {
    let mut fields = kept::take(&FIELD_LISTS);
    fields.reserve(count);
    fields
}

/// Locates every parsed header of a head as ranges into `base`, the bytes it was parsed
/// from, in a list kept from an ended head (or one allocation of the right size).
///
/// Errors if a header does not lie inside `base` (a parser bug, never a property of input).
pub(super) fn locate_fields(
    base: &[u8],
    headers: &[httparse::Header<'_>],
) -> Result<Vec<Field>, HttpError> {
    let mut fields = field_list(headers.len());
    for header in headers {
        let field = Field::locate(base, header.name.as_bytes(), header.value)
            .ok_or(HttpError::BadRequest("header outside head"))?;
        fields.push(field);
    }
    Ok(fields)
}

/// Returns the `(start, end)` offsets of `part` inside `base`, if `part` is a sub-slice of it.
pub(super) fn offsets(base: &[u8], part: &[u8]) -> Option<(u32, u32)> {
    let start = (part.as_ptr() as usize).checked_sub(base.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    if end > base.len() {
        return None;
    }
    Some((u32::try_from(start).ok()?, u32::try_from(end).ok()?))
}

impl Drop for Headers {
    /// Keeps the field list, emptied, for the next head (within the bounds above).
    fn drop(&mut self) {
        let fields = std::mem::take(&mut self.fields);
        kept::give_back(
            &FIELD_LISTS,
            fields,
            FIELD_LIST_KEPT_FIELDS,
            FIELD_LISTS_KEPT,
        );
    }
}

/// The header fields of one request or response head, in the order received.
///
/// Names keep the case they were received with; lookups compare them case-insensitively
/// (RFC 9110 §5.1). Values are the raw field values with surrounding whitespace removed.
#[derive(Clone, Default)]
pub struct Headers {
    /// The whole head (start line included), shared with nothing else.
    head: Bytes,
    /// Field ranges into `head`, in the order received.
    fields: Vec<Field>,
}

impl Headers {
    /// Wraps `head` and field ranges that `Field::locate` computed against the same bytes.
    pub(super) fn new(head: Bytes, fields: Vec<Field>) -> Headers {
        Headers { head, fields }
    }

    pub(super) fn slice(&self, start: u32, end: u32) -> &[u8] {
        self.head
            .get(start as usize..end as usize)
            .unwrap_or_default()
    }

    /// The head's bytes from `start` to `end` as text; empty if they are not UTF-8 (callers
    /// pass ranges the parser found to be visible ASCII).
    pub(super) fn text(&self, start: u32, end: u32) -> &str {
        std::str::from_utf8(self.slice(start, end)).unwrap_or_default()
    }

    fn name_of(&self, field: &Field) -> &str {
        // httparse only accepts token characters in names, so they are ASCII.
        std::str::from_utf8(self.slice(field.name_start, field.name_end)).unwrap_or_default()
    }

    fn value_of(&self, field: &Field) -> &[u8] {
        self.slice(field.value_start, field.value_end)
    }

    /// True if `field` is called `name` (ASCII case-insensitive, compared as bytes: this
    /// runs for every header on every lookup, so no UTF-8 check). The lengths are compared
    /// first, from the field's own ranges, so most fields are ruled out without reading the
    /// head.
    #[inline]
    fn is_named(&self, field: &Field, name: &str) -> bool {
        let name_bytes = field.name_end.wrapping_sub(field.name_start) as usize;
        name_bytes == name.len()
            && names_match(
                self.slice(field.name_start, field.name_end),
                name.as_bytes(),
            )
    }

    /// Returns the value of the first field called `name` (case-insensitive), or `None`.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|field| self.is_named(field, name))
            .map(|field| self.value_of(field))
    }

    /// Returns the values of every field called `name` (case-insensitive), in order.
    pub fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> {
        self.fields
            .iter()
            .filter(move |field| self.is_named(field, name))
            .map(|field| self.value_of(field))
    }

    /// Returns every `(name, value)` pair in the order received, names as received.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.fields
            .iter()
            .map(|field| (self.name_of(field), self.value_of(field)))
    }

    /// Returns the number of field lines (repeated names count once per line).
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Returns true if the head had no field lines.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// Returns true if any comma-separated element of any `name` field equals `token`,
    /// ignoring case and optional whitespace around elements (RFC 9110 §5.6.1).
    pub fn has_token(&self, name: &str, token: &str) -> bool {
        self.get_all(name)
            .flat_map(list_elements)
            .any(|element| element.eq_ignore_ascii_case(token.as_bytes()))
    }
}

/// Bytes compared at once by `names_match`.
const WORD_BYTES: usize = 8;

/// Names this short are compared a byte at a time; from here to `WORD_BYTES` as one word
/// made of their first and last four bytes.
const HALF_WORD_BYTES: usize = WORD_BYTES / 2;

/// True if `a` and `b` are equal ignoring ASCII case, like `<[u8]>::eq_ignore_ascii_case`.
///
/// Lookups compare a header name against every field name of the same length, so this runs
/// several times per message: names are compared a word at a time, the last word
/// overlapping the one before it (`content-length` is two words, not 14 bytes), and a word
/// is lowercased only when its bytes differ as received.
///
/// Kept out of line so that `Headers::is_named`, whose length check rules out most fields,
/// stays small enough to inline into every lookup loop.
#[inline(never)]
fn names_match(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    if a.len() < HALF_WORD_BYTES {
        return a.eq_ignore_ascii_case(b);
    }
    if a.len() < WORD_BYTES {
        return match (halves(a), halves(b)) {
            (Some(a_word), Some(b_word)) => words_match(&a_word, &b_word),
            _ => a.eq_ignore_ascii_case(b),
        };
    }
    let (Some(a_last), Some(b_last)) = (a.last_chunk::<WORD_BYTES>(), b.last_chunk::<WORD_BYTES>())
    else {
        return false;
    };
    let (a_words, _) = a.as_chunks::<WORD_BYTES>();
    let (b_words, _) = b.as_chunks::<WORD_BYTES>();
    a_words
        .iter()
        .zip(b_words)
        .all(|(a_word, b_word)| words_match(a_word, b_word))
        && words_match(a_last, b_last)
}

/// The first four and the last four bytes of `bytes` (which overlap below eight bytes) as
/// one word; `None` if `bytes` is shorter than four.
fn halves(bytes: &[u8]) -> Option<[u8; WORD_BYTES]> {
    let head = bytes.first_chunk::<HALF_WORD_BYTES>()?;
    let tail = bytes.last_chunk::<HALF_WORD_BYTES>()?;
    let mut word = [0; WORD_BYTES];
    let (word_head, word_tail) = word.split_at_mut(HALF_WORD_BYTES);
    word_head.copy_from_slice(head);
    word_tail.copy_from_slice(tail);
    Some(word)
}

/// True if two words are equal ignoring ASCII case; exact equality, the usual case for
/// names sent in lowercase, skips the lowercasing.
fn words_match(a: &[u8; WORD_BYTES], b: &[u8; WORD_BYTES]) -> bool {
    a == b || word_lowercase(a) == word_lowercase(b)
}

/// Reads eight bytes as a word with each ASCII uppercase letter turned into lowercase; other
/// bytes, non-ASCII ones included, are unchanged (the same mapping as
/// `u8::to_ascii_lowercase`, applied to eight bytes at once).
fn word_lowercase(bytes: &[u8; WORD_BYTES]) -> u64 {
    const ONES: u64 = u64::from_ne_bytes([0x01; WORD_BYTES]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; WORD_BYTES]);
    let word = u64::from_ne_bytes(*bytes);
    // Per byte, on its low seven bits (at most 0x7f, so no sum below carries into the next
    // byte): the high bit of `from_a` is set for values >= b'A', of `past_z` for > b'Z'.
    let low_bits = word & !HIGH;
    let from_a = low_bits + ONES * u64::from(0x80 - b'A');
    let past_z = low_bits + ONES * u64::from(0x80 - b'Z' - 1);
    // Uppercase: in A..=Z and an ASCII byte (high bit clear); 0x80 >> 2 is the case bit 0x20.
    let upper = from_a & !past_z & !word & HIGH;
    word | (upper >> 2)
}

/// Splits a list-valued field on commas and trims optional whitespace (RFC 9110 §5.6.1).
/// Empty elements are returned as empty slices; callers decide whether they matter.
pub(super) fn list_elements(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|b| *b == b',').map(trim_ows)
}

/// Removes spaces and tabs from both ends of `bytes` (RFC 9110 §5.6.3 OWS).
pub(super) fn trim_ows(bytes: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !is_ows(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |at| at + 1);
    bytes.get(start..end).unwrap_or_default()
}

/// Two header sets are equal when they hold the same names and values in the same order.
impl PartialEq for Headers {
    fn eq(&self, other: &Headers) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Headers {}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(
                self.iter()
                    .map(|(name, value)| (name, String::from_utf8_lossy(value))),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_heads_field_list_serves_the_next_head_and_a_long_one_is_not_kept() {
        let kept = || FIELD_LISTS.with(|l| l.borrow().len());
        let first: &'static [u8] = b"a: 1\r\nb: 2\r\nc: 3\r\n\r\n";
        let next: &'static [u8] = b"x: 9\r\ny: 8\r\n\r\n";
        let mut slots = [httparse::EMPTY_HEADER; 8];
        let Ok(httparse::Status::Complete((_, parsed))) =
            httparse::parse_headers(first, &mut slots)
        else {
            panic!("test head must parse");
        };
        let fields = locate_fields(first, parsed).expect("fields");
        let before = kept();
        drop(Headers::new(Bytes::from_static(first), fields));
        assert_eq!(kept(), before + 1, "the list is kept");
        let mut slots = [httparse::EMPTY_HEADER; 8];
        let Ok(httparse::Status::Complete((_, parsed))) = httparse::parse_headers(next, &mut slots)
        else {
            panic!("test head must parse");
        };
        let again = locate_fields(next, parsed).expect("fields");
        assert_eq!(kept(), before, "and taken by the next head");
        let h = Headers::new(Bytes::from_static(next), again);
        assert_eq!(h.len(), 2, "emptied: none of the old head's fields");
        assert_eq!(h.get("y"), Some(&b"8"[..]));
        assert_eq!(h.get("c"), None);
        drop(h);
        let kept = kept();
        let mut long = field_list(FIELD_LIST_KEPT_FIELDS + 1);
        long.clear();
        drop(Headers::new(Bytes::new(), long));
        assert_eq!(
            FIELD_LISTS.with(|l| l.borrow().len()),
            kept - 1,
            "taken, not given back"
        );
    }

    fn headers(head: &'static [u8]) -> Headers {
        let mut slots = [httparse::EMPTY_HEADER; 8];
        let Ok(httparse::Status::Complete((_, parsed))) = httparse::parse_headers(head, &mut slots)
        else {
            panic!("test head must parse");
        };
        let fields = parsed
            .iter()
            .map(|h| Field::locate(head, h.name.as_bytes(), h.value))
            .collect::<Option<Vec<_>>>()
            .expect("fields lie inside the head");
        Headers::new(Bytes::from_static(head), fields)
    }

    #[test]
    fn lookups_are_case_insensitive_and_ordered() {
        let h =
            headers(b"Host: a\r\nX-Two: 1\r\nx-two: 2\r\nConnection: Keep-Alive, Upgrade\r\n\r\n");
        assert_eq!(h.len(), 4);
        assert!(!h.is_empty());
        assert_eq!(h.get("host"), Some(&b"a"[..]));
        assert_eq!(h.get("HOST"), Some(&b"a"[..]));
        assert_eq!(h.get("missing"), None);
        assert_eq!(
            h.get_all("X-TWO").collect::<Vec<_>>(),
            [&b"1"[..], &b"2"[..]]
        );
        let names: Vec<&str> = h.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["Host", "X-Two", "x-two", "Connection"]);
        assert!(h.has_token("connection", "upgrade"));
        assert!(h.has_token("connection", "keep-alive"));
        assert!(!h.has_token("connection", "close"));
        assert!(!h.has_token("host", "b"));
    }

    #[test]
    fn empty_headers() {
        let h = Headers::default();
        assert!(h.is_empty());
        assert_eq!(h.get("host"), None);
        assert!(!h.has_token("connection", "close"));
    }

    #[test]
    fn names_match_like_eq_ignore_ascii_case() {
        // Every byte value against every other, inside names on both sides of each word edge, at
        // every position: the word-at-a-time compare must agree with the standard one.
        let bytes: Vec<u8> = (0..=255u8).collect();
        for len in [1, 2, 3, 4, 5, 6, 7, 8, 9, 14, 15, 16, 17] {
            for at in 0..len {
                for &x in &bytes {
                    let mut a = b"content-length-xy".get(..len).unwrap_or_default().to_vec();
                    a[at] = x;
                    for &y in &bytes {
                        let mut b = a.clone();
                        b[at] = y;
                        assert_eq!(
                            names_match(&a, &b),
                            a.eq_ignore_ascii_case(&b),
                            "{x:#x} vs {y:#x} at {at} of {len}"
                        );
                    }
                }
            }
        }
        assert!(names_match(b"", b""));
        assert!(names_match(b"Content-Length", b"content-length"));
        assert!(!names_match(b"content-length", b"content-lengtx"));
        assert!(!names_match(b"content-length", b"content-lengt"));
        assert!(!names_match(b"Xontent-Length", b"content-length"));
        // The XOR of these two is exactly the case bit, yet they are not letters.
        assert!(!names_match(b"mcp-session^id", b"mcp-session~id"));
        assert!(!names_match(b"@", b"`"));
    }

    #[test]
    fn trim_ows_edges() {
        assert_eq!(trim_ows(b""), b"");
        assert_eq!(trim_ows(b" \t "), b"");
        assert_eq!(trim_ows(b" a b\t"), b"a b");
        let elements: Vec<&[u8]> = list_elements(b"a, ,b ,").collect();
        assert_eq!(elements, [&b"a"[..], b"", b"b", b""]);
    }
}
