//! Parsing of the URLs and host names the config names: a `client` binding's upstream
//! `server:` URL, a `server` binding's `origins:` and `hosts:` allow-lists, and a redis
//! store's `url:`.
//!
//! Only what an HTTP/1.1 client needs is accepted: `http`/`https`, a DNS name, IPv4 address
//! or bracketed IPv6 address, an optional port, and a path with an optional query. The
//! result is pre-computed into the pieces the client binding sends (`authority` for the
//! `Host` header, `path_and_query` for the request target), so nothing is re-parsed per
//! request.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::model::{RedisUrl, Scheme, Secret, UpstreamUrl};
use super::text::quote;
use crate::limits::REDIS_DB_MAX;

/// Longest URL or origin accepted; it must fit a request target with room to spare.
const URL_BYTES_MAX: usize = crate::limits::REQUEST_TARGET_BYTES_MAX;

/// RFC 1035 §2.3.4: a name is at most 253 characters written out, a label at most 63.
const HOST_NAME_BYTES_MAX: usize = 253;
const HOST_LABEL_BYTES_MAX: usize = 63;

/// The host part of a URL authority, already checked.
struct Host {
    /// Lower-case name or address, IPv6 without brackets.
    name: String,
    /// Whether `name` is an IPv6 address (brackets are needed to write it in an authority).
    ipv6: bool,
}

impl Host {
    /// The host as written in an authority or a `Host` header: brackets around IPv6.
    fn written(&self) -> String {
        if self.ipv6 {
            format!("[{}]", self.name)
        } else {
            self.name.clone()
        }
    }
}

/// Parses an upstream URL such as `https://mcp.example.com/mcp`.
///
/// Returns the parsed URL, or a complete `found …, expected …` message. When the URL has
/// user information, the message shows it as `***` so that a password never reaches a log.
pub(super) fn parse_upstream_url(text: &str) -> Result<UpstreamUrl, String> {
    let expected = "expected an http:// or https:// URL";
    let fail = |what: &str| format!("found {}, {expected}{what}", quote(text));
    if text.len() > URL_BYTES_MAX {
        return Err(format!(
            "found a URL of {} bytes, {expected} of at most {URL_BYTES_MAX} bytes",
            text.len()
        ));
    }
    let (scheme, rest) = split_scheme(text).ok_or_else(|| fail(""))?;
    let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path_and_query) = rest.split_at(authority_len);
    if let Some((_, host_and_port)) = authority.rsplit_once('@') {
        let shown = format!("{}://***@{host_and_port}", scheme_name(scheme));
        return Err(format!(
            "found {}, {expected} without user information (credentials belong in authorization:)",
            quote(&shown)
        ));
    }
    if path_and_query.contains('#') {
        return Err(fail(" without a fragment"));
    }
    if !path_and_query.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(fail(
            " of visible ASCII characters (percent-encode the rest)",
        ));
    }
    if authority.is_empty() {
        return Err(fail(" with a host"));
    }
    let (host, port) = split_host_port(authority, default_port(scheme)).map_err(fail)?;
    let path_and_query = if path_and_query.starts_with('/') {
        path_and_query.to_owned()
    } else {
        format!("/{path_and_query}")
    };
    Ok(UpstreamUrl {
        scheme,
        authority: authority_string(&host, port, scheme),
        host: host.name,
        port,
        path_and_query,
    })
}

/// The port a `redis://` or `rediss://` URL without one connects to.
const REDIS_PORT_DEFAULT: u16 = 6379;

/// Parses a redis store URL: `redis://` or `rediss://` (TLS), optional user information
/// (`user:password@`, percent-encoded), a host, an optional port (6379) and an optional
/// database index path (`/0`, at most [`REDIS_DB_MAX`]). No query or fragment: every option
/// is a config key of its own.
///
/// Returns the parsed URL, or a complete `found …, expected …` message. The message never
/// repeats the user information (it may hold a password): it shows it as `***`.
pub(super) fn parse_redis_url(text: &str) -> Result<RedisUrl, String> {
    let expected = "expected a redis:// or rediss:// URL such as redis://127.0.0.1:6379/0";
    let shown = redact_userinfo(text);
    let fail = |what: &str| format!("found {}, {expected}{what}", quote(&shown));
    if text.len() > URL_BYTES_MAX {
        return Err(format!(
            "found a URL of {} bytes, {expected} of at most {URL_BYTES_MAX} bytes",
            text.len()
        ));
    }
    if !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(fail(
            " of visible ASCII characters (percent-encode the rest)",
        ));
    }
    let (scheme, rest) = text.split_once("://").ok_or_else(|| fail(""))?;
    let tls = if scheme.eq_ignore_ascii_case("redis") {
        false
    } else if scheme.eq_ignore_ascii_case("rediss") {
        true
    } else {
        return Err(fail(""));
    };
    if rest.contains(['?', '#']) {
        return Err(fail(
            " without a query or fragment (options are keys of the store)",
        ));
    }
    let authority_len = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_len);
    let (userinfo, host_and_port) = match authority.rsplit_once('@') {
        Some((userinfo, host_and_port)) => (Some(userinfo), host_and_port),
        None => (None, authority),
    };
    if host_and_port.is_empty() {
        return Err(fail(" with a host"));
    }
    let (host, port) = split_host_port(host_and_port, REDIS_PORT_DEFAULT).map_err(fail)?;
    let (username, password) = match userinfo {
        None => (None, None),
        Some(userinfo) => {
            let (user, password) = match userinfo.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (userinfo, None),
            };
            let bad = " whose user information is percent-encoded UTF-8 without control characters";
            let decode = |text: &str| {
                percent_decode(text)
                    .filter(|t| !t.chars().any(char::is_control))
                    .ok_or_else(|| fail(bad))
            };
            let user = decode(user)?;
            let password = match password {
                Some(p) => Some(decode(p)?),
                None => None,
            };
            (
                Some(user).filter(|u| !u.is_empty()),
                password.filter(|p| !p.is_empty()),
            )
        }
    };
    let db = match path.strip_prefix('/') {
        None | Some("") => 0,
        Some(digits) => parse_db(digits).ok_or_else(|| {
            fail(&format!(
                " whose path is a database index from 0 to {REDIS_DB_MAX}"
            ))
        })?,
    };
    let scheme = if tls { "rediss" } else { "redis" };
    let user_shown = username.as_deref().map_or(String::new(), |u| {
        let shown = if password.is_some() {
            format!("{u}:***")
        } else {
            u.to_owned()
        };
        format!("{}@", quote(&shown).trim_matches('"'))
    });
    Ok(RedisUrl {
        shown: format!("{scheme}://{user_shown}{}:{port}/{db}", host.written()),
        tls,
        host: host.name,
        port,
        db,
        username,
        password: password.map(Secret::new),
    })
}

/// `text` with everything between `://` and the last `@` of the authority replaced by `***`.
fn redact_userinfo(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        // No authority to find: hide everything after the last `@`'s left side anyway.
        return match text.rsplit_once('@') {
            Some((_, after)) => format!("***@{after}"),
            None => text.to_owned(),
        };
    };
    let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_len);
    match authority.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://***@{host}{tail}"),
        None => text.to_owned(),
    }
}

/// A database index of 1 to 5 digits, at most [`REDIS_DB_MAX`].
fn parse_db(digits: &str) -> Option<u32> {
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u32>().ok().filter(|&db| db <= REDIS_DB_MAX)
}

/// Decodes `%XX` escapes (RFC 3986 §2.1); `None` for a broken escape or bytes that are not
/// UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while let Some(&b) = bytes.get(at) {
        if b == b'%' {
            let hex = bytes.get(at + 1..at + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            if !hex.bytes().all(|h| h.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            out.push(b);
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Parses an allowed `Origin` value such as `http://localhost:6274`.
///
/// Returns it normalised for comparison (lower case, default port dropped, as browsers send
/// it), or a complete `found …, expected …` message.
pub(super) fn parse_origin(text: &str) -> Result<String, String> {
    let fail = || {
        format!(
            "found {}, expected an origin such as http://localhost:6274 (scheme, host and optional port)",
            quote(text)
        )
    };
    if text.len() > URL_BYTES_MAX {
        return Err(fail());
    }
    let (scheme, authority) = split_scheme(text).ok_or_else(fail)?;
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return Err(fail());
    }
    let (host, port) = split_host_port(authority, default_port(scheme)).map_err(|_| fail())?;
    Ok(format!(
        "{}://{}",
        scheme_name(scheme),
        authority_string(&host, port, scheme)
    ))
}

/// Parses an allowed `Host` header host name such as `mcp.example.com` or `[::1]`.
///
/// Returns it in lower case (IPv6 keeps its brackets, as a `Host` header writes it), or a
/// complete `found …, expected …` message.
pub(super) fn parse_host_name(text: &str) -> Result<String, String> {
    let fail = || {
        format!(
            "found {}, expected a host name without port, such as mcp.example.com, 127.0.0.1 or [::1]",
            quote(text)
        )
    };
    let host = if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        parse_ipv6(inner).ok_or_else(fail)?
    } else {
        parse_name(text).ok_or_else(fail)?
    };
    Ok(host.written())
}

/// Splits `scheme://rest`, accepting `http` and `https` in any case.
fn split_scheme(text: &str) -> Option<(Scheme, &str)> {
    let (scheme, rest) = text.split_once("://")?;
    if scheme.eq_ignore_ascii_case("http") {
        Some((Scheme::Http, rest))
    } else if scheme.eq_ignore_ascii_case("https") {
        Some((Scheme::Https, rest))
    } else {
        None
    }
}

/// Splits `host[:port]` into a checked host and a port, `default` if absent (the scheme's,
/// or Redis's 6379).
///
/// Returns the qualifier for the `expected …` message on failure.
fn split_host_port(authority: &str, default: u16) -> Result<(Host, u16), &'static str> {
    const BAD_HOST: &str = " whose host is a DNS name, an IPv4 address or a bracketed IPv6 address";
    const BAD_PORT: &str = " with a port from 1 to 65535";
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (inner, after) = rest.split_once(']').ok_or(BAD_HOST)?;
        let host = parse_ipv6(inner).ok_or(BAD_HOST)?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':').ok_or(BAD_HOST)?)),
        }
    } else {
        match authority.split_once(':') {
            Some((name, port)) => (parse_name(name).ok_or(BAD_HOST)?, Some(port)),
            None => (parse_name(authority).ok_or(BAD_HOST)?, None),
        }
    };
    let port = match port {
        None => default,
        Some(digits) => parse_port(digits).ok_or(BAD_PORT)?,
    };
    Ok((host, port))
}

/// A port of 1 to 5 digits, 1 to 65535.
fn parse_port(digits: &str) -> Option<u16> {
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u16>().ok().filter(|&port| port != 0)
}

/// An IPv6 address written without brackets (no zone identifiers).
fn parse_ipv6(text: &str) -> Option<Host> {
    let address: Ipv6Addr = text.parse().ok()?;
    Some(Host {
        name: address.to_string(),
        ipv6: true,
    })
}

/// A DNS name (labels of letters, digits and `-`, not starting or ending with `-`) or an
/// IPv4 address. A name made only of digits and dots must be a valid IPv4 address.
fn parse_name(text: &str) -> Option<Host> {
    if text.is_empty() || text.len() > HOST_NAME_BYTES_MAX {
        return None;
    }
    let labels_ok = text.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= HOST_LABEL_BYTES_MAX
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    });
    if !labels_ok {
        return None;
    }
    let numeric = text.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    if numeric && text.parse::<Ipv4Addr>().is_err() {
        return None;
    }
    Some(Host {
        name: text.to_ascii_lowercase(),
        ipv6: false,
    })
}

fn default_port(scheme: Scheme) -> u16 {
    match scheme {
        Scheme::Http => 80,
        Scheme::Https => 443,
    }
}

fn scheme_name(scheme: Scheme) -> &'static str {
    match scheme {
        Scheme::Http => "http",
        Scheme::Https => "https",
    }
}

/// `host[:port]` as sent in a `Host` header: the port is left out when it is the default.
fn authority_string(host: &Host, port: u16, scheme: Scheme) -> String {
    if port == default_port(scheme) {
        host.written()
    } else {
        format!("{}:{port}", host.written())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls_split_into_request_pieces() {
        // (input, scheme, host, port, path_and_query, authority)
        let table = [
            (
                "http://127.0.0.1:3002/mcp",
                Scheme::Http,
                "127.0.0.1",
                3002,
                "/mcp",
                "127.0.0.1:3002",
            ),
            (
                "http://[::1]:8080/mcp",
                Scheme::Http,
                "::1",
                8080,
                "/mcp",
                "[::1]:8080",
            ),
            (
                "https://MCP.Example.com/mcp",
                Scheme::Https,
                "mcp.example.com",
                443,
                "/mcp",
                "mcp.example.com",
            ),
            (
                "http://example.com",
                Scheme::Http,
                "example.com",
                80,
                "/",
                "example.com",
            ),
            (
                "http://example.com:80/",
                Scheme::Http,
                "example.com",
                80,
                "/",
                "example.com",
            ),
            (
                "https://example.com:80/",
                Scheme::Https,
                "example.com",
                80,
                "/",
                "example.com:80",
            ),
            (
                "HTTPS://example.com?x=1",
                Scheme::Https,
                "example.com",
                443,
                "/?x=1",
                "example.com",
            ),
            ("http://a/b?c=d&e", Scheme::Http, "a", 80, "/b?c=d&e", "a"),
            (
                "http://[2001:DB8::1]/",
                Scheme::Http,
                "2001:db8::1",
                80,
                "/",
                "[2001:db8::1]",
            ),
        ];
        for (text, scheme, host, port, path_and_query, authority) in table {
            let url = parse_upstream_url(text).map_err(|e| format!("{text}: {e}"));
            let url = match url {
                Ok(url) => url,
                Err(e) => panic!("{e}"),
            };
            assert_eq!(url.scheme, scheme, "{text}");
            assert_eq!(url.host, host, "{text}");
            assert_eq!(url.port, port, "{text}");
            assert_eq!(url.path_and_query, path_and_query, "{text}");
            assert_eq!(url.authority, authority, "{text}");
        }
    }

    #[test]
    fn bad_upstream_urls_are_refused() {
        let e = "expected an http:// or https:// URL";
        let host = " whose host is a DNS name, an IPv4 address or a bracketed IPv6 address";
        let table = [
            (
                "ftp://example.com/",
                format!("found \"ftp://example.com/\", {e}"),
            ),
            ("example.com", format!("found \"example.com\", {e}")),
            ("http://", format!("found \"http://\", {e} with a host")),
            (
                "http:///mcp",
                format!("found \"http:///mcp\", {e} with a host"),
            ),
            ("http://:80/", format!("found \"http://:80/\", {e}{host}")),
            ("http://a_b/", format!("found \"http://a_b/\", {e}{host}")),
            (
                "http://300.1.1.1/",
                format!("found \"http://300.1.1.1/\", {e}{host}"),
            ),
            ("http://[::1/", format!("found \"http://[::1/\", {e}{host}")),
            ("http://::1/", format!("found \"http://::1/\", {e}{host}")),
            (
                "http://a:0/",
                format!("found \"http://a:0/\", {e} with a port from 1 to 65535"),
            ),
            (
                "http://a:70000/",
                format!("found \"http://a:70000/\", {e} with a port from 1 to 65535"),
            ),
            (
                "http://a:/",
                format!("found \"http://a:/\", {e} with a port from 1 to 65535"),
            ),
            (
                "http://a/#top",
                format!("found \"http://a/#top\", {e} without a fragment"),
            ),
            (
                "http://a/b c",
                format!(
                    "found \"http://a/b c\", {e} of visible ASCII characters (percent-encode the rest)"
                ),
            ),
            (
                "https://user:hunter2@example.com/mcp",
                format!(
                    "found \"https://***@example.com\", {e} without user information (credentials belong in authorization:)"
                ),
            ),
        ];
        for (text, want) in table {
            assert_eq!(parse_upstream_url(text).err(), Some(want), "{text}");
        }
    }

    #[test]
    fn origins_normalise_and_bad_ones_are_refused() {
        let table = [
            ("http://localhost:6274", "http://localhost:6274"),
            ("HTTP://LocalHost:6274", "http://localhost:6274"),
            ("https://app.example.com:443", "https://app.example.com"),
            ("http://[::1]:3000", "http://[::1]:3000"),
        ];
        for (text, want) in table {
            assert_eq!(parse_origin(text).as_deref(), Ok(want), "{text}");
        }
        for text in [
            "localhost:6274",
            "http://localhost/",
            "ftp://a",
            "http://",
            "http://a@b",
        ] {
            assert!(parse_origin(text).is_err(), "{text}");
        }
    }

    #[test]
    fn host_names_normalise_and_bad_ones_are_refused() {
        let table = [
            ("mcp.Example.com", "mcp.example.com"),
            ("127.0.0.1", "127.0.0.1"),
            ("[::1]", "[::1]"),
        ];
        for (text, want) in table {
            assert_eq!(parse_host_name(text).as_deref(), Ok(want), "{text}");
        }
        for text in ["", "a:80", "::1", "[::1]:80", "a b", "http://a"] {
            assert!(parse_host_name(text).is_err(), "{text}");
        }
    }

    #[test]
    fn redis_urls_give_host_port_db_and_credentials() {
        let url = parse_redis_url("redis://127.0.0.1:6380/3").unwrap();
        assert_eq!(
            (url.tls, &*url.host, url.port, url.db, &url.username),
            (false, "127.0.0.1", 6380, 3, &None)
        );
        assert!(url.password.is_none());
        assert_eq!(url.shown, "redis://127.0.0.1:6380/3");
        let url = parse_redis_url("REDISS://app:p%40ss%3Aw0rd@Cache.Example.com").unwrap();
        assert!(url.tls);
        assert_eq!(
            (&*url.host, url.port, url.db),
            ("cache.example.com", 6379, 0)
        );
        assert_eq!(url.username.as_deref(), Some("app"));
        assert_eq!(url.password.as_ref().map(Secret::expose), Some("p@ss:w0rd"));
        assert_eq!(url.shown, "rediss://app:***@cache.example.com:6379/0");
        assert!(!url.shown.contains("w0rd"));
        let url = parse_redis_url("redis://:secret@[::1]/").unwrap();
        assert_eq!((&*url.host, url.username.as_deref()), ("::1", None));
        assert_eq!(url.password.as_ref().map(Secret::expose), Some("secret"));
        assert_eq!(url.shown, "redis://[::1]:6379/0");
        let url = parse_redis_url(&format!("redis://h/{REDIS_DB_MAX}")).unwrap();
        assert_eq!(url.db, REDIS_DB_MAX);
    }

    #[test]
    fn hostile_redis_urls_are_refused_without_repeating_a_password() {
        for bad in [
            "",
            "127.0.0.1:6379",
            "http://127.0.0.1:6379",
            "unix:///tmp/redis.sock",
            "redis://",
            "redis:///0",
            "redis://h:0",
            "redis://h:65536",
            "redis://h:-1",
            "redis://h/16x",
            "redis://h/-1",
            "redis://h/99999999999",
            "redis://h/0/1",
            "redis://h/0?protocol=resp3",
            "rediss://h/#insecure",
            "redis://h\r\n/0",
            "redis://h/0\r\nFLUSHALL",
            "redis://user:pa ss@h",
            "redis://user:%zz@h",
            "redis://user:%ff@h",
            "redis://user:a%0d%0aFLUSHALL@h",
            "redis://us%00er@h",
            "redis://bad_host!/0",
            "redis://[::1/0",
        ] {
            let err = parse_redis_url(bad).expect_err(bad);
            assert!(err.starts_with("found "), "{bad:?}: {err}");
            assert!(!err.contains('\n') && !err.contains('\r'), "{err}");
        }
        let err = parse_redis_url(&format!("redis://h/{}", REDIS_DB_MAX + 1)).unwrap_err();
        assert!(err.contains("database index"), "{err}");
        for secretive in [
            "redis://user:s3cr3t@h:99999",
            "redis://user:s3cr3t@h/x",
            "ftp://user:s3cr3t@h",
            "redis://user:s3cr3t@h\n",
            "user:s3cr3t@h",
        ] {
            let err = parse_redis_url(secretive).unwrap_err();
            assert!(!err.contains("s3cr3t"), "{err}");
        }
        let long = format!("redis://{}/0", "a".repeat(URL_BYTES_MAX));
        assert!(parse_redis_url(&long).unwrap_err().contains("bytes"));
    }
}
