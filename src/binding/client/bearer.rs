//! `WWW-Authenticate: Bearer …` challenges from an upstream (RFC 9110 §11.6.1, RFC 6750
//! §3, RFC 9728 §5.1), parsed into the typed [`BearerChallenge`] the server renders again.
//!
//! The grammar allows several challenges in one field value and several field lines:
//!
//! ```text
//! WWW-Authenticate = #challenge
//! challenge        = auth-scheme [ 1*SP ( token68 / #auth-param ) ]
//! auth-param       = token BWS "=" BWS ( token / quoted-string )
//! ```
//!
//! Commas separate both challenges and parameters, so a new challenge is recognised by a
//! token that is not followed by `=`. Scheme and parameter names are case-insensitive;
//! values keep their case. Unknown parameters are skipped; a malformed tail ends the parse
//! with what was read so far (an upstream's sloppy header still yields its realm).

use crate::stream::BearerChallenge;

/// Longest parameter value kept; longer values are cut (they are echoed to the agent).
const VALUE_BYTES_MAX: usize = 2048;

/// The Bearer challenge among `values` (the field lines of `WWW-Authenticate`), for an
/// upstream answer with `status` (401 or 403); `None` if no challenge uses the Bearer scheme.
pub fn parse<'a>(status: u16, values: impl Iterator<Item = &'a [u8]>) -> Option<BearerChallenge> {
    values
        .filter_map(|v| std::str::from_utf8(v).ok())
        .find_map(|v| parse_field(status, v))
}

/// Scans one field value for a Bearer challenge.
fn parse_field(status: u16, field: &str) -> Option<BearerChallenge> {
    let mut lex = Lexer { rest: field };
    let mut challenge: Option<BearerChallenge> = None;
    loop {
        lex.skip_separators();
        let Some(token) = lex.token() else {
            return challenge;
        };
        lex.skip_spaces();
        if lex.eat('=') {
            // A parameter of the current challenge.
            lex.skip_spaces();
            let value = if lex.peek() == Some('"') {
                match lex.quoted() {
                    Some(v) => v,
                    // An unterminated quote ends the field: keep what was read before it.
                    None => return challenge,
                }
            } else {
                lex.token().unwrap_or_default().to_owned()
            };
            if let Some(c) = challenge.as_mut() {
                set_param(c, token, value);
            }
            continue;
        }
        // A new challenge begins: a finished Bearer one is the answer.
        if challenge.is_some() {
            return challenge;
        }
        if token.eq_ignore_ascii_case("bearer") {
            challenge = Some(BearerChallenge {
                status,
                ..BearerChallenge::default()
            });
        } else {
            // Another scheme: skip a token68 credential if one follows.
            lex.skip_token68();
        }
    }
}

/// Stores a known parameter (the first occurrence wins, as RFC 9110 forbids repeats). A
/// value with a control byte other than HTAB (a quoted-pair can carry one) is dropped: it
/// is rendered into the agent's `WWW-Authenticate` later.
fn set_param(c: &mut BearerChallenge, name: &str, mut value: String) {
    if !crate::http::field_value_ok(value.as_bytes()) {
        return;
    }
    if value.len() > VALUE_BYTES_MAX {
        let mut cut = VALUE_BYTES_MAX;
        while !value.is_char_boundary(cut) {
            cut -= 1;
        }
        value.truncate(cut);
    }
    let slot = if name.eq_ignore_ascii_case("realm") {
        &mut c.realm
    } else if name.eq_ignore_ascii_case("scope") {
        &mut c.scope
    } else if name.eq_ignore_ascii_case("error") {
        &mut c.error
    } else if name.eq_ignore_ascii_case("error_description") {
        &mut c.error_description
    } else if name.eq_ignore_ascii_case("resource_metadata") {
        &mut c.resource_metadata
    } else {
        return;
    };
    if slot.is_none() {
        *slot = Some(value.into_boxed_str());
    }
}

/// A cursor over one field value.
struct Lexer<'a> {
    rest: &'a str,
}

impl<'a> Lexer<'a> {
    fn peek(&self) -> Option<char> {
        self.rest.chars().next()
    }

    fn eat(&mut self, c: char) -> bool {
        match self.rest.strip_prefix(c) {
            Some(rest) => {
                self.rest = rest;
                true
            }
            None => false,
        }
    }

    fn skip_spaces(&mut self) {
        self.rest = self.rest.trim_start_matches([' ', '\t']);
    }

    fn skip_separators(&mut self) {
        self.rest = self.rest.trim_start_matches([' ', '\t', ',']);
    }

    /// An RFC 9110 token (`tchar`s), or `None` when none starts here.
    fn token(&mut self) -> Option<&'a str> {
        let end = self
            .rest
            .find(|c: char| !is_tchar(c))
            .unwrap_or(self.rest.len());
        if end == 0 {
            return None;
        }
        let (token, rest) = self.rest.split_at(end);
        self.rest = rest;
        Some(token)
    }

    /// A quoted-string starting at `"`, unescaped; `None` if it never closes.
    fn quoted(&mut self) -> Option<String> {
        let mut out = String::new();
        let mut chars = self.rest.char_indices().skip(1);
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.rest = self.rest.get(i + 1..).unwrap_or_default();
                    return Some(out);
                }
                '\\' => out.push(chars.next()?.1),
                c => out.push(c),
            }
        }
        None
    }

    /// Skips a token68 credential (`1*( ALPHA / DIGIT / "-._~+/" ) *"="`) if one follows
    /// the scheme, so its padding is not read as a parameter.
    fn skip_token68(&mut self) {
        let saved = self.rest;
        self.skip_spaces();
        let end = self
            .rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || "-._~+/".contains(c)))
            .unwrap_or(self.rest.len());
        let after = self.rest.get(end..).unwrap_or_default();
        let padded = after.trim_start_matches('=');
        let ends_here = padded.trim_start_matches([' ', '\t']).is_empty()
            || padded.trim_start_matches([' ', '\t']).starts_with(',');
        if end > 0 && ends_here && (padded.len() != after.len() || !after.starts_with('=')) {
            self.rest = padded;
        } else {
            self.rest = saved;
        }
    }
}

/// `tchar` of RFC 9110 §5.6.2.
fn is_tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(status: u16, value: &str) -> Option<BearerChallenge> {
        parse(status, std::iter::once(value.as_bytes()))
    }

    fn get(v: &Option<Box<str>>) -> Option<&str> {
        v.as_deref()
    }

    #[test]
    fn quoted_values_in_any_order() {
        let c = one(
            403,
            r#"Bearer scope="repo read", error="insufficient_scope", realm="github", resource_metadata="https://as.example/.well-known/oauth-protected-resource""#,
        )
        .unwrap();
        assert_eq!(c.status, 403);
        assert_eq!(get(&c.realm), Some("github"));
        assert_eq!(get(&c.scope), Some("repo read"));
        assert_eq!(get(&c.error), Some("insufficient_scope"));
        assert_eq!(
            get(&c.resource_metadata),
            Some("https://as.example/.well-known/oauth-protected-resource")
        );
    }

    #[test]
    fn token_values_case_insensitive_names_and_escapes() {
        let c = one(
            401,
            r#"bEaReR ReAlm=example,ERROR=invalid_token , error_description="say \"hi\"""#,
        )
        .unwrap();
        assert_eq!(get(&c.realm), Some("example"));
        assert_eq!(get(&c.error), Some("invalid_token"));
        assert_eq!(get(&c.error_description), Some(r#"say "hi""#));
    }

    #[test]
    fn bare_bearer_and_other_schemes() {
        let c = one(401, "Bearer").unwrap();
        assert_eq!(
            c,
            BearerChallenge {
                status: 401,
                ..Default::default()
            }
        );
        assert!(one(401, r#"Basic realm="x""#).is_none());
        let c = one(401, r#"Basic realm="basic", Bearer realm="b", scope="s""#).unwrap();
        assert_eq!(get(&c.realm), Some("b"));
        assert_eq!(get(&c.scope), Some("s"));
        let c = one(401, r#"Bearer realm="first", Basic realm="other""#).unwrap();
        assert_eq!(get(&c.realm), Some("first"));
        let c = one(401, "Negotiate abc123==, Bearer error=invalid_token").unwrap();
        assert_eq!(get(&c.error), Some("invalid_token"));
    }

    #[test]
    fn several_field_lines_and_bad_input() {
        let lines: [&[u8]; 3] = [b"\xff\xfe", b"Basic realm=x", b"Bearer realm=\"r\""];
        let c = parse(401, lines.into_iter()).unwrap();
        assert_eq!(get(&c.realm), Some("r"));
        // An unterminated quote keeps what came before it.
        let c = one(401, r#"Bearer realm="r", scope="unterminated"#).unwrap();
        assert_eq!(get(&c.realm), Some("r"));
        assert_eq!(get(&c.scope), None);
        // Garbage never panics, whatever it is cut to.
        let text = r#"Bearer realm="a\"b", ,, =x, scope=, error="e" Basic =="#;
        for cut in 0..=text.len() {
            if let Some(prefix) = text.get(..cut) {
                let _ = one(401, prefix);
            }
        }
    }

    #[test]
    fn values_with_control_bytes_are_dropped() {
        // A quoted-pair may escape any byte; the decoders refuse raw control bytes, but the
        // parser does not rely on that.
        let c = one(
            401,
            "Bearer realm=\"a\\\rb\", scope=\"ok\", error=\"x\\\0\"",
        )
        .unwrap();
        assert_eq!(get(&c.realm), None);
        assert_eq!(get(&c.scope), Some("ok"));
        assert_eq!(get(&c.error), None);
        let c = one(401, "Bearer realm=\"tab\there\"").unwrap();
        assert_eq!(get(&c.realm), Some("tab\there"));
    }

    #[test]
    fn long_values_are_cut() {
        let long = "x".repeat(VALUE_BYTES_MAX + 10);
        let c = one(401, &format!("Bearer realm=\"{long}\"")).unwrap();
        assert_eq!(c.realm.map(|r| r.len()), Some(VALUE_BYTES_MAX));
    }
}
