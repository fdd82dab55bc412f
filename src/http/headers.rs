//! Zero-copy header fields of a decoded head.
//!
//! The decoders split the whole head off the read buffer as one frozen `Bytes` and keep only
//! byte ranges into it, so a head costs one small `Vec` of ranges and no copies of names or
//! values. Lookups are linear: a head holds at most `HEADERS_PER_MESSAGE_MAX` fields.

use std::fmt;

use bytes::Bytes;

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

/// Returns the `(start, end)` offsets of `part` inside `base`, if `part` is a sub-slice of it.
fn offsets(base: &[u8], part: &[u8]) -> Option<(u32, u32)> {
    let start = (part.as_ptr() as usize).checked_sub(base.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    if end > base.len() {
        return None;
    }
    Some((u32::try_from(start).ok()?, u32::try_from(end).ok()?))
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

    fn slice(&self, start: u32, end: u32) -> &[u8] {
        self.head
            .get(start as usize..end as usize)
            .unwrap_or_default()
    }

    fn name_of(&self, field: &Field) -> &str {
        // httparse only accepts token characters in names, so they are ASCII.
        std::str::from_utf8(self.slice(field.name_start, field.name_end)).unwrap_or_default()
    }

    fn value_of(&self, field: &Field) -> &[u8] {
        self.slice(field.value_start, field.value_end)
    }

    /// True if `field` is called `name` (ASCII case-insensitive, compared as bytes: this
    /// runs for every header on every lookup, so no UTF-8 check).
    fn is_named(&self, field: &Field, name: &str) -> bool {
        self.slice(field.name_start, field.name_end)
            .eq_ignore_ascii_case(name.as_bytes())
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
    fn trim_ows_edges() {
        assert_eq!(trim_ows(b""), b"");
        assert_eq!(trim_ows(b" \t "), b"");
        assert_eq!(trim_ows(b" a b\t"), b"a b");
        let elements: Vec<&[u8]> = list_elements(b"a, ,b ,").collect();
        assert_eq!(elements, [&b"a"[..], b"", b"b", b""]);
    }
}
