//! Byte pieces kept in order without a handle per tiny piece.
//!
//! Body bytes travel as `Bytes` handles sliced from the read buffers, one per chunk of a
//! chunked body. A peer that sends one-byte chunks (`1\r\nx\r\n` over and over) would make
//! every byte cost a 32-byte handle wherever pieces are kept: a queue of DATA frames, an
//! item held until it is complete, a result held until it is whole. [`keep`] copies two
//! small neighbours together instead, so what pieces cost grows with their bytes, not with
//! how finely the peer cut them. The first few pieces are kept as they came, so bodies read
//! in a few pieces are never copied.

use bytes::{Bytes, BytesMut};

use crate::limits::PIECE_JOIN_BYTES;

/// Pieces kept as they came before any are joined: a body read in a few pieces (an item
/// with its prefix, a result across two reads) is passed on as slices of what was read,
/// never copied.
pub const PIECES_KEPT_AS_GIVEN: usize = 4;

/// Keeps `piece` after `last`, the last of the `kept` pieces kept before it (if any): when
/// [`PIECES_KEPT_AS_GIVEN`] are kept already and `last` and `piece` are both smaller than
/// [`PIECE_JOIN_BYTES`], `piece` is copied onto the end of `last` and `None` comes back;
/// otherwise `piece` comes back, to be kept as a piece of its own (an empty piece is
/// dropped). So past the first few, no two small pieces are neighbours: `n` bytes kept
/// this way are at most `PIECES_KEPT_AS_GIVEN + 2 * n / PIECE_JOIN_BYTES + 1` pieces.
/// Appending to a piece made here reuses its buffer (it is the only handle of it), so
/// joining many pieces copies each byte about once.
pub fn keep(kept: usize, last: Option<&mut Bytes>, piece: Bytes) -> Option<Bytes> {
    if piece.is_empty() {
        return None;
    }
    let Some(last) = last else {
        return Some(piece);
    };
    if kept < PIECES_KEPT_AS_GIVEN
        || last.len() >= PIECE_JOIN_BYTES
        || piece.len() >= PIECE_JOIN_BYTES
    {
        return Some(piece);
    }
    let mut joined = match std::mem::take(last).try_into_mut() {
        Ok(own) => own,
        Err(shared) => {
            let mut copy = BytesMut::with_capacity(2 * PIECE_JOIN_BYTES);
            copy.extend_from_slice(&shared);
            copy
        }
    };
    joined.extend_from_slice(&piece);
    *last = joined.freeze();
    None
}

/// A message gathered whole into one `Bytes`. The common case, a message that came in one
/// piece, stays the slice the decoder gave (no copy, no allocation); one in several pieces
/// is copied together as they come, so it holds no handle per piece.
#[derive(Default)]
pub struct Whole {
    first: Bytes,
    joined: Option<BytesMut>,
}

impl Whole {
    /// Adds the next piece.
    pub fn push(&mut self, piece: Bytes) {
        match &mut self.joined {
            Some(joined) => joined.extend_from_slice(&piece),
            None if self.first.is_empty() => self.first = piece,
            None if piece.is_empty() => {}
            None => {
                let mut joined = BytesMut::with_capacity(self.first.len() + piece.len());
                joined.extend_from_slice(&std::mem::take(&mut self.first));
                joined.extend_from_slice(&piece);
                self.joined = Some(joined);
            }
        }
    }

    /// Bytes gathered so far.
    pub fn len(&self) -> usize {
        match &self.joined {
            Some(joined) => joined.len(),
            None => self.first.len(),
        }
    }

    /// True when nothing was gathered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes what was gathered, leaving this empty. A joined message whose buffer grew
    /// well past it (growth doubles) is copied into one of its size, so a message held
    /// after this (its slices live on) holds no spare room.
    pub fn take(&mut self) -> Bytes {
        match self.joined.take() {
            Some(joined) if joined.capacity() > joined.len() + joined.len() / 4 => {
                Bytes::copy_from_slice(&joined)
            }
            Some(joined) => joined.freeze(),
            None => std::mem::take(&mut self.first),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeps `pieces` in a list the way every user does.
    fn kept(pieces: impl IntoIterator<Item = Bytes>) -> Vec<Bytes> {
        let mut out: Vec<Bytes> = Vec::new();
        for piece in pieces {
            if let Some(p) = keep(out.len(), out.last_mut(), piece) {
                out.push(p);
            }
        }
        out
    }

    #[test]
    fn one_byte_pieces_are_joined_into_few() {
        let n = 100_000;
        let body: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let shared = Bytes::from(body.clone());
        let out = kept((0..n).map(|i| shared.slice(i..i + 1)));
        assert!(
            out.len() <= 2 * n / PIECE_JOIN_BYTES + 1,
            "{} pieces",
            out.len()
        );
        assert_eq!(out.concat(), body);
    }

    #[test]
    fn the_first_pieces_and_large_ones_stay_as_they_came() {
        let big = Bytes::from(vec![b'b'; PIECE_JOIN_BYTES]);
        let small = |s: &'static str| Bytes::from_static(s.as_bytes());
        let out = kept([
            small("a"),
            small("b"),
            small("c"),
            small("d"),
            small("e"),
            small("f"),
            big.clone(),
            small("s1"),
            big.clone(),
            small("s2"),
            small("s3"),
            Bytes::new(),
            big.clone(),
        ]);
        let lens: Vec<usize> = out.iter().map(Bytes::len).collect();
        let b = PIECE_JOIN_BYTES;
        assert_eq!(lens, [1, 1, 1, 3, b, 2, b, 4, b]);
        // Large pieces are the handles given, not copies.
        assert_eq!(out[4].as_ptr(), big.as_ptr());
        assert_eq!(out[3], "def");
        assert_eq!(out[5], "s1");
        assert_eq!(out[7], "s2s3");
    }

    #[test]
    fn a_whole_message_in_one_piece_is_that_piece_and_in_many_is_joined() {
        let piece = Bytes::from_static(b"{\"a\":1}");
        let mut one = Whole::default();
        one.push(Bytes::new());
        one.push(piece.clone());
        one.push(Bytes::new());
        assert_eq!(one.len(), piece.len());
        let taken = one.take();
        assert_eq!(taken.as_ptr(), piece.as_ptr());
        assert!(one.is_empty());
        let mut many = Whole::default();
        for b in piece.iter() {
            many.push(Bytes::copy_from_slice(&[*b]));
        }
        assert_eq!(many.len(), piece.len());
        assert_eq!(many.take(), piece);
        assert_eq!(many.take(), Bytes::new());
    }

    #[test]
    fn the_first_pieces_are_not_copied() {
        let piece = Bytes::from(vec![7u8; 10]);
        let out = kept((0..PIECES_KEPT_AS_GIVEN).map(|_| piece.clone()));
        assert_eq!(out.len(), PIECES_KEPT_AS_GIVEN);
        assert!(out.iter().all(|p| p.as_ptr() == piece.as_ptr()));
    }
}
