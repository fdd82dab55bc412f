//! One small document fetched with a plain `GET` over the upstream client's connections
//! (the same connect, TLS and response decoding as MCP exchanges): the server binding's
//! key sets (`auth.jwt.jwks`) come this way.
//!
//! The answer must be `200` and at most `max_bytes`; the whole exchange, connect included,
//! must finish within `timeout`. The connection is closed afterwards (`Connection: close`):
//! a document read every few minutes gains nothing from a pooled connection.

use super::exchange::Response;
use super::pool::Pool;
use crate::certs::Upstream;
use crate::config::UpstreamUrl;
use crate::http::ResponseEvent;
use crate::runtime::{Backend, Slots};
use bytes::{Bytes, BytesMut};
use std::rc::Rc;
use std::time::Duration;

/// Fetches `url`'s body; the error says what went wrong, for one log line.
pub async fn get(
    url: &Rc<UpstreamUrl>,
    tls: Option<Upstream>,
    backend: Backend,
    slots: Rc<Slots>,
    timeout: Duration,
    max_bytes: usize,
) -> Result<Bytes, String> {
    let pool = Pool::new(url.clone(), backend, slots, timeout, tls);
    let exchange = async {
        let lease = pool.take().await.map_err(|e| e.describe())?;
        let mut head = BytesMut::with_capacity(128 + url.path_and_query.len());
        head.extend_from_slice(b"GET ");
        head.extend_from_slice(url.path_and_query.as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        head.extend_from_slice(url.authority.as_bytes());
        head.extend_from_slice(b"\r\naccept: application/json\r\nconnection: close\r\n\r\n");
        lease
            .link
            .wire()
            .write(head.freeze())
            .await
            .map_err(|e| format!("cannot send the request: {e}"))?;
        let mut response = Response::new(lease);
        let mut body = BytesMut::new();
        loop {
            match response.next().await.map_err(|e| e.describe())? {
                ResponseEvent::Head(head) if head.status != 200 => {
                    return Err(format!("answered HTTP {}, expected 200", head.status));
                }
                ResponseEvent::Head(_) => {}
                ResponseEvent::Data(data) => {
                    if body.len() + data.len() > max_bytes {
                        return Err(format!("answered more than {max_bytes} bytes"));
                    }
                    body.extend_from_slice(&data);
                }
                ResponseEvent::End => return Ok(body.freeze()),
            }
        }
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(format!("no complete answer within {timeout:?}")),
    }
}
