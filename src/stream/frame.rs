//! The typed frames of internal MCP streams.
//!
//! DATA carries raw JSON bytes (`params` on the initial direction, `result` on the reply);
//! everything else is typed so that no binding re-parses what another already knew.

use bytes::Bytes;
use std::rc::Rc;
use std::time::Instant;

/// What a stream is for: the lifecycle of a session, or one JSON-RPC method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The long-lived stream of one agent session (initialize until DELETE or expiry).
    Lifecycle,
    ToolsList,
    ToolsCall,
    PromptsList,
    PromptsGet,
    ResourcesList,
    ResourcesRead,
    ResourcesTemplatesList,
    ResourcesSubscribe,
    ResourcesUnsubscribe,
    CompletionComplete,
    LoggingSetLevel,
    /// Any other JSON-RPC request (`tasks/*`, a vendor method), named in [`Begin::method`];
    /// only exits that advertise [`Caps::OTHER`] get these.
    Other,
}

impl Kind {
    /// Every request kind, in a fixed order (metrics labels index into it).
    pub const REQUESTS: [Kind; 11] = [
        Kind::ToolsList,
        Kind::ToolsCall,
        Kind::PromptsList,
        Kind::PromptsGet,
        Kind::ResourcesList,
        Kind::ResourcesRead,
        Kind::ResourcesTemplatesList,
        Kind::ResourcesSubscribe,
        Kind::ResourcesUnsubscribe,
        Kind::CompletionComplete,
        Kind::LoggingSetLevel,
    ];

    /// The kind of stream a JSON-RPC method opens; `None` for methods not forwarded.
    pub fn from_method(method: &str) -> Option<Kind> {
        Some(match method {
            "tools/list" => Kind::ToolsList,
            "tools/call" => Kind::ToolsCall,
            "prompts/list" => Kind::PromptsList,
            "prompts/get" => Kind::PromptsGet,
            "resources/list" => Kind::ResourcesList,
            "resources/read" => Kind::ResourcesRead,
            "resources/templates/list" => Kind::ResourcesTemplatesList,
            "resources/subscribe" => Kind::ResourcesSubscribe,
            "resources/unsubscribe" => Kind::ResourcesUnsubscribe,
            "completion/complete" => Kind::CompletionComplete,
            "logging/setLevel" => Kind::LoggingSetLevel,
            _ => return None,
        })
    }

    /// The JSON-RPC method name of this kind (`"lifecycle"` for the lifecycle stream).
    pub fn method(self) -> &'static str {
        match self {
            Kind::Lifecycle => "lifecycle",
            Kind::ToolsList => "tools/list",
            Kind::ToolsCall => "tools/call",
            Kind::PromptsList => "prompts/list",
            Kind::PromptsGet => "prompts/get",
            Kind::ResourcesList => "resources/list",
            Kind::ResourcesRead => "resources/read",
            Kind::ResourcesTemplatesList => "resources/templates/list",
            Kind::ResourcesSubscribe => "resources/subscribe",
            Kind::ResourcesUnsubscribe => "resources/unsubscribe",
            Kind::CompletionComplete => "completion/complete",
            Kind::LoggingSetLevel => "logging/setLevel",
            Kind::Other => "other",
        }
    }

    /// The capability an exit must advertise to serve this kind.
    pub fn capability(self) -> Caps {
        match self {
            Kind::Lifecycle => Caps::empty(),
            Kind::ToolsList | Kind::ToolsCall => Caps::TOOLS,
            Kind::PromptsList | Kind::PromptsGet => Caps::PROMPTS,
            Kind::ResourcesList
            | Kind::ResourcesRead
            | Kind::ResourcesTemplatesList
            | Kind::ResourcesUnsubscribe => Caps::RESOURCES,
            Kind::ResourcesSubscribe => Caps::RESOURCES_SUBSCRIBE,
            Kind::CompletionComplete => Caps::COMPLETIONS,
            Kind::LoggingSetLevel => Caps::LOGGING,
            Kind::Other => Caps::OTHER,
        }
    }
}

/// Server capabilities an exit serves, as bits (rendered to JSON only at the edge).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Caps(pub u16);

impl Caps {
    pub const TOOLS: Caps = Caps(1);
    pub const TOOLS_LIST_CHANGED: Caps = Caps(1 << 1);
    pub const PROMPTS: Caps = Caps(1 << 2);
    pub const PROMPTS_LIST_CHANGED: Caps = Caps(1 << 3);
    pub const RESOURCES: Caps = Caps(1 << 4);
    pub const RESOURCES_SUBSCRIBE: Caps = Caps(1 << 5);
    pub const RESOURCES_LIST_CHANGED: Caps = Caps(1 << 6);
    pub const LOGGING: Caps = Caps(1 << 7);
    pub const COMPLETIONS: Caps = Caps(1 << 8);
    /// The exit forwards requests of methods mcpyard does not know ([`Kind::Other`]).
    pub const OTHER: Caps = Caps(1 << 9);

    /// No capability.
    pub const fn empty() -> Caps {
        Caps(0)
    }

    /// True if every bit of `other` is set here.
    pub fn contains(self, other: Caps) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both sets of bits.
    pub fn union(self, other: Caps) -> Caps {
        Caps(self.0 | other.0)
    }
}

/// The list whose content changed (`notifications/<list>/list_changed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ListKind {
    Tools,
    Prompts,
    Resources,
}

impl ListKind {
    /// Where this kind is in a per-kind array (`[_; 3]`).
    pub fn index(self) -> usize {
        match self {
            ListKind::Tools => 0,
            ListKind::Prompts => 1,
            ListKind::Resources => 2,
        }
    }

    /// The notification method announcing a change of this list.
    pub fn method(self) -> &'static str {
        match self {
            ListKind::Tools => "notifications/tools/list_changed",
            ListKind::Prompts => "notifications/prompts/list_changed",
            ListKind::Resources => "notifications/resources/list_changed",
        }
    }

    /// The whole notification as JSON-RPC text: the same bytes for every session told.
    pub fn notification(self) -> &'static [u8] {
        match self {
            ListKind::Tools => br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#,
            ListKind::Prompts => {
                br#"{"jsonrpc":"2.0","method":"notifications/prompts/list_changed"}"#
            }
            ListKind::Resources => {
                br#"{"jsonrpc":"2.0","method":"notifications/resources/list_changed"}"#
            }
        }
    }
}

/// The typed header that opens the initial direction of a stream.
#[derive(Clone, Debug)]
pub struct Begin {
    /// What the stream is for.
    pub kind: Kind,
    /// The exit-side session this stream belongs to (from the lifecycle reply); empty on
    /// the lifecycle stream itself.
    pub session: Rc<str>,
    /// `params.name` (tools/call, prompts/get), `params.uri` (resources/*) or
    /// `params.ref.name` / `params.ref.uri` (completion/complete), decoded, if any.
    pub target: Option<Rc<str>>,
    /// Where `target` is written in the params DATA, so a proxy can rename it in flight
    /// without scanning the params.
    pub target_at: Option<TargetAt>,
    /// [`Kind::Other`] only: the JSON-RPC method name.
    pub method: Option<Rc<str>>,
    /// Exact byte length of the `params` DATA that follows (0 when there are none).
    pub params_len: u32,
    /// When the caller stops waiting for the reply.
    pub deadline: Instant,
    /// The raw JSON lexeme of `params._meta.progressToken`, when the agent asked for progress.
    pub progress_token: Option<Bytes>,
    /// Lifecycle only: the agent's raw `capabilities` object and negotiated version. Boxed:
    /// once per session, and every request's `Begin` would otherwise carry its room.
    pub client: Option<Box<ClientHello>>,
    /// The agent's `Authorization` header on this request, for exits that forward it
    /// (`authorization: forward`); the agent may renew it between requests.
    pub authorization: Option<Bytes>,
}

/// The raw JSON string lexeme of a [`Begin::target`] inside the params DATA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetAt {
    /// Offset of the opening quote. Invariant: `start < end <= params_len`.
    pub start: u32,
    /// Offset just past the closing quote.
    pub end: u32,
    /// The target is a uri (resources, resource-template references), not a name.
    pub uri: bool,
}

impl Begin {
    /// The header of a session's lifecycle stream: the agent's `hello`, its
    /// `Authorization` also on the stream itself, bounded by `deadline`.
    pub fn lifecycle(hello: ClientHello, deadline: Instant) -> Begin {
        Begin {
            kind: Kind::Lifecycle,
            session: Rc::from(""),
            target: None,
            target_at: None,
            method: None,
            params_len: 0,
            deadline,
            progress_token: None,
            authorization: hello.authorization.clone(),
            client: Some(Box::new(hello)),
        }
    }

    /// The JSON-RPC method this stream carries (the named one for [`Kind::Other`]).
    pub fn method_name(&self) -> &str {
        match (&self.method, self.kind) {
            (Some(method), Kind::Other) => method,
            _ => self.kind.method(),
        }
    }
}

/// What the agent said about itself in `initialize` (lifecycle streams only).
#[derive(Clone, Debug)]
pub struct ClientHello {
    /// The agent's raw `capabilities` JSON object.
    pub capabilities: Bytes,
    /// The protocol version negotiated with the agent.
    pub protocol_version: &'static str,
    /// The agent's `Authorization` header, kept only for `authorization: forward` exits.
    pub authorization: Option<Bytes>,
    /// A session another node opened: the exit's [`ReplyBegin::handoff`] from then. The
    /// exit takes the session up from it (no `initialize` upstream) where it can, or opens
    /// a fresh one. Outside input (read from a shared store): every exit checks it.
    pub adopt: Option<Bytes>,
    /// The caller's session is shared with other nodes (`sessions: { store }`): before an
    /// exit opens an upstream session at its first use here, it asks for the record again
    /// ([`Event::Recheck`]), since another node may have opened it moments ago.
    pub shared: bool,
}

/// The typed header that opens the reply direction.
#[derive(Clone, Debug, Default)]
pub struct ReplyBegin {
    /// Lifecycle only: the exit-side session id used in later request `Begin`s.
    pub session: Option<Rc<str>>,
    /// Lifecycle only: what the exit serves.
    pub caps: Caps,
    /// Lifecycle only: optional `instructions` text (raw JSON string lexeme).
    pub instructions: Option<Bytes>,
    /// Lifecycle only: what another node needs to take this session up (a JSON value the
    /// exit alone reads back, with no credential in it), for a server whose sessions are
    /// shared (`sessions: { store }`); `None` when there is nothing to take up.
    pub handoff: Option<Bytes>,
}

/// A typed in-band event carried by FLUSH, with the exit's event id when it has one.
#[derive(Clone, Debug)]
pub struct Flush {
    /// The exit's event id, used to resume (`Last-Event-ID`) after a dropped connection.
    pub id: Option<Rc<str>>,
    /// What happened.
    pub event: Event,
}

/// In-band events.
#[derive(Clone, Debug)]
pub enum Event {
    /// The event stream is live (a priming point for resumption).
    Resumable,
    /// The exit asks the agent to wait this long before reconnecting; negative = the
    /// exit has no event stream at all (the agent's GET gets 405).
    Suspend { retry_ms: i64 },
    /// `notifications/<list>/list_changed`.
    ListChanged(ListKind),
    /// `notifications/resources/updated`, raw params (`{"uri":...}`).
    ResourcesUpdated { params: Bytes },
    /// `notifications/progress`, raw params (include the agent's progressToken).
    Progress { params: Bytes },
    /// Any other notification (`notifications/message` logging, ...), raw params.
    Notification {
        method: Rc<str>,
        params: Option<Bytes>,
    },
    /// Reply direction of a lifecycle: the session's handoff changed (a route opened after
    /// the reply's BEGIN); replaces [`ReplyBegin::handoff`]. Never shown to the agent.
    Handoff(Bytes),
    /// Reply direction of a lifecycle: the exit is about to open an upstream session of a
    /// shared session at its first use on this node; the caller reads the session's record
    /// again and answers with [`Event::Rechecked`] carrying the same `seq` (or a later one)
    /// from a read that began after this ask.
    Recheck { seq: u64 },
    /// Initial direction of a lifecycle: the answer to the exit's rechecks up to `seq`, the
    /// record's handoff as read (empty when it has none or could not be read). The exit
    /// treats the handoff as it treats [`Event::Handoff`].
    Rechecked { seq: u64, handoff: Bytes },
    /// Initial direction of a lifecycle, just before its END: the session lives on at
    /// another node, so the exit lets go of it without ending it upstream (no `DELETE`).
    Detach,
    /// A server-to-client request (elicitation/create, sampling/createMessage, roots/list);
    /// `id` is the raw id lexeme the agent must answer with.
    Request {
        id: Bytes,
        method: Rc<str>,
        params: Option<Bytes>,
    },
}

/// A direction's frames, in order.
#[derive(Debug)]
pub enum Frame {
    /// Opens the reply direction (the initial direction's [`Begin`] is handed over at open).
    Begin(ReplyBegin),
    /// Raw JSON bytes; counts against the window.
    Data(Bytes),
    /// A typed event, in order with DATA.
    Flush(Flush),
    /// Graceful end of the direction.
    End,
    /// Abortive end of the direction.
    Abort,
}

/// A bearer challenge from an upstream's `WWW-Authenticate`, to render as 401 or 403.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BearerChallenge {
    /// 401 (no or invalid token) or 403 (insufficient scope).
    pub status: u16,
    pub realm: Option<Box<str>>,
    pub scope: Option<Box<str>>,
    pub error: Option<Box<str>>,
    pub error_description: Option<Box<str>>,
    pub resource_metadata: Option<Box<str>>,
    /// The refused request carried the agent's own credential (its client forwards it). A
    /// server binding that authenticates agents itself relays only such challenges: any
    /// other is about a credential the agent never sent.
    pub forwarded: bool,
}

/// Why a receiver rejected a direction.
#[derive(Clone, Debug)]
pub enum Reset {
    /// No detail: the exchange failed.
    Plain,
    /// A JSON-RPC error to render for the request.
    Error {
        code: i32,
        message: Rc<str>,
        data: Option<Bytes>,
    },
    /// An authorization challenge to render as 401/403 with `WWW-Authenticate`.
    Bearer(BearerChallenge),
}

/// A receiver-initiated request to the sender of a direction.
#[derive(Clone, Debug)]
pub enum Challenge {
    /// (Re)open the event flow after this exit event id (none: from now on).
    Resume { last_event_id: Option<Rc<str>> },
    /// The agent's connection went away; keep the request alive for a resume.
    Suspended,
    /// The agent answered a server-to-client request: the request's raw id and the raw
    /// `result` or `error` member of the agent's response.
    Answer {
        id: Bytes,
        result: Option<Bytes>,
        error: Option<Bytes>,
    },
}

#[cfg(test)]
mod tests {
    use super::ListKind;
    use bytes::BytesMut;

    #[test]
    fn a_list_change_notification_is_the_text_the_writer_makes() {
        for kind in [ListKind::Tools, ListKind::Prompts, ListKind::Resources] {
            let mut out = BytesMut::new();
            crate::jsonrpc::write_notification(kind.method(), None, &mut out);
            assert_eq!(&out[..], kind.notification());
        }
    }
}
