//! Parsing of the URLs and host names the config names: a `client` binding's upstream
//! `server:` URL, and a `server` binding's `origins:` and `hosts:` allow-lists.
//!
//! Only what an HTTP/1.1 client needs is accepted: `http`/`https`, a DNS name, IPv4 address
//! or bracketed IPv6 address, an optional port, and a path with an optional query. The
//! result is pre-computed into the pieces the client binding sends (`authority` for the
//! `Host` header, `path_and_query` for the request target), so nothing is re-parsed per
//! request.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::model::{Scheme, UpstreamUrl};
use super::raw::quote;

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
    let (host, port) = split_authority(authority, scheme).map_err(fail)?;
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
    let (host, port) = split_authority(authority, scheme).map_err(|_| fail())?;
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

/// Splits `host[:port]` into a checked host and a port, the scheme's default if absent.
///
/// Returns the qualifier for the `expected …` message on failure.
fn split_authority(authority: &str, scheme: Scheme) -> Result<(Host, u16), &'static str> {
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
        None => default_port(scheme),
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
}
