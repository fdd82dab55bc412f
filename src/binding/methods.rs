//! The method labels of the gateway's request metrics (`method="…"`): every request kind
//! the internal streams carry, plus the methods the server binding answers itself. The
//! server's request latencies and the proxy's per-toolkit counts are tables indexed by
//! these labels.

use crate::stream::Kind;

/// The methods the server answers itself, beside the request kinds; `other` is last.
const LOCAL_METHODS: [&str; 3] = ["initialize", "ping", "other"];

/// How many method labels there are (the length of a per-method table).
pub const METHODS: usize = Kind::REQUESTS.len() + LOCAL_METHODS.len();

/// The label index of a method name (`other` for a method the gateway does not know).
pub fn method_index(method: &str) -> usize {
    if let Some(i) = Kind::REQUESTS.iter().position(|k| k.method() == method) {
        return i;
    }
    let local = LOCAL_METHODS
        .iter()
        .position(|m| *m == method)
        .unwrap_or(LOCAL_METHODS.len() - 1);
    Kind::REQUESTS.len() + local
}

/// The method label (`method="…"`) of a label index.
pub fn method_label(index: usize) -> &'static str {
    match Kind::REQUESTS.get(index) {
        Some(k) => k.method(),
        None => LOCAL_METHODS
            .get(index - Kind::REQUESTS.len())
            .copied()
            .unwrap_or("other"),
    }
}

/// The label index of a stream kind (`other` for the lifecycle and unknown methods).
pub fn kind_index(kind: Kind) -> usize {
    match Kind::REQUESTS.iter().position(|k| *k == kind) {
        Some(i) => i,
        None => Kind::REQUESTS.len() + LOCAL_METHODS.len() - 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_and_local_method_has_its_own_label() {
        for k in Kind::REQUESTS {
            assert_eq!(method_label(method_index(k.method())), k.method());
            assert_eq!(method_label(kind_index(k)), k.method());
        }
        assert_eq!(method_label(method_index("initialize")), "initialize");
        assert_eq!(method_label(method_index("ping")), "ping");
        assert_eq!(method_label(method_index("something/else")), "other");
        assert_eq!(method_label(kind_index(Kind::Lifecycle)), "other");
        assert!(method_index("something/else") < METHODS);
    }
}
