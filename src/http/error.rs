//! Decode errors and the HTTP status each one is answered with.
//!
//! Every way outside bytes can be wrong ends up as one of these variants. The server answers
//! them with [`super::encode_error_response`] and closes the connection; the upstream client
//! maps them to a 502 of its own.

use std::fmt;

/// Why a message could not be decoded; each variant maps to one HTTP status.
///
/// The `&'static str` details are fixed, lowercase, single-line texts: they never quote
/// outside input, so they are safe to log and to send back as a response body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpError {
    /// Malformed syntax or framing (400); also used for truncated or malformed responses.
    BadRequest(&'static str),
    /// The body is larger than the decoder's `body_bytes_max` (413).
    PayloadTooLarge,
    /// The request target is longer than `REQUEST_TARGET_BYTES_MAX` (414).
    UriTooLong,
    /// The head or the trailers exceed `HEADER_BYTES_MAX` or `HEADERS_PER_MESSAGE_MAX` (431).
    HeaderFieldsTooLarge,
    /// A feature the codec does not implement, such as a transfer coding other than chunked (501).
    NotImplemented(&'static str),
    /// The message uses an HTTP version other than 1.0 or 1.1 (505).
    VersionNotSupported,
    /// A request started arriving but was not complete within `REQUEST_READ_TIMEOUT` (408).
    RequestTimeout,
}

impl HttpError {
    /// Returns the HTTP status code that answers this error.
    pub fn status(&self) -> u16 {
        match self {
            HttpError::BadRequest(_) => 400,
            HttpError::PayloadTooLarge => 413,
            HttpError::UriTooLong => 414,
            HttpError::HeaderFieldsTooLarge => 431,
            HttpError::NotImplemented(_) => 501,
            HttpError::VersionNotSupported => 505,
            HttpError::RequestTimeout => 408,
        }
    }

    /// Returns a short lowercase description of the problem, without a trailing newline.
    pub fn detail(&self) -> &'static str {
        match self {
            HttpError::BadRequest(detail) | HttpError::NotImplemented(detail) => detail,
            HttpError::PayloadTooLarge => "payload too large",
            HttpError::UriTooLong => "uri too long",
            HttpError::HeaderFieldsTooLarge => "header fields too large",
            HttpError::VersionNotSupported => "http version not supported",
            HttpError::RequestTimeout => "request not received in time",
        }
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.detail(), self.status())
    }
}

impl std::error::Error for HttpError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_details() {
        let table: [(HttpError, u16, &str); 6] = [
            (HttpError::BadRequest("bad thing"), 400, "bad thing"),
            (HttpError::PayloadTooLarge, 413, "payload too large"),
            (HttpError::UriTooLong, 414, "uri too long"),
            (
                HttpError::HeaderFieldsTooLarge,
                431,
                "header fields too large",
            ),
            (HttpError::NotImplemented("gzip"), 501, "gzip"),
            (
                HttpError::VersionNotSupported,
                505,
                "http version not supported",
            ),
        ];
        for (err, status, detail) in table {
            assert_eq!(err.status(), status);
            assert_eq!(err.detail(), detail);
        }
        assert_eq!(
            HttpError::HeaderFieldsTooLarge.to_string(),
            "header fields too large (431)"
        );
    }
}
