//! Aggregate event-id prefixes: the short tag that marks which route an event id came from.
//!
//! When a proxy has more than one route, each upstream mints SSE event ids in its own
//! namespace, so the proxy hands the agent one aggregate id listing the last id of every
//! route, each behind its route's prefix (`2=200;S=101`), and splits it again on resume.
//! The prefix is derived from the toolkit name alone, so it is the same on every worker and
//! across restarts, and an agent's `Last-Event-ID` stays valid as long as the toolkit names
//! do. The config loader computes the prefixes once (`validate.rs`) and stores them on each
//! `Route`; an unresolvable set refuses the file. The derivation is the one the Zilla
//! gateway's MCP binding uses, so aggregate ids stay compatible with it.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Length of a full event code: 4 CRC bytes in unpadded base64 are 6 characters.
pub const EVENT_CODE_CHARS: usize = 6;

/// A toolkit's full event code: CRC32C (Castagnoli) of the name's UTF-8 bytes, as 4 bytes
/// big-endian, in URL-safe base64 without padding. Always [`EVENT_CODE_CHARS`] ASCII
/// characters from `A-Z a-z 0-9 - _`; `bluesky` gives `SFRt9w`.
pub fn event_code(toolkit: &str) -> String {
    let crc = crc32c::crc32c(toolkit.as_bytes());
    let code = URL_SAFE_NO_PAD.encode(crc.to_be_bytes());
    assert!(code.len() == EVENT_CODE_CHARS);
    code
}

/// The event-id prefixes of a proxy's toolkits, in the order given.
///
/// Each prefix is the first L characters of the toolkit's [`event_code`], where L is the
/// shortest length from 1 to 6 at which all the codes differ; every toolkit gets the same
/// L, so a decoder can split an aggregate id without a table of lengths. Returns the
/// prefixes, or, when even the full codes of two toolkits are equal (a CRC32C collision,
/// or the same name twice), the indices of the first such pair, smaller index first.
pub fn event_prefixes(toolkits: &[&str]) -> Result<Vec<String>, (usize, usize)> {
    let codes: Vec<String> = toolkits.iter().map(|t| event_code(t)).collect();
    // Sorting the indices by code puts equal codes, and codes with a common prefix, next to
    // each other, so each length needs one pass over neighbours rather than all pairs.
    let mut order: Vec<usize> = (0..codes.len()).collect();
    order.sort_by(|&a, &b| codes.get(a).cmp(&codes.get(b)).then(a.cmp(&b)));
    let neighbours = || {
        order.windows(2).filter_map(|pair| match pair {
            &[a, b] => Some((a, b)),
            _ => None,
        })
    };
    let head = |index: usize, len: usize| codes.get(index).map(|code| head_of(code, len));
    for len in 1..=EVENT_CODE_CHARS {
        if neighbours().all(|(a, b)| head(a, len) != head(b, len)) {
            return Ok(codes
                .iter()
                .map(|code| head_of(code, len).to_owned())
                .collect());
        }
    }
    let collision = neighbours()
        .filter(|&(a, b)| codes.get(a) == codes.get(b))
        .map(|(a, b)| (a.min(b), a.max(b)))
        .min();
    // The loop above only falls through when some neighbours have equal full codes.
    Err(collision.unwrap_or((0, 0)))
}

/// The first `len` characters of a code (codes are ASCII, so characters are bytes).
fn head_of(code: &str, len: usize) -> &str {
    code.get(..len).unwrap_or(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two distinct toolkit names with the same CRC32C, found by a birthday search over
    /// `t0`, `t1`, … (about 1.4 million names; too slow to repeat in every test run, so the
    /// pair is pinned here and `crc32c_collision_is_real` checks it).
    const COLLIDING: [&str; 2] = ["t1371838", "t2000402"];

    #[test]
    fn codes_match_the_zilla_vectors() {
        assert_eq!(event_code("bluesky"), "SFRt9w");
        assert_eq!(event_code("quartz"), "2-p5DQ");
        assert_eq!(event_code("github"), "GSU2lg");
        assert_eq!(event_code("time"), "CQTPeA");
    }

    #[test]
    fn distinct_first_characters_give_one_character_prefixes() {
        assert_eq!(
            event_prefixes(&["bluesky", "quartz"]),
            Ok(vec!["S".to_owned(), "2".to_owned()])
        );
        assert_eq!(
            event_prefixes(&["github", "time"]),
            Ok(vec!["G".to_owned(), "C".to_owned()])
        );
    }

    #[test]
    fn a_shared_first_character_lengthens_every_prefix() {
        // slack → kCs95w, files → kbzQUA: they differ at the second character, so L = 2,
        // and the third toolkit gets two characters too.
        assert_eq!(event_code("slack"), "kCs95w");
        assert_eq!(event_code("files"), "kbzQUA");
        assert_eq!(
            event_prefixes(&["slack", "files", "bluesky"]),
            Ok(vec!["kC".to_owned(), "kb".to_owned(), "SF".to_owned()])
        );
        // kit1803 → ZOxHyA, kit8000 → ZOxDpw share three characters: L = 4.
        assert_eq!(
            event_prefixes(&["quartz", "kit1803", "kit8000"]),
            Ok(vec![
                "2-p5".to_owned(),
                "ZOxH".to_owned(),
                "ZOxD".to_owned()
            ])
        );
    }

    #[test]
    fn one_toolkit_gets_one_character_and_none_get_nothing() {
        assert_eq!(event_prefixes(&["bluesky"]), Ok(vec!["S".to_owned()]));
        assert_eq!(event_prefixes(&[]), Ok(Vec::new()));
    }

    #[test]
    fn crc32c_collision_is_real() {
        let [a, b] = COLLIDING;
        assert_ne!(a, b);
        assert_eq!(crc32c::crc32c(a.as_bytes()), crc32c::crc32c(b.as_bytes()));
        assert_eq!(event_code(a), "Ptjpsw");
        assert_eq!(event_code(b), "Ptjpsw");
    }

    #[test]
    fn equal_full_codes_report_the_first_colliding_pair() {
        let [a, b] = COLLIDING;
        assert_eq!(event_prefixes(&["github", a, "time", b]), Err((1, 3)));
        assert_eq!(event_prefixes(&[b, a]), Err((0, 1)));
        // The same name twice collides too (the loader refuses duplicates before this).
        assert_eq!(event_prefixes(&["time", "github", "time"]), Err((0, 2)));
    }
}
