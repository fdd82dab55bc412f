//! Message body length from the framing header fields (RFC 9112 §6).
//!
//! The request and response decoders share the Transfer-Encoding and Content-Length rules
//! here; each decoder adds its own cases first (a response to HEAD, 204, 304 has no body, a
//! response without framing fields is close-delimited, a request without them has no body).

use super::BodyFraming;
use super::error::HttpError;
use super::headers::{Headers, list_elements};

/// Longest Content-Length value we parse; 19 decimal digits always fit in a `u64`.
const CONTENT_LENGTH_DIGITS_MAX: usize = 19;

/// Returns the framing that Transfer-Encoding or Content-Length declare, or `None` if the
/// head has neither field.
///
/// Errors: both fields present (400), Transfer-Encoding in an HTTP/1.0 message (400), a
/// coding other than a single `chunked` (501, or 400 if `chunked` repeats), an invalid or
/// inconsistent Content-Length (400), or a Content-Length above `body_bytes_max` (413).
pub(super) fn declared_framing(
    headers: &Headers,
    minor_version: u8,
    body_bytes_max: u64,
) -> Result<Option<BodyFraming>, HttpError> {
    // Each lookup walks the fields, so look Content-Length up only where its answer is used.
    if headers.get("transfer-encoding").is_some() {
        if headers.get("content-length").is_some() {
            // RFC 9112 §6.3 (3): TE would override CL, but a message carrying both is the
            // classic request-smuggling vector (two hops disagreeing on where the body ends).
            // A gateway must not guess, so we refuse it outright instead of dropping CL.
            return Err(HttpError::BadRequest(
                "both transfer-encoding and content-length",
            ));
        }
        // RFC 9112 §6.1: Transfer-Encoding in an HTTP/1.0 message means the framing is faulty.
        if minor_version == 0 {
            return Err(HttpError::BadRequest("transfer-encoding in http/1.0"));
        }
        return chunked_only(headers).map(Some);
    }
    let Some(length) = content_length(headers)? else {
        return Ok(None);
    };
    if length > body_bytes_max {
        // Refused before any body byte arrives, so the peer learns early.
        return Err(HttpError::PayloadTooLarge);
    }
    Ok(Some(BodyFraming::Length(length)))
}

/// Accepts Transfer-Encoding only when its codings, across all fields, are exactly `chunked`.
///
/// RFC 9112 §6.1: a coding we do not understand gets 501. RFC 9112 §7: `chunked` must not be
/// applied more than once, and with it being the only coding it is also the final one, which
/// §6.3 (4) requires. Empty list elements are ignored (RFC 9110 §5.6.1).
fn chunked_only(headers: &Headers) -> Result<BodyFraming, HttpError> {
    let mut chunked_count: usize = 0;
    for coding in headers
        .get_all("transfer-encoding")
        .flat_map(list_elements)
        .filter(|coding| !coding.is_empty())
    {
        if !coding.eq_ignore_ascii_case(b"chunked") {
            return Err(HttpError::NotImplemented("transfer coding not implemented"));
        }
        chunked_count = chunked_count.saturating_add(1);
    }
    match chunked_count {
        0 => Err(HttpError::BadRequest("empty transfer-encoding")),
        1 => Ok(BodyFraming::Chunked),
        _ => Err(HttpError::BadRequest("chunked applied more than once")),
    }
}

/// Parses every Content-Length field and list element; all must be the same decimal number.
/// Returns `Ok(None)` if the head has no Content-Length field.
///
/// RFC 9112 §6.3 (5): several fields, or a comma list, with identical values may be treated
/// as one value; differing or non-numeric values are unrecoverable framing errors (400).
fn content_length(headers: &Headers) -> Result<Option<u64>, HttpError> {
    let mut length: Option<u64> = None;
    for element in headers.get_all("content-length").flat_map(list_elements) {
        let value =
            parse_decimal(element).ok_or(HttpError::BadRequest("invalid content-length"))?;
        match length {
            Some(seen) if seen != value => {
                return Err(HttpError::BadRequest("conflicting content-length"));
            }
            _ => length = Some(value),
        }
    }
    // Splitting a field value on commas yields at least one element, even for an empty
    // value, so `None` here means there was no Content-Length field at all.
    Ok(length)
}

/// Parses `1*DIGIT` (RFC 9110 §8.6) into a `u64`; `None` for empty, non-digit or too long.
fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > CONTENT_LENGTH_DIGITS_MAX {
        return None;
    }
    let mut value: u64 = 0;
    for digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        value = value
            .checked_mul(10)?
            .checked_add(u64::from(digit - b'0'))?;
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_parsing() {
        assert_eq!(parse_decimal(b"0"), Some(0));
        assert_eq!(parse_decimal(b"0012"), Some(12));
        assert_eq!(
            parse_decimal(b"9999999999999999999"),
            Some(9_999_999_999_999_999_999)
        );
        assert_eq!(parse_decimal(b"18446744073709551615"), None);
        assert_eq!(parse_decimal(b""), None);
        assert_eq!(parse_decimal(b"+1"), None);
        assert_eq!(parse_decimal(b"1 2"), None);
        assert_eq!(parse_decimal(b"0x10"), None);
    }
}
