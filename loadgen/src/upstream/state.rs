//! What all fixture workers share: the settings, the pre-rendered result bodies, the tool
//! catalogue (`tools.rs`; swapped whole for its next revision by `/control/tools_changed`),
//! the session table and the list_changed signal.
//!
//! Sessions live in one table behind a mutex rather than per worker: SO_REUSEPORT spreads
//! *connections* over workers, and one client session may use connections on several of
//! them. The critical section is one hash-set operation, so two to a few workers contend
//! little; the fixture favours being correct for any client over share-nothing purity.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use bytes::Bytes;
use tokio::sync::watch;

use super::tools::Tools;
use crate::args::UpstreamArgs;
use crate::limits::FIXTURE_SESSIONS_MAX;

/// The protocol version the fixture prefers and answers with unless the client asked for
/// another one it supports.
pub const LATEST_VERSION: &str = "2025-11-25";

/// Versions echoed back from `initialize`.
pub const ECHOED_VERSIONS: [&str; 2] = ["2025-06-18", "2025-11-25"];

/// Versions accepted in the `mcp-protocol-version` header (2025-03-26 is what a client
/// that sends none is assumed to speak).
pub const HEADER_VERSIONS: [&str; 3] = ["2025-03-26", "2025-06-18", "2025-11-25"];

/// The digits of a session id: a u64 in lowercase hex.
pub const SESSION_ID_CHARS: usize = 16;

/// Bodies rendered once at start and shared by every response (`Bytes` clones).
#[derive(Debug)]
pub struct Rendered {
    /// The tools/call result object with the `--result-bytes` payload.
    pub call_result: Bytes,
    /// The initialize result objects, one per echoed version (same order).
    pub initialize: [Bytes; ECHOED_VERSIONS.len()],
    /// The `{}` result of ping.
    pub empty: Bytes,
    /// One SSE event (as a chunk of a chunked body) carrying list_changed.
    pub list_changed_chunk: Bytes,
}

/// The state every worker shares.
#[derive(Debug)]
pub struct Shared {
    /// The command-line settings.
    pub args: UpstreamArgs,
    /// Pre-rendered bodies.
    pub rendered: Rendered,
    /// The tools/list result pages and the names tools/call accepts, of the current
    /// revision: readers `load` it without a lock; a revision replaces it whole.
    pub tools: ArcSwap<Tools>,
    /// Held while a revision is rendered and stored, so two triggers at once cannot store
    /// revisions out of order.
    revising: Mutex<()>,
    /// Live session ids, and the order they were created in.
    sessions: Mutex<Sessions>,
    /// Sessions created so far; XORed with `salt`, it makes ids unique per process.
    created: AtomicU64,
    /// Per-process randomness so ids differ between runs.
    salt: u64,
    /// Bumped by POST /control/list_changed; every open GET stream watches it.
    pub list_changed: watch::Sender<u64>,
    /// Open GET streams over all workers.
    pub streams: AtomicUsize,
}

impl Shared {
    /// Renders the fixed bodies for `args`.
    pub fn new(args: UpstreamArgs) -> Shared {
        let rendered = render(&args);
        let tools = ArcSwap::from_pointee(Tools::new(args.tools, args.page_size));
        let (list_changed, _) = watch::channel(0);
        Shared {
            args,
            rendered,
            tools,
            revising: Mutex::new(()),
            sessions: Mutex::new(Sessions::default()),
            created: AtomicU64::new(0),
            salt: RandomState::new().hash_one(std::process::id()),
            list_changed,
            streams: AtomicUsize::new(0),
        }
    }

    /// Creates a session and returns its id. When `FIXTURE_SESSIONS_MAX` are live the
    /// oldest is forgotten first (its next request gets 404 and its client starts over),
    /// so a long-lived fixture serves any number of runs that never DELETE.
    pub fn create_session(&self) -> String {
        let n = self.created.fetch_add(1, Ordering::Relaxed);
        // Both steps are bijections on u64, so distinct counters give distinct ids.
        let id = mix(n ^ self.salt);
        self.lock_sessions().insert(id);
        format!("{id:016x}")
    }

    /// Returns true if `header` names a live session.
    pub fn has_session(&self, header: &[u8]) -> bool {
        parse_session_id(header).is_some_and(|id| self.lock_sessions().live.contains(&id))
    }

    /// Forgets the session `header` names; returns false if it was not live.
    pub fn remove_session(&self, header: &[u8]) -> bool {
        parse_session_id(header).is_some_and(|id| self.lock_sessions().live.remove(&id))
    }

    /// Returns how many sessions are live.
    #[cfg(test)]
    pub fn session_count(&self) -> usize {
        self.lock_sessions().live.len()
    }

    fn lock_sessions(&self) -> std::sync::MutexGuard<'_, Sessions> {
        // A panic aborts the process (panic = "abort"), so a poisoned lock is not expected;
        // the table is consistent after every operation, so it stays usable regardless.
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes every open GET stream to send list_changed; returns how many are open.
    pub fn trigger_list_changed(&self) -> usize {
        self.list_changed.send_modify(|n| *n = n.wrapping_add(1));
        self.streams.load(Ordering::Relaxed)
    }

    /// Replaces the tool catalogue with its next revision (a real change of the list's
    /// content), then wakes every open GET stream to send list_changed, so a client that
    /// re-lists on the event gets the new revision; returns how many streams are open.
    pub fn trigger_tools_changed(&self) -> usize {
        {
            // A panic aborts the process (panic = "abort"); the guard protects no data.
            let _revising = self.revising.lock().unwrap_or_else(|e| e.into_inner());
            let next = self.tools.load().revised();
            self.tools.store(Arc::new(next));
        }
        self.trigger_list_changed()
    }
}

/// The session table: a set for lookups and a queue of creation order for eviction.
///
/// Invariants: `live.len() <= FIXTURE_SESSIONS_MAX`; `order` holds every live id (and
/// possibly ids already removed, skipped when reached) and at most
/// `2 * FIXTURE_SESSIONS_MAX` entries.
#[derive(Debug, Default)]
struct Sessions {
    live: HashSet<u64>,
    order: VecDeque<u64>,
}

impl Sessions {
    fn insert(&mut self, id: u64) {
        // Each pass pops one entry, so this ends within `order.len()` passes.
        while self.live.len() >= FIXTURE_SESSIONS_MAX {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.live.remove(&oldest);
        }
        if self.order.len() >= 2 * FIXTURE_SESSIONS_MAX {
            let live = &self.live;
            self.order.retain(|id| live.contains(id));
        }
        self.live.insert(id);
        self.order.push_back(id);
        assert!(self.live.len() <= FIXTURE_SESSIONS_MAX);
        assert!(self.order.len() <= 2 * FIXTURE_SESSIONS_MAX);
    }
}

/// Scrambles `x` so consecutive sessions get unrelated-looking ids: the splitmix64
/// finalizer, which is invertible (xor-shifts and odd multipliers), hence collision-free.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Parses a session id header: exactly `SESSION_ID_CHARS` lowercase hex digits.
pub fn parse_session_id(header: &[u8]) -> Option<u64> {
    if header.len() != SESSION_ID_CHARS {
        return None;
    }
    if !header
        .iter()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(header).ok()?, 16).ok()
}

/// Renders the fixed result objects for `args`.
fn render(args: &UpstreamArgs) -> Rendered {
    let payload = crate::mcp::fill(args.result_bytes);
    let mut call = Vec::with_capacity(args.result_bytes + 48);
    call.extend_from_slice(br#"{"content":[{"type":"text","text":""#);
    call.extend_from_slice(&payload);
    call.extend_from_slice(br#""}]}"#);
    let initialize = ECHOED_VERSIONS.map(|version| {
        Bytes::from(format!(
            r#"{{"protocolVersion":"{version}","capabilities":{{"tools":{{"listChanged":true}}}},"serverInfo":{{"name":"mcpyard-fixture","version":"{}"}}}}"#,
            env!("CARGO_PKG_VERSION")
        ))
    });
    let event = b"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n\n";
    let mut chunk = bytes::BytesMut::new();
    mcpyard::http::encode_chunk(event, &mut chunk);
    Rendered {
        call_result: Bytes::from(call),
        initialize,
        empty: Bytes::from_static(b"{}"),
        list_changed_chunk: chunk.freeze(),
    }
}

/// A fixture state for unit tests: no delay, the given payload, progress and SSE settings,
/// the two default tools.
#[cfg(test)]
pub(crate) fn for_tests(result_bytes: usize, progress: u32, sse: bool) -> Shared {
    Shared::new(test_args(result_bytes, progress, sse))
}

/// A fixture state for unit tests with `tools` tools in pages of `page_size` (0: one page).
#[cfg(test)]
pub(crate) fn for_tests_with_tools(tools: usize, page_size: usize) -> Shared {
    Shared::new(UpstreamArgs {
        tools,
        page_size,
        ..test_args(10, 0, false)
    })
}

#[cfg(test)]
fn test_args(result_bytes: usize, progress: u32, sse: bool) -> UpstreamArgs {
    UpstreamArgs {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        result_bytes,
        delay: std::time::Duration::ZERO,
        progress,
        progress_interval: std::time::Duration::ZERO,
        delay_from: crate::args::DelayFrom::Arrival,
        sse,
        workers: 1,
        tools: 2,
        page_size: 0,
        tls_cert: None,
        tls_key: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(result_bytes: usize) -> Shared {
        for_tests(result_bytes, 0, false)
    }

    #[test]
    fn sessions_are_unique_and_forgotten_on_remove() {
        let s = shared(0);
        let a = s.create_session();
        let b = s.create_session();
        assert_ne!(a, b);
        assert_eq!(a.len(), SESSION_ID_CHARS);
        assert!(s.has_session(a.as_bytes()));
        assert!(s.remove_session(a.as_bytes()));
        assert!(!s.has_session(a.as_bytes()));
        assert!(!s.remove_session(a.as_bytes()));
        assert_eq!(s.session_count(), 1);
    }

    #[test]
    fn a_full_table_forgets_the_oldest_session() {
        let mut sessions = Sessions::default();
        for id in 0..FIXTURE_SESSIONS_MAX as u64 {
            sessions.insert(id);
        }
        sessions.live.remove(&1);
        sessions.insert(u64::MAX);
        assert_eq!(sessions.live.len(), FIXTURE_SESSIONS_MAX);
        sessions.insert(u64::MAX - 1);
        assert!(!sessions.live.contains(&0));
        assert!(sessions.live.contains(&2));
        assert_eq!(sessions.live.len(), FIXTURE_SESSIONS_MAX);
    }

    #[test]
    fn session_ids_must_be_sixteen_lowercase_hex_digits() {
        assert_eq!(parse_session_id(b"00000000000000ff"), Some(255));
        assert_eq!(parse_session_id(b"00000000000000FF"), None);
        assert_eq!(parse_session_id(b"ff"), None);
        assert_eq!(parse_session_id(b"+000000000000000"), None);
        assert_eq!(parse_session_id(b"00000000000000fg"), None);
    }

    #[test]
    fn rendered_results_are_json_of_the_requested_size() {
        let s = shared(100);
        let v: serde_json::Value = serde_json::from_slice(&s.rendered.call_result)
            .unwrap_or_else(|e| panic!("call result: {e}"));
        assert_eq!(v["content"][0]["text"].as_str().map(str::len), Some(100));
        let v: serde_json::Value = serde_json::from_slice(s.tools.load().first_page())
            .unwrap_or_else(|e| panic!("tools list: {e}"));
        assert_eq!(v["tools"][0]["name"], "echo");
        for (body, version) in s.rendered.initialize.iter().zip(ECHOED_VERSIONS) {
            let v: serde_json::Value =
                serde_json::from_slice(body).unwrap_or_else(|e| panic!("initialize: {e}"));
            assert_eq!(v["protocolVersion"], version);
            assert_eq!(v["capabilities"]["tools"]["listChanged"], true);
        }
    }
}
