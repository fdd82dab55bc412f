//! Thin wrappers that hand crate-internal parsers and rewriters to the fuzz targets in
//! `fuzz/`.
//!
//! Several of the codecs that read outside input live in private modules of the bindings
//! (the aggregate event-id codec, the Last-Event-ID reader, the params splice, the cache's
//! list merge). The fuzz crate is a separate crate, so it can only reach public items; this
//! module, built only with the `fuzzing` feature that nothing shipped turns on, re-exports
//! those items behind signatures made of public types alone. Each wrapper calls the real
//! code and adds no logic of its own, so what the fuzzers exercise is what runs.

use crate::jsonrpc::{ParamIndex, Raw};
use bytes::Bytes;
use serde_json::value::RawValue;

use crate::binding::proxy::event_id::Prefixes;
use crate::binding::proxy::{cache, rename};
use crate::binding::server::{app, get, reply, session};
use crate::stream::{BearerChallenge, Kind};

/// A `Last-Event-ID` as the server reads it (mirrors the server's private type).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LastEventId {
    /// One of the server's own ids: `<stream>.<seq>`, perhaps with `:<exit id>`.
    Ours {
        /// The stream the id names (0 is the session's GET stream).
        stream: u32,
        /// The event's sequence number on that stream.
        seq: u64,
        /// The exit's own position after the `:`, when there is a non-empty one.
        exit: Option<String>,
    },
    /// An id only the exit may know.
    Foreign(String),
}

/// Reads a `Last-Event-ID` header value the way the server's GET handler does.
pub fn parse_last_event_id(raw: &[u8]) -> Option<LastEventId> {
    get::parse_event_id(raw).map(|parsed| match parsed {
        get::LastEvent::Ours { stream, seq, exit } => LastEventId::Ours {
            stream,
            seq,
            exit: exit.map(str::to_owned),
        },
        get::LastEvent::Foreign(text) => LastEventId::Foreign(text.to_owned()),
    })
}

/// True if the server puts exit id `exit` into its own event ids (`0.<seq>:<exit>`).
pub fn exit_id_carried(exit: &str) -> bool {
    session::exit_id_carried(exit)
}

/// The proxy's aggregate event-id codec over a fixed set of route prefixes.
#[derive(Debug)]
pub struct EventPrefixes(Prefixes);

impl EventPrefixes {
    /// `prefixes[i]` is route i's prefix; the prefixes given must be unique, as config
    /// validation guarantees (the codec asserts it).
    pub fn new(prefixes: &[Option<&str>]) -> EventPrefixes {
        EventPrefixes(Prefixes::new(prefixes))
    }

    /// True if the codec aggregates (some route has a prefix).
    pub fn aggregating(&self) -> bool {
        self.0.aggregating()
    }

    /// The aggregate of the routes' last ids (`ids[i]` is route i's).
    pub fn encode(&self, ids: &[Option<&str>]) -> Option<String> {
        let ids: Vec<Option<std::rc::Rc<str>>> =
            ids.iter().map(|id| id.map(std::rc::Rc::from)).collect();
        self.0.encode(&ids)
    }

    /// The (route index, route id) pairs an aggregate names.
    pub fn decode(&self, aggregate: &str) -> Vec<(usize, String)> {
        self.0
            .decode(aggregate)
            .into_iter()
            .map(|(route, id)| (route, id.to_string()))
            .collect()
    }
}

/// The `WWW-Authenticate` value the server sends the agent for an upstream's challenge.
pub fn render_bearer(challenge: &BearerChallenge) -> String {
    reply::render_bearer(challenge)
}

/// The proxy's in-flight params rename: bytes `start..end` of a stream replaced by `with`.
#[derive(Debug)]
pub struct Splice(rename::Splice);

impl Splice {
    /// A splice of `start..end` (`start <= end`, which the proxy guarantees) by `with`.
    pub fn new(start: usize, end: usize, with: Bytes) -> Splice {
        Splice(rename::Splice::new(start, end, with))
    }

    /// The stream's length after the splice, for an input of `in_len` bytes.
    pub fn out_len(&self, in_len: usize) -> usize {
        self.0.out_len(in_len)
    }

    /// What the next piece of the stream becomes.
    pub fn feed(&mut self, piece: Bytes) -> Vec<Bytes> {
        self.0.feed(piece).collect()
    }
}

/// The JSON string lexeme the proxy writes for an upstream name.
pub fn lexeme(name: &str) -> Bytes {
    rename::lexeme(name)
}

/// Where the server found the item a request names, as the proxy receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The decoded name or uri.
    pub name: String,
    /// Offset of the lexeme's opening quote in the params' raw text.
    pub start: usize,
    /// Offset just past its closing quote.
    pub end: usize,
}

/// The server's reading of a `tools/call` (`uri == false`) or `resources/read` params
/// object: the named item and where its lexeme sits in `params.get()`, or the error the
/// agent is answered with.
pub fn request_target(params: &RawValue, uri: bool) -> Result<Option<Target>, &'static str> {
    let kind = if uri {
        Kind::ResourcesRead
    } else {
        Kind::ToolsCall
    };
    Ok(app::target_of(
        kind,
        Some(Raw::from(params)),
        &ParamIndex::of(Raw::from(params)),
    )?
    .map(|(name, at)| Target {
        name: name.to_string(),
        start: at.start as usize,
        end: at.end as usize,
    }))
}

/// The list cache's merge of the routes' item fragments, as stored (`encode_list`: a header
/// naming each route (`labels[i]`) and its span, then the merged result).
pub fn encode_list(array: &str, labels: &[&str], fragments: &[Option<Bytes>]) -> Bytes {
    cache::encode_list(array, labels, fragments)
}

/// What the cache of a proxy whose routes are `labels` serves from `stored` to a session
/// that may not see the routes in `hidden` (bit i for route i); `None` when `stored` is
/// not a list `encode_list` made.
pub fn served_list(stored: &Bytes, labels: &[&str], hidden: u64) -> Option<Bytes> {
    cache::CachedList::decode(stored, labels).map(|list| list.for_session(hidden))
}

/// Reads a value as the redis store stored it (`<version>:<bytes>`): the version and the
/// bytes, or `None` where the store gives an error.
pub fn decode_redis_value(stored: Vec<u8>) -> Option<(u64, Bytes)> {
    crate::store::redis::decode_value(stored)
        .ok()
        .map(|v| (v.version, v.bytes))
}

/// Reads a redis store change message (`<version> <key>`) as the store thread does.
pub fn parse_redis_change(payload: &[u8]) -> Option<(u64, String)> {
    crate::store::redis::parse_change(payload).map(|(v, k)| (v, k.to_owned()))
}
