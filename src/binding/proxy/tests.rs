//! Binding tests for the proxy: the test plays the caller (a server binding) on internal
//! streams, and the proxy's routes are scripted fake exits that record what reached them.
//! No sockets: what is asserted is the frames on both sides of the proxy.

use super::*;
use crate::config::{AllowList, Glob, ProxyBinding, Route as RouteCfg, event_prefixes};
use crate::store::memory::MemoryStore;
use crate::store::testing::Hooked;
use crate::store::{Store, SystemClock};
use crate::stream::{
    Begin, Caller, Challenge, ClientHello, Event, Flush, Frame, ListKind, ReplyBegin, TargetAt,
    Throttle, open,
};
use bytes::{BufMut, BytesMut};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio::time::timeout;

/// Longest a test waits for a frame.
const WAIT: Duration = Duration::from_secs(5);

use crate::testing::{run_local as run, settle};

/// A scripted route exit: it records what reaches it and lets the test emit lifecycle
/// events.
struct Fake {
    name: &'static str,
    /// What reached the fake, one line per thing, in order.
    log: RefCell<Vec<String>>,
    /// Events the test wants sent on the lifecycle reply.
    events: RefCell<VecDeque<Flush>>,
    ready: Notify,
    /// Refuse `initialize` with this.
    refuse: RefCell<Option<Reset>>,
    /// The tools/list result this fake answers with.
    tools: Cell<&'static str>,
    /// While set, events (and the answer to a resume) wait in `events`: a route slow to
    /// answer.
    held: Cell<bool>,
}

impl Fake {
    fn new(name: &'static str, tools: &'static str) -> Rc<Fake> {
        Rc::new(Fake {
            name,
            log: RefCell::new(Vec::new()),
            events: RefCell::new(VecDeque::new()),
            ready: Notify::new(),
            refuse: RefCell::new(None),
            tools: Cell::new(tools),
            held: Cell::new(false),
        })
    }

    fn note(&self, line: String) {
        self.log.borrow_mut().push(line);
    }

    /// Queues an event for the lifecycle reply.
    fn emit(&self, id: Option<&str>, event: Event) {
        self.events.borrow_mut().push_back(Flush {
            id: id.map(Rc::from),
            event,
        });
        self.ready.notify_one();
    }

    /// Waits until the log has `line`.
    async fn saw(&self, line: &str) {
        timeout(WAIT, async {
            while !self.log.borrow().iter().any(|l| l == line) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{} never saw {line:?}; saw {:?}",
                self.name,
                self.log.borrow()
            )
        });
    }
}

struct FakeExit(Rc<Fake>);

impl Exit for FakeExit {
    fn serve(&self, callee: Callee) -> Option<Serving> {
        let fake = self.0.clone();
        if callee.begin.kind == Kind::Lifecycle {
            Some(Box::pin(fake_lifecycle(fake, callee)))
        } else {
            Some(Box::pin(fake_request(fake, callee)))
        }
    }
}

async fn fake_lifecycle(fake: Rc<Fake>, callee: Callee) {
    if let Some(reset) = fake.refuse.borrow_mut().take() {
        fake.note("initialize refused".into());
        return fail(&callee, reset);
    }
    let auth = callee
        .begin
        .authorization
        .as_ref()
        .map(|a| String::from_utf8_lossy(a).into_owned());
    fake.note(format!("initialize auth={auth:?}"));
    let reply = ReplyBegin {
        session: Some(Rc::from(format!("{}-s", fake.name))),
        caps: Caps(Caps::TOOLS.0 | Caps::TOOLS_LIST_CHANGED.0 | Caps::RESOURCES.0),
        instructions: Some(Bytes::from(format!("\"I am {}\"", fake.name))),
        handoff: None,
    };
    if callee.reply.begin(reply).await.is_err() {
        return;
    }
    loop {
        while !fake.held.get() {
            let Some(flush) = fake.events.borrow_mut().pop_front() else {
                break;
            };
            if callee.reply.flush(flush).await.is_err() {
                return;
            }
        }
        // Initial first: a proxy that ends a route drops its reply end at once, and the
        // END queued before that must be seen.
        tokio::select! {
            biased;
            frame = callee.initial.next() => match frame {
                Some(Frame::Flush(Flush { event: Event::Notification { method, .. }, .. })) => {
                    fake.note(format!("notification {method}"));
                }
                Some(Frame::End) => {
                    fake.note("end".into());
                    callee.reply.end();
                    return;
                }
                Some(Frame::Abort) | None => return,
                Some(_) => {}
            },
            throttle = callee.reply.throttle() => match throttle {
                Some(Throttle::Challenge(Challenge::Resume { last_event_id })) => {
                    fake.note(format!("resume {}", last_event_id.as_deref().unwrap_or("-")));
                    let flush = Flush { id: None, event: Event::Resumable };
                    fake.events.borrow_mut().push_back(flush);
                }
                Some(Throttle::Challenge(Challenge::Answer { id, .. })) => {
                    fake.note(format!("answer {}", String::from_utf8_lossy(&id)));
                }
                Some(Throttle::Challenge(Challenge::Suspended)) => fake.note("suspended".into()),
                Some(Throttle::Reset(_)) | None => return,
            },
            () = fake.ready.notified() => {}
        }
    }
}

async fn fake_request(fake: Rc<Fake>, callee: Callee) {
    let mut params = Vec::new();
    while params.len() < callee.begin.params_len as usize {
        match callee.initial.next().await {
            Some(Frame::Data(piece)) => {
                callee.initial.ack(piece.len() as u32);
                params.extend_from_slice(&piece);
            }
            _ => return,
        }
    }
    let begin = &callee.begin;
    fake.note(format!(
        "{} session={} target={} at={:?} params={}",
        begin.kind.method(),
        begin.session,
        begin.target.as_deref().unwrap_or("-"),
        begin.target_at.map(|a| (a.start, a.end)),
        String::from_utf8_lossy(&params)
    ));
    let result = match begin.kind {
        // A fake named `cycle` pages its tools with cursors that go round: a, b, a, ...
        Kind::ToolsList if fake.name == "cycle" => {
            let text = String::from_utf8_lossy(&params);
            let (tool, next) = if text.contains("\"a\"") {
                ("t2", "b")
            } else if text.contains("\"b\"") {
                ("t3", "a")
            } else {
                ("t1", "a")
            };
            Bytes::from(format!(
                r#"{{"tools":[{{"name":"{tool}"}}],"nextCursor":"{next}"}}"#
            ))
        }
        Kind::ToolsList => Bytes::from_static(fake.tools.get().as_bytes()),
        Kind::ResourcesRead => Bytes::from_static(
            br#"{"contents":[{"uri":"file:///a","text":"x"},{"uri":"file:///b","blob":"AA=="}]}"#,
        ),
        Kind::ToolsCall if begin.target.as_deref() == Some("elicit") => {
            let ask = Flush {
                id: None,
                event: Event::Request {
                    id: Bytes::from_static(b"7"),
                    method: Rc::from("elicitation/create"),
                    params: None,
                },
            };
            if callee.reply.begin(ReplyBegin::default()).await.is_err()
                || callee.reply.flush(ask).await.is_err()
            {
                return;
            }
            match callee.reply.throttle().await {
                Some(Throttle::Challenge(Challenge::Answer { id, .. })) => {
                    fake.note(format!("answer {}", String::from_utf8_lossy(&id)));
                }
                other => fake.note(format!("no answer: {other:?}")),
            }
            Bytes::from_static(b"{\"content\":[]}")
        }
        _ => Bytes::from(format!("{{\"from\":\"{}\"}}", fake.name)),
    };
    if callee.reply.begin(ReplyBegin::default()).await.is_ok()
        && callee.reply.data(result).await.is_ok()
    {
        callee.reply.end();
    }
}

/// A proxy over `fakes`, routed as `toolkits` (event prefixes as the config computes them).
fn proxy(fakes: &[(&str, &Rc<Fake>)], tools: Option<Vec<&str>>) -> Rc<Proxy> {
    let names: Vec<&str> = fakes.iter().map(|(t, _)| *t).collect();
    let prefixes = event_prefixes(&names).expect("distinct toolkits");
    let routes = fakes
        .iter()
        .zip(prefixes)
        .enumerate()
        .map(|(i, ((toolkit, fake), prefix))| RouteCfg {
            toolkit: Some((*toolkit).to_owned()),
            exit: fake.name.to_owned(),
            tools: if i == 0 {
                tools
                    .clone()
                    .map(|g| AllowList::new(g.into_iter().map(Glob::new).collect()))
            } else {
                None
            },
            prompts: None,
            resources: None,
            event_prefix: (fakes.len() > 1).then_some(prefix),
        })
        .collect();
    let exits: Vec<Rc<dyn Exit>> = fakes
        .iter()
        .map(|(_, f)| Rc::new(FakeExit((*f).clone())) as Rc<dyn Exit>)
        .collect();
    Proxy::new(
        "tools",
        &ProxyBinding {
            cache: None,
            routes,
        },
        exits,
        0,
        None,
    )
}

#[test]
fn a_resources_allow_list_admits_uris_only_in_normal_form() {
    run(async {
        let a = Fake::new("a", "{}");
        let routes = vec![RouteCfg {
            toolkit: Some("docs".to_owned()),
            exit: a.name.to_owned(),
            tools: None,
            prompts: None,
            resources: Some(AllowList::new(vec![Glob::new("file:///docs/*")])),
            event_prefix: None,
        }];
        let exits = vec![Rc::new(FakeExit(a.clone())) as Rc<dyn Exit>];
        let binding = ProxyBinding {
            cache: None,
            routes,
        };
        let p = Proxy::new("tools", &binding, exits, 0, None);
        let resolved = |uri: &str| {
            p.resolve(Family::Resources, uri)
                .map(|(_, rest)| rest.to_owned())
        };
        assert_eq!(
            resolved("docs+file:///docs/readme.md").as_deref(),
            Some("file:///docs/readme.md")
        );
        for alias in [
            "docs+file:///docs/../etc/passwd",
            "docs+file:///docs/%2e%2e/etc/passwd",
            "docs+file:///docs/..%2Fetc/passwd",
            "docs+file:///docs//x",
        ] {
            assert_eq!(resolved(alias), None, "{alias}");
        }
        p.stop();
    });
}

/// Two fakes routed as `bluesky` (a) and `quartz` (b), and a session open through them:
/// its lifecycle and id.
async fn bluesky_and_quartz() -> (Rc<Fake>, Rc<Fake>, Rc<Proxy>, Caller, Rc<str>) {
    let (a, b) = (Fake::new("a", "{}"), Fake::new("b", "{}"));
    let p = proxy(&[("bluesky", &a), ("quartz", &b)], None);
    let (life, reply) = connect(&p, None).await;
    let session = reply.session.expect("a session id");
    (a, b, p, life, session)
}

fn begin(kind: Kind, session: &str, params_len: usize) -> Begin {
    Begin {
        kind,
        session: Rc::from(session),
        target: None,
        target_at: None,
        method: None,
        params_len: params_len as u32,
        deadline: Instant::now() + WAIT,
        progress_token: None,
        client: None,
        authorization: None,
    }
}

/// Opens a session through the proxy; returns the lifecycle and the reply's header.
async fn connect(proxy: &Proxy, auth: Option<&'static str>) -> (Caller, ReplyBegin) {
    let mut b = begin(Kind::Lifecycle, "", 0);
    b.client = Some(Box::new(ClientHello {
        capabilities: Bytes::from_static(b"{}"),
        protocol_version: "2025-11-25",
        authorization: auth.map(|a| Bytes::from_static(a.as_bytes())),
        adopt: None,
        shared: false,
    }));
    b.authorization = auth.map(|a| Bytes::from_static(a.as_bytes()));
    let (caller, callee) = open(b);
    proxy.open(callee);
    match timeout(WAIT, caller.reply.next()).await.expect("an answer") {
        Some(Frame::Begin(reply)) => (caller, reply),
        other => panic!(
            "expected the lifecycle reply, got {other:?} / {:?}",
            caller.initial.try_throttle()
        ),
    }
}

/// The next FLUSH on `caller`'s reply (BEGIN is skipped, DATA acknowledged and skipped).
async fn next_flush(caller: &Caller) -> Flush {
    loop {
        match timeout(WAIT, caller.reply.next())
            .await
            .expect("a frame in time")
        {
            Some(Frame::Flush(flush)) => return flush,
            Some(Frame::Data(d)) => caller.reply.ack(d.len() as u32),
            Some(Frame::Begin(_)) => {}
            other => panic!("expected a FLUSH, got {other:?}"),
        }
    }
}

/// Sends a request through the proxy and collects its result (or its RESET).
async fn call(
    proxy: &Proxy,
    session: &str,
    kind: Kind,
    target: Option<(&str, TargetAt)>,
    params: &[u8],
    piece: usize,
) -> Result<String, Reset> {
    let mut b = begin(kind, session, params.len());
    if let Some((name, at)) = target {
        b.target = Some(Rc::from(name));
        b.target_at = Some(at);
    }
    let (caller, callee) = open(b);
    proxy.open(callee);
    for chunk in params.chunks(piece.max(1)) {
        if caller
            .initial
            .data(Bytes::copy_from_slice(chunk))
            .await
            .is_err()
        {
            break;
        }
    }
    let mut out = Vec::new();
    loop {
        match timeout(WAIT, caller.reply.next())
            .await
            .expect("a frame in time")
        {
            Some(Frame::Data(d)) => {
                caller.reply.ack(d.len() as u32);
                out.extend_from_slice(&d);
            }
            Some(Frame::Begin(_) | Frame::Flush(_)) => {}
            Some(Frame::End) => {
                caller.initial.end();
                return Ok(String::from_utf8(out).expect("utf-8"));
            }
            Some(Frame::Abort) | None => {
                caller.initial.abort();
                return Err(match caller.initial.try_throttle() {
                    Some(Throttle::Reset(r)) => r,
                    other => panic!("an abort without a reset: {other:?}"),
                });
            }
        }
    }
}

/// Params `{"name":<name>,...}` and where the name's lexeme is.
/// Calls tool `raw` (its JSON string contents as the agent wrote them; `decoded` as the
/// server decoded them) with no other params, the params cut every `piece` bytes.
async fn call_tool(
    proxy: &Proxy,
    session: &str,
    raw: &str,
    decoded: &str,
    piece: usize,
) -> Result<String, Reset> {
    let (params, at) = named_params(raw, "");
    call(
        proxy,
        session,
        Kind::ToolsCall,
        Some((decoded, at)),
        &params,
        piece,
    )
    .await
}

fn named_params(name: &str, rest: &str) -> (Vec<u8>, TargetAt) {
    let mut p = BytesMut::new();
    p.put_slice(b"{\"arguments\":{\"q\":\"bluesky__x\"},\"name\":");
    let start = p.len() as u32;
    crate::jsonrpc::escape_str(name, &mut p);
    let end = p.len() as u32;
    p.put_slice(rest.as_bytes());
    p.put_slice(b"}");
    (
        p.to_vec(),
        TargetAt {
            start,
            end,
            uri: false,
        },
    )
}

#[test]
fn event_ids_aggregate_and_resumes_split_per_route() {
    run(async {
        let (a, b) = (Fake::new("a", "{}"), Fake::new("b", "{}"));
        // bluesky's prefix is S, quartz's 2 (the pull request's vectors).
        let p = proxy(&[("bluesky", &a), ("quartz", &b)], None);
        let (life, reply) = connect(&p, None).await;
        assert!(reply.caps.contains(Caps::TOOLS));
        assert!(
            !reply.caps.contains(Caps::OTHER),
            "several routes: no pass-through"
        );
        let text: String = serde_json::from_slice(&reply.instructions.unwrap()).unwrap();
        assert_eq!(text, "bluesky: I am a\n\nquartz: I am b");

        life.reply
            .challenge(Challenge::Resume {
                last_event_id: None,
            })
            .unwrap();
        a.saw("resume -").await;
        b.saw("resume -").await;
        let ack = next_flush(&life).await;
        assert!(
            matches!(ack.event, Event::Resumable),
            "one answer once both answered"
        );

        a.emit(Some("101"), Event::ListChanged(ListKind::Tools));
        assert_eq!(next_flush(&life).await.id.as_deref(), Some("S=101"));
        b.emit(Some("200"), Event::ListChanged(ListKind::Tools));
        assert_eq!(next_flush(&life).await.id.as_deref(), Some("2=200;S=101"));
        // An event without an id still names every route's position.
        b.emit(None, Event::ListChanged(ListKind::Tools));
        assert_eq!(next_flush(&life).await.id.as_deref(), Some("2=200;S=101"));

        // A resume: each route from its own id, unknown prefixes ignored.
        let agg = Rc::from("2=150;X=9;S=90");
        life.reply
            .challenge(Challenge::Resume {
                last_event_id: Some(agg),
            })
            .unwrap();
        a.saw("resume 90").await;
        b.saw("resume 150").await;
        assert!(matches!(next_flush(&life).await.event, Event::Resumable));
        // The aggregate starts from the resumed positions.
        a.emit(Some("91"), Event::ListChanged(ListKind::Tools));
        assert_eq!(next_flush(&life).await.id.as_deref(), Some("2=150;S=91"));

        // A route with no pair in the id resumes from where it is.
        a.log.borrow_mut().clear();
        b.log.borrow_mut().clear();
        life.reply
            .challenge(Challenge::Resume {
                last_event_id: Some(Rc::from("S=5")),
            })
            .unwrap();
        a.saw("resume 5").await;
        b.saw("resume -").await;
        assert!(matches!(next_flush(&life).await.event, Event::Resumable));

        // Route ids with the aggregate's own separators are escaped, and come back whole.
        a.emit(Some("x;y=z%"), Event::ListChanged(ListKind::Tools));
        let id = next_flush(&life).await.id.unwrap();
        assert_eq!(&*id, "2=150;S=x%3By%3Dz%25");
        a.log.borrow_mut().clear();
        life.reply
            .challenge(Challenge::Resume {
                last_event_id: Some(id),
            })
            .unwrap();
        a.saw("resume x;y=z%").await;
        assert!(matches!(next_flush(&life).await.event, Event::Resumable));

        life.initial.end();
        a.saw("end").await;
        b.saw("end").await;
    });
}

#[test]
fn server_to_client_requests_carry_their_toolkit_and_answers_find_the_route() {
    run(async {
        let (a, b, p, life, session) = bluesky_and_quartz().await;
        b.emit(
            None,
            Event::Request {
                id: Bytes::from_static(b"7"),
                method: Rc::from("sampling/createMessage"),
                params: None,
            },
        );
        let flush = next_flush(&life).await;
        let Event::Request { id, .. } = flush.event else {
            panic!("a request, got {:?}", flush.event);
        };
        assert_eq!(&id[..], b"\"quartz~7\"");
        let answer = Challenge::Answer {
            id,
            result: Some(Bytes::from_static(b"{}")),
            error: None,
        };
        life.reply.challenge(answer).unwrap();
        b.saw("answer 7").await;
        assert!(!a.log.borrow().iter().any(|l| l.starts_with("answer")));

        // The same on a request's own stream.
        let (params, at) = named_params("bluesky__elicit", "");
        let mut bg = begin(Kind::ToolsCall, &session, params.len());
        bg.target = Some(Rc::from("bluesky__elicit"));
        bg.target_at = Some(at);
        let (caller, callee) = open(bg);
        p.open(callee);
        caller.initial.data(Bytes::from(params)).await.unwrap();
        let flush = next_flush(&caller).await;
        let Event::Request { id, .. } = flush.event else {
            panic!("a request, got {:?}", flush.event);
        };
        assert_eq!(&id[..], b"\"bluesky~7\"");
        caller
            .reply
            .challenge(Challenge::Answer {
                id,
                result: None,
                error: None,
            })
            .unwrap();
        a.saw("answer 7").await;
    });
}

#[test]
fn names_lose_their_prefix_going_up_wherever_the_params_split() {
    run(async {
        let (_a, b, p, _life, session) = bluesky_and_quartz().await;
        let (params, at) = named_params("quartz__search", ",\"x\":1");
        let want_params = String::from_utf8(params.clone())
            .unwrap()
            .replace("\"quartz__search\"", "\"search\"");
        for piece in [1, 2, 3, 7, 64] {
            b.log.borrow_mut().clear();
            let got = call(
                &p,
                &session,
                Kind::ToolsCall,
                Some(("quartz__search", at)),
                &params,
                piece,
            )
            .await
            .expect("a result");
            assert_eq!(got, "{\"from\":\"b\"}");
            let seen = b.log.borrow().join("\n");
            let start = at.start;
            let end = start + "\"search\"".len() as u32;
            assert_eq!(
                seen,
                format!(
                    "tools/call session=b-s target=search at=Some(({start}, {end})) params={want_params}"
                ),
                "params cut every {piece} bytes"
            );
        }
        // An escaped name is matched decoded and sent plain.
        let got = call_tool(&p, &session, "quartz\\u005f_search", "quartz__search", 5).await;
        assert!(got.is_ok());
        assert!(
            b.log
                .borrow()
                .last()
                .unwrap()
                .contains("\"name\":\"search\"}")
        );
        // Unknown toolkits and names no route admits are refused like an unknown tool.
        let err = call_tool(&p, &session, "nope__search", "nope__search", 5).await;
        match err {
            Err(Reset::Error { code, message, .. }) => {
                assert_eq!(code, crate::jsonrpc::INVALID_PARAMS);
                assert_eq!(&*message, "Unknown tool: nope__search");
            }
            other => panic!("expected an error, got {other:?}"),
        }
    });
}

#[test]
fn lists_merge_in_route_order_and_allow_lists_filter() {
    run(async {
        let a = Fake::new(
            "a",
            r#"{"tools":[{"name":"get_x","d":1},{"name":"del_x"}],"nextCursor":null}"#,
        );
        let b = Fake::new("b", r#"{"tools":[{"name":"get_x"}]}"#);
        let p = proxy(&[("bluesky", &a), ("quartz", &b)], Some(vec!["get_*"]));
        let (_life, reply) = connect(&p, None).await;
        let session = reply.session.unwrap();
        let got = call(&p, &session, Kind::ToolsList, None, b"", 1)
            .await
            .unwrap();
        assert_eq!(
            got,
            r#"{"tools":[{"name":"bluesky__get_x","d":1},{"name":"quartz__get_x"}]}"#
        );
        // What the allow-list hides cannot be called either.
        let refused = call_tool(&p, &session, "bluesky__del_x", "bluesky__del_x", 9).await;
        assert!(refused.is_err());
        // resources/read results get their uris back under the prefix.
        let uri = "quartz+file:///a";
        let mut params = BytesMut::new();
        params.put_slice(b"{\"uri\":");
        let start = params.len() as u32;
        crate::jsonrpc::escape_str(uri, &mut params);
        let end = params.len() as u32;
        params.put_slice(b"}");
        let at = TargetAt {
            start,
            end,
            uri: true,
        };
        let got = call(
            &p,
            &session,
            Kind::ResourcesRead,
            Some((uri, at)),
            &params,
            3,
        )
        .await
        .unwrap();
        assert_eq!(
            got,
            r#"{"contents":[{"uri":"quartz+file:///a","text":"x"},{"uri":"quartz+file:///b","blob":"AA=="}]}"#
        );
        assert!(
            b.log
                .borrow()
                .last()
                .unwrap()
                .ends_with("params={\"uri\":\"file:///a\"}")
        );
    });
}

#[test]
fn a_route_refusing_initialize_is_skipped_unless_it_is_the_only_one() {
    run(async {
        let challenge = Reset::Bearer(crate::stream::BearerChallenge {
            status: 401,
            realm: Some("b".into()),
            ..Default::default()
        });
        let (a, b) = (Fake::new("a", "{\"tools\":[]}"), Fake::new("b", "{}"));
        *b.refuse.borrow_mut() = Some(challenge.clone());
        let p = proxy(&[("bluesky", &a), ("quartz", &b)], None);
        let (_life, reply) = connect(&p, Some("Bearer t")).await;
        assert!(
            a.log
                .borrow()
                .contains(&"initialize auth=Some(\"Bearer t\")".to_owned())
        );
        b.saw("initialize refused").await;
        // An item request for it opens it again, and gets its answer: the challenge.
        let session = reply.session.unwrap();
        *b.refuse.borrow_mut() = Some(challenge.clone());
        match call_tool(&p, &session, "quartz__x", "quartz__x", 4).await {
            Err(Reset::Bearer(c)) => assert_eq!(c.realm.as_deref(), Some("b")),
            other => panic!("expected the challenge, got {other:?}"),
        }
        // And once it lets the agent in, the call goes through.
        let got = call_tool(&p, &session, "quartz__x", "quartz__x", 4).await;
        assert_eq!(got.unwrap(), "{\"from\":\"b\"}");

        // Alone, the route's refusal is the agent's answer.
        let c = Fake::new("c", "{}");
        *c.refuse.borrow_mut() = Some(challenge);
        let p = proxy(&[("solo", &c)], None);
        let mut b = begin(Kind::Lifecycle, "", 0);
        b.client = Some(Box::new(ClientHello {
            capabilities: Bytes::from_static(b"{}"),
            protocol_version: "2025-11-25",
            authorization: None,
            adopt: None,
            shared: false,
        }));
        let (caller, callee) = open(b);
        p.open(callee);
        assert!(matches!(
            timeout(WAIT, caller.reply.next()).await.unwrap(),
            Some(Frame::Abort)
        ));
        assert!(matches!(
            caller.initial.try_throttle(),
            Some(Throttle::Reset(Reset::Bearer(_)))
        ));
    });
}

/// A spawned task is as large as its future's largest state, and a session's relay task
/// lives as long as the session: the rare, large paths (opening a route, list fan-outs)
/// are boxed so these stay small. Bounds with some room; a jump past them is a state that
/// should have been boxed.
#[test]
fn task_futures_stay_small() {
    run(async {
        let a = Fake::new("a", "{}");
        let p = proxy(&[("solo", &a)], None);
        let (_keep, callee) = open(begin(Kind::ToolsCall, "x", 0));
        let request = request::serve(p.clone(), callee);
        assert!(
            std::mem::size_of_val(&request) <= 2560,
            "{}",
            std::mem::size_of_val(&request)
        );
        let (_keep, callee) = open(begin(Kind::Lifecycle, "", 0));
        let lifecycle = session::serve(p.clone(), callee);
        assert!(
            std::mem::size_of_val(&lifecycle) <= 1280,
            "{}",
            std::mem::size_of_val(&lifecycle)
        );
    });
}

/// The list changes queued on `caller`'s reply now, without waiting (other frames are
/// passed over).
fn list_changes_queued(caller: &Caller) -> usize {
    let mut told = 0;
    while let Some(frame) = caller.reply.try_next() {
        if let Frame::Flush(flush) = frame {
            told += usize::from(matches!(flush.event, Event::ListChanged(ListKind::Tools)));
        }
    }
    told
}

#[test]
fn a_waiting_session_is_told_of_a_list_change_at_once_and_once_while_unread() {
    run(async {
        let a = Fake::new("a", "{}");
        let p = proxy(&[("solo", &a)], None);
        let (life, reply) = connect(&p, None).await;
        let id = reply.session.expect("id");
        // The relay task reaches its wait.
        settle(8).await;
        assert_eq!(list_changes_queued(&life), 0);
        let session = p.sessions.borrow().get(&id).cloned().expect("the session");
        // Queued by the caller of `announce` itself: no turn of the relay task between.
        session.announce(ListKind::Tools);
        session.announce(ListKind::Tools);
        assert_eq!(list_changes_queued(&life), 1);
        // Read: the next change is news again.
        session.announce(ListKind::Tools);
        assert_eq!(list_changes_queued(&life), 1);
        // Woken by its caller and not run yet, the relay may have something to send
        // first: the news waits for it and follows what it sends.
        life.reply
            .challenge(Challenge::Suspended)
            .expect("the relay listens");
        session.announce(ListKind::Tools);
        assert_eq!(list_changes_queued(&life), 0);
        settle(8).await;
        assert_eq!(list_changes_queued(&life), 1);
        p.stop();
    });
}

#[test]
fn a_list_change_during_a_resume_round_follows_the_rounds_answer() {
    run(async {
        let a = Fake::new("a", "{}");
        let p = proxy(&[("solo", &a)], None);
        let (life, reply) = connect(&p, None).await;
        let id = reply.session.expect("id");
        a.saw("initialize auth=None").await;
        let session = p.sessions.borrow().get(&id).cloned().expect("the session");
        // The agent's GET asks to resume; the route is slow to answer.
        a.held.set(true);
        life.reply
            .challenge(Challenge::Resume {
                last_event_id: None,
            })
            .expect("the relay listens");
        a.saw("resume -").await;
        session.announce(ListKind::Tools);
        settle(8).await;
        assert!(
            life.reply.try_next().is_none(),
            "nothing goes before the round's answer"
        );
        a.held.set(false);
        a.ready.notify_one();
        assert!(matches!(next_flush(&life).await.event, Event::Resumable));
        assert!(matches!(
            next_flush(&life).await.event,
            Event::ListChanged(ListKind::Tools)
        ));
        p.stop();
    });
}

/// What the two workers of the lease test share (each builds its own proxy and routes).
#[derive(Default)]
struct Takeover {
    /// The next `tools/list` blocks its worker's thread, as a stuck worker would be.
    block_next: AtomicBool,
    /// The worker blocked now, plus one (0: none).
    blocked: AtomicUsize,
    /// `tools/list` requests each worker's route served.
    lists: [AtomicUsize; 2],
    /// Of those, the ones served while the other worker was blocked.
    while_blocked: [AtomicUsize; 2],
    /// The test is over: the workers stop.
    done: AtomicBool,
}

/// Longest a worker stays blocked (it wakes as soon as the other has taken over).
const BLOCK_MAX: Duration = Duration::from_secs(20);

/// The merged list the routes serve normally, and the one the blocked list returns.
const FRESH_TOOLS: &str = r#"{"tools":[{"name":"fresh"}]}"#;
const STALE_TOOLS: &str = r#"{"tools":[{"name":"stale"}]}"#;
/// What the store holds after a refresh of the fresh list (names carry the toolkit).
const FRESH_MERGED: &str = r#"{"tools":[{"name":"kit__fresh"}]}"#;

/// A route of worker `worker` in the lease test.
struct TakeoverExit {
    worker: usize,
    shared: Arc<Takeover>,
}

impl Exit for TakeoverExit {
    fn serve(&self, callee: Callee) -> Option<Serving> {
        let (worker, shared) = (self.worker, self.shared.clone());
        Some(Box::pin(takeover_route(worker, shared, callee)))
    }
}

async fn takeover_route(worker: usize, shared: Arc<Takeover>, callee: Callee) {
    if callee.begin.kind == Kind::Lifecycle {
        let reply = ReplyBegin {
            session: Some(Rc::from(format!("w{worker}"))),
            caps: Caps::TOOLS,
            instructions: None,
            handoff: None,
        };
        if callee.reply.begin(reply).await.is_err() {
            return;
        }
        loop {
            tokio::select! {
                frame = callee.initial.next() => {
                    if matches!(frame, Some(Frame::End | Frame::Abort) | None) {
                        callee.reply.end();
                        return;
                    }
                }
                throttle = callee.reply.throttle() => match throttle {
                    Some(Throttle::Challenge(Challenge::Resume { .. })) => {
                        let flush = Flush { id: None, event: Event::Resumable };
                        if callee.reply.flush(flush).await.is_err() {
                            return;
                        }
                    }
                    Some(Throttle::Reset(_)) | None => return,
                    Some(_) => {}
                },
            }
        }
    }
    let mut read = 0;
    while read < callee.begin.params_len as usize {
        match callee.initial.next().await {
            Some(Frame::Data(piece)) => {
                callee.initial.ack(piece.len() as u32);
                read += piece.len();
            }
            _ => return,
        }
    }
    let mut tools = FRESH_TOOLS;
    if callee.begin.kind == Kind::ToolsList {
        shared.lists[worker].fetch_add(1, Ordering::SeqCst);
        let blocked = shared.blocked.load(Ordering::SeqCst);
        if blocked != 0 && blocked != worker + 1 {
            shared.while_blocked[worker].fetch_add(1, Ordering::SeqCst);
        }
        if shared.block_next.swap(false, Ordering::SeqCst) {
            // The whole worker thread stops: no renewal, no timer, nothing runs on it.
            shared.blocked.store(worker + 1, Ordering::SeqCst);
            let until = Instant::now() + BLOCK_MAX;
            while shared.while_blocked[1 - worker].load(Ordering::SeqCst) == 0
                && Instant::now() < until
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            shared.blocked.store(0, Ordering::SeqCst);
            tools = STALE_TOOLS;
        }
    }
    if callee.reply.begin(ReplyBegin::default()).await.is_ok()
        && callee
            .reply
            .data(Bytes::from_static(tools.as_bytes()))
            .await
            .is_ok()
    {
        callee.reply.end();
    }
}

/// One worker of the lease test: a caching proxy over one route, until the test is done.
fn takeover_worker(worker: usize, shared: Arc<Takeover>, store: Arc<dyn Store>) {
    run(async move {
        let setup = cache::CacheSetup {
            store,
            ttl: Duration::from_millis(600),
            authorization: None,
            route_timeout: WAIT,
            forwarding: 0,
        };
        let routes = vec![RouteCfg {
            toolkit: Some("kit".to_owned()),
            exit: "kit".to_owned(),
            tools: None,
            prompts: None,
            resources: None,
            event_prefix: None,
        }];
        let exit = Rc::new(TakeoverExit {
            worker,
            shared: shared.clone(),
        }) as Rc<dyn Exit>;
        let binding = ProxyBinding {
            cache: None,
            routes,
        };
        let p = Proxy::new("tools", &binding, vec![exit], worker as u8, Some(setup));
        while !shared.done.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        p.stop();
    });
}

/// Polls `check` on the test thread until it holds; fails with `what` after `limit`.
fn wait_until(limit: Duration, what: &str, check: impl Fn() -> bool) {
    let until = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < until, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Two workers share a store; the one hydrating gets stuck (its thread blocked inside a
/// list request) past its lease: the other takes the lease over and hydrates, and the
/// stuck one, once it runs again, writes nothing of what it fetched under the lost lease.
#[test]
fn a_worker_stuck_past_its_lease_is_replaced_and_writes_nothing_after() {
    let shared = Arc::new(Takeover::default());
    // Every list written is recorded: a later write would hide a stale one.
    let store = Arc::new(Hooked::default());
    let workers: Vec<_> = (0..2)
        .map(|w| {
            let (shared, store) = (shared.clone(), store.clone() as Arc<dyn Store>);
            std::thread::spawn(move || takeover_worker(w, shared, store))
        })
        .collect();
    let listed = || {
        shared
            .lists
            .iter()
            .map(|n| n.load(Ordering::SeqCst))
            .sum::<usize>()
    };
    // The merged list agents get: the stored value after its one-line header.
    let json_of = |stored: &Bytes| {
        let at = stored
            .iter()
            .position(|b| *b == b'\n')
            .map_or(0, |at| at + 1);
        stored.slice(at..)
    };
    let merged = || {
        store
            .inner
            .get_now("tools/tools")
            .map(|v| json_of(&v.bytes))
    };
    let limit = BLOCK_MAX * 2;
    wait_until(limit, "never hydrated", || merged().is_some());
    assert_eq!(merged().as_deref(), Some(FRESH_MERGED.as_bytes()));
    // The next refresh (the TTL's) blocks whichever worker holds the lease.
    shared.block_next.store(true, Ordering::SeqCst);
    let before = listed();
    wait_until(limit, "no refresh after the TTL", || {
        shared.blocked.load(Ordering::SeqCst) != 0 || listed() > before + 1
    });
    wait_until(limit, "nobody took over", || {
        shared
            .while_blocked
            .iter()
            .any(|n| n.load(Ordering::SeqCst) > 0)
    });
    let stuck = (0..2)
        .find(|w| shared.while_blocked[1 - w].load(Ordering::SeqCst) > 0)
        .expect("a stuck worker");
    let successor = 1 - stuck;
    wait_until(limit, "the stuck worker never woke", || {
        shared.blocked.load(Ordering::SeqCst) == 0
    });
    // Two more refreshes (the successor's, unless it was itself starved past its lease),
    // then the store holds the fresh list, never the stale one the stuck worker fetched.
    let so_far = listed();
    wait_until(limit, "refreshes stopped", || listed() >= so_far + 2);
    assert!(shared.lists[successor].load(Ordering::SeqCst) > 0);
    assert_eq!(merged().as_deref(), Some(FRESH_MERGED.as_bytes()));
    let written = store.put_under("tools/tools");
    assert!(
        written
            .iter()
            .all(|w| &json_of(w)[..] == FRESH_MERGED.as_bytes()),
        "the stuck worker wrote under a lost lease: {written:?}"
    );
    shared.done.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().expect("worker thread");
    }
}

#[test]
fn a_cursor_given_again_ends_the_list_whatever_the_cycle() {
    run(async {
        let cycle = Fake::new("cycle", "{}");
        let p = proxy(&[("kit", &cycle)], None);
        let (_life, reply) = connect(&p, None).await;
        let session = reply.session.expect("a session id");
        let got = call(&p, &session, Kind::ToolsList, None, b"", 64).await;
        assert_eq!(
            got.expect("the list"),
            r#"{"tools":[{"name":"kit__t1"},{"name":"kit__t2"},{"name":"kit__t3"}]}"#
        );
        let asked = cycle
            .log
            .borrow()
            .iter()
            .filter(|l| l.starts_with("tools/list"))
            .count();
        assert_eq!(
            asked,
            3,
            "the page after b gave a again: {:?}",
            cycle.log.borrow()
        );
    });
}

/// A cached proxy over fake routes whose cache the test drives by hand: it holds the
/// hydration lease itself (so no worker hydrates) and writes the store as a hydrator would.
fn cached_proxy(fakes: &[(&str, &Rc<Fake>)], store: Arc<dyn Store>, gate: Duration) -> Rc<Proxy> {
    let names: Vec<&str> = fakes.iter().map(|(t, _)| *t).collect();
    let prefixes = event_prefixes(&names).expect("distinct toolkits");
    let routes = fakes
        .iter()
        .zip(prefixes)
        .map(|((toolkit, fake), prefix)| RouteCfg {
            toolkit: Some((*toolkit).to_owned()),
            exit: fake.name.to_owned(),
            tools: None,
            prompts: None,
            resources: None,
            event_prefix: (fakes.len() > 1).then_some(prefix),
        })
        .collect();
    let exits = fakes
        .iter()
        .map(|(_, f)| Rc::new(FakeExit((*f).clone())) as Rc<dyn Exit>)
        .collect();
    let setup = cache::CacheSetup {
        store,
        ttl: Duration::from_secs(300),
        authorization: None,
        route_timeout: gate,
        forwarding: 0,
    };
    Proxy::new(
        "tools",
        &ProxyBinding {
            cache: None,
            routes,
        },
        exits,
        0,
        Some(setup),
    )
}

/// A memory store whose hydration lease the test holds, so nobody hydrates: the lists in
/// it are the test's.
async fn store_leased() -> Arc<dyn Store> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::with_clock(Arc::new(SystemClock)));
    let lease = store
        .lock("tools/lifecycle.lock", Duration::from_secs(600))
        .await;
    assert!(matches!(lease, Ok(Some(_))));
    store
}

#[test]
fn a_session_that_fell_back_hears_of_the_first_cached_list_only_if_it_differs() {
    run(async {
        let store = store_leased().await;
        let a = Fake::new("a", r#"{"tools":[{"name":"x"}]}"#);
        let p = cached_proxy(&[("kit", &a)], store.clone(), Duration::from_millis(200));
        // The cache is not ready within the gate: both sessions open the route live.
        let (same_life, same) = connect(&p, None).await;
        let (diff_life, diff) = connect(&p, None).await;
        let (quiet_life, _quiet) = connect(&p, None).await;
        let same = same.session.expect("id");
        let diff = diff.session.expect("id");
        let live = call(&p, &same, Kind::ToolsList, None, b"", 64)
            .await
            .expect("a list");
        assert_eq!(live, r#"{"tools":[{"name":"kit__x"}]}"#);
        call(&p, &diff, Kind::ToolsList, None, b"", 64)
            .await
            .expect("a list");
        // `diff` was shown something else before (as if the route changed since).
        let other = p
            .sessions
            .borrow()
            .get(&diff)
            .cloned()
            .expect("the session");
        other.shown(Kind::ToolsList, 7);
        // The first cached tools list: what `same` was shown; news to `diff` only (the
        // quiet session never listed tools, so it gets the cached list when it does).
        let fragment = Bytes::from_static(br#"{"name":"kit__x"}"#);
        let stored = cache::encode_list("tools", &["kit"], &[Some(fragment)]);
        store.put("tools/tools", stored).await.expect("a put");
        let flush = next_flush(&diff_life).await;
        assert!(
            matches!(flush.event, Event::ListChanged(ListKind::Tools)),
            "{flush:?}"
        );
        for life in [&same_life, &quiet_life] {
            let more = timeout(Duration::from_millis(300), life.reply.next()).await;
            assert!(
                more.is_err(),
                "told although nothing it saw changed: {more:?}"
            );
        }
        // From now on lists come from the cache, for every session.
        let cached = call(&p, &same, Kind::ToolsList, None, b"", 64)
            .await
            .expect("a list");
        assert_eq!(cached, live);
        p.stop();
    });
}

/// A tools list of one tool named `name`, as the cache stores it (one route, `kit`).
fn kit_list(name: &str) -> Bytes {
    let fragment = Bytes::from(format!(r#"{{"name":"kit__{name}"}}"#));
    cache::encode_list("tools", &["kit"], &[Some(fragment)])
}

/// A caching proxy over a leased store holding every list (tools: `kit_list("x")`), and
/// `count` agent sessions on it.
async fn cached_fleet(count: usize) -> (Arc<dyn Store>, Rc<Proxy>, Vec<Caller>) {
    let store = store_leased().await;
    store
        .put("tools/tools", kit_list("x"))
        .await
        .expect("a put");
    // The other kinds, empty: the cache is ready once every kind is there.
    for (key, array) in [
        ("tools/prompts", "prompts"),
        ("tools/resources", "resources"),
        ("tools/resources/templates", "resourceTemplates"),
    ] {
        let empty = cache::encode_list(array, &["kit"], &[None]);
        store.put(key, empty).await.expect("a put");
    }
    let caps = cache::StoredCaps {
        routes: vec![cache::StoredRoute {
            label: "kit".into(),
            caps: Caps::TOOLS.0 | Caps::TOOLS_LIST_CHANGED.0,
            instructions: None,
        }],
    };
    let caps = serde_json::to_vec(&caps).expect("caps as JSON");
    store
        .put("tools/routes", Bytes::from(caps))
        .await
        .expect("a put");
    let a = Fake::new("a", r#"{"tools":[{"name":"x"}]}"#);
    let p = cached_proxy(&[("kit", &a)], store.clone(), Duration::from_secs(5));
    let mut lives = Vec::new();
    for _ in 0..count {
        lives.push(connect(&p, None).await.0);
    }
    (store, p, lives)
}

#[test]
fn cached_capabilities_are_read_by_label_not_position() {
    run(async {
        // The lease holder's config has the routes as `two, one` (a rolling change of
        // config); this node's as `one, two, three`.
        let store = store_leased().await;
        for kind in cache::KINDS {
            let (key, array) = cache::names(kind);
            let list = cache::encode_list(array, &["two", "one"], &[None, None]);
            store
                .put(&format!("tools/{key}"), list)
                .await
                .expect("a put");
        }
        let record = |label: &str, caps: Caps| cache::StoredRoute {
            label: label.into(),
            caps: caps.0,
            instructions: Some(format!("I am {label}")),
        };
        let caps = cache::StoredCaps {
            routes: vec![record("two", Caps::PROMPTS), record("one", Caps::TOOLS)],
        };
        let caps = serde_json::to_vec(&caps).expect("caps as JSON");
        store
            .put("tools/routes", Bytes::from(caps))
            .await
            .expect("a put");
        let (a, b, c) = (
            Fake::new("a", "{}"),
            Fake::new("b", "{}"),
            Fake::new("c", "{}"),
        );
        let p = cached_proxy(
            &[("one", &a), ("two", &b), ("three", &c)],
            store,
            Duration::from_secs(5),
        );
        let (_life, reply) = connect(&p, None).await;
        let text: String = serde_json::from_slice(&reply.instructions.expect("some")).unwrap();
        assert_eq!(text, "one: I am one\n\ntwo: I am two");
        assert!(reply.caps.contains(Caps::TOOLS) && reply.caps.contains(Caps::PROMPTS));
        assert_eq!(p.routes[0].known_caps.get(), Caps::TOOLS);
        assert_eq!(p.routes[1].known_caps.get(), Caps::PROMPTS);
        assert_eq!(p.routes[2].known_caps.get(), Caps::empty());
        p.stop();
    });
}

/// Each of `lives` gets one `tools/list_changed`, then nothing more.
async fn told_once_each(lives: &[Caller]) {
    for life in lives {
        let flush = next_flush(life).await;
        assert!(
            matches!(flush.event, Event::ListChanged(ListKind::Tools)),
            "{flush:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(lives.iter().all(|life| life.reply.try_next().is_none()));
}

#[test]
fn a_list_change_reaches_more_sessions_than_a_batch_each_once() {
    run(async {
        let count = ANNOUNCE_BATCH + 44;
        let (store, p, lives) = cached_fleet(count).await;
        let told_before = proxy_metrics::with(|m| m.cache.notifications);
        store
            .put("tools/tools", kit_list("y"))
            .await
            .expect("a put");
        told_once_each(&lives).await;
        let told = proxy_metrics::with(|m| m.cache.notifications) - told_before;
        assert_eq!(told, count as u64);
        p.stop();
    });
}

#[test]
fn changes_faster_than_the_batches_join_the_one_pass_under_way() {
    run(async {
        let count = 2 * ANNOUNCE_BATCH + 10;
        let (_store, p, lives) = cached_fleet(count).await;
        let at = cache::slot(Kind::ToolsList).expect("a cached kind");
        let told_before = proxy_metrics::with(|m| m.cache.notifications);
        // A storm of changes, all before the first batch task runs: one task, which goes
        // through the sessions twice (the first change, then the rest joined).
        for _ in 0..50 {
            p.announce(at, ListKind::Tools, cache::News::Changed(1));
        }
        assert_eq!(p.announcing[at].get(), Some(1));
        // Two passes of three batches, each batch a turn.
        for _ in 0..100 {
            if p.announcing[at].get().is_none() {
                break;
            }
            settle(1).await;
        }
        assert_eq!(p.announcing[at].get(), None);
        told_once_each(&lives).await;
        let told = proxy_metrics::with(|m| m.cache.notifications) - told_before;
        assert_eq!(told, 2 * count as u64);
        // New bytes with no route's items changed are news to nobody: no pass.
        p.announce(at, ListKind::Tools, cache::News::Changed(0));
        assert_eq!(p.announcing[at].get(), None);
        // A change after the pass ended starts a new one.
        p.announce(at, ListKind::Tools, cache::News::Changed(1));
        told_once_each(&lives).await;
        let told = proxy_metrics::with(|m| m.cache.notifications) - told_before;
        assert_eq!(told, 3 * count as u64);
        p.stop();
    });
}

/// A route exit whose `initialize` answers only after `delay`, and whose tools list is
/// one tool.
struct SlowOpen {
    delay: Duration,
    opened: Rc<std::cell::Cell<usize>>,
}

impl Exit for SlowOpen {
    fn serve(&self, callee: Callee) -> Option<Serving> {
        let (delay, opened) = (self.delay, self.opened.clone());
        Some(Box::pin(async move {
            if callee.begin.kind == Kind::Lifecycle {
                tokio::time::sleep(delay).await;
                opened.set(opened.get() + 1);
                let reply = ReplyBegin {
                    session: Some(Rc::from("slow")),
                    caps: Caps::TOOLS,
                    instructions: None,
                    handoff: None,
                };
                if callee.reply.begin(reply).await.is_ok() {
                    // Held until the proxy ends it.
                    while !matches!(
                        callee.initial.next().await,
                        Some(Frame::End | Frame::Abort) | None
                    ) {}
                    callee.reply.end();
                }
                return;
            }
            while let Some(Frame::Data(piece)) = callee.initial.try_next() {
                callee.initial.ack(piece.len() as u32);
            }
            if callee.reply.begin(ReplyBegin::default()).await.is_ok()
                && callee
                    .reply
                    .data(Bytes::from_static(br#"{"tools":[{"name":"t"}]}"#))
                    .await
                    .is_ok()
            {
                callee.reply.end();
            }
        }))
    }
}

#[test]
fn the_hydration_lease_is_renewed_while_the_session_opens() {
    run(async {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::with_clock(Arc::new(SystemClock)));
        let opened = Rc::new(std::cell::Cell::new(0));
        // The route takes 1.5 s to initialize; the cache's TTL (and so its leases) is 1 s.
        let exit = Rc::new(SlowOpen {
            delay: Duration::from_millis(1500),
            opened: opened.clone(),
        }) as Rc<dyn Exit>;
        let routes = vec![RouteCfg {
            toolkit: Some("kit".to_owned()),
            exit: "kit".to_owned(),
            tools: None,
            prompts: None,
            resources: None,
            event_prefix: None,
        }];
        let setup = cache::CacheSetup {
            store: store.clone(),
            ttl: Duration::from_secs(1),
            authorization: None,
            route_timeout: WAIT,
            forwarding: 0,
        };
        let p = Proxy::new(
            "tools",
            &ProxyBinding {
                cache: None,
                routes,
            },
            vec![exit],
            0,
            Some(setup),
        );
        let until = Instant::now() + WAIT;
        while store.get("tools/tools").await.ok().flatten().is_none() {
            assert!(
                Instant::now() < until,
                "never hydrated (opened {} times)",
                opened.get()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A lease lost while opening would be noticed at the first renewal after it, the
        // hydration ended and the session opened again by the next lease taken.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(
            opened.get(),
            1,
            "the session was opened again: the lease was lost"
        );
        p.stop();
    });
}

/// A route exit whose `initialize` answers, call by call, as scripted: refused, after a
/// delay, or at once.
struct Scripted {
    calls: Rc<std::cell::Cell<usize>>,
    script: Vec<Option<Duration>>,
}

impl Exit for Scripted {
    fn serve(&self, callee: Callee) -> Option<Serving> {
        let call = self.calls.get();
        self.calls.set(call + 1);
        let step = self.script.get(call).copied().flatten();
        Some(Box::pin(async move {
            if callee.begin.kind != Kind::Lifecycle {
                return fail(&callee, internal("not scripted"));
            }
            let Some(delay) = step else {
                return fail(&callee, internal("refused"));
            };
            tokio::time::sleep(delay).await;
            let reply = ReplyBegin {
                session: Some(Rc::from("scripted")),
                caps: Caps::TOOLS,
                instructions: None,
                handoff: None,
            };
            if callee.reply.begin(reply).await.is_ok() {
                while !matches!(
                    callee.initial.next().await,
                    Some(Frame::End | Frame::Abort) | None
                ) {}
                callee.reply.end();
            }
        }))
    }
}

#[test]
fn a_route_opening_dropped_halfway_is_not_left_opening() {
    run(async {
        let a = Fake::new("a", "{}");
        let calls = Rc::new(std::cell::Cell::new(0));
        // Refused at the session's initialize, slow on the next try, quick after that.
        let scripted = Rc::new(Scripted {
            calls: calls.clone(),
            script: vec![None, Some(Duration::from_millis(300)), Some(Duration::ZERO)],
        }) as Rc<dyn Exit>;
        let names = ["a", "s"];
        let prefixes = event_prefixes(&names).expect("distinct toolkits");
        let routes = names
            .iter()
            .zip(prefixes)
            .map(|(toolkit, prefix)| RouteCfg {
                toolkit: Some((*toolkit).to_owned()),
                exit: (*toolkit).to_owned(),
                tools: None,
                prompts: None,
                resources: None,
                event_prefix: Some(prefix),
            })
            .collect();
        let p = Proxy::new(
            "tools",
            &ProxyBinding {
                cache: None,
                routes,
            },
            vec![Rc::new(FakeExit(a.clone())) as Rc<dyn Exit>, scripted],
            0,
            None,
        );
        let (_life, reply) = connect(&p, None).await;
        let id = reply.session.expect("a session");
        let session = p.sessions.borrow().get(&id).cloned().expect("the session");
        // An opening given up halfway (as a hydration does when its lease is lost).
        let halfway = timeout(
            Duration::from_millis(20),
            session.route(&p, 1, true, Instant::now() + WAIT),
        )
        .await;
        assert!(halfway.is_err(), "the slow open cannot have finished");
        // The next one opens it, rather than waiting for an opening nobody finishes.
        let again = timeout(
            WAIT,
            session.route(&p, 1, true, Instant::now() + Duration::from_secs(2)),
        )
        .await
        .expect("an answer in time");
        assert!(again.is_ok(), "{:?}", again.err());
        assert_eq!(calls.get(), 3);
    });
}

#[test]
fn a_storm_of_list_changed_from_one_route_relists_that_route_a_few_times_only() {
    run(async {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::with_clock(Arc::new(SystemClock)));
        let a = Fake::new("a", r#"{"tools":[{"name":"x"}]}"#);
        let b = Fake::new("b", r#"{"tools":[{"name":"y"}]}"#);
        let p = cached_proxy(&[("noisy", &a), ("quiet", &b)], store.clone(), WAIT);
        let until = Instant::now() + WAIT;
        while store.get("tools/tools").await.ok().flatten().is_none() {
            assert!(Instant::now() < until, "never hydrated");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let lists = |f: &Fake| {
            f.log
                .borrow()
                .iter()
                .filter(|l| l.starts_with("tools/list "))
                .count()
        };
        let (a_before, b_before) = (lists(&a), lists(&b));
        // 200 notifications from one route over about half a second.
        let storm = Instant::now();
        for _ in 0..200 {
            a.emit(None, Event::ListChanged(ListKind::Tools));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // Its last change comes with the storm's last notification: it must not be lost.
        a.tools.set(r#"{"tools":[{"name":"x2"}]}"#);
        a.emit(None, Event::ListChanged(ListKind::Tools));
        let until = Instant::now() + WAIT;
        loop {
            let stored = store.get("tools/tools").await.ok().flatten();
            if stored.is_some_and(|v| v.bytes.windows(4).any(|w| w == b"x2\"}")) {
                break;
            }
            assert!(
                Instant::now() < until,
                "the storm's last change never reached the store: a listed {} times, b {}",
                lists(&a) - a_before,
                lists(&b) - b_before
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let took = storm.elapsed();
        let relisted = lists(&a) - a_before;
        assert_eq!(lists(&b), b_before, "the quiet route was listed again");
        // One listing per CACHE_REFRESH_INTERVAL_MIN at most, and one more to start.
        let most =
            2 + (took.as_millis() / crate::limits::CACHE_REFRESH_INTERVAL_MIN.as_millis()) as usize;
        assert!(
            (1..=most).contains(&relisted),
            "the noisy route was listed {relisted} times in {took:?}"
        );
        p.stop();
    });
}
