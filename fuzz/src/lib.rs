//! Helpers shared by the fuzz targets: reading control bytes off the front of an input and
//! cutting the rest into pieces.
//!
//! Every target takes its few parameters (where to split, which rule set, a limit) from the
//! first bytes of the fuzz input and the bytes under test from the rest, so libFuzzer's
//! mutations reach both, and a corpus file stays readable: a short binary header, then the
//! text of an HTTP message, an event stream or a JSON document.

/// A cursor over a fuzz input: control bytes come off the front, missing ones read as 0.
pub struct Input<'a> {
    rest: &'a [u8],
}

impl<'a> Input<'a> {
    /// A cursor at the start of `data`.
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { rest: data }
    }

    /// The next byte, or 0 when the input has run out.
    pub fn byte(&mut self) -> u8 {
        match self.rest.split_first() {
            Some((first, rest)) => {
                self.rest = rest;
                *first
            }
            None => 0,
        }
    }

    /// The next two bytes as a little-endian number.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    /// The next eight bytes as a little-endian number.
    pub fn u64(&mut self) -> u64 {
        let mut bytes = [0u8; 8];
        for b in &mut bytes {
            *b = self.byte();
        }
        u64::from_le_bytes(bytes)
    }

    /// Everything not read yet.
    pub fn rest(self) -> &'a [u8] {
        self.rest
    }
}

/// A cut point inside `len` bytes (0..=len) chosen by `selector`.
pub fn cut(selector: u16, len: usize) -> usize {
    usize::from(selector) % (len + 1)
}

/// `bytes` as two pieces split at the point `selector` chooses.
pub fn split(bytes: &[u8], selector: u16) -> [&[u8]; 2] {
    let (head, tail) = bytes.split_at(cut(selector, bytes.len()));
    [head, tail]
}

/// `bytes` as pieces of at most `size` bytes (one byte each for `size == 0`).
pub fn pieces(bytes: &[u8], size: usize) -> Vec<&[u8]> {
    bytes.chunks(size.max(1)).collect()
}
