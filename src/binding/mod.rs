//! Bindings: the agent-facing `server`, the upstream-facing `client`, the `proxy`, and the
//! embedded `demo` toolkit, joined by internal MCP streams ([`crate::stream`]).
//!
//! A binding that serves streams is an [`Exit`]. Callers open a stream with
//! [`crate::stream::open`] and hand the callee end to the exit, which gives back the work
//! that serves it: the caller runs it beside its own end of the stream (no task of its
//! own per request) or spawns it ([`Exit::open`]); every stream stays on the worker that
//! opened it.
//!
//! Each binding keeps its metrics beside it (`server::metrics`, `proxy::metrics`,
//! `client::metrics`), and [`metrics`] registers them for scrapes in one place.

pub mod client;
pub mod demo;
pub mod methods;
pub mod metrics;
pub mod protocol;
pub mod proxy;
pub mod server;

use crate::stream::Callee;
use std::future::Future;
use std::pin::Pin;

/// The work that serves one stream, for its caller to run on the same worker. Boxed, as
/// exits are trait objects: one allocation, where a task of its own would cost a task
/// cell, a copy of the future into it and a trip through the scheduler.
pub type Serving = Pin<Box<dyn Future<Output = ()>>>;

/// A binding that serves internal streams: the exit of a server or of a proxy route.
pub trait Exit {
    /// Takes one stream and gives back the work that serves it, which the caller must run
    /// on this worker until it completes, beside (not instead of) its own end of the
    /// stream: joined with it, or spawned. `None` when the stream was already answered or
    /// dropped (the callee's ends tell the caller).
    ///
    /// The exit reads exactly `callee.begin.params_len` bytes of params DATA from the
    /// initial direction (acknowledging them), then answers on the reply direction with a
    /// `ReplyBegin`, optional FLUSH events, the raw `result` DATA and END. To fail a
    /// request it RESETs the initial direction (`callee.initial.reset(Reset::Error{..})`
    /// or `Reset::Bearer`) and then ABORTs the reply; the caller, seeing the ABORT, takes
    /// the RESET to render. The caller holds the initial direction open until the reply
    /// ends, and sends CHALLENGEs against the reply (`callee.reply.throttle()`).
    fn serve(&self, callee: Callee) -> Option<Serving>;

    /// Takes one stream and serves it in a task of its own on this worker.
    fn open(&self, callee: Callee) {
        if let Some(serving) = self.serve(callee) {
            tokio::task::spawn_local(crate::runtime::pass::run(serving));
        }
    }
}
