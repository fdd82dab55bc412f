//! The session's GET event stream: opened or resumed (`Last-Event-ID`: from the session's
//! ring, or from the exit's own position carried in the id, `0.<seq>:<exit id>`), held
//! open with keepalives, replaced by a newer GET; and a request's SSE stream resumed by a
//! GET that names it.
//!
//! Invariant: at most one GET stream per session is live; a newer one ends the older.

use super::Server;
use super::auth::Identity;
use super::edge::{accepts_sse, http_error};
use super::lookup::session_for;
use super::net::Request;
use super::session::{
    GetHold, NO_LIVE_STREAM, Session, Support, data_event, exit_id_carried, sse_head,
};
use super::sink::Sink;
use crate::binding::server::metrics as server_metrics;
use crate::limits::{EVENTS_PROBE_TIMEOUT, SSE_KEEPALIVE_INTERVAL};
use crate::sse;
use crate::stream::Challenge;
use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;
use std::rc::{Rc, Weak};
use std::time::Instant;

/// A `Last-Event-ID` as the agent sent it back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LastEvent<'a> {
    /// One of ours: `<stream>.<seq>`, and for the GET stream (0) perhaps `:<exit id>`.
    Ours {
        stream: u32,
        seq: u64,
        exit: Option<&'a str>,
    },
    /// Not ours: an id only the exit may know (e.g. a proxy's aggregate).
    Foreign(&'a str),
}

/// Reads a `Last-Event-ID`; `None` when it is not UTF-8 or empty.
pub(crate) fn parse_event_id(raw: &[u8]) -> Option<LastEvent<'_>> {
    // HTTP trims SP and HTAB around a field value (the decoder already has); nothing else,
    // since other Unicode spaces are part of an opaque exit id.
    let text = std::str::from_utf8(raw).ok()?.trim_matches([' ', '\t']);
    if text.is_empty() {
        return None;
    }
    let (ours, exit) = match text.split_once(':') {
        Some((ours, exit)) => (ours, Some(exit).filter(|e| !e.is_empty())),
        None => (text, None),
    };
    let parsed = ours.split_once('.').and_then(|(stream, seq)| {
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(stream) || !digits(seq) {
            return None;
        }
        Some((stream.parse::<u32>().ok()?, seq.parse::<u64>().ok()?))
    });
    Some(match parsed {
        Some((stream, seq)) if stream == 0 || exit.is_none() => {
            LastEvent::Ours { stream, seq, exit }
        }
        _ => LastEvent::Foreign(text),
    })
}

/// GET: opens (or resumes) the session's event stream, or resumes a request's stream.
pub async fn get(server: Rc<Server>, req: Request, sink: Sink, who: Option<Rc<Identity>>) {
    if !accepts_sse(&req) {
        return http_error(
            sink,
            406,
            "Not Acceptable: Accept must list text/event-stream",
            None,
        )
        .await;
    }
    let session = match session_for(&server, &req, who.as_deref()).await {
        Ok(s) => s,
        Err((status, message)) => return http_error(sink, status, message, None).await,
    };
    let last = req
        .head
        .headers
        .get("last-event-id")
        .and_then(parse_event_id);
    let resume = match last {
        Some(LastEvent::Ours { stream, seq, .. }) if stream != 0 => {
            let inflight = session
                .st
                .borrow()
                .streams
                .get(&stream)
                .and_then(Weak::upgrade);
            let Some(inflight) = inflight else {
                return http_error(sink, 400, NO_LIVE_STREAM, None).await;
            };
            // Answered here, not by the reply, which may be waiting for a write.
            if let Some(message) = inflight.stream.get().refusal() {
                return http_error(sink, 400, message, None).await;
            }
            let old = inflight.attach.borrow_mut().replace((sink, seq));
            drop(old); // a resume that never got picked up: its connection is aborted
            inflight.wake.notify_one();
            return;
        }
        Some(LastEvent::Ours { seq, exit, .. }) => match replayable(&session, seq) {
            true => Resume::Ring(seq),
            false => {
                server_metrics::with(|m| m.events_replay_missed += 1);
                match exit {
                    Some(exit) => Resume::Exit(Rc::from(exit)),
                    None => Resume::Now,
                }
            }
        },
        Some(LastEvent::Foreign(id)) => Resume::Exit(Rc::from(id)),
        None => Resume::Now,
    };
    // Where the stream starts without a resume point: the events from this moment on,
    // including those that arrive while the exit is asked (they come right behind its
    // answer, and the task that records them runs before this one resumes).
    let (asked, now) = {
        let st = session.st.borrow();
        (st.acks, st.next_seq - 1)
    };
    let from = match resume {
        Resume::Ring(seq) => seq,
        Resume::Exit(_) | Resume::Now => now,
    };
    let hold = Hold::new(&session, from, asked);
    let last_event_id = match &resume {
        Resume::Exit(id) => Some(id.clone()),
        Resume::Ring(_) | Resume::Now => None,
    };
    let _ = session
        .lifecycle
        .reply
        .challenge(Challenge::Resume { last_event_id });
    // Resuming the exit from its own id: what it queued before answering belongs to the
    // old flow (the exit replays from the id), so the stream starts after its answer.
    let answered = match resume {
        Resume::Exit(_) => Some(asked),
        Resume::Ring(_) | Resume::Now => None,
    };
    if !wait_support(&session, answered).await {
        return http_error(
            sink,
            405,
            "Method Not Allowed: the exit has no event stream",
            None,
        )
        .await;
    }
    let cursor = {
        let st = session.st.borrow();
        match resume {
            Resume::Ring(seq) => seq,
            Resume::Exit(_) if st.acks > asked => st.acked_at,
            Resume::Exit(_) => st.next_seq - 1,
            Resume::Now => now,
        }
    };
    // The stream gets its own small task: the one answering this request is sized for
    // every kind of request (POST is the largest) and would be held for the stream's
    // whole life, as would the request (its head keeps the read buffer alive).
    drop(req);
    tokio::task::spawn_local(serve_get(session, sink, cursor, hold));
}

/// A GET stream being set up ([`State::get_hold`]); released when it is live, or dropped
/// when the setup fails (a 405, the agent gone).
struct Hold {
    session: Rc<Session>,
    hold: GetHold,
}

impl Hold {
    fn new(session: &Rc<Session>, from: u64, asked: u64) -> Hold {
        let mut st = session.st.borrow_mut();
        let hold = GetHold {
            from,
            asked,
            number: st.holds,
        };
        st.holds += 1;
        st.get_hold = Some(hold);
        drop(st);
        // The lifecycle task may be waiting behind a stalled older GET: with a hold, it
        // reads on until the exit has answered this one (see `Session::get_behind`).
        session.taken.notify_waiters();
        Hold {
            session: session.clone(),
            hold,
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut st = self.session.st.borrow_mut();
        // A newer GET's hold is its own to release.
        if st.get_hold == Some(self.hold) {
            st.get_hold = None;
            st.trim_ring_bytes();
        }
        drop(st);
        self.session.taken.notify_waiters();
    }
}

/// Where a GET stream starts.
enum Resume {
    /// After this seq, from the ring.
    Ring(u64),
    /// After this exit event id, replayed by the exit; the ring is not used.
    Exit(Rc<str>),
    /// From now on.
    Now,
}

/// True if every GET event after `seq` is still in the ring (or none has come yet).
fn replayable(session: &Session, seq: u64) -> bool {
    let st = session.st.borrow();
    let latest = st.next_seq - 1;
    let oldest = st.ring.front().map_or(st.next_seq, |(first, _)| *first);
    seq <= latest && seq + 1 >= oldest
}

/// Waits (bounded) for the exit to say whether it has an event stream; true = serve it.
/// With `answered`, waits for an answer counted after that many (the answer to the resume
/// just asked for), not for one the exit gave earlier.
async fn wait_support(session: &Session, answered: Option<u64>) -> bool {
    let probe = tokio::time::sleep(EVENTS_PROBE_TIMEOUT);
    tokio::pin!(probe);
    loop {
        let n = session.changed.notified();
        let (support, fresh) = {
            let st = session.st.borrow();
            (st.support, answered.is_none_or(|before| st.acks > before))
        };
        match support {
            Support::Yes if fresh => return true,
            Support::No if fresh => return false,
            _ => {}
        }
        tokio::select! {
            () = n => {}
            () = &mut probe => return true,
        }
    }
}

/// Serves the session's GET event stream from `cursor` on, until the agent goes, the
/// session closes or a newer GET replaces it.
///
/// This is the state an idle session with an open GET stream sits in, once per session,
/// so it is kept small: writes are boxed (a write future is larger than the whole wait,
/// and is only alive while an event or keepalive goes out).
async fn serve_get(session: Rc<Session>, mut sink: Sink, mut cursor: u64, hold: Hold) {
    let generation = {
        let mut st = session.st.borrow_mut();
        st.get_generation += 1;
        st.get_live = true;
        st.get_taken = cursor;
        st.trim_ring_bytes();
        st.get_generation
    };
    drop(hold);
    // A GET replaced by this one ends.
    session.changed.notify_waiters();
    let mut gone = Box::pin(sink.head(200, &sse_head(&session.id)))
        .await
        .is_err();
    if !gone && session.version >= "2025-11-25" {
        // The priming event: an id and empty data.
        if let Some(priming) = data_event(&priming_id(&session, cursor), b"") {
            gone = Box::pin(sink.body(&priming)).await.is_err();
        }
    }
    let mut replaced = false;
    // One keep-alive timer for the stream's life, moved only when it fires: a timer armed
    // at every wake would enter tokio's timer wheel and leave it again for each of
    // thousands of streams at every list change. A comment goes out once
    // SSE_KEEPALIVE_INTERVAL passed without a write.
    let mut last_write = Instant::now();
    let keepalive = tokio::time::sleep(SSE_KEEPALIVE_INTERVAL);
    tokio::pin!(keepalive);
    while !gone {
        let changed = session.changed.notified();
        let Some(pending) = fresh_events(&session, generation, &mut cursor) else {
            replaced = true;
            break;
        };
        if !pending.is_empty() {
            gone = !Box::pin(write_events(&mut sink, pending)).await;
            last_write = Instant::now();
            // Taken once written, not before: events on their way to an agent that
            // stopped reading stay in the ring (the exit waits meanwhile), so they are
            // still there at the cut for a resuming GET to replay.
            if !gone {
                let mut st = session.st.borrow_mut();
                // A newer GET may have replaced this one during the write: the ring's
                // position is the newer one's to keep.
                if st.get_generation == generation {
                    st.get_taken = cursor;
                    st.trim_ring_bytes();
                }
                drop(st);
                session.taken.notify_waiters();
            }
        }
        if gone {
            break;
        }
        let step = tokio::select! {
            () = changed => 0,
            () = keepalive.as_mut() => 1,
            () = sink.closed() => 2,
        };
        match step {
            1 => {
                let due = last_write + SSE_KEEPALIVE_INTERVAL;
                let now = Instant::now();
                if now < due {
                    // Written since the timer was set: wait out the rest.
                    keepalive.as_mut().reset(due.into());
                    continue;
                }
                let mut out = BytesMut::with_capacity(4);
                sse::encode_comment("", &mut out);
                gone = Box::pin(sink.body(&out)).await.is_err();
                last_write = Instant::now();
                keepalive
                    .as_mut()
                    .reset((last_write + SSE_KEEPALIVE_INTERVAL).into());
            }
            2 => gone = true,
            _ => {}
        }
    }
    let current = {
        let mut st = session.st.borrow_mut();
        let current = st.get_generation == generation;
        if current {
            st.get_live = false;
            st.last_active = Instant::now();
        }
        current
    };
    session.taken.notify_waiters();
    if replaced || !gone {
        let _ = Box::pin(sink.finish()).await;
    } else if current {
        let _ = session.lifecycle.reply.challenge(Challenge::Suspended);
    }
}

/// The id of a GET stream's priming event at `cursor`: the exit's position too when the
/// cursor is the latest event (an older cursor is followed at once by replayed events,
/// which carry their own).
fn priming_id(session: &Session, cursor: u64) -> String {
    let st = session.st.borrow();
    match &st.last_exit_event {
        Some(exit) if cursor + 1 == st.next_seq && exit_id_carried(exit) => {
            format!("0.{cursor}:{exit}")
        }
        _ => format!("0.{cursor}"),
    }
}

/// The ring's events after `cursor`, which moves past them; `None` once the session closed
/// or a newer GET replaced this one (`generation`). The cursor moves past the events taken
/// here only: events pushed while they are being written are the next round's (the
/// session's `changed` fires for them).
fn fresh_events(session: &Session, generation: u64, cursor: &mut u64) -> Option<Events> {
    let st = session.st.borrow();
    if st.closed || st.get_generation != generation {
        return None;
    }
    let before = *cursor;
    if let Some(&(last, _)) = st.ring.back() {
        *cursor = before.max(last);
    }
    let fresh = st.ring.iter().filter(|(seq, _)| *seq > before);
    Some(fresh.map(|(_, b)| b.clone()).collect())
}

/// Events taken from the ring in one wake: one, as a rule (a list change tells every
/// session once), so a short list is kept inline.
type Events = SmallVec<[Bytes; 2]>;

/// Writes already-encoded events in order; false once the connection is gone.
async fn write_events(sink: &mut Sink, events: Events) -> bool {
    for event in events {
        if sink.body(&event).await.is_err() {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_are_ours_or_the_exits() {
        let ours = |stream, seq, exit| Some(LastEvent::Ours { stream, seq, exit });
        assert_eq!(parse_event_id(b"0.17"), ours(0, 17, None));
        assert_eq!(parse_event_id(b" 3.0 "), ours(3, 0, None));
        assert_eq!(
            parse_event_id(b"0.5:2=200;S=101"),
            ours(0, 5, Some("2=200;S=101"))
        );
        assert_eq!(parse_event_id(b"0.5:"), ours(0, 5, None));
        // An exit's own id after `:` keeps every byte, colons included.
        assert_eq!(parse_event_id(b"0.5:a:b"), ours(0, 5, Some("a:b")));
        for foreign in [
            "3",
            "a.b",
            "3.",
            ".4",
            "-1.2",
            "1.2.3",
            "2=200;S=101",
            "4.1:x",
        ] {
            assert_eq!(
                parse_event_id(foreign.as_bytes()),
                Some(LastEvent::Foreign(foreign)),
                "{foreign:?}"
            );
        }
        assert_eq!(parse_event_id(b""), None);
        assert_eq!(parse_event_id(b"  "), None);
        assert_eq!(parse_event_id(b"\xff.1"), None);
        // Only SP and HTAB are trimmed (as HTTP does): other Unicode spaces are the exit's
        // (a fuzz finding: `str::trim` cut them).
        assert_eq!(
            parse_event_id("0.17:S=abc\u{3000}".as_bytes()),
            ours(0, 17, Some("S=abc\u{3000}"))
        );
        assert_eq!(
            parse_event_id("\u{a0}0.1".as_bytes()),
            Some(LastEvent::Foreign("\u{a0}0.1"))
        );
        assert_eq!(parse_event_id(b"\t0.2:x \t"), ours(0, 2, Some("x")));
    }

    #[test]
    fn exit_ids_ride_in_ours_only_when_they_come_back_whole() {
        // A fuzz finding: an exit id ending in a space came back without it.
        for fine in ["7", "S=abc;2=1", "a b", "x\ty", "\u{3000}"] {
            assert!(exit_id_carried(fine), "{fine:?}");
        }
        for not in [
            "", "abc ", " abc", "\tabc", "abc\t", "a\rb", "a\nb", "a\0b", "a\x7fb",
        ] {
            assert!(!exit_id_carried(not), "{not:?}");
        }
    }
}
