//! Session ids: 128 CSPRNG bits plus the owning node and worker, in visible ASCII.
//!
//! Format: `<node:2 hex><worker:2 hex><22 chars of URL-safe base64 of 16 random bytes>`,
//! 26 characters from `[0-9a-f]` and `[A-Za-z0-9_-]` (MCP requires 0x21–0x7E). The worker
//! prefix lets any worker hand a request to the owner without a shared table.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Random bytes per id (128 bits; the MCP guidance asks for at least 122).
const RANDOM_BYTES: usize = 16;
/// Length of a session id in characters.
pub const SESSION_ID_LEN: usize = 4 + 22;

/// Mints a new session id owned by `worker` on `node`. Fails only if the OS random
/// source fails, in which case no session may be created.
pub fn mint(node: u8, worker: u8) -> Result<String, getrandom::Error> {
    let mut random = [0u8; RANDOM_BYTES];
    getrandom::fill(&mut random)?;
    let mut id = String::with_capacity(SESSION_ID_LEN);
    id.push_str(&format!("{node:02x}{worker:02x}"));
    URL_SAFE_NO_PAD.encode_string(random, &mut id);
    assert!(id.len() == SESSION_ID_LEN);
    Ok(id)
}

/// The (node, worker) owning `id`, or `None` if `id` is not of our format.
pub fn owner(id: &[u8]) -> Option<(u8, u8)> {
    if id.len() != SESSION_ID_LEN {
        return None;
    }
    let head = id.get(..4)?;
    // Hex digits only (`from_str_radix` would take a sign too).
    if !head.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let hex = std::str::from_utf8(head).ok()?;
    let node = u8::from_str_radix(hex.get(..2)?, 16).ok()?;
    let worker = u8::from_str_radix(hex.get(2..)?, 16).ok()?;
    let tail = id.get(4..)?;
    if !tail
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
    {
        return None;
    }
    Some((node, worker))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_ids_are_visible_ascii_and_name_their_owner() {
        let id = mint(0, 7).expect("os random");
        assert_eq!(id.len(), SESSION_ID_LEN);
        assert!(id.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        assert_eq!(owner(id.as_bytes()), Some((0, 7)));
        assert_ne!(id, mint(0, 7).expect("os random"));
    }

    #[test]
    fn foreign_ids_have_no_owner() {
        for bad in [
            &b""[..],
            b"0007",
            b"zz07AAAAAAAAAAAAAAAAAAAAAA",
            b"+f+fAAAAAAAAAAAAAAAAAAAAAA",
            b"0007AAAAAAAAAAAAAAAAAAAA A",
        ] {
            assert_eq!(owner(bad), None, "{bad:?}");
        }
        let mut long = mint(1, 2).expect("os random").into_bytes();
        long.push(b'x');
        assert_eq!(owner(&long), None);
    }

    #[test]
    fn every_prefix_of_an_id_is_rejected() {
        let id = mint(3, 4).expect("os random");
        for cut in 0..id.len() {
            assert_eq!(owner(&id.as_bytes()[..cut]), None);
        }
    }
}
