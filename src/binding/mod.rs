//! Bindings: the agent-facing `server`, the upstream-facing `client`, the `proxy`, and the
//! embedded `demo` toolkit, joined by internal MCP streams ([`crate::stream`]).
//!
//! A binding that serves streams is an [`Exit`]. Callers open a stream with
//! [`crate::stream::open`] and hand the callee end to the exit, which spawns its handling
//! on the current worker; every stream stays on the worker that opened it.

pub mod client;
pub mod demo;
pub mod proxy;
pub mod server;

use crate::stream::Callee;

/// A binding that serves internal streams: the exit of a server or of a proxy route.
pub trait Exit {
    /// Takes one stream and serves it on this worker (spawning a local task as needed).
    ///
    /// The exit reads exactly `callee.begin.params_len` bytes of params DATA from the
    /// initial direction (acknowledging them), then answers on the reply direction with a
    /// `ReplyBegin`, optional FLUSH events, the raw `result` DATA and END. To fail a
    /// request it RESETs the initial direction (`callee.initial.reset(Reset::Error{..})`
    /// or `Reset::Bearer`) and then ABORTs the reply; the caller, seeing the ABORT, takes
    /// the RESET to render. The caller holds the initial direction open until the reply
    /// ends, and sends CHALLENGEs against the reply (`callee.reply.throttle()`).
    fn open(&self, callee: Callee);
}
