//! JSON Web Key Sets (RFC 7517): the public keys a token issuer signs with, read from a file
//! or from the bytes of an HTTPS answer and turned into `jsonwebtoken` decoding keys.
//!
//! The config loader reads a file set once to refuse a broken one at start-up; the server
//! binding's guard reads sets again while running. A set is bounded in bytes
//! ([`JWKS_BYTES_MAX`]) and keys ([`JWKS_KEYS_MAX`]). Keys mcpyard cannot use (symmetric
//! `oct` keys, P-521, keys marked for encryption, malformed members) are skipped, not fatal:
//! an issuer may publish keys for other uses beside its signing keys.

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, KeyAlgorithm, KeyOperations, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use std::io::Read;
use std::path::Path;

/// Largest key set read: a few dozen RSA keys fit in a tenth of it.
pub const JWKS_BYTES_MAX: usize = 256 * 1024;
/// Most keys kept from one set.
pub const JWKS_KEYS_MAX: usize = 64;
/// Longest `kid` a usable key may have. A key with a longer one is skipped, not kept without
/// its name: unnamed, it would be tried for tokens naming other keys.
const KID_BYTES_MAX: usize = 256;

/// What signs: the key type a token's `alg` needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Rsa,
    Ec,
    Ed,
}

impl Family {
    /// The key type `alg` verifies with; `None` for HMAC, which is never accepted.
    pub fn of(alg: Algorithm) -> Option<Family> {
        match alg {
            Algorithm::RS256
            | Algorithm::RS384
            | Algorithm::RS512
            | Algorithm::PS256
            | Algorithm::PS384
            | Algorithm::PS512 => Some(Family::Rsa),
            Algorithm::ES256 | Algorithm::ES384 => Some(Family::Ec),
            Algorithm::EdDSA => Some(Family::Ed),
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => None,
        }
    }
}

/// One usable public key.
pub struct Key {
    /// `kid`, if the set gave one.
    pub kid: Option<Box<str>>,
    pub family: Family,
    /// The one algorithm the key is for, if the set said (`alg`): it checks no other.
    pub alg: Option<Algorithm>,
    pub key: DecodingKey,
}

/// The usable keys of one set, and a digest of the bytes they came from (a re-read that
/// brings the same bytes changes nothing).
pub struct KeySet {
    pub keys: Vec<Key>,
    pub digest: u32,
    /// The set had more than [`JWKS_KEYS_MAX`] usable keys; those past it were left out.
    pub left_out: bool,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kids: Vec<Option<&str>> = self.keys.iter().map(|k| k.kid.as_deref()).collect();
        f.debug_struct("KeySet")
            .field("kids", &kids)
            .field("digest", &self.digest)
            .finish()
    }
}

impl KeySet {
    /// The keys a token with `kid` and signed with `alg` may have used: the one with that
    /// `kid`; for a `kid` the set does not name, the family's keys without a `kid`; for a
    /// token without one, every key of the family. A key whose `alg` names another
    /// algorithm is never one.
    pub fn candidates<'a>(
        &'a self,
        kid: Option<&'a str>,
        alg: Algorithm,
    ) -> impl Iterator<Item = &'a Key> + 'a {
        let family = Family::of(alg);
        let named = kid.filter(|k| self.has_kid(k));
        self.keys.iter().filter(move |k| {
            Some(k.family) == family
                && k.alg.is_none_or(|a| a == alg)
                && match (kid, named) {
                    (_, Some(named)) => k.kid.as_deref() == Some(named),
                    (Some(_), None) => k.kid.is_none(),
                    (None, _) => true,
                }
        })
    }

    /// Whether the set has a key named `kid`.
    pub fn has_kid(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }
}

/// Reads a key set file, refusing one larger than [`JWKS_BYTES_MAX`].
pub fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read the key set: {e}"))?;
    let mut bytes = Vec::new();
    file.take(JWKS_BYTES_MAX as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the key set: {e}"))?;
    if bytes.len() > JWKS_BYTES_MAX {
        return Err(format!(
            "a key set larger than {JWKS_BYTES_MAX} bytes, expected a JWK Set"
        ));
    }
    Ok(bytes)
}

/// Parses a JWK Set (`{"keys":[...]}`): an error when it is not one. A well-formed set
/// may hold no usable key (an issuer that withdrew them all): it is then empty, and
/// refuses every token; only the config loader refuses it ([`require_keys`]). Past
/// [`JWKS_KEYS_MAX`] usable keys the rest are left out (`left_out`).
pub fn parse(bytes: &[u8]) -> Result<KeySet, String> {
    if bytes.len() > JWKS_BYTES_MAX {
        return Err(format!(
            "a key set larger than {JWKS_BYTES_MAX} bytes, expected a JWK Set"
        ));
    }
    #[derive(serde::Deserialize)]
    struct Set {
        keys: Vec<serde_json::Value>,
    }
    // The error names where, not what: the bytes may be anyone's, and they go to a log.
    let set: Set = serde_json::from_slice(bytes).map_err(|e| {
        format!(
            "not a JWK Set ({:?} error at line {} column {}), expected {{\"keys\":[...]}}",
            e.classify(),
            e.line(),
            e.column()
        )
    })?;
    let mut keys: Vec<Key> = set
        .keys
        .into_iter()
        .filter_map(|value| serde_json::from_value::<Jwk>(value).ok())
        .filter_map(|jwk| usable(&jwk))
        .take(JWKS_KEYS_MAX + 1)
        .collect();
    let left_out = keys.len() > JWKS_KEYS_MAX;
    keys.truncate(JWKS_KEYS_MAX);
    Ok(KeySet {
        keys,
        digest: crc32c::crc32c(bytes),
        left_out,
    })
}

/// `set`, if it holds a usable key: a set read at start-up that holds none is a mistake
/// in the config, not a withdrawal.
pub fn require_keys(set: KeySet) -> Result<KeySet, String> {
    if set.keys.is_empty() {
        return Err(
            "a JWK Set without a usable signing key, expected RSA, EC (P-256, P-384) or Ed25519 keys"
                .to_owned(),
        );
    }
    Ok(set)
}

/// The decoding key of one JWK, when it is a public signing key mcpyard can use.
fn usable(jwk: &Jwk) -> Option<Key> {
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return None;
    }
    // Operations named, and checking signatures not among them: not a verification key.
    if jwk
        .common
        .key_operations
        .as_ref()
        .is_some_and(|ops| !ops.contains(&KeyOperations::Verify))
    {
        return None;
    }
    let alg = match jwk.common.key_algorithm {
        None => None,
        Some(named) => Some(signing_algorithm(named)?),
    };
    let family = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Family::Rsa,
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            jsonwebtoken::jwk::EllipticCurve::P256 | jsonwebtoken::jwk::EllipticCurve::P384 => {
                Family::Ec
            }
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(okp) => match okp.curve {
            jsonwebtoken::jwk::EllipticCurve::Ed25519 => Family::Ed,
            _ => return None,
        },
        AlgorithmParameters::OctetKey(_) => return None,
    };
    let kid = jwk.common.key_id.as_deref();
    if kid.is_some_and(|k| k.len() > KID_BYTES_MAX) {
        return None;
    }
    let key = DecodingKey::from_jwk(jwk).ok()?;
    if alg.is_some_and(|a| Family::of(a) != Some(family)) {
        return None;
    }
    Some(Key {
        kid: kid.map(Box::from),
        family,
        alg,
        key,
    })
}

/// The signature algorithm a JWK's `alg` names; `None` for encryption and HMAC ones.
fn signing_algorithm(named: KeyAlgorithm) -> Option<Algorithm> {
    Some(match named {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        KeyAlgorithm::HS256
        | KeyAlgorithm::HS384
        | KeyAlgorithm::HS512
        | KeyAlgorithm::RSA1_5
        | KeyAlgorithm::RSA_OAEP
        | KeyAlgorithm::RSA_OAEP_256 => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unusable_keys_are_skipped_and_a_set_without_any_is_empty() {
        let oct = br#"{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"h"}]}"#;
        // Well formed: an empty set (every token refused), which only start-up refuses.
        let empty = parse(oct).unwrap();
        assert!(empty.keys.is_empty());
        assert!(
            require_keys(empty)
                .unwrap_err()
                .contains("without a usable signing key")
        );
        assert!(parse(br#"{"keys":[]}"#).unwrap().keys.is_empty());
        assert!(parse(b"[]").unwrap_err().contains("not a JWK Set"));
        assert!(parse(b"{\"keys\":[").is_err());
        let big = vec![b' '; JWKS_BYTES_MAX + 1];
        assert!(parse(&big).unwrap_err().contains("larger than"));
    }

    #[test]
    fn an_ed25519_key_is_found_by_kid_and_family() {
        // Public key bytes of RFC 8037's example.
        let set = br#"{"keys":[
            {"kty":"oct","k":"c2VjcmV0","kid":"h"},
            {"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo","kid":"ed"},
            {"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo","kid":"enc","use":"enc"}
        ]}"#;
        let set = parse(set).unwrap();
        assert_eq!(set.keys.len(), 1);
        assert!(set.has_kid("ed") && !set.has_kid("enc") && !set.has_kid("h"));
        assert_eq!(set.candidates(Some("ed"), Algorithm::EdDSA).count(), 1);
        assert_eq!(set.candidates(Some("ed"), Algorithm::RS256).count(), 0);
        assert_eq!(set.candidates(None, Algorithm::EdDSA).count(), 1);
        // A kid the set does not name is tried only against keys without a kid: none here.
        assert_eq!(set.candidates(Some("other"), Algorithm::EdDSA).count(), 0);
        let kidless = br#"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#;
        let kidless = parse(kidless).unwrap();
        assert_eq!(
            kidless.candidates(Some("other"), Algorithm::EdDSA).count(),
            1
        );
        assert_eq!(Family::of(Algorithm::HS256), None);
    }

    #[test]
    fn a_key_with_an_overlong_kid_is_skipped_not_kept_unnamed() {
        let x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
        let set = |kid: &str| {
            format!(
                r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","x":"{x}","kid":"{kid}"}},{{"kty":"OKP","crv":"Ed25519","x":"{x}","kid":"short"}}]}}"#
            )
        };
        let longest = parse(set(&"k".repeat(KID_BYTES_MAX)).as_bytes()).unwrap();
        assert_eq!(longest.keys.len(), 2);
        assert!(longest.has_kid(&"k".repeat(KID_BYTES_MAX)));
        let over = parse(set(&"k".repeat(KID_BYTES_MAX + 1)).as_bytes()).unwrap();
        assert_eq!(over.keys.len(), 1);
        // Unnamed, it would be a candidate for a token naming a key the set does not have.
        assert_eq!(over.candidates(Some("other"), Algorithm::EdDSA).count(), 0);
    }

    #[test]
    fn a_key_is_used_only_for_what_the_set_says_it_is_for() {
        let x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
        let set = |extra: &str| {
            let text = format!(r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","x":"{x}"{extra}}}]}}"#);
            parse(text.as_bytes()).unwrap()
        };
        assert_eq!(set("").keys.len(), 1);
        assert_eq!(set(r#","key_ops":["verify"]"#).keys.len(), 1);
        assert_eq!(set(r#","key_ops":["encrypt"]"#).keys.len(), 0);
        assert_eq!(set(r#","alg":"RSA-OAEP""#).keys.len(), 0);
        assert_eq!(set(r#","alg":"HS256""#).keys.len(), 0);
        // An alg of another family than the key's type.
        assert_eq!(set(r#","alg":"RS256""#).keys.len(), 0);
        let named = set(r#","alg":"EdDSA""#);
        assert_eq!(named.candidates(None, Algorithm::EdDSA).count(), 1);
    }

    #[test]
    fn past_the_bound_keys_are_left_out_not_the_set() {
        let x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
        let keys: Vec<String> = (0..=JWKS_KEYS_MAX)
            .map(|i| format!(r#"{{"kty":"OKP","crv":"Ed25519","x":"{x}","kid":"k{i}"}}"#))
            .collect();
        let text = format!(r#"{{"keys":[{}]}}"#, keys.join(","));
        let set = parse(text.as_bytes()).unwrap();
        assert_eq!(set.keys.len(), JWKS_KEYS_MAX);
        assert!(set.left_out);
        assert!(set.has_kid("k0") && !set.has_kid(&format!("k{JWKS_KEYS_MAX}")));
    }
}
