//! Renaming in flight: the toolkit prefix comes off an item's name in the params going up,
//! goes onto uris in notifications coming down, and server-to-client request ids get the
//! route's toolkit so answers find their way back.
//!
//! Params are renamed without scanning them: the server recorded where the name's raw
//! lexeme sits ([`crate::stream::TargetAt`]), so [`Splice`] swaps those bytes for the
//! upstream's name while the rest streams through as zero-copy slices, wherever the DATA
//! pieces happen to split.

use crate::jsonrpc;
use bytes::{BufMut, Bytes, BytesMut};

/// Replaces bytes `start..end` of a stream with `with`, piece by piece.
#[derive(Debug)]
pub struct Splice {
    start: usize,
    end: usize,
    with: Bytes,
    /// Bytes of the stream seen so far.
    at: usize,
    /// `with` has gone out.
    done: bool,
}

impl Splice {
    /// A splice of `start..end` (`start <= end`) by `with`.
    pub fn new(start: usize, end: usize, with: Bytes) -> Splice {
        assert!(start <= end);
        Splice {
            start,
            end,
            with,
            at: 0,
            done: false,
        }
    }

    /// How the stream's length changes: `with` minus the replaced bytes.
    pub fn out_len(&self, in_len: usize) -> usize {
        in_len - (self.end - self.start) + self.with.len()
    }

    /// What `piece` (the next bytes of the stream) becomes: at most three pieces, in order.
    pub fn feed(&mut self, piece: Bytes) -> impl Iterator<Item = Bytes> {
        let mut out = Pieces::default();
        self.feed_into(piece, &mut out);
        out.0.into_iter().flatten()
    }

    fn feed_into(&mut self, piece: Bytes, out: &mut Pieces) {
        let from = self.at;
        let to = from + piece.len();
        self.at = to;
        // The piece covers stream bytes from..to: what lies before `start` is kept, then
        // `with` goes out once the stream has reached `start`, then what lies after `end`.
        let kept_to = self.start.clamp(from, to);
        if kept_to > from {
            out.push(piece.slice(..kept_to - from));
        }
        if !self.done && to >= self.start {
            self.done = true;
            if !self.with.is_empty() {
                out.push(self.with.clone());
            }
        }
        let kept_from = self.end.clamp(from, to);
        if to > kept_from {
            out.push(piece.slice(kept_from - from..));
        }
    }
}

/// Up to three pieces, without a heap allocation.
#[derive(Default)]
struct Pieces([Option<Bytes>; 3]);

impl Pieces {
    fn push(&mut self, piece: Bytes) {
        let free = self.0.iter_mut().find(|p| p.is_none());
        assert!(free.is_some(), "a splice makes at most three pieces of one");
        if let Some(slot) = free {
            *slot = Some(piece);
        }
    }
}

/// The JSON string lexeme of `name`.
pub fn lexeme(name: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(name.len() + 2);
    jsonrpc::escape_str(name, &mut out);
    out.freeze()
}

/// Separates a route's toolkit from a server-to-client request's own id.
const ID_SEPARATOR: char = '~';

/// The id a server-to-client request of route `toolkit` is shown to the agent with: the
/// JSON string `"<toolkit>~<raw id>"`, so ids of different routes cannot collide.
pub fn wrap_id(toolkit: &str, raw: &[u8]) -> Bytes {
    let raw = String::from_utf8_lossy(raw);
    lexeme(&format!("{toolkit}{ID_SEPARATOR}{raw}"))
}

/// Undoes [`wrap_id`]: the toolkit and the route's own raw id lexeme, which must be a
/// JSON string or number (it is written into a JSON body upstream as it is).
pub fn unwrap_id(raw: &[u8]) -> Option<(String, Bytes)> {
    let text: String = serde_json::from_slice(raw).ok()?;
    let (toolkit, id) = text.split_once(ID_SEPARATOR)?;
    jsonrpc::id_key_of_raw(id)?;
    Some((
        toolkit.to_owned(),
        Bytes::copy_from_slice(id.trim().as_bytes()),
    ))
}

/// `params` with `prefix` put in front of the string value of member `key` (e.g. the
/// `uri` of `notifications/resources/updated`); `None` if there is no such string.
pub fn prefix_member(params: &[u8], key: &str, prefix: &[u8]) -> Option<Bytes> {
    let text = std::str::from_utf8(params).ok()?;
    let whole = jsonrpc::Raw::parse(text)?;
    let value = jsonrpc::param_raw(whole, key)?;
    if !value.get().starts_with('"') {
        return None;
    }
    // Both are slices of `text`: the member's offset is the distance between their starts.
    let at = value.get().as_ptr() as usize - text.as_ptr() as usize + 1;
    let (head, tail) = params.split_at_checked(at)?;
    let mut out = BytesMut::with_capacity(params.len() + prefix.len());
    out.put_slice(head);
    out.put_slice(prefix);
    out.put_slice(tail);
    Some(out.freeze())
}

/// `params` with member `key` (a server-to-client request id, as in
/// `notifications/cancelled`'s `requestId`) replaced by its [`wrap_id`] form.
pub fn wrap_member_id(params: &[u8], key: &str, toolkit: &str) -> Option<Bytes> {
    let text = std::str::from_utf8(params).ok()?;
    let whole = jsonrpc::Raw::parse(text)?;
    let value = jsonrpc::param_raw(whole, key)?;
    let start = value.get().as_ptr() as usize - text.as_ptr() as usize;
    let end = start + value.get().len();
    let wrapped = wrap_id(toolkit, value.get().as_bytes());
    let mut out = BytesMut::with_capacity(params.len() + wrapped.len());
    out.put_slice(params.get(..start)?);
    out.put_slice(&wrapped);
    out.put_slice(params.get(end..)?);
    Some(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` cut at `cuts` through a splice and joins the output.
    fn spliced(input: &[u8], cuts: &[usize], start: usize, end: usize, with: &[u8]) -> Vec<u8> {
        let mut splice = Splice::new(start, end, Bytes::copy_from_slice(with));
        let mut out = Vec::new();
        let mut from = 0;
        for &cut in cuts.iter().chain([input.len()].iter()) {
            out.extend(splice.feed(Bytes::copy_from_slice(&input[from..cut])));
            from = cut;
        }
        assert_eq!(
            out.iter().map(Bytes::len).sum::<usize>(),
            splice.out_len(input.len())
        );
        out.concat()
    }

    #[test]
    fn the_prefix_comes_off_at_every_split_of_the_params() {
        let params = br#"{"name":"github__search","arguments":{"q":"github__x"}}"#;
        let start = 8;
        let end = start + br#""github__search""#.len();
        let want = br#"{"name":"search","arguments":{"q":"github__x"}}"#;
        for a in 0..=params.len() {
            for b in a..=params.len() {
                assert_eq!(
                    spliced(params, &[a, b], start, end, b"\"search\""),
                    want,
                    "cut at {a}, {b}"
                );
            }
        }
        // One byte at a time, and with empty pieces in between.
        let every: Vec<usize> = (0..=params.len()).flat_map(|i| [i, i]).collect();
        assert_eq!(spliced(params, &every, start, end, b"\"search\""), want);
    }

    #[test]
    fn splices_at_the_edges() {
        let all = b"abcdef";
        for a in 0..=all.len() {
            assert_eq!(spliced(all, &[a], 0, 2, b"XY"), b"XYcdef");
            assert_eq!(spliced(all, &[a], 4, 6, b"Z"), b"abcdZ");
            assert_eq!(spliced(all, &[a], 3, 3, b"_"), b"abc_def");
            assert_eq!(spliced(all, &[a], 0, 6, b""), b"");
            assert_eq!(spliced(all, &[a], 6, 6, b"!"), b"abcdef!");
        }
    }

    #[test]
    fn request_ids_carry_their_toolkit_both_ways() {
        for raw in [&b"0"[..], b"17", b"\"abc\"", b"\"a~b\\\"c\"", b"-3.5e2"] {
            let wrapped = wrap_id("github", raw);
            let text: String = serde_json::from_slice(&wrapped).unwrap();
            assert!(text.starts_with("github~"), "{text}");
            let (toolkit, back) = unwrap_id(&wrapped).unwrap();
            assert_eq!(toolkit, "github");
            assert_eq!(&back[..], raw);
        }
        // What an agent could forge does not reach an upstream body.
        assert!(unwrap_id(br#""github~1,\"method\":\"x\"""#).is_none());
        assert!(unwrap_id(br#""github-1""#).is_none());
        assert!(unwrap_id(b"12").is_none());
        assert!(unwrap_id(b"not json").is_none());
    }

    #[test]
    fn members_are_renamed_in_small_params() {
        assert_eq!(
            &prefix_member(br#"{"uri":"file:///a","x":1}"#, "uri", b"gh+").unwrap()[..],
            br#"{"uri":"gh+file:///a","x":1}"#
        );
        assert_eq!(
            &prefix_member(br#"{ "x": {"uri":"no"}, "uri" : "z" }"#, "uri", b"p+").unwrap()[..],
            br#"{ "x": {"uri":"no"}, "uri" : "p+z" }"#
        );
        assert!(prefix_member(br#"{"uri":5}"#, "uri", b"p+").is_none());
        assert!(prefix_member(br#"{"x":"y"}"#, "uri", b"p+").is_none());
        assert_eq!(
            &wrap_member_id(br#"{"requestId":3,"reason":"late"}"#, "requestId", "gh").unwrap()[..],
            br#"{"requestId":"gh~3","reason":"late"}"#
        );
    }
}
