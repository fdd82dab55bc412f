//! Fuzzes how the redis store reads what Redis hands back: a stored value
//! (`<version>:<bytes>`) and a change message (`<version> <key>`). Oracles: arbitrary bytes
//! never panic, and whatever reads as a value or a message reads the same once written out
//! again the way the store's write script writes it; and any version above 0 with any
//! bytes, written that way, reads back exactly.
//!
//! Input: eight bytes of version; the rest is both the arbitrary reply and the bytes (or
//! key, as lossy UTF-8) written with that version.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcpyard::fuzzing::{decode_redis_value, parse_redis_change};
use mcpyard_fuzz::Input;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let version = input.u64();
    let rest = input.rest();

    // Arbitrary replies: a reading is stable.
    if let Some((v, bytes)) = decode_redis_value(rest.to_vec()) {
        assert!(v > 0, "version 0 read from {rest:?}");
        let mut again = format!("{v}:").into_bytes();
        again.extend_from_slice(&bytes);
        assert_eq!(decode_redis_value(again), Some((v, bytes)), "{rest:?}");
    }
    if let Some((v, key)) = parse_redis_change(rest) {
        let again = format!("{v} {key}");
        assert_eq!(parse_redis_change(again.as_bytes()), Some((v, key)), "{rest:?}");
    }

    // What the store writes reads back exactly.
    if version > 0 {
        let mut stored = format!("{version}:").into_bytes();
        stored.extend_from_slice(rest);
        let read = decode_redis_value(stored);
        assert_eq!(read.as_ref().map(|(v, b)| (*v, &b[..])), Some((version, rest)));
        let key = String::from_utf8_lossy(rest).into_owned();
        let message = format!("{version} {key}");
        assert_eq!(parse_redis_change(message.as_bytes()), Some((version, key)));
    }
});
