//! Internal MCP streams: the typed, credit-windowed spine between bindings.
//!
//! Only the edges speak HTTP and JSON-RPC. Between bindings every JSON-RPC request is one
//! bidirectional stream and every agent session has one long-lived lifecycle stream:
//!
//! - the **initial** direction (caller → callee) starts with a typed [`Begin`] (kind,
//!   session, name or uri, params length, deadline), then carries the raw `params` bytes as
//!   DATA, then END or ABORT;
//! - the **reply** direction (callee → caller) starts with a [`ReplyBegin`], carries the raw
//!   `result` bytes as DATA and typed in-band events as FLUSH, then END or ABORT;
//! - against each direction its receiver sends WINDOW (credit), RESET (typed: bearer
//!   challenge, JSON-RPC error, plain) and CHALLENGE (resume, suspended, answer).
//!
//! ## Credit
//!
//! A sender may have at most `max` unacknowledged DATA bytes in flight on a direction; the
//! receiver returns credit ([`Receiver::ack`]) once it has consumed bytes, normally after
//! they reached the next socket. One slot ([`crate::limits::STREAM_WINDOW_BYTES`]) is the
//! window, so back-pressure runs from the slowest socket back to the first one. One
//! exception: an answer its sender holds whole anyway (a stored list) may go as one frame
//! outside the window ([`Sender::data_whole`]); the receiver's acks pay it back before the
//! window opens again, and a direction holds at most one such frame. FLUSH and
//! END frames carry no bytes but are bounded in count by
//! [`crate::limits::STREAM_FRAMES_MAX`]. Every grant and every stall (a sender waiting for
//! credit) is recorded in the worker's HDR histograms ([`crate::metrics`]).
//!
//! ## Held-open initial
//!
//! The caller keeps the initial direction open until the reply has ended and then closes
//! it with the same severity (END after END, ABORT after ABORT or RESET). That lets a RESET
//! carrying a bearer challenge or a JSON-RPC error travel back, and lets answers to
//! server-to-client requests and resume challenges reach a live request.
//!
//! Streams live on one worker: the pipe is `Rc<RefCell<..>>` with wakers, no atomics.

mod frame;
pub mod pieces;
mod pipe;
mod window;

pub use frame::{
    BearerChallenge, Begin, Caps, Challenge, ClientHello, Event, Flush, Frame, Kind, ListKind,
    ReplyBegin, Reset, TargetAt,
};
pub use pipe::{Callee, Caller, Gone, Inline, Receiver, Sender, SenderHandle, Throttle, open};
pub use window::Window;
