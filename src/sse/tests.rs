//! Seeded round trip: random events written by the encoder (whole or through a
//! [`DataWriter`] in random fragments) and read back by the [`Decoder`] in random fragments.
//!
//! The seed comes from `MCPYARD_SEED` when set, else a fixed value; it is printed in every
//! assertion message so a failure can be replayed.

use bytes::{Bytes, BytesMut};

use super::{DataWriter, Decoder, Event, Message, encode_comment, encode_event};
use crate::testing::Rng;

/// Round trips per run.
const ROUNDS: usize = 200;
/// Events per round trip.
const EVENTS_PER_ROUND_MAX: u64 = 12;

/// Random bytes biased toward CR, LF, space and colon, the bytes the framing cares about.
fn random_data(rng: &mut Rng) -> Vec<u8> {
    let len = rng.below(40);
    (0..len)
        .map(|_| match rng.below(10) {
            0 => b'\r',
            1 => b'\n',
            2 => b' ',
            3 => b':',
            _ => rng.below(256) as u8,
        })
        .collect()
}

/// Random field text without CR, LF or NUL (what the encoder accepts).
fn random_text(rng: &mut Rng) -> String {
    const ALPHABET: &[char] = &['a', 'Z', '0', '9', ' ', ':', '-', '_', 'é', '€', '\t'];
    let len = rng.below(8);
    (0..len)
        .filter_map(|_| ALPHABET.get(rng.below(ALPHABET.len() as u64) as usize))
        .collect()
}

/// What the decoder reports for `data`: CR, CRLF and LF all read back as LF.
fn normalized(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut after_cr = false;
    for &byte in data {
        match byte {
            b'\n' if after_cr => {}
            b'\r' => out.push(b'\n'),
            _ => out.push(byte),
        }
        after_cr = byte == b'\r';
    }
    out
}

/// Encodes one random event into `wire` and returns the message the decoder should report.
fn write_random_event(rng: &mut Rng, wire: &mut BytesMut) -> Option<Message> {
    let id = rng.chance(50).then(|| random_text(rng));
    let data = rng.chance(80).then(|| random_data(rng));
    if rng.chance(30) {
        encode_comment(&random_text(rng), wire);
    }
    let expected = if let (Some(data), true) = (&data, rng.chance(40)) {
        // Streamed in random fragments.
        let Ok(mut writer) = DataWriter::begin(id.as_deref(), wire) else {
            panic!("begin rejected a valid id {id:?}");
        };
        let mut rest = data.as_slice();
        while !rest.is_empty() {
            let cut = rng.below(rest.len() as u64 + 1) as usize;
            let (head, tail) = rest.split_at(cut);
            writer.write(head, wire);
            rest = tail;
        }
        writer.finish(wire);
        Message {
            id: id.clone(),
            data: Some(Bytes::from(normalized(data))),
            ..Message::default()
        }
    } else {
        let event = rng.chance(30).then(|| random_text(rng));
        let retry_ms = rng.chance(20).then(|| rng.next_u64() >> rng.below(64));
        let ev = Event {
            id: id.as_deref(),
            event: event.as_deref(),
            data: data.as_deref(),
            retry_ms,
        };
        assert_eq!(encode_event(&ev, wire), Ok(()));
        Message {
            id: id.clone(),
            event,
            data: data.as_deref().map(|d| Bytes::from(normalized(d))),
            retry_ms,
        }
    };
    (expected != Message::default()).then_some(expected)
}

#[test]
fn encoder_decoder_round_trip_seeded() {
    let (mut rng, seed) = Rng::seeded(0x5EED_F00D_CAFE);
    for round in 0..ROUNDS {
        let mut wire = BytesMut::new();
        let mut want = Vec::new();
        let mut want_last_id = None;
        for _ in 0..=rng.below(EVENTS_PER_ROUND_MAX) {
            if let Some(message) = write_random_event(&mut rng, &mut wire) {
                if let Some(id) = &message.id {
                    want_last_id = (!id.is_empty()).then(|| id.clone());
                }
                want.push(message);
            }
        }
        let wire = wire.freeze();

        let mut decoder = Decoder::new();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut rest = &wire[..];
        while !rest.is_empty() {
            let cut = 1 + rng.below(rest.len() as u64) as usize;
            let (head, tail) = rest.split_at(cut);
            buf.extend_from_slice(head);
            rest = tail;
            for _ in 0..=buf.len() {
                match decoder.decode(&mut buf) {
                    Ok(Some(message)) => got.push(message),
                    Ok(None) => break,
                    Err(error) => panic!("seed {seed} round {round}: error {error}"),
                }
            }
        }
        assert_eq!(got, want, "seed {seed} round {round}: wire {wire:?}");
        assert!(
            buf.is_empty(),
            "seed {seed} round {round}: leftover {buf:?}"
        );
        assert_eq!(
            decoder.last_event_id(),
            want_last_id.as_deref(),
            "seed {seed} round {round}: last event id"
        );
    }
}
