//! Assembles the running gateway from a validated config: binds every listener, starts one
//! pinned worker per core with its own event loop, serves the metrics endpoint (each
//! worker's core and binding metrics, gathered through its inbox and merged), and drains
//! gracefully on SIGINT/SIGTERM.

use crate::binding::client::Client;
use crate::binding::client::fetch as client_fetch;
use crate::binding::demo::{Demo, DemoShared};
use crate::binding::metrics::BindingMetrics;
use crate::binding::proxy::Proxy;
use crate::binding::proxy::cache::CacheSetup;
use crate::binding::server::auth::{Guard, keys};
use crate::binding::server::{Server, net};
use crate::binding::{self, Exit};
use crate::config::{Binding, ClientAuth, Config, JwksSource, ProxyBinding};
use crate::limits::{
    CONNECTIONS_PER_WORKER_MAX, DRAIN_DEADLINE, METRICS_CONNECTIONS_MAX, METRICS_EXCHANGE_TIMEOUT,
};
use crate::runtime::{self, Backend, Inboxes, Listener, Slots, Task};
use crate::store::Store;
use crate::store::memory::MemoryStore;
use crate::store::redis::RedisStore;
use crate::{log, metrics};
use arc_swap::ArcSwap;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::{mpsc, watch};

/// Everything a worker needs, sent to its thread.
struct WorkerPlan {
    index: usize,
    backend: Backend,
    config: Arc<Config>,
    demos: Arc<BTreeMap<String, Arc<DemoShared>>>,
    listeners: Vec<std::net::TcpListener>,
    inbox: mpsc::Receiver<Task>,
    inboxes: Inboxes,
    drain: watch::Receiver<bool>,
    registrable: usize,
    /// TLS of the server and client bindings that have it, shared by every worker.
    tls: Arc<TlsSetups>,
    /// The `stores:`, shared by every worker.
    stores: Arc<BTreeMap<String, Arc<dyn Store>>>,
    /// The `auth` guards of the server bindings that have one, by binding name.
    guards: Arc<BTreeMap<String, Arc<Guard>>>,
}

/// The TLS configs of the bindings that use TLS, by binding name: built once, shared by
/// every worker (rustls configs are thread-safe; resumption state is shared with them).
#[derive(Default)]
struct TlsSetups {
    /// Swapped whole on SIGHUP (certificate reload); each new connection loads the current one.
    servers: BTreeMap<String, Arc<ArcSwap<rustls::ServerConfig>>>,
    clients: BTreeMap<String, crate::certs::Upstream>,
}

fn tls_setups(config: &Config) -> Result<TlsSetups, String> {
    let mut setups = TlsSetups::default();
    for (name, binding) in &config.bindings {
        match binding {
            Binding::Server(s) => {
                if let Some(t) = &s.tls {
                    let built = crate::certs::server_config(&t.cert, &t.key)
                        .map_err(|e| format!("{}: bindings.{name}.tls: {e}", config.source))?;
                    setups
                        .servers
                        .insert(name.clone(), Arc::new(ArcSwap::new(built)));
                }
            }
            Binding::Client(c) if c.server.scheme == crate::config::Scheme::Https => {
                let built = crate::certs::Upstream::new(&c.server.host, c.tls_ca.as_deref())
                    .map_err(|e| format!("{}: bindings.{name}.server: {e}", config.source))?;
                setups.clients.insert(name.clone(), built);
            }
            _ => {}
        }
    }
    Ok(setups)
}

/// Runs the gateway until a signal drains it. Returns an error message if it cannot start.
pub fn run(config: Config) -> Result<(), String> {
    let backend = runtime::choose_backend(config.runtime.io)?;
    let workers = runtime::worker_count(config.runtime.workers);
    if workers > usize::from(u8::MAX) + 1 {
        return Err(format!(
            "{}: runtime.workers: {workers} workers, expected at most 256",
            config.source
        ));
    }
    // The signal handlers go in before anything listens: a SIGTERM that arrives once the
    // first agent can connect must drain the gateway, not kill it by the default action.
    let main_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the main event loop: {e}"))?;
    let signals = {
        let _entered = main_rt.enter();
        Signals::install()?
    };
    let tls = Arc::new(tls_setups(&config)?);
    let mut stores: BTreeMap<String, Arc<dyn Store>> = BTreeMap::new();
    for (name, store) in &config.stores {
        let store: Arc<dyn Store> = match store {
            crate::config::Store::Memory => Arc::new(MemoryStore::default()),
            crate::config::Store::Redis(redis) => Arc::new(
                RedisStore::start(name, redis).map_err(|e| format!("{}: {e}", config.source))?,
            ),
        };
        stores.insert(name.clone(), store);
    }
    let stores = Arc::new(stores);
    let mut guards = BTreeMap::new();
    for (name, server) in config.servers() {
        if let Some(auth) = &server.auth {
            let guard = Guard::new((**auth).clone(), &server.path, server.tls.is_some())
                .map_err(|e| format!("{}: bindings.{name}.auth: {e}", config.source))?;
            if auth.resource.is_none() && !server.listen.ip().is_loopback() {
                log::warn(format_args!(
                    "auth: {name}: no resource is set, so the protected-resource metadata \
                     names the URL each request's Host gives (set auth.resource to the \
                     public URL agents use)"
                ));
            }
            guards.insert(name.to_owned(), guard);
        }
    }
    let guards = Arc::new(guards);
    let demos: BTreeMap<String, Arc<DemoShared>> = config
        .bindings
        .iter()
        .filter_map(|(name, b)| match b {
            Binding::Demo(d) => Some((name.clone(), DemoShared::new(d.progress_interval))),
            _ => None,
        })
        .collect();
    let mut per_worker: Vec<Vec<std::net::TcpListener>> =
        (0..workers).map(|_| Vec::new()).collect();
    for (name, server) in config.servers() {
        let (sockets, bound) =
            runtime::io::bind_reuseport(server.listen, workers).map_err(|e| {
                format!(
                    "{}: bindings.{name}.listen: cannot listen on {}: {e}",
                    config.source, server.listen
                )
            })?;
        for (w, s) in sockets.into_iter().enumerate() {
            if let Some(list) = per_worker.get_mut(w) {
                list.push(s);
            }
        }
        println!("listening {name} {bound}");
    }
    let metrics_listener = match config.telemetry.metrics {
        Some(addr) => {
            let l = std::net::TcpListener::bind(addr).map_err(|e| {
                format!(
                    "{}: telemetry.metrics: cannot listen on {addr}: {e}",
                    config.source
                )
            })?;
            let bound = l.local_addr().map_err(|e| e.to_string())?;
            println!("listening metrics {bound}");
            Some(l)
        }
        None => None,
    };
    log::info(format_args!(
        "gateway: starting workers={workers} io={}",
        backend.name()
    ));
    let registrable = if backend == Backend::Uring {
        runtime::registrable_slots(workers)
    } else {
        0
    };
    let (inboxes, receivers) = runtime::inboxes(workers);
    let (drain_tx, drain_rx) = watch::channel(false);
    let config = Arc::new(config);
    let demos = Arc::new(demos);
    let mut threads = Vec::with_capacity(workers);
    for ((index, listeners), inbox) in per_worker.into_iter().enumerate().zip(receivers) {
        let plan = WorkerPlan {
            index,
            backend,
            config: config.clone(),
            demos: demos.clone(),
            listeners,
            inbox,
            inboxes: inboxes.clone(),
            drain: drain_rx.clone(),
            registrable,
            tls: tls.clone(),
            stores: stores.clone(),
            guards: guards.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("mcpyard-w{index}"))
            .spawn(move || {
                runtime::pin(plan.index);
                let backend = plan.backend;
                if let Err(e) = runtime::block_on(backend, worker(plan)) {
                    log::error(format_args!("worker: event loop failed: {e}"));
                    std::process::exit(1);
                }
            })
            .map_err(|e| format!("cannot start a worker thread: {e}"))?;
        threads.push(thread);
    }
    let Signals {
        mut terminate,
        mut interrupt,
        hangup,
    } = signals;
    main_rt.block_on(async {
        if let Some(l) = metrics_listener {
            match tokio_listener(l) {
                Ok(l) => {
                    tokio::spawn(serve_metrics(l, inboxes.clone()));
                }
                Err(e) => log::warn(format_args!("metrics: cannot serve: {e}")),
            }
        }
        tokio::spawn(reload_on_hangup(hangup, config.clone(), tls.clone()));
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    });
    log::info(format_args!(
        "gateway: draining (deadline {}s)",
        DRAIN_DEADLINE.as_secs()
    ));
    let _ = drain_tx.send(true);
    for t in threads {
        let _ = t.join();
    }
    log::info(format_args!("gateway: stopped"));
    Ok(())
}

fn tokio_listener(l: std::net::TcpListener) -> std::io::Result<tokio::net::TcpListener> {
    l.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(l)
}

/// On every SIGHUP, reads each TLS server binding's certificate and key again and swaps
/// them in for new connections; live connections keep the session they have. A file that
/// does not load leaves the previous certificate in place (one log line says why).
/// Resumption keys and the session cache carry over, so agents still resume.
async fn reload_on_hangup(mut hangup: Signal, config: Arc<Config>, tls: Arc<TlsSetups>) {
    while hangup.recv().await.is_some() {
        if tls.servers.is_empty() {
            log::info(format_args!(
                "gateway: SIGHUP: no TLS server binding to reload"
            ));
        }
        for (name, current) in &tls.servers {
            let Some(Binding::Server(server)) = config.bindings.get(name) else {
                continue;
            };
            let Some(files) = &server.tls else {
                continue;
            };
            match crate::certs::server_config(&files.cert, &files.key) {
                Ok(mut fresh) => {
                    let old = current.load();
                    if let Some(f) = Arc::get_mut(&mut fresh) {
                        f.ticketer = old.ticketer.clone();
                        f.session_storage = old.session_storage.clone();
                    }
                    current.store(fresh);
                    log::info(format_args!(
                        "server {name}: TLS certificate reloaded from {}",
                        files.cert.display()
                    ));
                }
                Err(e) => log::error(format_args!(
                    "server {name}: TLS certificate not reloaded, the previous one stays: {e}"
                )),
            }
        }
    }
}

/// The main thread's signal streams, installed before the first listener binds.
struct Signals {
    terminate: Signal,
    interrupt: Signal,
    hangup: Signal,
}

impl Signals {
    /// Installs the handlers; must run inside the main runtime's context.
    fn install() -> Result<Signals, String> {
        let one = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| format!("cannot install the {name} handler: {e}"))
        };
        Ok(Signals {
            terminate: one(SignalKind::terminate(), "SIGTERM")?,
            interrupt: one(SignalKind::interrupt(), "SIGINT")?,
            hangup: one(SignalKind::hangup(), "SIGHUP")?,
        })
    }
}

/// This worker's exits, built once each however many bindings exit to them.
struct Exits<'a> {
    plan: &'a WorkerPlan,
    slots: &'a Rc<Slots>,
    built: BTreeMap<String, Rc<dyn Exit>>,
    /// The client instances among them (drain waits for their sessions).
    clients: Vec<Rc<Client>>,
    /// The proxy instances among them (drain stops their caches).
    proxies: Vec<Rc<Proxy>>,
}

impl Exits<'_> {
    /// This worker's instance of the exit named `name` (built on first use); `None` if
    /// the config has no such exit (validation rules that out).
    fn get(&mut self, name: &str) -> Option<Rc<dyn Exit>> {
        if let Some(exit) = self.built.get(name) {
            return Some(exit.clone());
        }
        let worker = self.plan.index as u8;
        let exit: Rc<dyn Exit> = match self.plan.config.bindings.get(name)? {
            Binding::Demo(_) => Demo::new(self.plan.demos.get(name)?.clone()),
            Binding::Client(cfg) => {
                let client = Client::new(
                    name,
                    cfg,
                    worker,
                    self.plan.backend,
                    self.slots.clone(),
                    self.plan.tls.clients.get(name).cloned(),
                );
                self.clients.push(client.clone());
                client
            }
            Binding::Proxy(cfg) => {
                let mut routes = Vec::with_capacity(cfg.routes.len());
                for route in &cfg.routes {
                    routes.push(self.get(&route.exit)?);
                }
                let proxy = Proxy::new(name, cfg, routes, worker, self.cache_setup(cfg));
                self.proxies.push(proxy.clone());
                proxy
            }
            Binding::Server(_) => return None,
        };
        self.built.insert(name.to_owned(), exit.clone());
        Some(exit)
    }
}

impl Exits<'_> {
    /// How proxy `cfg`'s cache reaches its store, if it has one.
    fn cache_setup(&self, cfg: &ProxyBinding) -> Option<CacheSetup> {
        let cache = cfg.cache.as_ref()?;
        let store = self.plan.stores.get(&cache.store)?.clone();
        // A hydration waits for its slowest route's client at most this long.
        let route_timeout = cfg
            .routes
            .iter()
            .map(|r| match self.plan.config.bindings.get(&r.exit) {
                Some(Binding::Client(c)) => c.connect_timeout + c.response_timeout,
                _ => DEMO_ROUTE_TIMEOUT,
            })
            .max()
            .unwrap_or(DEMO_ROUTE_TIMEOUT);
        // Routes whose client sends each agent's own credential upstream.
        let forwarding = cfg
            .routes
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                matches!(
                    self.plan.config.bindings.get(&r.exit),
                    Some(Binding::Client(c)) if c.authorization == Some(ClientAuth::Forward)
                )
            })
            .fold(0, |set, (i, _)| set | 1 << i);
        Some(CacheSetup {
            store,
            ttl: cache.ttl,
            authorization: cache.authorization.as_ref().map(|s| s.bearer_header()),
            route_timeout,
            forwarding,
        })
    }
}

/// What a hydration waits for a demo route (it answers at once).
const DEMO_ROUTE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Deadline of one read of an `https://` key set, the connection included.
const JWKS_FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts a server binding's key reader on this worker (worker 0): it reads the file, or
/// fetches the URL with the client binding's connections, until the drain.
fn start_key_reader(
    name: &str,
    guard: &Arc<Guard>,
    backend: Backend,
    drain: &watch::Receiver<bool>,
    slots: &Rc<Slots>,
) {
    let name = name.to_owned();
    let drain = drain.clone();
    let guard = guard.clone();
    match guard.cfg.jwt.jwks.clone() {
        JwksSource::File(path) => {
            tokio::task::spawn_local(async move {
                let read = || {
                    let path = path.clone();
                    async move { crate::jwks::read_file(&path).map(bytes::Bytes::from) }
                };
                tokio::select! {
                    () = keys::run(&name, guard, read) => {}
                    () = runtime::drained(drain) => {}
                }
            });
        }
        JwksSource::Url(url) => {
            let tls = match crate::certs::Upstream::new(&url.host, guard.cfg.jwt.jwks_ca.as_deref())
            {
                Ok(tls) => tls,
                Err(e) => {
                    log::error(format_args!(
                        "auth: {name}: cannot set up TLS for the key set: {e}"
                    ));
                    return;
                }
            };
            let url = Rc::new(url);
            let slots = slots.clone();
            tokio::task::spawn_local(async move {
                let read = || {
                    client_fetch::get(
                        &url,
                        Some(tls.clone()),
                        backend,
                        slots.clone(),
                        JWKS_FETCH_TIMEOUT,
                        crate::jwks::JWKS_BYTES_MAX,
                    )
                };
                tokio::select! {
                    () = keys::run(&name, guard, read) => {}
                    () = runtime::drained(drain) => {}
                }
            });
        }
    }
}

/// One worker: its servers, accept loops and inbox, until the drain signal.
async fn worker(plan: WorkerPlan) {
    let slots = Rc::new(Slots::new(plan.backend == Backend::Uring, plan.registrable));
    let mut servers = Vec::new();
    let mut listeners = Vec::new();
    let mut exits = Exits {
        plan: &plan,
        slots: &slots,
        built: BTreeMap::new(),
        clients: Vec::new(),
        proxies: Vec::new(),
    };
    let configured: Vec<(String, crate::config::ServerBinding)> = plan
        .config
        .servers()
        .map(|(n, s)| (n.to_owned(), s.clone()))
        .collect();
    for ((index, (name, cfg)), std) in configured
        .into_iter()
        .enumerate()
        .zip(plan.listeners.iter())
    {
        let Some(exit) = exits.get(&cfg.exit) else {
            log::error(format_args!(
                "worker: binding {name}: exit {} cannot be built",
                cfg.exit
            ));
            return;
        };
        let sessions = cfg
            .sessions_store
            .as_ref()
            .and_then(|store| plan.stores.get(store))
            .cloned();
        let server = Server::new(
            &name,
            index,
            cfg,
            plan.index as u8,
            exit,
            plan.inboxes.clone(),
            crate::binding::server::Common {
                tls: plan.tls.servers.get(&name).cloned(),
                sessions,
                auth: plan.guards.get(&name).cloned(),
            },
        );
        let listener = match std
            .try_clone()
            .and_then(|s| Listener::adopt(s, plan.backend))
        {
            Ok(l) => Rc::new(l),
            Err(e) => {
                log::error(format_args!(
                    "worker: binding {name}: cannot adopt listener: {e}"
                ));
                return;
            }
        };
        tokio::task::spawn_local(accept_loop(
            listener.clone(),
            server.clone(),
            slots.clone(),
            plan.drain.clone(),
        ));
        listeners.push(listener);
        servers.push(server);
    }
    let clients = std::mem::take(&mut exits.clients);
    let proxies = std::mem::take(&mut exits.proxies);
    drop(exits);
    drop(plan.listeners);
    if plan.index == 0 {
        for (name, guard) in plan.guards.iter() {
            start_key_reader(name, guard, plan.backend, &plan.drain, &slots);
        }
    }
    tokio::task::spawn_local(runtime::run_inbox(plan.inbox));
    runtime::drained(plan.drain.clone()).await;
    for l in &listeners {
        l.shutdown();
    }
    let deadline = Instant::now() + DRAIN_DEADLINE;
    for s in &servers {
        s.drain(deadline).await;
    }
    // Responses the drain just ended (closed sessions, relayed replies) finish writing
    // before the connections are shut down.
    while net::busy() > 0 && Instant::now() < deadline {
        tokio::time::sleep(crate::limits::TICK).await;
    }
    net::shutdown_all();
    while net::live() > 0 && Instant::now() < deadline {
        tokio::time::sleep(crate::limits::TICK).await;
    }
    // The caches' hydration sessions are not agents': they end here.
    for p in &proxies {
        p.stop();
    }
    // Sessions are closed by now (their DELETEs went upstream); drop the idle pool.
    while clients.iter().any(|c| c.sessions() > 0) && Instant::now() < deadline {
        tokio::time::sleep(crate::limits::TICK).await;
    }
    for c in &clients {
        c.close_idle();
    }
}

async fn accept_loop(
    listener: Rc<Listener>,
    server: Rc<Server>,
    slots: Rc<Slots>,
    drain: watch::Receiver<bool>,
) {
    loop {
        match listener.accept().await {
            Ok((conn, _peer)) => {
                if net::live() >= CONNECTIONS_PER_WORKER_MAX || server.draining() {
                    metrics::with(|m| m.overload_rejections += 1);
                    tokio::task::spawn_local(net::refuse(conn, server.tls.is_some()));
                    continue;
                }
                tokio::task::spawn_local(crate::runtime::pass::run(net::serve(
                    server.clone(),
                    slots.clone(),
                    conn,
                )));
            }
            Err(e) => {
                if *drain.borrow() {
                    return;
                }
                // EMFILE and friends: back off briefly instead of spinning.
                log::warn(format_args!("accept: {e}"));
                tokio::time::sleep(crate::limits::TICK).await;
            }
        }
    }
}

/// Serves `GET /metrics` (Prometheus text) on the main thread, gathering every worker's
/// snapshot through its inbox.
async fn serve_metrics(listener: tokio::net::TcpListener, inboxes: Inboxes) {
    let places = Arc::new(tokio::sync::Semaphore::new(METRICS_CONNECTIONS_MAX));
    loop {
        let mut stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                log::warn(format_args!("metrics accept: {e}"));
                tokio::time::sleep(crate::limits::TICK).await;
                continue;
            }
        };
        let Ok(place) = places.clone().try_acquire_owned() else {
            // Every place taken (scrapers that hang, or a flood): closed at once, counted.
            METRICS_REFUSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            drop(stream);
            continue;
        };
        let inboxes = inboxes.clone();
        tokio::spawn(async move {
            // A scraper that sends nothing, or does not read, is let go of in bounded time.
            let exchange = async {
                let mut head = vec![0u8; 4096];
                let mut len = 0;
                while let Some(room) = head.get_mut(len..).filter(|r| !r.is_empty()) {
                    match stream.read(room).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => len += n,
                    }
                    if head
                        .get(..len)
                        .is_some_and(|h| h.windows(4).any(|w| w == b"\r\n\r\n"))
                    {
                        break;
                    }
                }
                let ok = head.starts_with(b"GET /metrics ") || head.starts_with(b"GET /metrics?");
                let (status, body) = if ok {
                    ("200 OK", render(gather(&inboxes).await))
                } else {
                    ("404 Not Found", "not found\n".to_owned())
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            };
            let _ = tokio::time::timeout(METRICS_EXCHANGE_TIMEOUT, exchange).await;
            drop(place);
        });
    }
}

/// Scrape connections closed at once because [`METRICS_CONNECTIONS_MAX`] were open.
static METRICS_REFUSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// One worker's metrics at a scrape: the core's and the bindings'.
type Snapshot = (metrics::WorkerMetrics, BindingMetrics);

/// Merges the workers' snapshots into one Prometheus text: the core's series, the stores',
/// then the bindings'.
fn render(snapshots: Vec<Snapshot>) -> String {
    let (core, bindings): (Vec<_>, Vec<_>) = snapshots.into_iter().unzip();
    let mut out = String::with_capacity(8 * 1024);
    metrics::render(&core, &mut out);
    binding::metrics::render(&bindings, &mut out);
    let refused = METRICS_REFUSED.load(std::sync::atomic::Ordering::Relaxed);
    let _ = write!(
        out,
        "# HELP mcpyard_metrics_scrapes_refused_total Scrape connections closed at once: every place was taken.\n\
         # TYPE mcpyard_metrics_scrapes_refused_total counter\n\
         mcpyard_metrics_scrapes_refused_total {refused}\n"
    );
    out
}

/// Asks every worker for a [`Snapshot`] through its inbox and waits for the answers.
async fn gather(inboxes: &Inboxes) -> Vec<Snapshot> {
    let (tx, mut rx) = mpsc::channel(inboxes.len().max(1));
    let mut asked = 0;
    for w in 0..inboxes.len() {
        let tx = tx.clone();
        if inboxes
            .send(
                w,
                Box::new(move || {
                    let _ = tx.try_send((metrics::snapshot(), binding::metrics::snapshot()));
                }),
            )
            .is_ok()
        {
            asked += 1;
        }
    }
    drop(tx);
    let mut out = Vec::with_capacity(asked);
    while let Some(m) = rx.recv().await {
        out.push(m);
    }
    out
}
